//! Flow control: the claim's rules as data. Per-key ordering ([`ordering`]) keeps the jobs
//! of one key out of the claim index until the job before them has finished; concurrency
//! and rate limits ([`limits`]) are charged by the claim that takes the jobs. Every rule is
//! enforced by the statements in `store/`, so it holds across nodes and crashes.

pub(crate) mod limits;
#[cfg(test)]
mod limits_tests;
pub(crate) mod ordering;
