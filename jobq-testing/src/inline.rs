//! Inline mode: one attempt of one job on the current task, no database.
//!
//! The args go through JSON exactly as an enqueue sends them, then through
//! [`jobq::run_attempt`] — the runtime's own decode, timeout, panic catching and
//! classification — and the result is told the way the runtime would act on it.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use jobq::{AttemptOutcome, Failure, Job, JobContext, JobId, NextState};

/// How one attempt ended, and what the runtime would do next.
///
/// Panics and timeouts are retryable failures with the codes `panic` and `timeout`, as
/// the runtime classifies them; a payload that does not decode is a permanent failure with
/// the code `decode`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler returned `Ok`: the job would be `done`.
    Done,
    /// A retryable failure with attempts left: the job would run again after `delay`.
    Retry {
        /// The failure's stable code (`panic`, `timeout`, or the handler's own).
        code: String,
        /// The error's message.
        message: String,
        /// The wait before the next attempt: the error's Retry-After if it carries one,
        /// else the job's retry policy for this attempt (jittered when the policy is).
        delay: Duration,
    },
    /// A terminal failure: the job would be `failed`.
    Failed {
        /// The failure's stable code.
        code: String,
        /// The error's message.
        message: String,
        /// `true` when the failure was retryable but this was the last allowed attempt;
        /// `false` for a permanent failure.
        exhausted: bool,
    },
    /// The handler cancelled the job ([`jobq::JobError::cancel`]): it would be `cancelled`.
    Cancelled {
        /// The cancellation's code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The args would not survive an enqueue: they do not serialize to JSON, or the
    /// JSON is too large or holds something PostgreSQL's `jsonb` refuses. The handler did
    /// not run.
    Rejected {
        /// `serialize`, `payload_too_large`, `nul_in_payload` or `invalid_idempotency_key`.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The attempt was stopped from outside before it finished (a lost lease or a
    /// shutdown). Inline runs have neither, so they never end this way.
    Interrupted {
        /// The runtime's label for it.
        reason: String,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => f.write_str("done"),
            Outcome::Retry {
                code,
                message,
                delay,
            } => write!(f, "retry `{code}` after {delay:?}: {message}"),
            Outcome::Failed {
                code,
                message,
                exhausted: true,
            } => write!(f, "failed `{code}` (attempts exhausted): {message}"),
            Outcome::Failed { code, message, .. } => {
                write!(f, "failed `{code}` (permanent): {message}")
            }
            Outcome::Cancelled { code, message } => write!(f, "cancelled `{code}`: {message}"),
            Outcome::Rejected { code, message } => {
                write!(f, "rejected before running `{code}`: {message}")
            }
            Outcome::Interrupted { reason } => write!(f, "interrupted ({reason})"),
        }
    }
}

impl Outcome {
    /// Whether the handler succeeded.
    pub fn is_done(&self) -> bool {
        matches!(self, Outcome::Done)
    }

    /// The failure's code, if the attempt failed, was cancelled or was rejected.
    pub fn code(&self) -> Option<&str> {
        match self {
            Outcome::Retry { code, .. }
            | Outcome::Failed { code, .. }
            | Outcome::Cancelled { code, .. } => Some(code),
            Outcome::Rejected { code, .. } => Some(code),
            Outcome::Done | Outcome::Interrupted { .. } => None,
        }
    }

    /// The failure's message, if the attempt failed, was cancelled or was rejected.
    pub fn message(&self) -> Option<&str> {
        match self {
            Outcome::Retry { message, .. }
            | Outcome::Failed { message, .. }
            | Outcome::Cancelled { message, .. }
            | Outcome::Rejected { message, .. } => Some(message),
            Outcome::Done | Outcome::Interrupted { .. } => None,
        }
    }

    /// The wait before the next attempt, if there is one.
    pub fn delay(&self) -> Option<Duration> {
        match self {
            Outcome::Retry { delay, .. } => Some(*delay),
            _ => None,
        }
    }

    /// Asserts the handler succeeded.
    ///
    /// # Panics
    ///
    /// When it did not, with the outcome in the message.
    #[track_caller]
    pub fn assert_done(&self) {
        if !self.is_done() {
            panic!("expected the job to be done, but it ended: {self}");
        }
    }

    /// Asserts a retryable failure with `code` and attempts left; returns the delay
    /// before the next attempt.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_retry(&self, code: &str) -> Duration {
        match self {
            Outcome::Retry { code: c, delay, .. } if c == code => *delay,
            _ => panic!("expected a retry with code `{code}`, but the job ended: {self}"),
        }
    }

    /// Asserts a terminal failure with `code`, permanent or exhausted; returns its
    /// message.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_failed(&self, code: &str) -> &str {
        match self {
            Outcome::Failed {
                code: c, message, ..
            } if c == code => message,
            _ => {
                panic!("expected a terminal failure with code `{code}`, but the job ended: {self}")
            }
        }
    }

    /// Asserts a permanent failure with `code` (not an exhausted retry); returns its
    /// message.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_permanent(&self, code: &str) -> &str {
        match self {
            Outcome::Failed {
                code: c,
                message,
                exhausted: false,
            } if c == code => message,
            _ => {
                panic!("expected a permanent failure with code `{code}`, but the job ended: {self}")
            }
        }
    }

    /// Asserts the handler cancelled the job.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_cancelled(&self) {
        if !matches!(self, Outcome::Cancelled { .. }) {
            panic!("expected the job to cancel itself, but it ended: {self}");
        }
    }

    /// Asserts the handler panicked (a retry, or a terminal failure on the last attempt,
    /// with code `panic`); returns the panic's message.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_panicked(&self) -> &str {
        match self {
            Outcome::Retry { code, message, .. } | Outcome::Failed { code, message, .. }
                if code == "panic" =>
            {
                message
            }
            _ => panic!("expected the handler to panic, but the job ended: {self}"),
        }
    }

    /// Asserts the attempt hit the job's `TIMEOUT` (code `timeout`).
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_timed_out(&self) {
        match self {
            Outcome::Retry { code, .. } | Outcome::Failed { code, .. } if code == "timeout" => {}
            _ => panic!("expected the attempt to time out, but the job ended: {self}"),
        }
    }

    /// Asserts the args were rejected before running, with `code`.
    ///
    /// # Panics
    ///
    /// When the outcome is anything else.
    #[track_caller]
    pub fn assert_rejected(&self, code: &str) -> &str {
        match self {
            Outcome::Rejected { code: c, message } if *c == code => message,
            _ => {
                panic!("expected the args to be rejected with `{code}`, but the job ended: {self}")
            }
        }
    }
}

/// Runs attempt 1 of job `J` with `args` on the current task and tells how it ended.
/// Shorthand for `Perform::<J>::new(args).run().await`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use jobq::{Job, JobContext, JobError};
///
/// struct Greet;
/// impl Job for Greet {
///     const KIND: &'static str = "greet";
///     type Args = String;
///     type Error = JobError;
///     async fn run(_ctx: JobContext, name: String) -> Result<(), JobError> {
///         if name.is_empty() {
///             return Err(JobError::permanent("no_name", "nobody to greet"));
///         }
///         Ok(())
///     }
/// }
///
/// jobq_testing::perform::<Greet>("world".into()).await.assert_done();
/// jobq_testing::perform::<Greet>(String::new()).await.assert_permanent("no_name");
/// # }
/// ```
pub async fn perform<J: Job>(args: J::Args) -> Outcome {
    Perform::<J>::new(args).run().await
}

/// One inline attempt of job `J`, with the context values a test wants to set.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # use jobq::{Job, JobContext, JobError};
/// # struct Flaky;
/// # impl Job for Flaky {
/// #     const KIND: &'static str = "flaky";
/// #     type Args = ();
/// #     type Error = JobError;
/// #     async fn run(_ctx: JobContext, _: ()) -> Result<(), JobError> {
/// #         Err(JobError::retryable("upstream_down", "503"))
/// #     }
/// # }
/// use jobq_testing::{Outcome, Perform};
///
/// let outcome = Perform::<Flaky>::new(()).attempt(3).max_attempts(3).run().await;
/// assert!(matches!(outcome, Outcome::Failed { exhausted: true, .. }));
/// # }
/// ```
#[must_use = "a Perform does nothing until `.run().await`"]
pub struct Perform<J: Job> {
    args: J::Args,
    attempt: u32,
    max_attempts: u32,
    ctx: JobContext,
    _job: PhantomData<fn() -> J>,
}

impl<J: Job> fmt::Debug for Perform<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Perform")
            .field("kind", &J::KIND)
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("id", &self.ctx.id())
            .field("queue", &self.ctx.queue())
            .finish_non_exhaustive()
    }
}

impl<J: Job> Perform<J> {
    /// Attempt 1 of `J::RETRY.max_attempts()`, job id 0, queue `J::QUEUE`.
    pub fn new(args: J::Args) -> Self {
        Perform {
            args,
            attempt: 1,
            max_attempts: J::RETRY.max_attempts(),
            ctx: JobContext::detached(J::KIND).with_queue(J::QUEUE),
            _job: PhantomData,
        }
    }

    /// The attempt number the handler sees (`ctx.attempt()`), from 1. It also picks the
    /// retry policy's delay and whether a retryable failure is the last one.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt.max(1);
        self
    }

    /// How many attempts the job has in all (`ctx.max_attempts()`), as an enqueue's
    /// `.max_attempts(n)` override would set it.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// The job id the handler sees (`ctx.id()`).
    pub fn id(mut self, id: JobId) -> Self {
        self.ctx = self.ctx.with_id(id);
        self
    }

    /// The queue the handler sees (`ctx.queue()`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.ctx = self.ctx.with_queue(queue);
        self
    }

    /// Application state the handler reads with `ctx.state::<T>()`, as the runtime's
    /// `RuntimeBuilder::state` would give it.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.ctx = self.ctx.with_state(value);
        self
    }

    /// Serializes the args as an enqueue would, then runs the attempt through
    /// [`jobq::run_attempt`] and classifies its end as the runtime would.
    pub async fn run(self) -> Outcome {
        // Exactly the checks and the serialization enqueue performs.
        let payload = match jobq::EnqueueBuilder::<J>::new(self.args).validate() {
            Ok(p) => p,
            Err(e) => {
                return Outcome::Rejected {
                    code: e.code(),
                    message: e.to_string(),
                };
            }
        };
        let ctx = self
            .ctx
            .with_attempt(self.attempt)
            .with_max_attempts(self.max_attempts);
        let outcome = jobq::run_attempt::<J>(ctx, payload).await;
        classify::<J>(outcome, self.attempt, self.max_attempts)
    }

    /// [`run`](Self::run), with the output the attempt recorded (a handler's `Ok(value)`
    /// of a `Serialize` type, or [`JobContext::record_output`]), as the runtime would
    /// store it in `jobs.output`.
    pub async fn run_with_output(self) -> (Outcome, Option<serde_json::Value>) {
        let ctx = self.ctx.clone();
        let outcome = self.run().await;
        (outcome, ctx.recorded_output())
    }
}

/// One inline attempt of job `J` on a stored payload of payload version `version`, as a
/// row written before a deploy would be claimed: an older version goes through the kind's
/// upgrades (`#[jobq::upgrade]`), one with no upgrade path fails with `unknown_version`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # use jobq::{Job, JobContext, JobError};
/// # struct Greet;
/// # impl Job for Greet {
/// #     const KIND: &'static str = "greet";
/// #     type Args = String;
/// #     type Error = JobError;
/// #     async fn run(_ctx: JobContext, _: String) -> Result<(), JobError> { Ok(()) }
/// # }
/// jobq_testing::perform_payload::<Greet>(1, serde_json::json!("world")).await.assert_done();
/// jobq_testing::perform_payload::<Greet>(7, serde_json::json!("world"))
///     .await
///     .assert_permanent("unknown_version");
/// # }
/// ```
pub async fn perform_payload<J: Job>(version: u32, payload: serde_json::Value) -> Outcome {
    let max_attempts = J::RETRY.max_attempts();
    let ctx = JobContext::detached(J::KIND)
        .with_queue(J::QUEUE)
        .with_attempt(1)
        .with_max_attempts(max_attempts);
    let version = i32::try_from(version).unwrap_or(i32::MAX);
    let outcome = jobq::run_attempt_versioned::<J>(ctx, version, payload).await;
    classify::<J>(outcome, 1, max_attempts)
}

/// What the runtime's completer would write for `outcome`, told as an [`Outcome`].
fn classify<J: Job>(outcome: AttemptOutcome, attempt: u32, max_attempts: u32) -> Outcome {
    match outcome {
        AttemptOutcome::Done => Outcome::Done,
        AttemptOutcome::Failed(failure) => classify_failure::<J>(failure, attempt, max_attempts),
        other => Outcome::Interrupted {
            reason: other.label().to_owned(),
        },
    }
}

fn classify_failure<J: Job>(failure: Failure, attempt: u32, max_attempts: u32) -> Outcome {
    let next = jobq::next_state(
        attempt,
        max_attempts,
        &failure.class,
        &J::RETRY,
        rand::random::<f64>(),
    );
    let Failure { class, message } = failure;
    let code = class.code.into_owned();
    match next {
        NextState::Retry { delay } => Outcome::Retry {
            code,
            message,
            delay,
        },
        NextState::Failed { exhausted } => Outcome::Failed {
            code,
            message,
            exhausted,
        },
        NextState::Cancelled => Outcome::Cancelled { code, message },
    }
}
