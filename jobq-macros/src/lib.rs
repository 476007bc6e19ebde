//! Procedural macros for jobq: `#[job]` and `#[derive(Classify)]`. Use them through the
//! `jobq` crate's re-exports.
