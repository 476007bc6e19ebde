//! The dashboard's reads: the jobs list (filtered, paged by keyset), failures grouped by
//! kind and code, finished jobs per minute, and the audit log filtered. Each statement is
//! built from the filters actually given, so the planner sees the literal shape it runs
//! (a filter on a scheduled or finished state scans `jobs_state_id_idx`; none, or one on
//! `pending` or `running`, whose rows that index leaves out, scans the primary key
//! backwards).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Postgres, QueryBuilder};

use super::AuditRow;
use crate::error::Error;
use crate::ids::{JobId, JobState};

/// Which jobs [`job_browse`] lists. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct BrowseFilter<'a> {
    pub(crate) id: Option<i64>,
    pub(crate) state: Option<&'a str>,
    pub(crate) queue: Option<&'a str>,
    pub(crate) kind: Option<&'a str>,
    pub(crate) code: Option<&'a str>,
    /// Enqueued at or after.
    pub(crate) since: Option<DateTime<Utc>>,
    /// Enqueued before.
    pub(crate) until: Option<DateTime<Utc>>,
    /// Only ids below this one: the keyset of the next page.
    pub(crate) before: Option<i64>,
}

/// A job as a list shows it (no payload).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct JobSummary {
    /// The id.
    pub id: JobId,
    /// The kind.
    pub kind: String,
    /// The queue.
    pub queue: String,
    /// Its state.
    pub state: JobState,
    /// Attempts started so far.
    pub attempts: i32,
    /// The attempt budget.
    pub max_attempts: i32,
    /// Not before this time.
    pub run_after: DateTime<Utc>,
    /// The last failure's stable code.
    pub last_error_code: Option<String>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// Reached a terminal state at.
    pub finished_at: Option<DateTime<Utc>>,
}

fn browse_query(f: &BrowseFilter<'_>, limit: i64, explain: bool) -> QueryBuilder<Postgres> {
    let mut q = QueryBuilder::new(if explain { "EXPLAIN " } else { "" });
    q.push(
        "SELECT id, kind, queue, state, attempts, max_attempts, run_after, last_error_code,
                created_at, finished_at
         FROM jobq.jobs WHERE true",
    );
    if let Some(id) = f.id {
        q.push(" AND id = ").push_bind(id);
    }
    if let Some(state) = f.state {
        // A known state is written as a literal, so that the planner can prove the
        // partial index's predicate from it in a plan it keeps.
        match state.parse::<JobState>() {
            Ok(s) => q.push(format_args!(" AND state = '{}'", s.as_str())),
            Err(_) => q.push(" AND state = ").push_bind(state),
        };
    }
    if let Some(queue) = f.queue {
        q.push(" AND queue = ").push_bind(queue);
    }
    if let Some(kind) = f.kind {
        q.push(" AND kind = ").push_bind(kind);
    }
    if let Some(code) = f.code {
        q.push(" AND last_error_code = ").push_bind(code);
    }
    if let Some(since) = f.since {
        q.push(" AND created_at >= ").push_bind(since);
    }
    if let Some(until) = f.until {
        q.push(" AND created_at < ").push_bind(until);
    }
    if let Some(before) = f.before {
        q.push(" AND id < ").push_bind(before);
    }
    q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    q
}

/// Jobs matching `f`, newest (highest id) first, at most `limit`.
pub(crate) async fn job_browse(
    conn: &mut PgConnection,
    f: &BrowseFilter<'_>,
    limit: i64,
) -> Result<Vec<JobSummary>, Error> {
    Ok(browse_query(f, limit, false)
        .build_query_as::<JobSummary>()
        .fetch_all(&mut *conn)
        .await?)
}

/// The plan of [`job_browse`]'s statement for `f`, one line per row of `EXPLAIN`.
pub(crate) async fn job_browse_explain(
    conn: &mut PgConnection,
    f: &BrowseFilter<'_>,
    limit: i64,
) -> Result<Vec<String>, Error> {
    Ok(browse_query(f, limit, true)
        .build_query_scalar::<String>()
        .fetch_all(&mut *conn)
        .await?)
}

/// Failed jobs of one queue, kind and code.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct FailedGroup {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The last error's stable code (`None`: failed without one).
    pub code: Option<String>,
    /// Jobs in the group.
    pub count: i64,
    /// The most recent failure's finish time.
    pub last_finished_at: Option<DateTime<Utc>>,
}

/// Every `failed` job grouped by queue, kind and last error code, largest group first.
pub(crate) async fn job_failed_groups(conn: &mut PgConnection) -> Result<Vec<FailedGroup>, Error> {
    Ok(sqlx::query_as::<_, FailedGroup>(
        "SELECT queue, kind, last_error_code AS code, count(*) AS count,
                max(finished_at) AS last_finished_at
         FROM jobq.jobs WHERE state = 'failed'
         GROUP BY queue, kind, last_error_code
         ORDER BY count(*) DESC, queue, kind, last_error_code",
    )
    .fetch_all(&mut *conn)
    .await?)
}

/// Jobs finished in one minute.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct MinuteCount {
    /// The minute's start.
    pub minute: DateTime<Utc>,
    /// Finished `done`.
    pub done: i64,
    /// Finished `failed`.
    pub failed: i64,
}

/// Done and failed jobs per minute since `since` (minutes without any are left out), by
/// range scans of `jobs_finished_idx`.
pub(crate) async fn stats_per_minute(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
) -> Result<Vec<MinuteCount>, Error> {
    Ok(sqlx::query_as::<_, MinuteCount>(
        "SELECT date_bin('1 minute', finished_at, $1) AS minute,
                count(*) FILTER (WHERE state = 'done') AS done,
                count(*) FILTER (WHERE state = 'failed') AS failed
         FROM jobq.jobs
         WHERE state IN ('done', 'failed') AND finished_at >= $1
         GROUP BY 1 ORDER BY 1",
    )
    .bind(since)
    .fetch_all(&mut *conn)
    .await?)
}

/// Which audit rows [`audit_browse`] lists. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditBrowse<'a> {
    pub(crate) action: Option<&'a str>,
    pub(crate) actor: Option<&'a str>,
    pub(crate) job_id: Option<i64>,
    /// Only rows with an id below this one: the keyset of the next page.
    pub(crate) before: Option<i64>,
}

/// Audit rows matching `f`, newest first, at most `limit`.
pub(crate) async fn audit_browse(
    conn: &mut PgConnection,
    f: &AuditBrowse<'_>,
    limit: i64,
) -> Result<Vec<AuditRow>, Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "SELECT id, job_id, action, actor, reason, before_state, after_state, detail, created_at
         FROM jobq.job_audit WHERE true",
    );
    if let Some(action) = f.action {
        q.push(" AND action = ").push_bind(action);
    }
    if let Some(actor) = f.actor {
        q.push(" AND actor = ").push_bind(actor);
    }
    if let Some(job_id) = f.job_id {
        q.push(" AND job_id = ").push_bind(job_id);
    }
    if let Some(before) = f.before {
        q.push(" AND id < ").push_bind(before);
    }
    q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    Ok(q.build_query_as::<AuditRow>().fetch_all(&mut *conn).await?)
}
