//! Work in progress: filled in by a later commit on this branch.

fn main() {}
