//! jobq-testing's own error: every message is one line that says what to do.

/// An error from a jobq-testing helper.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing usable answers at the database URL. The message names the URL (password
    /// hidden), the cause, and how to fix it.
    #[error("cannot reach PostgreSQL at {url} ({cause}); {hint}")]
    Unreachable {
        /// The URL tried, with its password replaced by `***`.
        url: String,
        /// Why the connection failed.
        cause: String,
        /// What to do about it.
        hint: String,
    },
    /// The database returned an error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A jobq call failed (migrating, enqueueing).
    #[error(transparent)]
    Jobq(#[from] jobq::Error),
    /// A stored job's payload does not decode as its type's args.
    #[error("job {id} of kind `{kind}` has a payload that does not decode as its args: {message}")]
    Decode {
        /// The job's id.
        id: jobq::JobId,
        /// Its kind.
        kind: String,
        /// The decoder's complaint.
        message: String,
    },
}
