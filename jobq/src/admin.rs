//! Operator actions: replay, cancel, retry now, payload correction, pause and resume —
//! each fenced against concurrent workers and audited in `jobq.job_audit`.
//!
//! Every action is one statement that checks the state it expects on the row it changes
//! (a replay touches only `failed` or `cancelled` jobs, never a `running` one) and writes
//! its audit row (actor, action, reason, time, state before and after) in that same
//! statement, so the action and its record commit together.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
//! use jobq::admin::{Admin, BulkReplay, Filter};
//!
//! let admin = Admin::new(pool).actor("alice");
//! admin.replay(jobq::JobId(42), Some("SMTP credentials fixed")).await?;
//!
//! // Every `smtp_auth` failure of the last day, 20 per second at most.
//! let filter = Filter::default()
//!     .kind("send_invoice")
//!     .code("smtp_auth")
//!     .since(chrono::Utc::now() - chrono::Duration::days(1));
//! let report = admin
//!     .replay_many(&filter, BulkReplay::at_rate(20.0), Some("SMTP credentials fixed"))
//!     .await?;
//! println!("replayed {} jobs", report.replayed);
//! # Ok(()) }
//! ```
//!
//! # Ordered jobs
//!
//! A failed job with an ordering key parks the jobs of its key behind it. Replaying it
//! runs it again first (the rest wait for it); cancelling it lets the rest proceed;
//! [`Admin::unpark`] keeps it `failed` and lets the rest proceed. Cancelling a waiting
//! job releases the one behind it.
//!
//! # Replay semantics
//!
//! A replayed job goes back to `pending`, due now, keeping its id, idempotency key, error
//! history and attempt count. When its attempt budget is spent (`attempts >=
//! max_attempts`), `max_attempts` becomes `attempts + 1`: a replay grants exactly one
//! more attempt, in line with "try one, then replay at a bounded rate". A stale attempt of
//! the job can never write over the replayed run: the next claim increments `attempts`,
//! so the stale attempt's fencing token `(id, n)` no longer matches.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Error;
use crate::ids::JobState;
use crate::job::{Job, JobId, MAX_PAYLOAD_BYTES};
use crate::registry::{JobHandler, registered_jobs};
use crate::store::{self, Actor, TerminalFilter};

pub use crate::store::{
    AuditRow, FailedGroup, JobRow, JobSummary, LimitRow, LimitUsage, ParkedKey, ScheduleRow,
    TerminalJob, Transition, Unparked,
};

/// Operator actions over one pool, by one actor.
#[derive(Debug, Clone)]
pub struct Admin {
    pool: PgPool,
    actor: String,
    handlers: BTreeMap<&'static str, JobHandler>,
}

/// Which terminal jobs [`Admin::failed`] lists and [`Admin::replay_many`] replays. The
/// default selects every `failed` job.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only jobs whose last error has this code.
    pub code: Option<String>,
    /// Only jobs that finished at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only jobs that finished before this time.
    pub until: Option<DateTime<Utc>>,
    /// Cancelled jobs too, not only failed ones.
    pub include_cancelled: bool,
}

impl Filter {
    /// Only `kind`.
    #[must_use]
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Only `queue`.
    #[must_use]
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only last error code `code`.
    #[must_use]
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Finished at or after `at`.
    #[must_use]
    pub fn since(mut self, at: DateTime<Utc>) -> Self {
        self.since = Some(at);
        self
    }

    /// Finished before `at`.
    #[must_use]
    pub fn until(mut self, at: DateTime<Utc>) -> Self {
        self.until = Some(at);
        self
    }

    /// Cancelled jobs too.
    #[must_use]
    pub fn include_cancelled(mut self, yes: bool) -> Self {
        self.include_cancelled = yes;
        self
    }

    fn states(&self) -> &'static [&'static str] {
        if self.include_cancelled {
            &["failed", "cancelled"]
        } else {
            &["failed"]
        }
    }

    fn store(&self) -> TerminalFilter<'_> {
        TerminalFilter {
            states: self.states(),
            kind: self.kind.as_deref(),
            queue: self.queue.as_deref(),
            code: self.code.as_deref(),
            since: self.since,
            until: self.until,
        }
    }
}

/// How fast and how far [`Admin::replay_many`] goes.
#[derive(Debug, Clone, Copy)]
pub struct BulkReplay {
    /// Jobs per second at most (default 10). Jobs are replayed in small chunks (a tenth
    /// of a second's worth each), so no burst exceeds the rate.
    pub rate_per_sec: f64,
    /// Replay at most this many (default: all that match).
    pub limit: Option<u64>,
    /// Count what would be replayed, change nothing.
    pub dry_run: bool,
}

impl Default for BulkReplay {
    fn default() -> Self {
        BulkReplay {
            rate_per_sec: 10.0,
            limit: None,
            dry_run: false,
        }
    }
}

impl BulkReplay {
    /// At most `rate_per_sec` jobs per second, all that match.
    pub fn at_rate(rate_per_sec: f64) -> Self {
        BulkReplay {
            rate_per_sec,
            ..BulkReplay::default()
        }
    }
}

/// What [`Admin::replay_many`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BulkReplayReport {
    /// Jobs that matched the filter when it started (before `limit`).
    pub matched: u64,
    /// Jobs replayed (0 for a dry run).
    pub replayed: u64,
    /// Matched jobs whose state changed before their turn (a concurrent replay, cancel
    /// or prune); left alone.
    pub skipped: u64,
    /// The replayed ids, ascending.
    pub ids: Vec<JobId>,
    /// Wall time taken, in seconds.
    pub elapsed_secs: f64,
}

/// What pausing or resuming a queue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueChange {
    /// The queue.
    pub queue: String,
    /// Whether it was paused before.
    pub was_paused: bool,
    /// Whether it is paused now.
    pub paused: bool,
}

/// What a limit applies to: every job of a kind, or every job of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitTarget {
    /// A job kind (concurrency and rate limits).
    Kind(String),
    /// A queue (concurrency limits only).
    Queue(String),
}

impl LimitTarget {
    /// The scope and name, after checking the name as enqueue does.
    fn parts(&self) -> Result<(&'static str, &str), Error> {
        let (scope, name, max) = match self {
            LimitTarget::Kind(k) => ("kind", k, crate::job::MAX_KIND_LEN),
            LimitTarget::Queue(q) => ("queue", q, crate::job::MAX_QUEUE_LEN),
        };
        store::validate_name(scope, name, max)?;
        Ok((scope, name))
    }
}

/// An operator's change to a limit ([`Admin::limit_set`]); fields left `None` keep their
/// value (the operator's, else the code's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSet {
    /// The most running jobs (per concurrency key for a kind limited per key).
    pub concurrency: Option<u32>,
    /// The rate (kinds only).
    pub rate: Option<crate::Rate>,
    /// The bucket's size, with a new `rate` (default: the rate's count).
    pub burst: Option<u32>,
}

/// One job with its audit trail, as [`Admin::job`] returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDetail {
    /// Every column of the job (the error history is `job.errors`).
    pub job: JobRow,
    /// Every operator action on it, oldest first.
    pub audit: Vec<AuditRow>,
}

/// The actor written when none is set: `$USER`, or `unknown`.
pub fn default_actor() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

impl Admin {
    /// Actions over `pool`, as [`default_actor`], validating corrected payloads against
    /// every `#[jobq::job]` type linked into the binary.
    pub fn new(pool: PgPool) -> Self {
        let handlers = registered_jobs()
            .into_iter()
            .map(|h| (h.kind(), h))
            .collect();
        Admin {
            pool,
            actor: default_actor(),
            handlers,
        }
    }

    /// Who acts, as written to the audit rows.
    #[must_use]
    pub fn actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = actor.into();
        self
    }

    /// Validates corrected payloads of `J`'s kind against `J::Args`.
    #[must_use]
    pub fn register<J: Job>(mut self) -> Self {
        let h = JobHandler::of::<J>();
        self.handlers.insert(h.kind(), h);
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn who<'a>(&'a self, reason: Option<&'a str>) -> Actor<'a> {
        Actor {
            name: &self.actor,
            reason,
        }
    }

    /// Explains why an action found nothing to change.
    async fn refuse(&self, id: JobId, action: &'static str, expected: &'static str) -> Error {
        let state = match self.pool.acquire().await {
            Ok(mut conn) => store::job_state_get(&mut conn, id.0).await,
            Err(e) => Err(e.into()),
        };
        match state {
            Ok(Some(state)) => Error::WrongState {
                id: id.0,
                state,
                action,
                expected,
            },
            Ok(None) => Error::NotFound {
                what: "job",
                name: id.to_string(),
            },
            Err(e) => e,
        }
    }

    /// Replays one `failed` or `cancelled` job (see the [module docs](self) for what
    /// replay keeps and changes).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unknown id, [`Error::WrongState`] when the job is not
    /// `failed` or `cancelled` (a running job is never touched), [`Error::Database`] when
    /// the database cannot be reached.
    pub async fn replay(&self, id: JobId, reason: Option<&str>) -> Result<Transition, Error> {
        let mut conn = self.pool.acquire().await?;
        let mut t = store::job_replay_many(&mut conn, &[id.0], self.who(reason)).await?;
        if !t.is_empty() {
            // A replayed job rejoins its key's chain; the jobs behind it keep waiting.
            store::ordering_settle(&mut conn, &[id.0]).await?;
        }
        drop(conn);
        match t.pop() {
            Some(t) => Ok(t),
            None => Err(self.refuse(id, "replay", "failed or cancelled").await),
        }
    }

    /// Replays every job `filter` matches, at most `opts.rate_per_sec` per second, in
    /// ascending id order; each job gets its own audit row. Jobs whose state changed in
    /// the meantime are skipped, not forced.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a rate that is not positive, [`Error::Database`] when the
    /// database cannot be reached (jobs replayed before it stay replayed).
    pub async fn replay_many(
        &self,
        filter: &Filter,
        opts: BulkReplay,
        reason: Option<&str>,
    ) -> Result<BulkReplayReport, Error> {
        if !(opts.rate_per_sec.is_finite() && opts.rate_per_sec > 0.0) {
            return Err(Error::Config(format!(
                "replay rate must be a positive number of jobs per second, got {}",
                opts.rate_per_sec
            )));
        }
        let started = tokio::time::Instant::now();
        let mut f = filter.store();
        // What matches now: jobs that finish after this moment (perhaps failing again
        // because of the replay) are not swept up. Counted, not loaded: the ids are read
        // a chunk at a time, each chunk on a connection taken for it and given back
        // before the pause, so a slow replay holds no connection while it waits.
        let mut conn = self.pool.acquire().await?;
        let now = store::db_now(&mut conn).await?;
        f.until = Some(f.until.map_or(now, |u| u.min(now)));
        let matched = store::job_count_terminal(&mut conn, &f).await?;
        drop(conn);
        let mut report = BulkReplayReport {
            matched,
            ..BulkReplayReport::default()
        };
        if opts.dry_run {
            report.elapsed_secs = started.elapsed().as_secs_f64();
            return Ok(report);
        }
        let budget = opts.limit.unwrap_or(u64::MAX).min(matched);
        // A tenth of a second's worth per statement: smooth, and a small lock footprint.
        let chunk = ((opts.rate_per_sec / 10.0).ceil() as u64).clamp(1, 500);
        let (mut seen, mut after) = (0_u64, 0_i64);
        while seen < budget {
            // Pace: the jobs before this chunk may not have gone faster than the rate.
            let due = started + Duration::from_secs_f64(seen as f64 / opts.rate_per_sec);
            tokio::time::sleep_until(due).await;
            let take = i64::try_from(chunk.min(budget - seen)).unwrap_or(i64::MAX);
            let mut conn = self.pool.acquire().await?;
            let ids = store::job_ids_terminal(&mut conn, &f, after, take).await?;
            let Some(&last) = ids.last() else { break };
            let done = store::job_replay_many(&mut conn, &ids, self.who(reason)).await?;
            let replayed: Vec<i64> = done.iter().map(|t| t.id.0).collect();
            store::ordering_settle(&mut conn, &replayed).await?;
            drop(conn);
            after = last;
            seen += ids.len() as u64;
            report.replayed += done.len() as u64;
            report.skipped += (ids.len() - done.len()) as u64;
            report.ids.extend(done.iter().map(|t| t.id));
        }
        // Matched at the start but gone (replayed or pruned by someone else) before
        // their chunk was read.
        report.skipped += budget - seen;
        report.elapsed_secs = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Cancels a job: `scheduled`, `pending` or `failed` becomes `cancelled` at once; a `running` job
    /// finishes its attempt, then becomes `cancelled` instead of retrying (its context's
    /// cancellation fires at its next heartbeat). The returned transition's `after` is
    /// `running` in that case.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unknown id, [`Error::WrongState`] for a `done` or
    /// `cancelled` job (or a running one already asked to cancel), [`Error::Database`]
    /// when the database cannot be reached.
    pub async fn cancel(&self, id: JobId, reason: Option<&str>) -> Result<Transition, Error> {
        let mut conn = self.pool.acquire().await?;
        let t = store::job_cancel(&mut conn, id.0, self.who(reason)).await?;
        if t.as_ref().is_some_and(|t| t.after == "cancelled") {
            // The next job of its ordering key (if it has one) may run now.
            store::ordering_settle(&mut conn, &[id.0]).await?;
        }
        drop(conn);
        match t {
            Some(t) => Ok(t),
            None => Err(self
                .refuse(id, "cancel", "scheduled, pending, failed or running")
                .await),
        }
    }

    /// Makes a `scheduled` job (waiting for its backoff or its scheduled time) `pending`
    /// and due now.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unknown id, [`Error::WrongState`] when the job is not
    /// scheduled (or already due), [`Error::Database`] when the database cannot be reached.
    pub async fn retry_now(&self, id: JobId, reason: Option<&str>) -> Result<Transition, Error> {
        let mut conn = self.pool.acquire().await?;
        let t = store::job_retry_now(&mut conn, id.0, self.who(reason), None).await?;
        drop(conn);
        match t {
            Some(t) => Ok(t),
            None => Err(self.refuse(id, "retry-now", "scheduled").await),
        }
    }

    /// Replaces the payload of a `failed` or `cancelled` job, typically before a replay.
    /// Where the kind is known to this process (a `#[jobq::job]` type linked in, or
    /// [`register`](Self::register)ed), the payload must decode as its args. The audit
    /// row keeps the payload before and after.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (`invalid_payload`, `payload_too_large`) for a payload that
    /// does not decode or is too large, [`Error::NotFound`], [`Error::WrongState`] for a
    /// job that is not failed or cancelled, [`Error::Database`].
    pub async fn edit_payload(
        &self,
        id: JobId,
        payload: serde_json::Value,
        reason: Option<&str>,
    ) -> Result<Transition, Error> {
        let mut conn = self.pool.acquire().await?;
        let Some(job) = store::job_get(&mut conn, id.0).await? else {
            return Err(Error::NotFound {
                what: "job",
                name: id.to_string(),
            });
        };
        if let Some(h) = self.handlers.get(job.kind.as_str()) {
            h.check_payload(&payload)
                .map_err(|m| Error::invalid("invalid_payload", m))?;
        }
        let text = payload.to_string();
        if text.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::invalid(
                "payload_too_large",
                format!(
                    "payload is {} bytes; the limit is {MAX_PAYLOAD_BYTES}",
                    text.len()
                ),
            ));
        }
        let t = store::job_payload_update(&mut conn, id.0, &text, self.who(reason)).await?;
        drop(conn);
        match t {
            Some(t) => Ok(t),
            None => Err(self.refuse(id, "edit-payload", "failed or cancelled").await),
        }
    }

    /// Every limit in force (code and operator rows merged), with its usage now:
    /// running jobs, tokens in the kind-wide bucket and when the next one comes, key
    /// buckets and throttles.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn limits(&self) -> Result<Vec<LimitUsage>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::limits_usage(&mut conn, None).await
    }

    /// Sets an operator's limit on `target`, audited (`limit_set`); every node claims by
    /// it within a poll interval. The operator's fields win over the code's until
    /// [`limit_clear`](Self::limit_clear). Returns whether anything was written.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty change (`empty_limit`), a concurrency or burst of
    /// 0 (`invalid_limit`), a rate on a queue or a burst without a rate
    /// (`invalid_limit`), a bad name; [`Error::Database`].
    pub async fn limit_set(
        &self,
        target: &LimitTarget,
        change: &LimitSet,
        reason: Option<&str>,
    ) -> Result<bool, Error> {
        let (scope, name) = target.parts()?;
        if change == &LimitSet::default() {
            return Err(Error::invalid(
                "empty_limit",
                "give a concurrency, a rate, or both",
            ));
        }
        if change.concurrency == Some(0) || change.burst == Some(0) {
            return Err(Error::invalid(
                "invalid_limit",
                "a concurrency or burst must be at least 1 (pause a queue with `jobq pause`)",
            ));
        }
        if scope == "queue" && change.rate.is_some() {
            return Err(Error::invalid(
                "invalid_limit",
                "a queue takes a concurrency limit only; rate-limit its kinds",
            ));
        }
        if change.burst.is_some() && change.rate.is_none() {
            return Err(Error::invalid(
                "invalid_limit",
                "a burst goes with a rate: give both",
            ));
        }
        let clamp = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let c = store::LimitChange {
            concurrency: change.concurrency.map(clamp),
            rate: change
                .rate
                .map(|r| (clamp(r.count()), r.period().as_secs_f64())),
            burst: change.burst.map(clamp),
        };
        let mut conn = self.pool.acquire().await?;
        store::limit_set(&mut conn, scope, name, Some(&c), self.who(reason)).await
    }

    /// Removes the operator's limit on `target`, audited (`limit_clear`): the code's
    /// limit, if any, applies again within a poll interval. Returns whether there was
    /// one.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a bad name; [`Error::Database`].
    pub async fn limit_clear(
        &self,
        target: &LimitTarget,
        reason: Option<&str>,
    ) -> Result<bool, Error> {
        let (scope, name) = target.parts()?;
        let mut conn = self.pool.acquire().await?;
        store::limit_set(&mut conn, scope, name, None, self.who(reason)).await
    }

    /// Pauses `queue`: producers on every node stop claiming from it at their next claim
    /// (within a poll interval). Running attempts finish normally; nothing is lost.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for a queue that has no jobs, no worker and no settings,
    /// [`Error::Invalid`] for a bad name, [`Error::Database`].
    pub async fn pause(&self, queue: &str, reason: Option<&str>) -> Result<QueueChange, Error> {
        self.set_paused(queue, true, reason).await
    }

    /// Resumes a paused `queue` and wakes its producers.
    ///
    /// # Errors
    ///
    /// As [`pause`](Self::pause).
    pub async fn resume(&self, queue: &str, reason: Option<&str>) -> Result<QueueChange, Error> {
        self.set_paused(queue, false, reason).await
    }

    async fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        reason: Option<&str>,
    ) -> Result<QueueChange, Error> {
        store::validate_name("queue", queue, crate::job::MAX_QUEUE_LEN)?;
        let mut conn = self.pool.acquire().await?;
        if !store::queue_exists(&mut conn, queue).await? {
            return Err(Error::NotFound {
                what: "queue",
                name: queue.to_owned(),
            });
        }
        let was_paused =
            store::queue_set_paused(&mut conn, queue, paused, self.who(reason)).await?;
        Ok(QueueChange {
            queue: queue.to_owned(),
            was_paused,
            paused,
        })
    }

    /// Lets the jobs parked behind the failed jobs of ordering key `key` proceed
    /// (`jobq unpark KEY --skip-failed`): those failed jobs stay `failed`, keep their
    /// history and can still be replayed, but no longer block the key; each gets an
    /// `unpark` audit row with this actor and `reason`. `scope` names the key's scope (a
    /// kind, or an `ordering_scope`); `None` unparks the key in every scope.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the key has no failed job that blocks it,
    /// [`Error::Database`].
    pub async fn unpark(
        &self,
        key: &str,
        scope: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Unparked, Error> {
        let mut conn = self.pool.acquire().await?;
        let done = store::ordering_unpark(&mut conn, scope, key, self.who(reason)).await?;
        if done.skipped.is_empty() {
            return Err(Error::NotFound {
                what: "parked ordering key",
                name: match scope {
                    Some(scope) => format!("{scope}/{key}"),
                    None => key.to_owned(),
                },
            });
        }
        Ok(done)
    }

    /// Ordering keys parked behind a failed job, oldest blocker first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn parked(&self, limit: u32) -> Result<Vec<ParkedKey>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::ordering_parked_keys(&mut conn, i64::from(limit)).await
    }

    /// One job, every column, with its audit trail.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unknown id, [`Error::Database`].
    pub async fn job(&self, id: JobId) -> Result<JobDetail, Error> {
        let mut conn = self.pool.acquire().await?;
        let Some(job) = store::job_get(&mut conn, id.0).await? else {
            return Err(Error::NotFound {
                what: "job",
                name: id.to_string(),
            });
        };
        let audit = store::audit_list_for_job(&mut conn, id.0).await?;
        Ok(JobDetail { job, audit })
    }

    /// Failed (and, with [`Filter::include_cancelled`], cancelled) jobs matching
    /// `filter`, most recently finished first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn failed(&self, filter: &Filter, limit: u32) -> Result<Vec<TerminalJob>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::job_list_terminal(&mut conn, &filter.store(), i64::from(limit)).await
    }

    /// The most recent audit rows, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditRow>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::audit_list_recent(&mut conn, i64::from(limit)).await
    }

    /// Every periodic schedule: expression, zone, next and last slot, the last slot's
    /// job and its state, whether it is paused.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::schedules_list(&mut conn).await
    }

    /// Pauses schedule `name` (audited): no slot is enqueued until it is resumed; the
    /// slots that pass meanwhile are handled by its missed-slot policy. Returns whether it
    /// was paused already.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unknown schedule, [`Error::Database`].
    pub async fn schedule_pause(&self, name: &str, reason: Option<&str>) -> Result<bool, Error> {
        self.schedule_set_paused(name, true, reason).await
    }

    /// Resumes schedule `name` (audited). Returns whether it was paused.
    ///
    /// # Errors
    ///
    /// As [`schedule_pause`](Self::schedule_pause).
    pub async fn schedule_resume(&self, name: &str, reason: Option<&str>) -> Result<bool, Error> {
        self.schedule_set_paused(name, false, reason).await
    }

    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        reason: Option<&str>,
    ) -> Result<bool, Error> {
        let mut conn = self.pool.acquire().await?;
        store::schedule_set_paused(&mut conn, name, paused, self.who(reason))
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "schedule",
                name: name.to_owned(),
            })
    }

    /// Enqueues one job of schedule `name` now, outside its slots (audited), with the
    /// schedule's args; its slots are unchanged.
    ///
    /// # Errors
    ///
    /// As [`schedule_pause`](Self::schedule_pause).
    pub async fn schedule_run_now(&self, name: &str, reason: Option<&str>) -> Result<JobId, Error> {
        let mut conn = self.pool.acquire().await?;
        store::schedule_run_now(&mut conn, name, self.who(reason))
            .await?
            .map(JobId)
            .ok_or_else(|| Error::NotFound {
                what: "schedule",
                name: name.to_owned(),
            })
    }

    /// Jobs matching `query`, newest first, at most `limit`: one page of the dashboard's
    /// list. The next page is `query.before(last id)`, a keyset that costs the same on
    /// every page.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn jobs(&self, query: &JobQuery, limit: u32) -> Result<Vec<JobSummary>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::job_browse(&mut conn, &query.store(), i64::from(limit)).await
    }

    /// The database's plan for [`jobs`](Self::jobs)' statement, one `EXPLAIN` line each:
    /// to check that a filter pages on an index.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn jobs_plan(&self, query: &JobQuery, limit: u32) -> Result<Vec<String>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::job_browse_explain(&mut conn, &query.store(), i64::from(limit)).await
    }

    /// Every `failed` job, grouped by queue, kind and last error code, largest first.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn failed_groups(&self) -> Result<Vec<FailedGroup>, Error> {
        let mut conn = self.pool.acquire().await?;
        store::job_failed_groups(&mut conn).await
    }

    /// Audit rows matching `query`, newest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn audit_filtered(
        &self,
        query: &AuditQuery,
        limit: u32,
    ) -> Result<Vec<AuditRow>, Error> {
        let mut conn = self.pool.acquire().await?;
        let f = store::AuditBrowse {
            action: query.action.as_deref(),
            actor: query.actor.as_deref(),
            job_id: query.job_id,
            before: query.before,
        };
        store::audit_browse(&mut conn, &f, i64::from(limit)).await
    }
}

/// Which jobs [`Admin::jobs`] lists; the default lists every job. Every field narrows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobQuery {
    /// This id only.
    pub id: Option<JobId>,
    /// This state only.
    pub state: Option<JobState>,
    /// This queue.
    pub queue: Option<String>,
    /// This kind.
    pub kind: Option<String>,
    /// Last error code.
    pub code: Option<String>,
    /// Enqueued at or after.
    pub since: Option<DateTime<Utc>>,
    /// Enqueued before.
    pub until: Option<DateTime<Utc>>,
    /// Ids below this one only: the next page after a page whose last id this is.
    pub before: Option<i64>,
}

impl JobQuery {
    /// The next page after a page whose last (smallest) id is `id`.
    #[must_use]
    pub fn before(mut self, id: i64) -> Self {
        self.before = Some(id);
        self
    }

    fn store(&self) -> store::BrowseFilter<'_> {
        store::BrowseFilter {
            id: self.id.map(|id| id.0),
            state: self.state.map(JobState::as_str),
            queue: self.queue.as_deref(),
            kind: self.kind.as_deref(),
            code: self.code.as_deref(),
            since: self.since,
            until: self.until,
            before: self.before,
        }
    }
}

/// Which audit rows [`Admin::audit_filtered`] lists; the default lists all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditQuery {
    /// This action (`replay`, `cancel`, `pause`, …).
    pub action: Option<String>,
    /// This actor.
    pub actor: Option<String>,
    /// This job.
    pub job_id: Option<i64>,
    /// Rows with an id below this one only: the next page.
    pub before: Option<i64>,
}
