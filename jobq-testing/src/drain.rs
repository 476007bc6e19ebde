//! Database mode: run every due job on the current task, optionally moving the clock
//! forward until every job is terminal.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use jobq::{DrainReport, DrainedAttempt, Job, JobId, Runtime, RuntimeBuilder};
use sqlx::PgPool;

use crate::error::Error;

/// Runs the jobs in a database synchronously, on the current task, through
/// [`jobq::Runtime::drain`]: the runtime's own claim, execution path and fenced writes.
///
/// Without [`advance_clock`](Self::advance_clock) it runs every job due now (by the
/// database's clock), again and again, until none is due; a retry waits for its backoff,
/// so it stays `scheduled`. With it, the drain then moves its clock to the earliest
/// `run_after` still waiting (`pending` or `scheduled`), promotes what is due by it, and
/// goes on, until every job of the served kinds is terminal —
/// retries and scheduled jobs included, without sleeping. Times written by the drain
/// (`finished_at`, a retry's `run_after`) are on that clock.
///
/// ```no_run
/// # use jobq::{Job, JobContext, JobError};
/// # struct SendInvoice;
/// # impl Job for SendInvoice {
/// #     const KIND: &'static str = "send_invoice";
/// #     type Args = i64;
/// #     type Error = JobError;
/// #     async fn run(_: JobContext, _: i64) -> Result<(), JobError> { Ok(()) }
/// # }
/// # async fn t(pool: sqlx::PgPool) -> Result<(), jobq_testing::Error> {
/// SendInvoice::enqueue(&pool, 42).await?;
/// let drained = jobq_testing::Drain::new(&pool)
///     .register::<SendInvoice>()
///     .advance_clock(true)
///     .run()
///     .await?;
/// assert_eq!(drained.done(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a Drain does nothing until `.run().await`"]
pub struct Drain {
    pool: PgPool,
    registrations: Vec<fn(RuntimeBuilder) -> RuntimeBuilder>,
    states: Vec<Arc<dyn Fn(RuntimeBuilder) -> RuntimeBuilder + Send + Sync>>,
    auto_register: bool,
    queues: Option<BTreeSet<String>>,
    advance_clock: bool,
    start: Option<DateTime<Utc>>,
    max_rounds: u32,
}

/// Rounds a drain runs at most unless told otherwise.
pub const DEFAULT_MAX_ROUNDS: u32 = 1000;

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("registered", &self.registrations.len())
            .field("states", &self.states.len())
            .field("auto_register", &self.auto_register)
            .field("queues", &self.queues)
            .field("advance_clock", &self.advance_clock)
            .field("start", &self.start)
            .field("max_rounds", &self.max_rounds)
            .finish()
    }
}

impl Drain {
    /// A drain over `pool` serving every `#[jobq::job]` type linked into the test binary
    /// (add hand-written types with [`register`](Self::register)), all queues, the
    /// database's clock, no clock movement.
    pub fn new(pool: &PgPool) -> Self {
        Drain {
            pool: pool.clone(),
            registrations: Vec::new(),
            states: Vec::new(),
            auto_register: true,
            queues: None,
            advance_clock: false,
            start: None,
            max_rounds: DEFAULT_MAX_ROUNDS,
        }
    }

    /// Serves job type `J` too. Types implemented by hand are not registered otherwise.
    pub fn register<J: Job>(mut self) -> Self {
        self.registrations.push(|b| b.register::<J>());
        self
    }

    /// Hands `value` to every attempt, as `RuntimeBuilder::state` does in production;
    /// handlers read it with `ctx.state::<T>()`.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states
            .push(Arc::new(move |b: RuntimeBuilder| b.state(value.clone())));
        self
    }

    /// Whether to serve every `#[jobq::job]` type linked into the binary (default `true`).
    /// With `false`, only the types passed to [`register`](Self::register) run.
    pub fn auto_register(mut self, yes: bool) -> Self {
        self.auto_register = yes;
        self
    }

    /// Runs only jobs in `queue` (call again to add more). Default: every queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queues
            .get_or_insert_with(BTreeSet::new)
            .insert(queue.into());
        self
    }

    /// Whether to move the clock forward to the next waiting job's `run_after` whenever
    /// nothing is due, until every job is terminal (default `false`).
    pub fn advance_clock(mut self, yes: bool) -> Self {
        self.advance_clock = yes;
        self
    }

    /// Fixes the clock at `at` instead of following the database's `now()`: jobs due by
    /// `at` run (and, with [`advance_clock`](Self::advance_clock), the clock moves on from
    /// there).
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.start = Some(at);
        self
    }

    /// How many rounds (one [`jobq::Runtime::drain`] each) to run before giving up with
    /// [`Error::DrainLimit`] (default [`DEFAULT_MAX_ROUNDS`]). A job that enqueues a new
    /// job of its own kind every time would otherwise never let an advancing drain end.
    pub fn max_rounds(mut self, rounds: u32) -> Self {
        self.max_rounds = rounds.max(1);
        self
    }

    fn runtime(&self, queues: &[String]) -> Result<Runtime, Error> {
        let mut b = Runtime::builder(self.pool.clone())
            .auto_register(self.auto_register)
            .listen(false)
            .reaper(None)
            .worker_id("jobq-testing");
        for q in queues {
            b = b.queue(q.clone(), 1);
        }
        for add in &self.registrations {
            b = add(b);
        }
        for add in &self.states {
            b = add(b);
        }
        Ok(b.build()?)
    }

    /// Runs the drain.
    ///
    /// # Errors
    ///
    /// [`Error::Jobq`] when no job type is registered (or two claim one kind) or a write
    /// fails, [`Error::Database`] on a database error, [`Error::DrainLimit`] when jobs are
    /// still pending after [`max_rounds`](Self::max_rounds).
    pub async fn run(self) -> Result<Drained, Error> {
        let kinds: Vec<String> = self.runtime(&[])?.kinds().map(str::to_owned).collect();
        let mut clock = match self.start {
            Some(t) => t,
            None => jobq::__testing::clock_now(&self.pool).await?,
        };
        let mut drained = Drained {
            report: DrainReport::default(),
            rounds: 0,
            clock,
        };
        loop {
            if self.start.is_none() && drained.rounds > 0 {
                // Jobs the handlers enqueued are due by the database's clock, which may
                // have passed ours.
                clock = clock.max(jobq::__testing::clock_now(&self.pool).await?);
            }
            let mut pending = jobq::__testing::job_pending_queues(&self.pool, &kinds).await?;
            if let Some(only) = &self.queues {
                pending.retain(|p| only.contains(&p.queue));
            }
            let Some(earliest) = pending.iter().map(|p| p.earliest).min() else {
                break;
            };
            if earliest > clock {
                if !self.advance_clock {
                    break;
                }
                clock = earliest;
            }
            let queues: Vec<String> = pending.into_iter().map(|p| p.queue).collect();
            if drained.rounds >= self.max_rounds {
                let sample =
                    jobq::__testing::job_pending_sample(&self.pool, &kinds, &queues, 5).await?;
                let pending = sample
                    .iter()
                    .map(|(id, kind)| format!("#{id} {kind}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(Error::DrainLimit {
                    rounds: drained.rounds,
                    pending,
                });
            }
            drained.rounds += 1;
            let report = self.runtime(&queues)?.drain(Some(clock)).await?;
            let ran = report.attempts.len();
            drained.report.attempts.extend(report.attempts);
            drained.clock = clock;
            if ran == 0 {
                // Due jobs exist but none could be claimed (locked by another
                // transaction): stop rather than spin.
                break;
            }
        }
        Ok(drained)
    }
}

/// What a [`Drain`] did: every attempt it ran, in order, across its rounds. Derefs to
/// [`jobq::DrainReport`] for the counts (`done()`, `retried()`, `failed()`,
/// `cancelled()`) and the `attempts`.
#[derive(Debug, Clone)]
pub struct Drained {
    /// Every attempt, in the order they ran.
    pub report: DrainReport,
    /// Rounds run (each one [`jobq::Runtime::drain`] at one clock value).
    pub rounds: u32,
    /// The clock at the last round.
    pub clock: DateTime<Utc>,
}

impl std::ops::Deref for Drained {
    type Target = DrainReport;
    fn deref(&self) -> &DrainReport {
        &self.report
    }
}

impl Drained {
    /// Whether no attempt ran.
    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }

    /// The jobs that ran, each once, in the order they first ran.
    pub fn jobs(&self) -> Vec<JobId> {
        let mut seen = BTreeSet::new();
        self.attempts
            .iter()
            .filter(|a| seen.insert(a.id))
            .map(|a| a.id)
            .collect()
    }

    /// The attempts of job `id`, in order.
    pub fn attempts_of(&self, id: JobId) -> Vec<&DrainedAttempt> {
        self.attempts.iter().filter(|a| a.id == id).collect()
    }

    /// The state each job ran was left in by its last attempt (`None` when that write did
    /// not apply), in the order the jobs first ran.
    pub fn final_states(&self) -> Vec<(JobId, Option<&str>)> {
        self.jobs()
            .into_iter()
            .map(|id| {
                let state = self
                    .attempts
                    .iter()
                    .rev()
                    .find(|a| a.id == id)
                    .and_then(|a| a.state.as_deref());
                (id, state)
            })
            .collect()
    }
}
