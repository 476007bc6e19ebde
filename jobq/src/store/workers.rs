//! Statements on `jobq.workers`: each runtime's heartbeat row (queues with concurrency,
//! kinds with leases), so stats can tell running against capacity and spot kinds no live
//! worker serves.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use crate::error::Error;

/// Inserts or refreshes this runtime's row (`last_seen = now()`).
pub(crate) async fn worker_upsert(
    conn: &mut PgConnection,
    id: &str,
    queues: &serde_json::Value,
    kinds: &serde_json::Value,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO jobq.workers (id, queues, kinds) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE
         SET queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, last_seen = now()",
    )
    .bind(id)
    .bind(queues)
    .bind(kinds)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Deletes this runtime's row (on shutdown).
pub(crate) async fn worker_delete(conn: &mut PgConnection, id: &str) -> Result<(), Error> {
    sqlx::query("DELETE FROM jobq.workers WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Deletes rows unseen for `older_than_secs`; returns how many.
pub(crate) async fn worker_delete_stale(
    conn: &mut PgConnection,
    older_than_secs: f64,
) -> Result<u64, Error> {
    let done =
        sqlx::query("DELETE FROM jobq.workers WHERE last_seen < now() - make_interval(secs => $1)")
            .bind(older_than_secs)
            .execute(&mut *conn)
            .await?;
    Ok(done.rows_affected())
}

/// A live runtime as its heartbeat row describes it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerRow {
    pub(crate) id: String,
    pub(crate) queues: serde_json::Value,
    pub(crate) kinds: serde_json::Value,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) last_seen: DateTime<Utc>,
}

/// Runtimes seen within `max_age_secs`.
pub(crate) async fn worker_list_live(
    conn: &mut PgConnection,
    max_age_secs: f64,
) -> Result<Vec<WorkerRow>, Error> {
    let rows = sqlx::query(
        "SELECT id, queues, kinds, started_at, last_seen FROM jobq.workers
         WHERE last_seen >= now() - make_interval(secs => $1) ORDER BY id",
    )
    .bind(max_age_secs)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(WorkerRow {
                id: r.try_get("id")?,
                queues: r.try_get("queues")?,
                kinds: r.try_get("kinds")?,
                started_at: r.try_get("started_at")?,
                last_seen: r.try_get("last_seen")?,
            })
        })
        .collect()
}
