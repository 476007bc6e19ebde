//! Errors: the library's infrastructure [`Error`], and a job's outcome ([`JobError`],
//! classified through [`Classify`]).
//!
//! The two never mix. [`Error`] is what jobq's own calls return (a database that cannot be
//! reached, an enqueue that is rejected); [`JobError`] and [`Classify`] describe why one
//! attempt of a job did not succeed and what the runtime should do about it.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// An error from jobq itself: enqueue, migrate, runtime construction, store access.
///
/// Every variant has a stable [`code`](Error::code), so callers can match on a string in
/// logs and metrics as well as on the variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database returned an error or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A job's arguments could not be serialized to JSON.
    #[error("job arguments of kind `{kind}` could not be serialized: {source}")]
    Serialize {
        /// The job kind.
        kind: String,
        /// The underlying serde error.
        #[source]
        source: serde_json::Error,
    },
    /// An enqueue was rejected before reaching the database (an empty kind, a payload over
    /// the size limit, `max_attempts` of 0, …). `code` is stable.
    #[error("invalid job ({code}): {message}")]
    Invalid {
        /// Stable machine-readable code, e.g. `payload_too_large`.
        code: &'static str,
        /// What was wrong, for people.
        message: String,
    },
    /// Two different job types were registered for one kind.
    #[error("job kind `{kind}` is registered twice: by `{first}` and by `{second}`")]
    DuplicateKind {
        /// The kind both claim.
        kind: String,
        /// The type registered first.
        first: &'static str,
        /// The type registered second.
        second: &'static str,
    },
    /// The runtime was configured in a way that cannot work.
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    /// The attempt this call was made for no longer holds the job: its lease expired and
    /// the job was rescued, completed or claimed again. The write was not applied.
    #[error("job {id} attempt {attempt} no longer holds its lease; the write was not applied")]
    LeaseLost {
        /// The job id.
        id: i64,
        /// The attempt that lost the job.
        attempt: i32,
    },
    /// A migration could not be applied.
    #[error("migration {version} ({name}) failed: {source}")]
    Migrate {
        /// The migration's version.
        version: i64,
        /// The migration's name.
        name: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// An operator action named something that does not exist: a job id, a queue.
    #[error("no such {what}: {name}")]
    NotFound {
        /// `job` or `queue`.
        what: &'static str,
        /// The id or name given.
        name: String,
    },
    /// An operator action found the job in a state it does not apply to (replaying a
    /// running job, retrying a job that is not waiting). Nothing was changed.
    #[error("job {id} is {state}; {action} applies only to {expected} jobs")]
    WrongState {
        /// The job id.
        id: i64,
        /// The state the job is in.
        state: String,
        /// The action attempted.
        action: &'static str,
        /// The states the action applies to.
        expected: &'static str,
    },
    /// A message broker (the outbox's NATS or RabbitMQ) refused or failed a call, such as
    /// acknowledging a delivery.
    #[error("broker error ({code}): {message}")]
    Broker {
        /// Stable code, e.g. `nats_ack`, `amqp_ack`.
        code: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// A stable, machine-readable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Database(_) => "database",
            Error::Serialize { .. } => "serialize",
            Error::Invalid { code, .. } => code,
            Error::DuplicateKind { .. } => "duplicate_kind",
            Error::Config(_) => "config",
            Error::LeaseLost { .. } => "lease_lost",
            Error::Migrate { .. } => "migrate",
            Error::NotFound { .. } => "not_found",
            Error::WrongState { .. } => "wrong_state",
            Error::Broker { code, .. } => code,
        }
    }

    pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            code,
            message: message.into(),
        }
    }
}

/// What the runtime should do with a job whose attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Try again after a backoff, while attempts remain.
    Retryable,
    /// Do not try again: the job goes straight to `failed`.
    Permanent,
    /// The job decided it should not run any more: the job goes to `cancelled`.
    Cancel,
}

impl Disposition {
    /// `"retryable"`, `"permanent"` or `"cancel"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Retryable => "retryable",
            Disposition::Permanent => "permanent",
            Disposition::Cancel => "cancel",
        }
    }
}

/// The classification of one failure: what to do, a stable code, and an optional
/// Retry-After that overrides the job's backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// Retry, fail, or cancel.
    pub disposition: Disposition,
    /// A stable code stored in `jobs.last_error_code`, e.g. `rate_limited`.
    pub code: Cow<'static, str>,
    /// When set on a retryable failure, the next attempt waits exactly this long instead
    /// of the job's backoff.
    pub retry_after: Option<Duration>,
}

impl Classification {
    /// A retryable failure with `code`.
    pub fn retryable(code: impl Into<Cow<'static, str>>) -> Self {
        Classification {
            disposition: Disposition::Retryable,
            code: code.into(),
            retry_after: None,
        }
    }

    /// A permanent failure with `code`.
    pub fn permanent(code: impl Into<Cow<'static, str>>) -> Self {
        Classification {
            disposition: Disposition::Permanent,
            code: code.into(),
            retry_after: None,
        }
    }

    /// A cancellation with `code`.
    pub fn cancel(code: impl Into<Cow<'static, str>>) -> Self {
        Classification {
            disposition: Disposition::Cancel,
            code: code.into(),
            retry_after: None,
        }
    }

    /// Sets the Retry-After of a retryable failure.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// Classifies a job's error: retryable or permanent, with a stable code.
///
/// Derive it with `#[derive(jobq::Classify)]` and per-variant attributes
/// (`#[jobq(permanent)]`, `#[jobq(retryable, code = "rate_limited", retry_after = wait)]`),
/// or return [`JobError`], which implements it directly. Unannotated variants of a derived
/// type are retryable.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a job's error type because it does not implement `jobq::Classify`",
    label = "this error type does not say whether a failure is retryable or permanent",
    note = "add `#[derive(jobq::Classify)]` to `{Self}` (variants are retryable unless marked `#[jobq(permanent)]`), or return `jobq::JobError`"
)]
pub trait Classify {
    /// How the runtime should treat this failure.
    fn classify(&self) -> Classification;
}

impl<T: Classify + ?Sized> Classify for Box<T> {
    fn classify(&self) -> Classification {
        (**self).classify()
    }
}

impl Classify for std::convert::Infallible {
    fn classify(&self) -> Classification {
        match *self {}
    }
}

/// A job's failure, classified by hand: use it as a handler's error type when no domain
/// error type fits, or convert a domain error into it.
///
/// ```
/// use jobq::JobError;
/// use std::time::Duration;
///
/// let e = JobError::retryable("provider_unavailable", "mail provider returned 503")
///     .retry_after(Duration::from_secs(30));
/// assert_eq!(e.to_string(), "mail provider returned 503");
/// let e = JobError::permanent("invoice_missing", "invoice 42 does not exist");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    class: Classification,
    message: String,
}

impl JobError {
    /// A failure worth retrying (a dependency is down, a lock timed out, …).
    pub fn retryable(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        JobError {
            class: Classification::retryable(code),
            message: message.into(),
        }
    }

    /// A failure that retrying cannot fix (bad input, a missing record, …).
    pub fn permanent(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        JobError {
            class: Classification::permanent(code),
            message: message.into(),
        }
    }

    /// The job should not run any more: it moves to `cancelled`, not `failed`.
    pub fn cancel(message: impl Into<String>) -> Self {
        JobError {
            class: Classification::cancel("cancelled"),
            message: message.into(),
        }
    }

    /// Wait exactly `after` before the next attempt, instead of the job's backoff.
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.class.retry_after = Some(after);
        self
    }

    /// Wraps any error as a retryable failure with `code`, keeping its message.
    pub fn retryable_from(code: impl Into<Cow<'static, str>>, err: impl fmt::Display) -> Self {
        JobError::retryable(code, err.to_string())
    }

    /// The message given at construction.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JobError {}

impl Classify for JobError {
    fn classify(&self) -> Classification {
        self.class.clone()
    }
}

impl From<sqlx::Error> for JobError {
    fn from(err: sqlx::Error) -> Self {
        JobError::retryable("database", err.to_string())
    }
}

impl From<Error> for JobError {
    fn from(err: Error) -> Self {
        match err {
            Error::LeaseLost { .. } => JobError::retryable("lease_lost", err.to_string()),
            Error::Invalid { code, .. } => JobError::permanent(code, err.to_string()),
            other => JobError::retryable(other.code(), other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_error_classifies_as_built() {
        let e = JobError::retryable("x", "m").retry_after(Duration::from_secs(3));
        let c = e.classify();
        assert_eq!(c.disposition, Disposition::Retryable);
        assert_eq!(c.code, "x");
        assert_eq!(c.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(
            JobError::permanent("p", "m").classify().disposition,
            Disposition::Permanent
        );
        assert_eq!(
            JobError::cancel("stop").classify().disposition,
            Disposition::Cancel
        );
    }

    #[test]
    fn infra_errors_have_stable_codes() {
        assert_eq!(
            Error::invalid("payload_too_large", "x").code(),
            "payload_too_large"
        );
        assert_eq!(Error::LeaseLost { id: 1, attempt: 2 }.code(), "lease_lost");
    }
}
