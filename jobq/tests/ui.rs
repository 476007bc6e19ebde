//! Compile-time tests of `#[jobq::job]` and `#[derive(jobq::Classify)]`: every feature has
//! a `pass` case, every mistake a `fail` case whose `.stderr` is the message users see.
//!
//! Regenerate the expected messages with `TRYBUILD=overwrite cargo test --workspace --test ui`
//! (the features the workspace enables, as CI builds it, change some of rustc's notes),
//! then read every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
