//! Every SQL statement jobq-testing issues, one function each, named `noun_verb`.
//!
//! jobq's own `store` owns the statements of the runtime (claim, complete, fail); what is
//! here only creates and drops test databases and reads `jobq.jobs` for drains and
//! assertions.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};

/// Creates database `name` (a name this crate generated: `[a-z0-9_]` only).
pub(crate) async fn database_create(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(conn)
        .await?;
    Ok(())
}

/// Drops database `name`, cutting off the sessions still connected to it.
pub(crate) async fn database_drop(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(conn)
    .await?;
    Ok(())
}

/// One round trip that proves the server answers.
pub(crate) async fn server_ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query("SELECT 1").execute(conn).await?;
    Ok(())
}

/// The database's clock (start of this statement's transaction).
pub(crate) async fn clock_now(pool: &PgPool) -> sqlx::Result<DateTime<Utc>> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}

/// Pending jobs of some kinds, per queue.
#[derive(Debug, Clone)]
pub(crate) struct PendingQueue {
    pub(crate) queue: String,
    /// The earliest `run_after` among them.
    pub(crate) earliest: DateTime<Utc>,
}

/// Queues holding waiting jobs (`pending` or `scheduled`) of `kinds`, due or not, with their earliest due time.
pub(crate) async fn job_pending_queues(
    pool: &PgPool,
    kinds: &[String],
) -> sqlx::Result<Vec<PendingQueue>> {
    let rows = sqlx::query(
        r#"
        SELECT queue, min(run_after) AS earliest
        FROM jobq.jobs
        WHERE state IN ('pending', 'scheduled') AND kind = ANY($1)
        GROUP BY queue
        ORDER BY queue
        "#,
    )
    .bind(kinds)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(PendingQueue {
                queue: r.try_get("queue")?,
                earliest: r.try_get("earliest")?,
            })
        })
        .collect()
}

/// The first `limit` waiting jobs (`pending` or `scheduled`) of `kinds` in `queues`, as
/// `(id, kind)`.
pub(crate) async fn job_pending_sample(
    pool: &PgPool,
    kinds: &[String],
    queues: &[String],
    limit: i64,
) -> sqlx::Result<Vec<(i64, String)>> {
    sqlx::query_as(
        r#"
        SELECT id, kind FROM jobq.jobs
        WHERE state IN ('pending', 'scheduled') AND kind = ANY($1) AND queue = ANY($2)
        ORDER BY run_after, id
        LIMIT $3
        "#,
    )
    .bind(kinds)
    .bind(queues)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// A row of `jobq.jobs`, as the assertions show it.
#[derive(Debug, Clone)]
pub(crate) struct JobRow {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) state: jobq::JobState,
    pub(crate) attempts: i32,
    pub(crate) max_attempts: i32,
    pub(crate) run_after: DateTime<Utc>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) last_error_code: Option<String>,
    pub(crate) payload: serde_json::Value,
}

/// Every job of `kind` this connection can see (its own uncommitted inserts included),
/// oldest first.
pub(crate) async fn job_list_by_kind(
    conn: &mut PgConnection,
    kind: &str,
) -> sqlx::Result<Vec<JobRow>> {
    let rows = sqlx::query(
        r#"
        SELECT id, queue, priority, state, attempts, max_attempts, run_after, created_at,
               idempotency_key, last_error_code, payload
        FROM jobq.jobs
        WHERE kind = $1
        ORDER BY id
        "#,
    )
    .bind(kind)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(JobRow {
                id: r.try_get("id")?,
                queue: r.try_get("queue")?,
                priority: r.try_get("priority")?,
                state: r.try_get("state")?,
                attempts: r.try_get("attempts")?,
                max_attempts: r.try_get("max_attempts")?,
                run_after: r.try_get("run_after")?,
                created_at: r.try_get("created_at")?,
                idempotency_key: r.try_get("idempotency_key")?,
                last_error_code: r.try_get("last_error_code")?,
                payload: r.try_get("payload")?,
            })
        })
        .collect()
}
