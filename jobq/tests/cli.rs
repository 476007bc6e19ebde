//! Work in progress: the CLI end-to-end tests come with the CLI.
