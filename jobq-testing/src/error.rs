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
    /// A jobq call failed (migrating, building the runtime, draining).
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
    /// [`Drain`](crate::Drain) ran its maximum number of rounds and jobs were still pending.
    #[error(
        "drain stopped after {rounds} rounds with jobs still pending ({pending}); raise Drain::max_rounds or look for a job that keeps enqueueing itself"
    )]
    DrainLimit {
        /// Rounds run.
        rounds: u32,
        /// The first pending jobs, as `#id kind`.
        pending: String,
    },
}
