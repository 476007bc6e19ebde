//! The statements of `jobq-testing`, exposed to it as `jobq::__testing`: creating and
//! dropping test databases, and reading `jobq.jobs` for drains and assertions. Not part
//! of jobq's interface. They return `sqlx::Result`, as `jobq-testing` reports them.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};

/// Creates database `name` (a name this crate generated: `[a-z0-9_]` only).
pub async fn database_create(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(conn)
        .await?;
    Ok(())
}

/// Drops database `name`, cutting off the sessions still connected to it.
pub async fn database_drop(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(conn)
    .await?;
    Ok(())
}

/// One round trip that proves the server answers.
pub async fn server_ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query("SELECT 1").execute(conn).await?;
    Ok(())
}

/// The database's clock (start of this statement's transaction).
pub async fn clock_now(pool: &PgPool) -> sqlx::Result<DateTime<Utc>> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}

/// Pending jobs of some kinds, per queue.
#[derive(Debug, Clone)]
pub struct PendingQueue {
    /// The queue.
    pub queue: String,
    /// The earliest `run_after` among them.
    pub earliest: DateTime<Utc>,
}

/// Queues holding waiting jobs (`pending` or `scheduled`) of `kinds`, due or not, with their earliest due time.
pub async fn job_pending_queues(
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
pub async fn job_pending_sample(
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
pub struct JobRow {
    /// The id.
    pub id: crate::ids::JobId,
    /// The queue.
    pub queue: String,
    /// Smaller runs first.
    pub priority: i16,
    /// Its state.
    pub state: crate::ids::JobState,
    /// Attempts started so far.
    pub attempts: i32,
    /// The attempt budget.
    pub max_attempts: i32,
    /// Not before this time.
    pub run_after: DateTime<Utc>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The last failure's stable code.
    pub last_error_code: Option<String>,
    /// The arguments.
    pub payload: serde_json::Value,
}

/// Every job of `kind` this connection can see (its own uncommitted inserts included),
/// oldest first.
pub async fn job_list_by_kind(conn: &mut PgConnection, kind: &str) -> sqlx::Result<Vec<JobRow>> {
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
                id: crate::ids::JobId(r.try_get("id")?),
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
