//! The [`Job`] trait, job ids, and enqueueing (one job, a builder with options, a batch).
//!
//! Enqueue takes a [`Conn`]: `&mut tx` (the job exists exactly when `tx` commits),
//! `&pool`, or `&mut PgConnection`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tracing::Instrument;

use crate::context::JobContext;
use crate::error::{Classify, Error};
use crate::notify::WAKE_UPS;
use crate::retry::RetryPolicy;
use crate::store;

pub use crate::limits::{
    MAX_IDEMPOTENCY_KEY_LEN, MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_QUEUE_LEN, MIN_LEASE,
};
pub use crate::options::{DecodeError, Replace, Unique, UniqueState, Upgrade, decode_as};
pub use crate::rows::Enqueued;

/// A job type: its kind, arguments, error, policies and handler.
///
/// `#[jobq::job]` writes this impl for you; implementing it by hand is the same contract.
///
/// ```
/// use jobq::{Job, JobContext, JobError, RetryPolicy};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Args { invoice_id: i64 }
///
/// struct SendInvoice;
///
/// impl Job for SendInvoice {
///     const KIND: &'static str = "send_invoice";
///     const RETRY: RetryPolicy = RetryPolicy::exponential(10).jitter(true);
///     type Args = Args;
///     type Error = JobError;
///
///     fn idempotency_key(args: &Args) -> Option<String> {
///         Some(args.invoice_id.to_string())
///     }
///
///     async fn run(_ctx: JobContext, args: Args) -> Result<(), JobError> {
///         if args.invoice_id < 0 {
///             return Err(JobError::permanent("invoice_missing", "no such invoice"));
///         }
///         Ok(())
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a jobq job",
    label = "this type does not implement `jobq::Job`",
    note = "annotate an async fn with `#[jobq::job(kind = \"...\")]`, or implement `jobq::Job` by hand"
)]
pub trait Job: Send + Sync + 'static {
    /// The stable name stored in `jobs.kind`; renaming it orphans queued jobs.
    const KIND: &'static str;
    /// The queue jobs of this kind go to unless an enqueue overrides it.
    const QUEUE: &'static str = "default";
    /// Priority; smaller runs first (0 is the default, negative is more urgent).
    const PRIORITY: i16 = 0;
    /// The retry policy: attempts and backoff.
    const RETRY: RetryPolicy =
        RetryPolicy::exponential(crate::retry::DEFAULT_MAX_ATTEMPTS).jitter(true);
    /// How long one claim holds the job before another worker may rescue it. The runtime
    /// extends it by heartbeats while the handler runs; keep it well above the time a
    /// heartbeat can be delayed (a GC pause, a slow database), not above the run time.
    const LEASE: Duration = Duration::from_secs(60);
    /// The longest one attempt may run; past it the attempt is cancelled and recorded as
    /// a retryable `timeout` failure. `None` means no limit.
    const TIMEOUT: Option<Duration> = None;
    /// The payload version new jobs are stored with (`#[job(version = N)]`); rows of older
    /// versions are decoded through [`Job::decode`]'s upgrades.
    const VERSION: u32 = 1;
    /// A job not done within this time of its creation is not run or retried again: it
    /// fails with code `expired`. `None` means no limit.
    const MAX_AGE: Option<Duration> = None;
    /// The kind's uniqueness rule (`#[job(unique(...))]`), if any.
    const UNIQUE: Option<Unique> = None;
    /// Debounce (`#[job(debounce = "30s")]`): each enqueue replaces the pending job's args
    /// and pushes its `run_after` to now plus this; implies a uniqueness rule over pending
    /// jobs (by the `unique(by = …)` fields, or one pending job per kind).
    const DEBOUNCE: Option<Duration> = None;
    /// The kind's cluster-wide concurrency and rate limits (`#[job(concurrency = 5)]`,
    /// `rate = "100/s"`); an operator's `jobq limit set` overrides them at run time.
    const LIMITS: crate::KindLimits = crate::KindLimits::NONE;

    /// The arguments, stored as JSON in `jobs.payload`.
    type Args: Serialize + DeserializeOwned + Send + 'static;
    /// The handler's error, classified retryable or permanent.
    type Error: Classify + fmt::Display + Send + 'static;

    /// The idempotency key for `args`, if jobs of this kind are deduplicated: a second
    /// enqueue with the same key inserts nothing and returns the first job's id.
    fn idempotency_key(args: &Self::Args) -> Option<String> {
        let _ = args;
        None
    }

    /// The ordering scope: jobs of every kind with the same scope and ordering key run
    /// one at a time, in enqueue order (`#[job(ordering_scope = "billing")]`); `None`
    /// scopes the key by this kind.
    const ORDERING_SCOPE: Option<&'static str> = None;

    /// The ordering key of a job with these args (`#[job(ordering = account_id)]`):
    /// jobs with the same key (in the same scope) run one at a time, in enqueue order.
    /// `None` (the default): the job is not ordered.
    fn ordering_key(args: &Self::Args) -> Option<String> {
        let _ = args;
        None
    }

    /// The concurrency key of `args` (`concurrency_key = field`): with a per-key
    /// concurrency limit, at most that many jobs of one key run at once.
    fn concurrency_key(args: &Self::Args) -> Option<String> {
        let _ = args;
        None
    }

    /// The rate key of `args` (`rate_key = field`): with a per-key rate limit, each key
    /// has a token bucket of its own.
    fn rate_key(args: &Self::Args) -> Option<String> {
        let _ = args;
        None
    }

    /// The uniqueness key of `args` (the `unique(by = …)` fields); `None` means the whole
    /// args, when the kind has a uniqueness rule.
    fn unique_key(args: &Self::Args) -> Option<serde_json::Value> {
        let _ = args;
        None
    }

    /// Decodes a stored payload of `version`: the current version directly, older ones
    /// through the kind's [`Upgrade`] chain (`#[job(version = N)]` writes this).
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] with code `decode` or `unknown_version`.
    fn decode(version: u32, payload: &str) -> Result<Self::Args, DecodeError> {
        if version == Self::VERSION {
            decode_as(Self::KIND, version, payload)
        } else {
            Err(DecodeError::unknown_version(
                Self::KIND,
                version,
                Self::VERSION,
            ))
        }
    }

    /// The kind's own periodic schedule and its args (`#[job(cron = …)]`, `every = …`);
    /// the runtime registers it under the kind's name.
    fn periodic() -> Option<(crate::maintenance::Schedule, Self::Args)> {
        None
    }

    /// Runs one attempt.
    fn run(
        ctx: JobContext,
        args: Self::Args,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Enqueues one job through `conn` (`&mut tx`, `&pool` or `&mut PgConnection`).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when the job is rejected before reaching the database (payload
    /// over [`MAX_PAYLOAD_BYTES`], a bad kind or queue name), [`Error::Serialize`] when the
    /// args do not serialize, [`Error::Database`] when the insert fails.
    fn enqueue<'c>(
        conn: impl Into<Conn<'c>>,
        args: Self::Args,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send
    where
        Self: Sized,
    {
        Self::with(args).enqueue(conn)
    }

    /// Starts an enqueue with options: `J::with(args).run_after(t).priority(p).enqueue(conn)`.
    fn with(args: Self::Args) -> EnqueueBuilder<Self>
    where
        Self: Sized,
    {
        EnqueueBuilder::new(args)
    }

    /// Enqueues many jobs in one round trip. Returns one [`Enqueued`] per input, in order.
    ///
    /// # Errors
    ///
    /// As [`Job::enqueue`]; nothing is inserted if any job is rejected.
    fn enqueue_many<'c, I>(
        conn: impl Into<Conn<'c>>,
        args: I,
    ) -> impl Future<Output = Result<Vec<Enqueued>, Error>> + Send
    where
        I: IntoIterator<Item = Self::Args>,
        Self: Sized,
    {
        Self::enqueue_many_with(conn, args.into_iter().map(EnqueueBuilder::<Self>::new))
    }

    /// Enqueues many jobs with options in one round trip:
    /// `J::enqueue_many_with(conn, items.map(|a| J::with(a).run_in(d)))`. Returns one
    /// [`Enqueued`] per input, in order, duplicates reported per item.
    ///
    /// # Errors
    ///
    /// As [`Job::enqueue`]; nothing is inserted if any job is rejected.
    fn enqueue_many_with<'c, I>(
        conn: impl Into<Conn<'c>>,
        builders: I,
    ) -> impl Future<Output = Result<Vec<Enqueued>, Error>> + Send
    where
        I: IntoIterator<Item = EnqueueBuilder<Self>>,
        Self: Sized,
    {
        let mut events = Vec::new();
        let mut prepared: Result<Vec<store::NewJob>, Error> = builders
            .into_iter()
            .map(|mut b| {
                events.extend(b.take_events()?);
                b.into_new_job()
            })
            .collect();
        let span = match &mut prepared {
            Ok(jobs) => crate::trace::enqueue_span(Self::KIND, jobs),
            Err(_) => tracing::Span::none(),
        };
        let conn = conn.into();
        async move { insert(conn, &prepared?, true, &events).await }.instrument(span)
    }
}

pub use crate::ids::JobId;

/// An enqueue with options, from [`Job::with`].
#[must_use = "an EnqueueBuilder does nothing until `.enqueue(conn)` is awaited"]
pub struct EnqueueBuilder<J: Job> {
    args: J::Args,
    run_after: Option<DateTime<Utc>>,
    delay: Option<Duration>,
    priority: i16,
    queue: Option<String>,
    max_attempts: Option<u32>,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    wake: bool,
    unique: Option<Unique>,
    on_conflict: Option<Replace>,
    max_age: Option<Duration>,
    deadline: Option<DateTime<Utc>>,
    concurrency_key: Option<String>,
    rate_key: Option<String>,
    events: Vec<crate::outbox::Event>,
    _job: PhantomData<fn() -> J>,
}

impl<J: Job> fmt::Debug for EnqueueBuilder<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The args are deliberately not printed: payloads stay out of logs.
        f.debug_struct("EnqueueBuilder")
            .field("kind", &J::KIND)
            .field("run_after", &self.run_after)
            .field("delay", &self.delay)
            .field("priority", &self.priority)
            .field("queue", &self.queue)
            .field("max_attempts", &self.max_attempts)
            .field("wake", &self.wake)
            .field("unique", &self.unique)
            .field("on_conflict", &self.on_conflict)
            .field("max_age", &self.max_age)
            .field("deadline", &self.deadline)
            .field("ordering_key", &self.ordering_key)
            .field("concurrency_key", &self.concurrency_key)
            .field("rate_key", &self.rate_key)
            .field(
                "events",
                &self
                    .events
                    .iter()
                    .map(|e| e.event_type())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<J: Job> EnqueueBuilder<J> {
    /// Same as [`Job::with`].
    pub fn new(args: J::Args) -> Self {
        EnqueueBuilder {
            args,
            run_after: None,
            delay: None,
            priority: J::PRIORITY,
            queue: None,
            max_attempts: None,
            idempotency_key: None,
            ordering_key: None,
            wake: true,
            unique: J::UNIQUE,
            on_conflict: None,
            max_age: J::MAX_AGE,
            deadline: None,
            concurrency_key: None,
            rate_key: None,
            events: Vec::new(),
            _job: PhantomData,
        }
    }

    /// Do not run before `at` (a time in the past runs as soon as possible).
    pub fn run_after(mut self, at: DateTime<Utc>) -> Self {
        self.run_after = Some(at);
        self.delay = None;
        self
    }

    /// Do not run before `delay` from now, measured by the database's clock.
    pub fn run_in(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_after = None;
        self
    }

    /// Overrides the kind's priority (smaller runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Overrides the kind's queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Overrides the retry policy's number of attempts (at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Overrides the idempotency key the kind derives from its args.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the ordering key, overriding the one `#[job(ordering = …)]` derives from the
    /// args: jobs with the same key in the kind's ordering scope run one at a time, in
    /// enqueue (id) order, on every node; a retry keeps its place, and a job that ends
    /// `failed` parks the jobs behind it until an operator replays or cancels it or runs
    /// `jobq unpark`. Must be enqueued in a READ COMMITTED transaction (the default).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Overrides the concurrency key the kind derives from its args (`concurrency_key =
    /// field`): with a per-key concurrency limit, at most that many jobs of one key run
    /// at once across all nodes.
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Overrides the rate key the kind derives from its args (`rate_key = field`): with
    /// a per-key rate limit, each key has a token bucket of its own.
    pub fn rate_key(mut self, key: impl Into<String>) -> Self {
        self.rate_key = Some(key.into());
        self
    }

    /// Whether to wake the workers of the job's queue once it commits (default `true`).
    /// Without a wake-up the job is found by the next poll (`poll_interval`, one second
    /// by default) or at once by a producer that is busy claiming anyway. Worth turning
    /// off for bulk loads a busy runtime drains regardless, and for enqueues inside
    /// transactions at high rates from many connections: PostgreSQL commits notifying
    /// transactions one at a time (see README, "Wake-ups").
    pub fn wake(mut self, wake: bool) -> Self {
        self.wake = wake;
        self
    }

    /// A uniqueness rule for this enqueue (overrides the kind's): see [`Unique`].
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// What a duplicate of a pending job replaces in it (see [`Replace`]). Without a
    /// uniqueness rule of its own, the kind's is used, or the default [`Unique::new`].
    pub fn on_conflict(mut self, replace: Replace) -> Self {
        self.on_conflict = Some(replace);
        self
    }

    /// Not done within `max_age` of its creation, the job fails with code `expired`
    /// (overrides the kind's `max_age`).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }

    /// Not done by `deadline`, the job fails with code `expired` (with a `max_age`, the
    /// earlier of the two applies).
    pub fn deadline(mut self, deadline: DateTime<Utc>) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Writes `event` to the outbox (see [`crate::outbox`]) with the job: both exist
    /// exactly when the enqueue's transaction commits, whether or not the job was a
    /// duplicate. One event rides the job's own insert statement, so it costs no round
    /// trip (jobs with an ordering key or uniqueness/time options, and more than one
    /// event, take a statement per part inside a savepoint). Call it again for more
    /// events; they are written in order.
    ///
    /// ```no_run
    /// # #[jobq::job(kind = "send_invoice")]
    /// # async fn send_invoice(_: u64) -> Result<(), jobq::JobError> { Ok(()) }
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
    /// use jobq::Job;
    /// use jobq::outbox::Event;
    ///
    /// let mut tx = pool.begin().await?;
    /// SendInvoice::with(42)
    ///     .publish(Event::new("invoice_due", &42).aggregate("invoice", 42, 1))
    ///     .enqueue(&mut tx)
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn publish(mut self, event: impl crate::outbox::IntoEvent) -> Self {
        self.events.push(event.into_event());
        self
    }

    /// Inserts the job through `conn`, with the events of [`publish`](Self::publish).
    ///
    /// # Errors
    ///
    /// As [`Job::enqueue`]; for the events, as [`crate::outbox::publish`].
    pub fn enqueue<'c>(
        mut self,
        conn: impl Into<Conn<'c>>,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send {
        let wake = self.wake;
        let events = self.take_events();
        let mut prepared = self.into_new_job();
        let span = match &mut prepared {
            Ok(job) => crate::trace::enqueue_span(J::KIND, std::slice::from_mut(job)),
            Err(_) => tracing::Span::none(),
        };
        let conn = conn.into();
        async move {
            let job = prepared?;
            let events = events?;
            let mut done = insert(conn, std::slice::from_ref(&job), wake, &events).await?;
            Ok(done.remove(0))
        }
        .instrument(span)
    }

    /// Serializes and checks the job as enqueue would, without touching the database:
    /// returns the payload as it would be stored.
    ///
    /// # Errors
    ///
    /// As [`Job::enqueue`], for everything checked before the database.
    pub fn validate(&self) -> Result<serde_json::Value, Error> {
        let job = self.to_new_job()?;
        serde_json::from_str(&job.payload).map_err(|source| Error::Serialize {
            kind: J::KIND.to_owned(),
            source,
        })
    }

    /// The events of [`publish`](Self::publish), validated, leaving none behind.
    fn take_events(&mut self) -> Result<Vec<store::NewEvent>, Error> {
        std::mem::take(&mut self.events)
            .into_iter()
            .map(crate::outbox::Event::validate)
            .collect()
    }

    /// Validates and serializes, without touching the database.
    pub(crate) fn into_new_job(self) -> Result<store::NewJob, Error> {
        self.to_new_job()
    }

    fn to_new_job(&self) -> Result<store::NewJob, Error> {
        let payload = serde_json::to_string(&self.args).map_err(|source| Error::Serialize {
            kind: J::KIND.to_owned(),
            source,
        })?;
        let idempotency_key = match &self.idempotency_key {
            Some(key) => Some(key.clone()),
            None => J::idempotency_key(&self.args),
        };
        let max_attempts = self.max_attempts.unwrap_or_else(|| J::RETRY.max_attempts());
        let (delay, on_conflict, unique) = self.debounced();
        let job = store::NewJob {
            kind: J::KIND.to_owned(),
            queue: self.queue.clone().unwrap_or_else(|| J::QUEUE.to_owned()),
            payload,
            priority: self.priority,
            max_attempts: i32::try_from(max_attempts).map_err(|_| {
                Error::invalid(
                    "invalid_max_attempts",
                    format!(
                        "max_attempts must be at most {}, got {max_attempts}",
                        i32::MAX
                    ),
                )
            })?,
            run_after: self.run_after,
            delay_secs: delay.map(|d| d.as_secs_f64()),
            idempotency_key,
            time: self.time_opts(on_conflict, unique.as_ref())?,
            trace_context: None,
            ordering: self
                .ordering_key
                .clone()
                .or_else(|| J::ordering_key(&self.args))
                .map(|key| store::NewOrdering {
                    scope: J::ORDERING_SCOPE.unwrap_or(J::KIND).to_owned(),
                    key,
                }),
        };
        job.validate()?;
        Ok(job)
    }
}

impl<J: Job> EnqueueBuilder<J> {
    /// The delay, replacement and uniqueness rule after the kind's debounce: each enqueue
    /// pushes the pending job to now + debounce and replaces its args, unless this enqueue
    /// set its own time or replacement.
    fn debounced(&self) -> (Option<Duration>, Option<Replace>, Option<Unique>) {
        let Some(debounce) = J::DEBOUNCE else {
            return (self.delay, self.on_conflict, self.unique.clone());
        };
        let explicit_time = self.run_after.is_some() || self.delay.is_some();
        let delay = if explicit_time {
            self.delay
        } else {
            Some(debounce)
        };
        let unique = self
            .unique
            .clone()
            .or_else(|| Some(Unique::new().states(&[UniqueState::Pending])));
        (
            delay,
            Some(self.on_conflict.unwrap_or(Replace::both())),
            unique,
        )
    }

    /// The columns of `0005_time` this enqueue sets.
    fn time_opts(
        &self,
        on_conflict: Option<Replace>,
        unique: Option<&Unique>,
    ) -> Result<store::TimeOpts, Error> {
        let unique = match (unique, on_conflict) {
            (Some(u), _) => Some(u.clone()),
            (None, Some(_)) => Some(Unique::new()),
            (None, None) => None,
        };
        let unique_key = match &unique {
            None => None,
            Some(u) => Some(match u.explicit_key() {
                Some(key) => key.to_owned(),
                None => {
                    let serialize = |source| Error::Serialize {
                        kind: J::KIND.to_owned(),
                        source,
                    };
                    match J::unique_key(&self.args) {
                        Some(fields) => serde_json::to_string(&fields).map_err(serialize)?,
                        None => serde_json::to_string(&self.args).map_err(serialize)?,
                    }
                }
            }),
        };
        Ok(store::TimeOpts {
            payload_version: i32::try_from(J::VERSION).unwrap_or(i32::MAX),
            unique_states: unique.as_ref().map_or(0, Unique::state_bits),
            unique_period_secs: unique.as_ref().and_then(Unique::period_secs),
            unique_key,
            replace: on_conflict,
            max_age_secs: self.max_age.map(|d| d.as_secs_f64()),
            deadline: self.deadline,
            concurrency_key: self
                .concurrency_key
                .clone()
                .or_else(|| J::concurrency_key(&self.args)),
            rate_key: self.rate_key.clone().or_else(|| J::rate_key(&self.args)),
        })
    }
}

/// Inserts `jobs` through `conn` (a connection of the caller's pool, checked out for the
/// statement, or the caller's own connection) and, if `wake`, wakes the queues of the due
/// ones in the same statement, less those notified lately (see [`crate::notify`]).
/// `events` go to the outbox with a single job (see [`EnqueueBuilder::publish`]).
async fn insert(
    conn: Conn<'_>,
    jobs: &[store::NewJob],
    wake: bool,
    events: &[store::NewEvent],
) -> Result<Vec<Enqueued>, Error> {
    let queues = if wake {
        store::NewJob::due_queues(jobs)
    } else {
        Vec::new()
    };
    let recent = WAKE_UPS.recent(&queues, Instant::now());
    let how = store::Wake {
        queues: &queues,
        recent: &recent,
    };
    let mut pooled;
    let conn = match conn.0 {
        ConnKind::Pool(pool) => {
            pooled = pool.acquire().await?;
            &mut *pooled
        }
        ConnKind::Connection(conn) => conn,
    };
    let (done, db) = match jobs {
        [job] => store::job_insert(conn, job, how, events)
            .await
            .map(|(e, db)| (vec![e], db))?,
        _ => store::job_insert_batch(conn, jobs, how, events).await?,
    };
    if let Some(db) = db {
        WAKE_UPS.inserted(&queues, &recent, &db, Instant::now());
    }
    // One counter update per run of jobs with the same kind and queue (a labelled
    // counter costs a lookup per update; a batch is usually one kind and one queue).
    let mut run: Option<(&str, &str, u64)> = None;
    for (job, _) in jobs.iter().zip(&done).filter(|(_, e)| !e.duplicate) {
        match &mut run {
            Some((kind, queue, n)) if *kind == job.kind && *queue == job.queue => *n += 1,
            _ => {
                if let Some((kind, queue, n)) = run {
                    crate::metrics::enqueued(kind, queue, n);
                }
                run = Some((&job.kind, &job.queue, 1));
            }
        }
    }
    if let Some((kind, queue, n)) = run {
        crate::metrics::enqueued(kind, queue, n);
    }
    Ok(done)
}

/// Where a jobq statement runs: a pool (one statement, its own implicit transaction), or
/// a connection — typically the caller's open transaction, so the write commits or rolls
/// back with it.
///
/// Every jobq function that writes on the caller's behalf takes `impl Into<Conn>`, so all
/// of these work: `&pool`, `&mut tx` (a `sqlx::Transaction<'_, Postgres>`), `&mut *tx`,
/// `&mut conn` (a `PoolConnection<Postgres>`) and `&mut *conn` (a `PgConnection`).
/// (A concrete type rather than a generic `sqlx::Acquire` bound: the latter's
/// higher-ranked lifetime makes futures that use it fail to be `Send` inside spawned
/// tasks, with the error "implementation of `Acquire` is not general enough".)
///
/// Opaque: build one with `.into()` (or let `impl Into<Conn>` do it).
#[derive(Debug)]
pub struct Conn<'c>(ConnKind<'c>);

#[derive(Debug)]
enum ConnKind<'c> {
    /// Acquire a connection from this pool for the statement.
    Pool(&'c PgPool),
    /// Run on this connection (inside whatever transaction it has open).
    Connection(&'c mut PgConnection),
}

impl<'c> From<&'c PgPool> for Conn<'c> {
    fn from(pool: &'c PgPool) -> Self {
        Conn(ConnKind::Pool(pool))
    }
}

impl<'c> From<&'c mut PgConnection> for Conn<'c> {
    fn from(conn: &'c mut PgConnection) -> Self {
        Conn(ConnKind::Connection(conn))
    }
}

impl<'c> From<&'c mut Transaction<'_, Postgres>> for Conn<'c> {
    fn from(tx: &'c mut Transaction<'_, Postgres>) -> Self {
        Conn(ConnKind::Connection(&mut *tx))
    }
}

impl<'c> From<&'c mut PoolConnection<Postgres>> for Conn<'c> {
    fn from(conn: &'c mut PoolConnection<Postgres>) -> Self {
        Conn(ConnKind::Connection(&mut *conn))
    }
}
