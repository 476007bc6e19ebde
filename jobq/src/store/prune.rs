//! Retention: deleting terminal jobs in bounded batches, with their effect-ledger rows.
//!
//! An effect key is deleted only together with its job, so it outlives every possible
//! replay of that job (a replay needs the row; once the row is gone nothing can replay
//! it).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Error;

/// Which terminal rows one prune statement selects.
#[derive(Debug, Clone)]
pub(crate) struct PruneParams<'a> {
    /// `done`, `failed` or `cancelled`.
    pub(crate) state: &'a str,
    /// Rows that finished before this time.
    pub(crate) before: DateTime<Utc>,
    /// Only this kind (a per-kind override); `None`: every kind not in `except_kinds`.
    pub(crate) kind: Option<&'a str>,
    /// Kinds with their own retention, left to their own statements.
    pub(crate) except_kinds: &'a [String],
}

/// A failed job that parks its ordering key is kept until an operator replays, cancels or
/// unparks it: deleting it would let the jobs behind it run unannounced.
const PRUNE_WHERE: &str = "state = $1 AND finished_at < $2
      AND ($3::text IS NULL OR kind = $3)
      AND ($3::text IS NOT NULL OR NOT (kind = ANY($4)))
      AND NOT (state = 'failed' AND ordering_key IS NOT NULL AND NOT ordering_skipped)";

/// Deletes up to `batch` matching rows that finished at `from` or later (`None`: any
/// time), oldest first, skipping rows another transaction holds, and their effect-ledger
/// rows. Returns how many jobs it deleted (fewer than `batch`: nothing more is due) and
/// when the last of them had finished, where the pass's next batch starts.
///
/// Starting there matters while a snapshot is held open somewhere: the index entries of
/// the rows a pass deleted stay until vacuum may remove them, and each batch reading
/// from the oldest walked every one of them (a pass of many batches read quadratically).
pub(crate) async fn job_prune_batch(
    conn: &mut PgConnection,
    p: &PruneParams<'_>,
    from: Option<DateTime<Utc>>,
    batch: i64,
) -> Result<(u64, Option<DateTime<Utc>>), Error> {
    let sql = format!(
        r#"
        WITH doomed AS MATERIALIZED (
            SELECT id FROM jobq.jobs
            WHERE state IN ('done', 'failed', 'cancelled') AND {PRUNE_WHERE}
              AND finished_at >= coalesce($6, '-infinity'::timestamptz)
            ORDER BY finished_at
            LIMIT $5
            FOR UPDATE SKIP LOCKED
        ),
        del AS (
            DELETE FROM jobq.jobs j USING doomed d
            WHERE j.id = d.id AND j.state = $1
            RETURNING j.id, j.finished_at
        ),
        effects AS (
            DELETE FROM jobq.job_effects e USING del WHERE e.job_id = del.id
        )
        SELECT count(*), max(finished_at) FROM del
        "#
    );
    let (n, last): (i64, Option<DateTime<Utc>>) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(p.state)
        .bind(p.before)
        .bind(p.kind)
        .bind(p.except_kinds)
        .bind(batch)
        .bind(from)
        .fetch_one(&mut *conn)
        .await?;
    Ok((u64::try_from(n).unwrap_or(0), last))
}

/// How many rows a prune with `p` would delete now.
pub(crate) async fn job_prune_count(
    conn: &mut PgConnection,
    p: &PruneParams<'_>,
) -> Result<u64, Error> {
    let sql = format!(
        "SELECT count(*) FROM jobq.jobs
         WHERE state IN ('done', 'failed', 'cancelled') AND {PRUNE_WHERE}"
    );
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(p.state)
        .bind(p.before)
        .bind(p.kind)
        .bind(p.except_kinds)
        .fetch_one(&mut *conn)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Records a prune pass in `jobq.job_audit` (`action = 'prune'`, counts in `detail`):
/// inserts its row when `row` is `None`, else replaces that row's counts. Returns the
/// row's id. Run in the transaction of the batch whose deletions it counts.
pub(crate) async fn audit_prune_pass(
    conn: &mut PgConnection,
    row: Option<i64>,
    actor: &str,
    detail: &serde_json::Value,
) -> Result<i64, Error> {
    let id = match row {
        None => {
            sqlx::query_scalar(
                "INSERT INTO jobq.job_audit (job_id, action, actor, reason, detail)
                 VALUES (NULL, 'prune', $1, 'retention policy', $2) RETURNING id",
            )
            .bind(actor)
            .bind(detail)
            .fetch_one(&mut *conn)
            .await?
        }
        Some(id) => {
            sqlx::query_scalar("UPDATE jobq.job_audit SET detail = $2 WHERE id = $1 RETURNING id")
                .bind(id)
                .bind(detail)
                .fetch_one(&mut *conn)
                .await?
        }
    };
    Ok(id)
}

/// Takes the session-level advisory lock `key` on this connection if it is free.
pub(crate) async fn advisory_lock_try(conn: &mut PgConnection, key: i64) -> Result<bool, Error> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await?)
}

/// Whether this connection still works (and so still holds its session locks).
pub(crate) async fn connection_ping(conn: &mut PgConnection) -> Result<(), Error> {
    sqlx::query("SELECT 1").execute(&mut *conn).await?;
    Ok(())
}

/// Releases the session-level advisory lock `key` held by this connection.
pub(crate) async fn advisory_unlock(conn: &mut PgConnection, key: i64) -> Result<bool, Error> {
    Ok(sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await?)
}

/// This connection's server process id.
pub(crate) async fn connection_backend_pid(conn: &mut PgConnection) -> Result<i32, Error> {
    Ok(sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await?)
}
