//! Flow control: the claim's rules as data.

pub(crate) mod limits;
#[cfg(test)]
mod limits_tests;
