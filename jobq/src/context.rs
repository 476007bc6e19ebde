//! [`JobContext`]: what one attempt knows about itself, and what it may do.
//!
//! The context depends on no runtime module: the executor hands each attempt its lease
//! handle and its cancellation token when it builds the context.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::ids::JobId;
use crate::store;

/// The context of one attempt: its job's identity, its attempt number, a cancellation
/// signal, and the fenced operations an attempt may perform (the effect ledger,
/// complete-in-transaction, extending its own lease).
///
/// Cheap to clone; clones share the cancellation signal and lease.
#[derive(Clone)]
pub struct JobContext {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    id: JobId,
    kind: Arc<str>,
    queue: Arc<str>,
    attempt: u32,
    /// The claim's lease generation: with the id, the fencing token of every write.
    fence: i64,
    max_attempts: u32,
    created_at: Option<DateTime<Utc>>,
    cancel: CancellationToken,
    lease: Option<AttemptLease>,
    state: State,
    /// The attempt's recorded output (or why it could not be recorded).
    output: Arc<std::sync::Mutex<Option<Result<String, crate::output::Refused>>>>,
}

/// The database side of an attempt: the pool, the lease length and the local deadline
/// the runtime's watchdog enforces. Absent for a detached context.
#[derive(Clone)]
pub(crate) struct AttemptLease {
    /// The application's pool, handed to the handler ([`JobContext::pool`]).
    pub(crate) pool: PgPool,
    /// jobq's own pool, for the attempt's own writes (lease extensions), so they never
    /// wait for a connection the application holds.
    pub(crate) own: PgPool,
    pub(crate) lease: Duration,
    /// When this process must consider the lease lost, by its monotonic clock: the send
    /// time of the last successful extension plus the lease. The database's own expiry
    /// is always later, so the attempt is dropped before anyone else can claim the job.
    pub(crate) deadline: Arc<Deadline>,
}

/// An attempt's local lease deadline: moved only later, by each successful extension,
/// and read by the watchdog when its sleep ends (a later deadline puts it back to
/// sleep), so an extension wakes nobody.
#[derive(Debug)]
pub(crate) struct Deadline {
    first: Instant,
    /// How far past `first` the deadline is now, in nanoseconds.
    past_first: std::sync::atomic::AtomicU64,
}

impl Deadline {
    pub(crate) fn new(at: Instant) -> Deadline {
        Deadline {
            first: at,
            past_first: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn get(&self) -> Instant {
        let past = self.past_first.load(std::sync::atomic::Ordering::Acquire);
        self.first + Duration::from_nanos(past)
    }

    /// Moves the deadline to `at` if that is later.
    pub(crate) fn extend_to(&self, at: Instant) {
        let past =
            u64::try_from(at.saturating_duration_since(self.first).as_nanos()).unwrap_or(u64::MAX);
        self.past_first
            .fetch_max(past, std::sync::atomic::Ordering::AcqRel);
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("id", &self.inner.id)
            .field("kind", &self.inner.kind)
            .field("queue", &self.inner.queue)
            .field("attempt", &self.inner.attempt)
            .field("max_attempts", &self.inner.max_attempts)
            .field("cancelled", &self.inner.cancel.is_cancelled())
            .field("attached", &self.inner.lease.is_some())
            .finish()
    }
}

/// The parts the executor builds a context from.
pub(crate) struct ContextParts {
    pub(crate) id: JobId,
    pub(crate) kind: Arc<str>,
    pub(crate) queue: Arc<str>,
    pub(crate) attempt: u32,
    pub(crate) fence: i64,
    pub(crate) max_attempts: u32,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) lease: Option<AttemptLease>,
    pub(crate) state: State,
}

/// Shared application state handed to every attempt, by type: what a handler needs
/// beyond its args (a pool, an HTTP client, a mail provider). Set with
/// [`RuntimeBuilder::state`](crate::RuntimeBuilder::state), read with
/// [`JobContext::state`].
#[derive(Clone, Default)]
pub(crate) struct State {
    by_type: Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl State {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        Arc::make_mut(&mut self.by_type).insert(TypeId::of::<T>(), Arc::new(value));
    }

    fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.by_type.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "State({} values)", self.by_type.len())
    }
}

impl JobContext {
    pub(crate) fn from_parts(p: ContextParts) -> Self {
        JobContext {
            inner: Arc::new(Inner {
                id: p.id,
                kind: p.kind,
                queue: p.queue,
                attempt: p.attempt,
                fence: p.fence,
                max_attempts: p.max_attempts,
                created_at: p.created_at,
                cancel: p.cancel,
                lease: p.lease,
                state: p.state,
                output: Arc::default(),
            }),
        }
    }

    /// A context attached to no database row, for running a handler outside the runtime
    /// (`jobq-testing`'s inline mode does this). Attempt 1 of 1, job id 0, queue
    /// `default`; change them with the `with_*` methods. Its
    /// [`effect_once`](Self::effect_once) records effects unfenced, and
    /// [`complete_in_tx`](Self::complete_in_tx) and [`extend_lease`](Self::extend_lease)
    /// do nothing.
    pub fn detached(kind: impl Into<String>) -> Self {
        JobContext::from_parts(ContextParts {
            id: JobId(0),
            kind: Arc::from(kind.into()),
            queue: Arc::from("default"),
            attempt: 1,
            fence: 0,
            max_attempts: 1,
            created_at: None,
            cancel: CancellationToken::new(),
            lease: None,
            state: State::default(),
        })
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::make_mut(&mut self.inner));
        self
    }

    /// Sets the job id (detached contexts).
    #[must_use]
    pub fn with_id(self, id: JobId) -> Self {
        self.edit(|p| p.id = id)
    }

    /// Sets the attempt number, 1-based (detached contexts).
    #[must_use]
    pub fn with_attempt(self, attempt: u32) -> Self {
        self.edit(|p| p.attempt = attempt.max(1))
    }

    /// Sets the number of attempts allowed (detached contexts).
    #[must_use]
    pub fn with_max_attempts(self, max_attempts: u32) -> Self {
        self.edit(|p| p.max_attempts = max_attempts.max(1))
    }

    /// Sets the queue (detached contexts).
    #[must_use]
    pub fn with_queue(self, queue: impl Into<String>) -> Self {
        let queue = Arc::from(queue.into());
        self.edit(|p| p.queue = queue)
    }

    /// Adds a state value of type `T` (detached contexts; the runtime's come from
    /// [`RuntimeBuilder::state`](crate::RuntimeBuilder::state)).
    #[must_use]
    pub fn with_state<T: Send + Sync + 'static>(self, value: T) -> Self {
        self.edit(|p| p.state.insert(value))
    }

    /// The application state of type `T` given to the runtime with
    /// [`RuntimeBuilder::state`](crate::RuntimeBuilder::state).
    ///
    /// ```
    /// #[derive(Clone)]
    /// struct Mailer { from: String }
    ///
    /// let ctx = jobq::JobContext::detached("send").with_state(Mailer { from: "billing@example.com".into() });
    /// assert_eq!(ctx.state::<Mailer>().unwrap().from, "billing@example.com");
    /// assert!(ctx.state::<String>().is_none());
    /// ```
    pub fn state<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.inner.state.get::<T>()
    }

    /// The runtime's pool (`None` for a detached context).
    pub fn pool(&self) -> Option<&PgPool> {
        self.inner.lease.as_ref().map(|l| &l.pool)
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.inner.id
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.inner.kind
    }

    /// The queue the job was claimed from.
    pub fn queue(&self) -> &str {
        &self.inner.queue
    }

    /// This attempt's number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// Records `value` as the job's output (`jobs.output`), written with the attempt's
    /// completion; a later call replaces it. A handler returning `Ok(value)` of a
    /// `Serialize` type records it this way by itself.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (`output_too_large`) past [`MAX_OUTPUT_BYTES`](crate::MAX_OUTPUT_BYTES)
    /// serialized, or (`invalid_output`) for a value that does not serialize as JSON jsonb
    /// can store; nothing is recorded then.
    pub fn record_output<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<(), Error> {
        let text = crate::output::encode(value).map_err(|(code, m)| Error::invalid(code, m))?;
        self.set_output(Ok(text));
        Ok(())
    }

    /// The output recorded so far by this attempt, if any.
    pub fn recorded_output(&self) -> Option<serde_json::Value> {
        match &*self.inner.output.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(text)) => serde_json::from_str(text).ok(),
            _ => None,
        }
    }

    pub(crate) fn set_output(&self, output: Result<String, crate::output::Refused>) {
        *self.inner.output.lock().unwrap_or_else(|p| p.into_inner()) = Some(output);
    }

    /// The recorded output (`Err`: why the returned value could not be recorded).
    pub(crate) fn output_text(&self) -> Option<Result<String, crate::output::Refused>> {
        self.inner
            .output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many attempts the job has in all.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// Whether this is the job's last allowed attempt.
    pub fn is_last_attempt(&self) -> bool {
        self.inner.attempt >= self.inner.max_attempts
    }

    /// The lease one claim or heartbeat grants this attempt (`None` when detached).
    pub fn lease(&self) -> Option<Duration> {
        self.inner.lease.as_ref().map(|l| l.lease)
    }

    /// When the job was enqueued (by the database's clock), if known.
    pub fn created_at(&self) -> Option<DateTime<Utc>> {
        self.inner.created_at
    }

    /// Whether this attempt has been cancelled (timeout, lost lease, shutdown deadline,
    /// or an operator's cancel). The runtime also drops the handler's future shortly after;
    /// this is for work the handler spawned, or for stopping between steps.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Completes when this attempt is cancelled.
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await;
    }

    /// A token that is cancelled with this attempt, to hand to spawned work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.cancel.child_token()
    }

    /// Records `key` in the effect ledger (`jobq.job_effects`) inside the caller's
    /// transaction and tells whether it is new. `true`: perform the effect in the same
    /// transaction and commit. `false`: this effect already happened (an earlier attempt
    /// committed it), skip it.
    ///
    /// Only a transaction is accepted (see [`InTransaction`]): outside one, the ledger row
    /// and the effect would commit separately. The fence check locks the job's row until
    /// the transaction ends, so no rescue can slip in between the check and the commit.
    ///
    /// ```no_run
    /// # async fn f(ctx: jobq::JobContext, pool: sqlx::PgPool) -> Result<(), jobq::Error> {
    /// let mut tx = pool.begin().await?;
    /// if ctx.effect_once(&mut tx, "invoice-42-marked-sent").await? {
    ///     sqlx::query("UPDATE invoices SET status = 'sent' WHERE id = 42")
    ///         .execute(&mut *tx)
    ///         .await?;
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if this attempt no longer holds its job (roll back: a newer
    /// attempt owns the job now); [`Error::Database`] on a database error.
    pub async fn effect_once(&self, mut tx: impl InTransaction, key: &str) -> Result<bool, Error> {
        let conn = tx.connection();
        let (id, fence) = self.fence();
        if self.inner.lease.is_some() && !store::job_fence_check(conn, id, fence).await? {
            return Err(self.lease_lost());
        }
        let attempt = i32::try_from(self.inner.attempt).unwrap_or(i32::MAX);
        store::effect_record(conn, key, id, attempt).await
    }

    /// Marks the job `done` inside the caller's transaction, so a database side effect and
    /// the job's completion commit, or vanish, together. The runtime's own completion
    /// after the handler returns then finds the job done and leaves it. Only a
    /// transaction is accepted (see [`InTransaction`]).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if this attempt no longer holds its job (roll back);
    /// [`Error::Database`] on a database error.
    pub async fn complete_in_tx(&self, mut tx: impl InTransaction) -> Result<(), Error> {
        if self.inner.lease.is_none() {
            return Ok(());
        }
        let (id, fence) = self.fence();
        if store::job_complete_in_tx(tx.connection(), id, fence).await? {
            Ok(())
        } else {
            Err(self.lease_lost())
        }
    }

    /// Extends this attempt's lease to `lease` from now (database clock). The runtime's
    /// heartbeats already do this; call it before a step known to block heartbeats.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the attempt no longer holds its job; [`Error::Database`].
    pub async fn extend_lease(&self, lease: Duration) -> Result<(), Error> {
        let Some(l) = &self.inner.lease else {
            return Ok(());
        };
        let sent = Instant::now();
        let (id, fence) = self.fence();
        let mut conn = l.own.acquire().await?;
        if store::lease_extend_one(&mut conn, id, fence, lease.as_secs_f64()).await? {
            l.deadline.extend_to(sent + lease);
            Ok(())
        } else {
            Err(self.lease_lost())
        }
    }

    /// Slows every job of rate key `key` of this attempt's kind until `until`, on every
    /// node: no job of the key is claimed before then, and after it the key's bucket
    /// refills from one token at its rate. The key is the jobs' `rate_key` for a kind
    /// limited per key, else the kind's name ([`kind`](Self::kind)), which slows the
    /// whole kind; a kind with no rate limit honours throttles too. A later throttle of
    /// the same key is kept. Return the attempt's own `Err(... retry_after)` as usual.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (`invalid_rate_key`) for an empty key or one with a NUL;
    /// [`Error::Database`]. A detached context does nothing.
    pub async fn throttle(&self, key: &str, until: DateTime<Utc>) -> Result<(), Error> {
        if key.is_empty() || key.contains('\0') {
            return Err(Error::invalid(
                "invalid_rate_key",
                "a rate key must be non-empty text without NUL characters",
            ));
        }
        let Some(l) = &self.inner.lease else {
            return Ok(());
        };
        let mut conn = l.own.acquire().await?;
        store::rate_throttle(&mut conn, &self.inner.kind, key, until).await
    }

    /// A guard that cancels this attempt's token when dropped (the executor holds it for
    /// the length of the attempt).
    pub(crate) fn cancel_on_drop(&self) -> tokio_util::sync::DropGuard {
        self.inner.cancel.clone().drop_guard()
    }

    /// The fencing token `(id, lease generation)` every write of this attempt carries.
    fn fence(&self) -> (i64, i64) {
        (self.inner.id.0, self.inner.fence)
    }

    fn lease_lost(&self) -> Error {
        Error::LeaseLost {
            id: self.inner.id.0,
            attempt: i32::try_from(self.inner.attempt).unwrap_or(i32::MAX),
        }
    }
}

/// The caller's transaction, the only thing [`JobContext::effect_once`] and
/// [`JobContext::complete_in_tx`] accept: `&mut tx` for a `sqlx::Transaction` of
/// PostgreSQL. A pool or a bare connection would autocommit the ledger row (or the
/// completion) on its own, apart from the effect it vouches for, and exactly-once would be
/// silently lost; so they do not compile.
///
/// ```compile_fail
/// # async fn f(ctx: jobq::JobContext, pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// ctx.effect_once(&pool, "k").await?; // error: `&Pool<Postgres>` is not a transaction
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction: the effect ledger and complete-in-transaction only work inside the caller's transaction",
    label = "pass `&mut tx` here, from `let mut tx = pool.begin().await?`",
    note = "outside a transaction the ledger row (or the completion) would commit apart from the effect it vouches for, and exactly-once would be lost"
)]
pub trait InTransaction: sealed::Sealed {
    /// The transaction's connection.
    #[doc(hidden)]
    fn connection(&mut self) -> &mut PgConnection;
}

impl InTransaction for &mut Transaction<'_, Postgres> {
    fn connection(&mut self) -> &mut PgConnection {
        self
    }
}

#[allow(unreachable_pub)]
mod sealed {
    pub trait Sealed {}
    impl Sealed for &mut sqlx::Transaction<'_, sqlx::Postgres> {}
}

/// A handler's `Ok` value, for the macro's dispatch.
#[doc(hidden)]
#[derive(Debug)]
pub struct OutputOf<'a, T>(pub &'a T);

/// Records a `Serialize` value (chosen first by method resolution when it applies).
#[doc(hidden)]
pub trait RecordSerialize {
    fn __jobq_record(&self, ctx: &JobContext);
}

impl<T: serde::Serialize> RecordSerialize for OutputOf<'_, T> {
    fn __jobq_record(&self, ctx: &JobContext) {
        ctx.set_output(crate::output::encode(self.0));
    }
}

/// Drops any other value, as before outputs were recorded.
#[doc(hidden)]
pub trait RecordOther {
    fn __jobq_record(&self, ctx: &JobContext);
}

impl<T> RecordOther for &OutputOf<'_, T> {
    fn __jobq_record(&self, _ctx: &JobContext) {}
}
