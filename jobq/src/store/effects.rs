//! Statements a handler runs inside its own transaction: the effect ledger and
//! complete-in-transaction. Both are fenced by the attempt's `(id, lease generation)`.
//! The fence check locks the job row for the rest of the caller's transaction, so a
//! rescue (the reaper, another claim, an operator) waits for that transaction and a
//! stale attempt's effect can never commit after its job changed hands. The ledger's
//! primary key does the rest: a second attempt inserting the same key waits for the
//! first attempt's transaction and then sees its key.

use sqlx::PgConnection;

use crate::error::Error;

/// Whether `(id, fence)` still holds its job, as the caller's transaction sees it; when
/// it does, the row stays locked (`FOR NO KEY UPDATE`) until that transaction ends.
pub(crate) async fn job_fence_check(
    conn: &mut PgConnection,
    id: i64,
    fence: i64,
) -> Result<bool, Error> {
    let held: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM jobq.jobs WHERE id = $1 AND lease_gen = $2 AND (state = 'running') IS TRUE
         FOR NO KEY UPDATE",
    )
    .bind(id)
    .bind(fence)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(held.is_some())
}

/// Records `key` in the effect ledger for job `id`. Returns `true` if the key is new.
/// A concurrent transaction holding the same key makes this wait for it, then see it.
pub(crate) async fn effect_record(
    conn: &mut PgConnection,
    key: &str,
    id: i64,
    attempt: i32,
) -> Result<bool, Error> {
    let inserted = sqlx::query(
        "INSERT INTO jobq.job_effects (effect_key, job_id, attempt) VALUES ($1, $2, $3)
         ON CONFLICT (effect_key) DO NOTHING",
    )
    .bind(key)
    .bind(id)
    .bind(attempt)
    .execute(&mut *conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Marks the job `done` from inside the handler's transaction, fenced by
/// `(id, lease generation)`. Returns whether it applied.
pub(crate) async fn job_complete_in_tx(
    conn: &mut PgConnection,
    id: i64,
    fence: i64,
) -> Result<bool, Error> {
    let done = sqlx::query(
        "UPDATE jobq.jobs SET state = 'done', finished_at = now(), locked_until = NULL, locked_by = NULL
         WHERE id = $1 AND lease_gen = $2 AND (state = 'running') IS TRUE",
    )
    .bind(id)
    .bind(fence)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
