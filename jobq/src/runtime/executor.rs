//! One attempt: decode, run the handler under its timeout, catch its panic, classify the
//! result. The same function serves the runtime, `Runtime::drain` and `jobq-testing`, so a
//! test runs exactly the path production runs.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use crate::context::JobContext;
use crate::error::Classification;
use crate::job::Job;
use crate::registry::{Failure, JobHandler};
use crate::retry::RetryPolicy;

use super::lease::Signals;

/// How one attempt ended, as the executor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The handler returned `Ok`.
    Done,
    /// The handler failed: its own error classified, or a built-in failure (`panic`,
    /// `timeout` and `decode`).
    Failed(Failure),
    /// The attempt lost its lease (the heartbeat found the job taken, or could not renew
    /// it in time); its future was dropped and nothing is written for it.
    LeaseLost,
    /// The runtime shut down before the attempt finished; its future was dropped and the
    /// job is handed back.
    Interrupted,
}

impl AttemptOutcome {
    /// A short word for tracing and metrics: `done`, `retryable`, `permanent`, `cancel`,
    /// `lease_lost`, `interrupted`.
    pub fn label(&self) -> &'static str {
        match self {
            AttemptOutcome::Done => "done",
            AttemptOutcome::Failed(f) => f.class.disposition.as_str(),
            AttemptOutcome::LeaseLost => "lease_lost",
            AttemptOutcome::Interrupted => "interrupted",
        }
    }
}

impl Failure {
    /// The wait before the next attempt after failed attempt `attempt`: the error's
    /// Retry-After if it carries one, else the policy's backoff.
    pub fn retry_delay(&self, policy: &RetryPolicy, attempt: u32) -> Duration {
        self.class
            .retry_after
            .unwrap_or_else(|| policy.next_delay(attempt))
    }
}

/// Runs one attempt of `handler` on `payload` (its version and JSON): decode, timeout, panic catching,
/// classification. `interrupt` resolving first drops the handler's future and yields
/// `interrupt`'s outcome.
pub(crate) async fn execute<I>(
    handler: &JobHandler,
    ctx: JobContext,
    (version, payload): (i32, String),
    interrupt: I,
) -> AttemptOutcome
where
    I: Future<Output = AttemptOutcome>,
{
    // Cancelled however the attempt ends, so work the handler spawned with the context's
    // token stops with it, before the job can run again.
    let _cancel_on_exit = ctx.cancel_on_drop();
    let run = AssertUnwindSafe(handler.call(ctx, version, payload)).catch_unwind();
    let timed = async {
        match handler.timeout() {
            Some(limit) => tokio::time::timeout(limit, run).await.ok(),
            None => Some(run.await),
        }
    };
    tokio::select! {
        biased;
        outcome = interrupt => outcome,
        result = timed => match result {
            Some(Ok(Ok(()))) => AttemptOutcome::Done,
            Some(Ok(Err(failure))) => AttemptOutcome::Failed(failure),
            Some(Err(panic)) => AttemptOutcome::Failed(Failure {
                class: Classification::retryable("panic"),
                message: format!("handler panicked: {}", panic_message(&*panic)),
            }),
            None => AttemptOutcome::Failed(Failure {
                class: Classification::retryable("timeout"),
                message: format!(
                    "attempt exceeded its timeout of {:?} and was cancelled",
                    handler.timeout().unwrap_or_default()
                ),
            }),
        },
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Runs one attempt of job type `J` outside the runtime, on the current task, through the
/// runtime's own execution path: the payload is decoded as `J::Args`, the handler runs
/// under `J::TIMEOUT`, a panic is caught and classified (`panic`), a timeout too
/// (`timeout`), a payload that does not decode is a permanent `decode` failure.
///
/// `jobq-testing` builds on this; most users want that crate instead.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use jobq::{AttemptOutcome, Job, JobContext, JobError};
///
/// struct Hello;
/// impl Job for Hello {
///     const KIND: &'static str = "hello";
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
/// let ctx = JobContext::detached(Hello::KIND);
/// let outcome = jobq::run_attempt::<Hello>(ctx, serde_json::json!("world")).await;
/// assert_eq!(outcome, AttemptOutcome::Done);
/// # }
/// ```
pub async fn run_attempt<J: Job>(ctx: JobContext, payload: serde_json::Value) -> AttemptOutcome {
    let version = i32::try_from(J::VERSION).unwrap_or(i32::MAX);
    run_attempt_versioned::<J>(ctx, version, payload).await
}

/// As [`run_attempt`], for a payload stored with payload version `version`: an older
/// version is decoded through the kind's upgrades ([`Job::decode`]), one with no upgrade
/// path fails permanently with code `unknown_version`.
pub async fn run_attempt_versioned<J: Job>(
    ctx: JobContext,
    version: i32,
    payload: serde_json::Value,
) -> AttemptOutcome {
    let handler = JobHandler::of::<J>();
    let recorder = ctx.clone();
    let outcome = execute(
        &handler,
        ctx,
        (version, payload.to_string()),
        std::future::pending(),
    )
    .await;
    recorded(&recorder, outcome).0
}

/// Everything one attempt in the running runtime needs besides its job.
pub(crate) struct AttemptEnv {
    pub(crate) config: std::sync::Arc<super::Config>,
    pub(crate) running: super::lease::RunningSet,
    pub(crate) completer: super::completer::Completer,
    /// The queue's handler slots; a job claimed ahead waits here for one.
    pub(crate) slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// The job's place in the line for those slots.
    pub(crate) turn: SlotTurn,
    /// Handlers of the queue that have returned so far (the producer's measure of how
    /// fast slots free).
    pub(crate) finished: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Fired when the runtime stops claiming: a job still waiting for a slot is handed
    /// back instead of run.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
}

/// A job's place in its queue's line for handler slots. Jobs take slots in the order
/// they were claimed: their tasks are polled in any order, and a job claimed ahead must
/// not be overtaken by one claimed after it (which could hold the slot for long).
#[derive(Debug)]
pub(crate) struct SlotTurn {
    /// Closes when the job claimed before this one has its slot or gave up waiting.
    after: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Dropped when this job has its slot or gives up, letting the next one go.
    done: tokio::sync::oneshot::Sender<()>,
}

impl SlotTurn {
    /// The next place in the line whose last place `last` is (`None`: empty); `last`
    /// becomes this one.
    pub(crate) fn next(last: &mut Option<tokio::sync::oneshot::Receiver<()>>) -> SlotTurn {
        let (done, closed) = tokio::sync::oneshot::channel();
        SlotTurn {
            after: last.replace(closed),
            done,
        }
    }
}

/// Runs one claimed job inside the runtime: registers it for heartbeats, waits for a
/// handler slot if it was claimed ahead of one, runs it under a `jobq.job` span with its
/// lease watchdog and the shutdown interrupt, and hands its outcome to the completer,
/// which settles the attempt once the outcome is committed.
///
/// `held` is the job's place among those its producer holds, and the slot its share of
/// the queue's concurrency. Both are given back when the handler returns, not when the
/// outcome commits, so the next job starts while this one's completion waits for its
/// batch (concurrency counts handlers running, as in River and Sidekiq), and the attempt
/// ends there. The completer's backlog bounds how far that can run ahead of committing:
/// past it, the attempt holds both until its outcome is written.
pub(crate) async fn run_claimed(
    env: AttemptEnv,
    mut job: crate::store::ClaimedJob,
    claim_sent: tokio::time::Instant,
    held: tokio::sync::OwnedSemaphorePermit,
) {
    use tracing::Instrument;

    let mut held = Some(held);
    let mut slot = None;
    let span = attempt_span(&job);
    async {
        let Some(handler) = env.config.registry.get(&job.kind).cloned() else {
            // Claims name only served kinds, so this cannot happen; fail loudly anyway.
            let write = super::completer::Write::Fail {
                id: job.id,
                fence: job.fence,
                disposition: crate::error::Disposition::Permanent,
                code: "unknown_kind".to_owned(),
                message: format!("no handler for kind `{}` in this worker", job.kind),
                retry_in: None,
            };
            drop(held.take());
            env.completer
                .write(write, settle(job, claim_sent, false))
                .await;
            return;
        };
        crate::metrics::claimed(&job.kind, &job.queue, job.wait_secs);
        let lease = handler.lease();
        let deadline = std::sync::Arc::new(crate::context::Deadline::new(claim_sent + lease));
        let cancel = tokio_util::sync::CancellationToken::new();
        let signals = std::sync::Arc::new(Signals::default());
        env.running.insert(
            job.id,
            super::lease::Running {
                fence: job.fence,
                lease,
                deadline: deadline.clone(),
                cancel: cancel.clone(),
                signals: signals.clone(),
            },
        );
        let ctx = attempt_context(&env.config, &job, lease, cancel.clone(), deadline.clone());
        let stop = async {
            tokio::select! {
                _ = super::lease::watchdog(&deadline, &signals) => AttemptOutcome::LeaseLost,
                _ = signals.raised(Signals::INTERRUPT) => AttemptOutcome::Interrupted,
            }
        };
        let payload = std::mem::take(&mut job.payload);
        tokio::pin!(stop);
        let SlotTurn { after, done } = env.turn;
        let in_turn = async {
            if let Some(after) = after {
                // An error is the earlier job's sender dropped: exactly the signal.
                let _ = after.await;
            }
            env.slots.clone().acquire_owned().await
        };
        let waited = env.running.wait_for_slot(async {
            tokio::select! {
                biased;
                outcome = &mut stop => Err(outcome),
                _ = env.stopping.cancelled() => Err(AttemptOutcome::Interrupted),
                // An operator cancelled it before it started: handing it back makes it
                // `cancelled` (the hand-back honours the request) without running it.
                _ = cancel.cancelled() => Err(AttemptOutcome::Interrupted),
                s = in_turn => s.map_err(|_| AttemptOutcome::Interrupted),
            }
        });
        let waited = waited.await;
        drop(done);
        let (outcome, output) = match waited {
            Ok(s) => {
                slot = Some(s);
                let version = job.payload_version;
                let recorder = ctx.clone();
                let outcome = execute(&handler, ctx, (version, payload), stop).await;
                env.finished
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                recorded(&recorder, outcome)
            }
            // Claimed ahead and never started: a shutdown or a cancel request hands it
            // back at once, as an interrupted attempt (the attempt does not count).
            Err(outcome) => (outcome, None),
        };
        tracing::Span::current().record("job.outcome", outcome.label());
        let Some(write) = outcome_write(&handler, &job, &outcome, output) else {
            env.running.remove(job.id, job.fence);
            return;
        };
        // Handed back by the shutdown (an operator's cancel of a job waiting for its slot
        // is handed back too, but is not the shutdown's doing): counted in the shutdown's
        // report, so the attempt waits until it is.
        let interrupted = matches!(write, super::completer::Write::HandBack { .. })
            && env.stopping.is_cancelled();
        signals.raise(Signals::SETTLED);
        let settle = settle(job, claim_sent, interrupted);
        if env.completer.has_room() && !interrupted {
            drop(slot.take());
            drop(held.take());
            env.completer.send(write, settle);
        } else {
            env.completer.write(write, settle).await;
        }
    }
    .instrument(span)
    .await;
}

/// What the completer does for an attempt of `job` once its outcome is written.
fn settle(
    job: crate::store::ClaimedJob,
    claimed: tokio::time::Instant,
    interrupted: bool,
) -> super::completer::Settle {
    super::completer::Settle {
        kind: job.kind,
        queue: job.queue,
        claimed,
        interrupted,
    }
}

/// The `jobq.job` span of one attempt; `job.outcome` is recorded when it ends. Never
/// carries the payload. With the `otel` feature it continues the trace the job was
/// enqueued in, as a consumer span (OpenTelemetry's messaging conventions: the enqueuing
/// span is the parent of every attempt, retries included).
pub(crate) fn attempt_span(job: &crate::store::ClaimedJob) -> tracing::Span {
    let span = tracing::info_span!(
        "jobq.job",
        otel.name = %format_args!("process {}", job.kind),
        otel.kind = "consumer",
        messaging.system = "jobq",
        messaging.operation.type = "process",
        messaging.destination.name = %job.queue,
        messaging.message.id = job.id,
        job.id = job.id,
        job.kind = %job.kind,
        job.queue = %job.queue,
        job.attempt = job.attempt,
        job.outcome = tracing::field::Empty,
    );
    crate::trace::continue_in(&span, job.trace_context.as_deref());
    span
}

/// The context of one claimed attempt, whose kind's lease is `lease`.
pub(crate) fn attempt_context(
    config: &super::Config,
    job: &crate::store::ClaimedJob,
    lease: Duration,
    cancel: tokio_util::sync::CancellationToken,
    deadline: std::sync::Arc<crate::context::Deadline>,
) -> JobContext {
    JobContext::from_parts(crate::context::ContextParts {
        id: crate::JobId(job.id),
        kind: job.kind.clone(),
        queue: job.queue.clone(),
        attempt: u32::try_from(job.attempt).unwrap_or(0),
        fence: job.fence,
        max_attempts: u32::try_from(job.max_attempts).unwrap_or(0),
        created_at: Some(job.created_at),
        cancel,
        lease: Some(crate::context::AttemptLease {
            pool: config.pool.clone(),
            own: config.own.clone(),
            lease,
            deadline,
        }),
        state: config.state.clone(),
    })
}

/// The outcome with the attempt's recorded output (left readable on `ctx`): a successful attempt whose returned
/// value could not be recorded (too large, not JSON) fails permanently with the reason.
pub(crate) fn recorded(
    ctx: &JobContext,
    outcome: AttemptOutcome,
) -> (AttemptOutcome, Option<String>) {
    match (outcome, ctx.output_text()) {
        (AttemptOutcome::Done, Some(Ok(text))) => (AttemptOutcome::Done, Some(text)),
        (AttemptOutcome::Done, Some(Err((code, message)))) => (
            AttemptOutcome::Failed(Failure {
                class: Classification::permanent(code),
                message,
            }),
            None,
        ),
        (outcome, _) => (outcome, None),
    }
}

/// The write an outcome calls for; `None` for a lost lease (the job is not ours).
pub(crate) fn outcome_write(
    handler: &JobHandler,
    job: &crate::store::ClaimedJob,
    outcome: &AttemptOutcome,
    output: Option<String>,
) -> Option<super::completer::Write> {
    use super::completer::Write;
    let (id, fence) = (job.id, job.fence);
    match outcome {
        AttemptOutcome::Done => Some(Write::Complete { id, fence, output }),
        AttemptOutcome::Failed(f) => {
            let attempt = u32::try_from(job.attempt).unwrap_or(1);
            let max_attempts = u32::try_from(job.max_attempts).unwrap_or(1);
            let next = crate::retry::next_state(
                attempt,
                max_attempts,
                &f.class,
                &handler.retry(),
                rand::random::<f64>(),
            );
            let retry_in = match next {
                crate::retry::NextState::Retry { delay } => {
                    tracing::info!(code = %f.class.code, error = %f.message, "attempt failed (retryable)");
                    Some(delay)
                }
                _ => {
                    tracing::warn!(code = %f.class.code, error = %f.message, "attempt failed ({})", f.class.disposition.as_str());
                    None
                }
            };
            Some(Write::Fail {
                id,
                fence,
                disposition: f.class.disposition,
                code: f.class.code.to_string(),
                message: f.message.clone(),
                retry_in,
            })
        }
        AttemptOutcome::LeaseLost => None,
        AttemptOutcome::Interrupted => Some(Write::HandBack { id, fence }),
    }
}
