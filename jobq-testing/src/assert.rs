//! Assertions on what was enqueued, typed by job.
//!
//! Each one reads `jobq.jobs` through the connection it is given, so inside the caller's
//! own uncommitted transaction it sees that transaction's enqueues — and nothing another
//! transaction has not committed.

use std::fmt;

use chrono::{DateTime, Utc};
use jobq::{Job, JobId};
use sqlx::{Acquire, Postgres};

use crate::error::Error;
use jobq::__testing::{self as sql, JobRow};

/// How many jobs a failed assertion lists.
const LISTED: usize = 10;
/// How much of a payload a failed assertion shows.
const PAYLOAD_CHARS: usize = 120;

/// A job of kind `J::KIND` as stored, with its args decoded.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EnqueuedJob<A> {
    /// The job's id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its priority (smaller runs first).
    pub priority: i16,
    /// Its state.
    pub state: jobq::JobState,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts it may have.
    pub max_attempts: u32,
    /// When it may run.
    pub run_after: DateTime<Utc>,
    /// When it was enqueued (the enqueueing transaction's start).
    pub created_at: DateTime<Utc>,
    /// Its idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The code of its last failure, if any.
    pub last_error_code: Option<String>,
    /// Its payload as stored.
    pub payload: serde_json::Value,
    /// The payload decoded as the job type's args.
    pub args: A,
}

impl<A> fmt::Display for EnqueuedJob<A> {
    /// One line: id, queue, priority, state, attempts, run_after and the start of the
    /// payload.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} queue={} priority={} state={} attempts={}/{} run_after={} args={}",
            self.id,
            self.queue,
            self.priority,
            self.state,
            self.attempts,
            self.max_attempts,
            self.run_after.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            short(&self.payload)
        )
    }
}

fn short(payload: &serde_json::Value) -> String {
    let text = payload.to_string();
    if text.chars().count() <= PAYLOAD_CHARS {
        return text;
    }
    let cut: String = text.chars().take(PAYLOAD_CHARS).collect();
    format!("{cut}… ({} bytes)", text.len())
}

fn decode<J: Job>(row: JobRow) -> Result<EnqueuedJob<J::Args>, Error> {
    let args = serde_json::from_value(row.payload.clone()).map_err(|e| Error::Decode {
        id: row.id,
        kind: J::KIND.to_owned(),
        message: e.to_string(),
    })?;
    Ok(EnqueuedJob {
        id: row.id,
        queue: row.queue,
        priority: row.priority,
        state: row.state,
        attempts: u32::try_from(row.attempts).unwrap_or(0),
        max_attempts: u32::try_from(row.max_attempts).unwrap_or(0),
        run_after: row.run_after,
        created_at: row.created_at,
        idempotency_key: row.idempotency_key,
        last_error_code: row.last_error_code,
        payload: row.payload,
        args,
    })
}

/// Every job of kind `J::KIND` that `conn` can see, in any state, oldest first — a
/// transaction's own uncommitted enqueues included. `conn` is anything jobq's enqueue
/// takes: `&mut *tx`, `&mut tx`, `&pool`, `&mut PgConnection`.
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
/// let jobs = jobq_testing::enqueued::<SendInvoice>(&pool).await?;
/// let ids: Vec<i64> = jobs.iter().map(|j| j.args).collect();
/// assert_eq!(ids, [42, 43]);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::Database`] when the query fails (for example when jobq is not migrated);
/// [`Error::Decode`] when a stored payload does not decode as `J::Args`.
pub async fn enqueued<'c, J: Job>(
    conn: impl Acquire<'c, Database = Postgres> + Send,
) -> Result<Vec<EnqueuedJob<J::Args>>, Error> {
    let mut conn = conn.acquire().await?;
    sql::job_list_by_kind(&mut conn, J::KIND)
        .await?
        .into_iter()
        .map(decode::<J>)
        .collect()
}

/// The jobs, or a panic naming what could not be read.
fn listed<A>(
    result: Result<Vec<EnqueuedJob<A>>, Error>,
    kind: &str,
    caller: &std::panic::Location<'_>,
) -> Vec<EnqueuedJob<A>> {
    match result {
        Ok(jobs) => jobs,
        Err(e) => panic!("{caller}: could not list the enqueued `{kind}` jobs: {e}"),
    }
}

fn listing<A>(jobs: &[EnqueuedJob<A>]) -> String {
    let mut out = String::new();
    for j in jobs.iter().take(LISTED) {
        out.push_str("\n  ");
        out.push_str(&j.to_string());
    }
    if jobs.len() > LISTED {
        out.push_str(&format!("\n  … and {} more", jobs.len() - LISTED));
    }
    out
}

/// Asserts that a job of kind `J::KIND` whose args satisfy `matches` is visible through
/// `conn`, and returns the first (oldest) such job.
///
/// ```no_run
/// # use jobq::{Job, JobContext, JobError};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)] struct InvoiceArgs { invoice_id: i64 }
/// # struct SendInvoice;
/// # impl Job for SendInvoice {
/// #     const KIND: &'static str = "send_invoice";
/// #     type Args = InvoiceArgs;
/// #     type Error = JobError;
/// #     async fn run(_: JobContext, _: InvoiceArgs) -> Result<(), JobError> { Ok(()) }
/// # }
/// # async fn t(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// SendInvoice::enqueue(&mut *tx, InvoiceArgs { invoice_id: 42 }).await?;
/// let job = jobq_testing::assert_enqueued::<SendInvoice>(&mut *tx, |a| a.invoice_id == 42).await;
/// assert_eq!(job.queue, "default");
/// tx.rollback().await?;
/// jobq_testing::assert_not_enqueued::<SendInvoice>(&pool).await;
/// # Ok(()) }
/// ```
///
/// # Panics
///
/// When no such job is visible (the message lists the jobs of that kind that are), or
/// when the jobs cannot be read.
#[track_caller]
pub fn assert_enqueued<'c, J: Job>(
    conn: impl Acquire<'c, Database = Postgres> + Send,
    matches: impl Fn(&J::Args) -> bool + Send,
) -> impl Future<Output = EnqueuedJob<J::Args>> + Send {
    let caller = std::panic::Location::caller();
    async move {
        let mut jobs = listed(enqueued::<J>(conn).await, J::KIND, caller);
        let total = jobs.len();
        match jobs.iter().position(|j| matches(&j.args)) {
            Some(i) => jobs.swap_remove(i),
            None if total == 0 => panic!(
                "{caller}: expected a `{}` job matching the predicate to be enqueued, but no `{}` job is visible to this connection",
                J::KIND,
                J::KIND
            ),
            None => panic!(
                "{caller}: expected a `{}` job matching the predicate to be enqueued, but none of the {total} visible matches:{}",
                J::KIND,
                listing(&jobs)
            ),
        }
    }
}

/// Asserts that a job of kind `J::KIND` with exactly these args (compared as JSON) is
/// visible through `conn`, and returns the first (oldest) such job.
///
/// # Panics
///
/// As [`assert_enqueued`]; also when `args` do not serialize.
#[track_caller]
pub fn assert_enqueued_with<'c, J: Job>(
    conn: impl Acquire<'c, Database = Postgres> + Send,
    args: &J::Args,
) -> impl Future<Output = EnqueuedJob<J::Args>> + Send {
    let caller = std::panic::Location::caller();
    let expected = serde_json::to_value(args);
    async move {
        let expected = match expected {
            Ok(v) => v,
            Err(e) => panic!(
                "{caller}: the expected `{}` args do not serialize: {e}",
                J::KIND
            ),
        };
        let mut jobs = listed(enqueued::<J>(conn).await, J::KIND, caller);
        if let Some(i) = jobs.iter().position(|j| j.payload == expected) {
            return jobs.swap_remove(i);
        }
        if jobs.is_empty() {
            panic!(
                "{caller}: expected a `{}` job with args {} to be enqueued, but no `{}` job is visible to this connection",
                J::KIND,
                short(&expected),
                J::KIND
            );
        }
        panic!(
            "{caller}: expected a `{}` job with args {} to be enqueued, but none of the {} visible has them:{}",
            J::KIND,
            short(&expected),
            jobs.len(),
            listing(&jobs)
        );
    }
}

/// Asserts that no job of kind `J::KIND` is visible through `conn`.
///
/// # Panics
///
/// When one is (the message lists them), or when the jobs cannot be read.
#[track_caller]
pub fn assert_not_enqueued<'c, J: Job>(
    conn: impl Acquire<'c, Database = Postgres> + Send,
) -> impl Future<Output = ()> + Send {
    assert_not_enqueued_where::<J>(conn, |_| true)
}

/// Asserts that no job of kind `J::KIND` whose args satisfy `matches` is visible through
/// `conn`.
///
/// # Panics
///
/// When one is (the message lists them), or when the jobs cannot be read.
#[track_caller]
pub fn assert_not_enqueued_where<'c, J: Job>(
    conn: impl Acquire<'c, Database = Postgres> + Send,
    matches: impl Fn(&J::Args) -> bool + Send,
) -> impl Future<Output = ()> + Send {
    let caller = std::panic::Location::caller();
    async move {
        let jobs = listed(enqueued::<J>(conn).await, J::KIND, caller);
        let hits: Vec<EnqueuedJob<J::Args>> =
            jobs.into_iter().filter(|j| matches(&j.args)).collect();
        if !hits.is_empty() {
            panic!(
                "{caller}: expected no matching `{}` job to be enqueued, but {} is visible:{}",
                J::KIND,
                hits.len(),
                listing(&hits)
            );
        }
    }
}
