//! Workspace-level integration, failure-injection and end-to-end tests for jobq. The tests
//! live in `tests/*.rs`; each test binary gets its own `inventory` of `#[jobq::job]`s.
