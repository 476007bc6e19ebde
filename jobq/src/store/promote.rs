//! The promoter's statement: scheduled jobs that are due become pending.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::NOTIFY_CHANNEL;
use crate::error::Error;

/// Moves up to `limit` `scheduled` jobs whose `run_after` has come (by `now`, or the
/// database's clock) to `pending`, oldest due first, and wakes their queues' producers on
/// commit. Rows another node is promoting are skipped (`SKIP LOCKED`) and the update
/// re-checks the state, so any number of nodes may run it at once and each job is
/// promoted exactly once. Returns how many it promoted; fewer than `limit` means none is
/// left due.
pub(crate) async fn job_promote_due(
    conn: &mut PgConnection,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<u64, Error> {
    let n: i64 = sqlx::query_scalar(
        r#"
        WITH due AS MATERIALIZED (
            SELECT id FROM jobq.jobs
            WHERE state = 'scheduled' AND run_after <= coalesce($2, now())
            ORDER BY run_after
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        upd AS (
            UPDATE jobq.jobs j SET state = 'pending'
            FROM due d
            WHERE j.id = d.id AND (j.state = 'scheduled') IS TRUE
            RETURNING j.queue
        ),
        wake AS (
            SELECT pg_notify($3, q.queue) FROM (SELECT DISTINCT queue FROM upd) q
        )
        SELECT count(*) FROM upd WHERE (SELECT count(*) FROM wake) >= 0
        "#,
    )
    .bind(limit)
    .bind(now)
    .bind(NOTIFY_CHANNEL)
    .fetch_one(&mut *conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
