//! The reads behind `jobq::stats`: each is a scan of a partial index (pending and running
//! rows), or index-only range scans of `jobs_kind_finished_idx` per kind over a recent
//! window, so they stay cheap however many finished rows the table keeps.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use crate::error::Error;

/// Pending and running jobs of one (queue, kind).
#[derive(Debug, Clone)]
pub(crate) struct LiveCounts {
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) due: i64,
    /// Due, but waiting behind an earlier job of their ordering key.
    pub(crate) blocked: i64,
    pub(crate) scheduled: i64,
    pub(crate) retrying: i64,
    pub(crate) running: i64,
    pub(crate) oldest_due_run_after: Option<DateTime<Utc>>,
    pub(crate) oldest_due_created_at: Option<DateTime<Utc>>,
}

/// Counts waiting (due, scheduled, waiting for a retry: states `pending` and `scheduled`,
/// by `run_after` against `now`, so a scheduled job the promoter has not reached yet
/// counts as due; a due job waiting behind an earlier job of its ordering key counts as
/// blocked instead) and running jobs per queue and kind, with the oldest due job's
/// `run_after` and `created_at`. Each branch matches one
/// partial index's predicate.
pub(crate) async fn stats_live(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> Result<Vec<LiveCounts>, Error> {
    let rows = sqlx::query(
        r#"
        SELECT queue, kind,
               count(*) FILTER (WHERE state <> 'running' AND run_after <= $1
                                  AND blocked_by IS NULL) AS due,
               count(*) FILTER (WHERE state <> 'running' AND run_after <= $1
                                  AND blocked_by IS NOT NULL) AS blocked,
               count(*) FILTER (WHERE state <> 'running' AND run_after > $1 AND attempts = 0)
                   AS scheduled,
               count(*) FILTER (WHERE state <> 'running' AND run_after > $1 AND attempts > 0)
                   AS retrying,
               count(*) FILTER (WHERE state = 'running') AS running,
               min(run_after) FILTER (WHERE state <> 'running' AND run_after <= $1
                                            AND blocked_by IS NULL) AS oldest_due_run_after,
               min(created_at) FILTER (WHERE state <> 'running' AND run_after <= $1
                                            AND blocked_by IS NULL) AS oldest_due_created_at
        FROM (
            SELECT queue, kind, state, run_after, attempts, created_at, blocked_by
            FROM jobq.jobs WHERE state = 'pending'
            UNION ALL
            SELECT queue, kind, state, run_after, attempts, created_at, blocked_by
            FROM jobq.jobs WHERE state = 'scheduled'
            UNION ALL
            SELECT queue, kind, state, run_after, attempts, created_at, blocked_by
            FROM jobq.jobs WHERE state = 'running'
        ) j
        GROUP BY queue, kind
        ORDER BY queue, kind
        "#,
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(LiveCounts {
                queue: r.try_get("queue")?,
                kind: r.try_get("kind")?,
                due: r.try_get("due")?,
                blocked: r.try_get("blocked")?,
                scheduled: r.try_get("scheduled")?,
                retrying: r.try_get("retrying")?,
                running: r.try_get("running")?,
                oldest_due_run_after: r.try_get("oldest_due_run_after")?,
                oldest_due_created_at: r.try_get("oldest_due_created_at")?,
            })
        })
        .collect()
}

/// The distinct kinds among finished rows, by a loose index scan of
/// `jobs_kind_finished_idx` (one probe per kind, not one row per job).
const FINISHED_KINDS: &str = r#"
    WITH RECURSIVE kinds AS (
        (SELECT kind FROM jobq.jobs WHERE state IN ('done', 'failed', 'cancelled')
         ORDER BY kind LIMIT 1)
        UNION ALL
        SELECT (SELECT j.kind FROM jobq.jobs j
                WHERE j.state IN ('done', 'failed', 'cancelled') AND j.kind > k.kind
                ORDER BY j.kind LIMIT 1)
        FROM kinds k WHERE k.kind IS NOT NULL
    )
"#;

/// Jobs of one (queue, kind, state, code) that finished in the window.
#[derive(Debug, Clone)]
pub(crate) struct FinishedCounts {
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) state: String,
    /// The last error code, for `failed` rows; `None` otherwise.
    pub(crate) code: Option<String>,
    pub(crate) count: i64,
}

/// Counts jobs finished since `since`, per queue, kind, state and (for failures) code.
pub(crate) async fn stats_finished(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
) -> Result<Vec<FinishedCounts>, Error> {
    let sql = format!(
        r#"{FINISHED_KINDS}
        SELECT k.kind, x.queue, x.state, x.code, x.n
        FROM kinds k
        CROSS JOIN LATERAL (
            SELECT j.queue, j.state,
                   CASE WHEN j.state = 'failed' THEN j.last_error_code END AS code,
                   count(*) AS n
            FROM jobq.jobs j
            WHERE j.state IN ('done', 'failed', 'cancelled')
              AND j.kind = k.kind AND j.finished_at >= $1
            GROUP BY 1, 2, 3
        ) x
        WHERE k.kind IS NOT NULL
        ORDER BY x.queue, k.kind, x.state, x.code
        "#
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(since)
        .fetch_all(&mut *conn)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(FinishedCounts {
                queue: r.try_get("queue")?,
                kind: r.try_get("kind")?,
                state: r.try_get("state")?,
                code: r.try_get("code")?,
                count: r.try_get("n")?,
            })
        })
        .collect()
}

/// Jobs waiting for a retry whose last failure is in the window, per queue,
/// kind and code.
pub(crate) async fn stats_retrying_codes(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
) -> Result<Vec<FinishedCounts>, Error> {
    let rows = sqlx::query(
        r#"
        SELECT queue, kind, last_error_code AS code, count(*) AS n
        FROM jobq.jobs
        WHERE state IN ('scheduled', 'pending') AND attempts > 0 AND last_failed_at >= $1
        GROUP BY 1, 2, 3
        ORDER BY 1, 2, 3
        "#,
    )
    .bind(since)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(FinishedCounts {
                queue: r.try_get("queue")?,
                kind: r.try_get("kind")?,
                state: "scheduled".to_owned(),
                code: r.try_get("code")?,
                count: r.try_get("n")?,
            })
        })
        .collect()
}

/// Run-time percentiles of one kind.
#[derive(Debug, Clone)]
pub(crate) struct RunTimes {
    pub(crate) kind: String,
    pub(crate) samples: i64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// p50, p99 and max of `finished_at - started_at` (the last attempt's run time) over the
/// `samples` most recent jobs of each kind that finished `done` or `failed` since `since`.
pub(crate) async fn stats_run_times(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
    samples: i64,
) -> Result<Vec<RunTimes>, Error> {
    let sql = format!(
        r#"{FINISHED_KINDS}
        SELECT k.kind, p.samples, p.p50, p.p99, p.max
        FROM kinds k
        CROSS JOIN LATERAL (
            SELECT count(*) AS samples,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY s.secs) AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY s.secs) AS p99,
                   max(s.secs) AS max
            FROM (
                SELECT extract(epoch FROM j.finished_at - j.started_at)::float8 AS secs
                FROM jobq.jobs j
                WHERE j.state IN ('done', 'failed', 'cancelled')
                  AND j.kind = k.kind AND j.finished_at >= $1
                  AND j.state IN ('done', 'failed') AND j.started_at IS NOT NULL
                ORDER BY j.finished_at DESC
                LIMIT $2
            ) s
        ) p
        WHERE k.kind IS NOT NULL AND p.samples > 0
        ORDER BY k.kind
        "#
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(since)
        .bind(samples)
        .fetch_all(&mut *conn)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(RunTimes {
                kind: r.try_get("kind")?,
                samples: r.try_get("samples")?,
                p50: r.try_get::<Option<f64>, _>("p50")?.unwrap_or(0.0),
                p99: r.try_get::<Option<f64>, _>("p99")?.unwrap_or(0.0),
                max: r.try_get::<Option<f64>, _>("max")?.unwrap_or(0.0),
            })
        })
        .collect()
}

/// A queue's row in `jobq.queues`.
#[derive(Debug, Clone)]
pub(crate) struct QueueRow {
    pub(crate) name: String,
    pub(crate) paused: bool,
    pub(crate) paused_at: Option<DateTime<Utc>>,
    pub(crate) paused_by: Option<String>,
}

/// Every row of `jobq.queues`.
pub(crate) async fn queue_list(conn: &mut PgConnection) -> Result<Vec<QueueRow>, Error> {
    let rows =
        sqlx::query("SELECT name, paused, paused_at, paused_by FROM jobq.queues ORDER BY name")
            .fetch_all(&mut *conn)
            .await?;
    rows.into_iter()
        .map(|r| {
            Ok(QueueRow {
                name: r.try_get("name")?,
                paused: r.try_get("paused")?,
                paused_at: r.try_get("paused_at")?,
                paused_by: r.try_get("paused_by")?,
            })
        })
        .collect()
}

/// The database's clock.
pub(crate) async fn db_now(conn: &mut PgConnection) -> Result<DateTime<Utc>, Error> {
    Ok(sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await?)
}

/// Due pending jobs (not waiting behind their ordering key) and the oldest one's
/// `run_after`, for each of `queues` that has any (the metrics gauges). A scheduled job
/// whose time has come but which the promoter has not reached yet counts as due.
///
/// Each state is counted through its own partial index (`jobs_claim_kind_idx`, whose
/// leading column is the queue, and `jobs_scheduled_idx`), so the count reads the due
/// rows of those queues only: every node runs it on each heartbeat, and as one scan of
/// the states it read future jobs, finished history and other queues too. The queue test
/// of the scheduled part is written `IS TRUE` so the planner cannot pick `jobs_queue_idx`
/// for it, which holds every scheduled and finished row of the queue.
pub(crate) async fn queue_depths(
    conn: &mut PgConnection,
    queues: &[String],
) -> Result<Vec<(String, i64, Option<f64>)>, Error> {
    let rows = sqlx::query(
        r#"
        SELECT queue, sum(n)::int8 AS depth,
               extract(epoch FROM now() - min(oldest))::float8 AS oldest_age
        FROM (
            SELECT queue, count(*) AS n, min(run_after) AS oldest FROM jobq.jobs
            WHERE state = 'pending' AND blocked_by IS NULL AND queue = ANY($1)
              AND run_after <= now()
            GROUP BY queue
            UNION ALL
            SELECT queue, count(*), min(run_after) FROM jobq.jobs
            WHERE state = 'scheduled' AND run_after <= now() AND (queue = ANY($1)) IS TRUE
              AND blocked_by IS NULL
            GROUP BY queue
        ) due
        GROUP BY queue
        "#,
    )
    .bind(queues)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok((
                r.try_get("queue")?,
                r.try_get("depth")?,
                r.try_get("oldest_age")?,
            ))
        })
        .collect()
}
