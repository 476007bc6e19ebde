//! Operator statements: replay, cancel, retry now, payload correction, pause and resume,
//! and the reads behind `failed` and `show`. Every write is conditional on the state it
//! expects, in the same statement, and writes its `jobq.job_audit` row in that statement,
//! so an action and its audit commit together or not at all.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::NOTIFY_CHANNEL;
use crate::error::Error;
use crate::rows::{AuditRow, JobRow, TerminalJob, Transition};

/// Who acts and why, written to every audit row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Actor<'a> {
    pub(crate) name: &'a str,
    pub(crate) reason: Option<&'a str>,
}

fn transitions(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<Transition>, Error> {
    rows.into_iter()
        .map(|r| {
            Ok(Transition {
                id: r.try_get("id")?,
                before: r.try_get("before_state")?,
                after: r.try_get("after_state")?,
            })
        })
        .collect()
}

/// Replays failed or cancelled jobs: back to `pending`, due now, with their id,
/// idempotency key and error history kept, and one more attempt allowed when their
/// budget is spent (`max_attempts = greatest(max_attempts, attempts + 1)`). Running,
/// pending and done jobs are left alone. Writes one audit row per replayed job and wakes
/// their queues on commit.
pub(crate) async fn job_replay_many(
    conn: &mut PgConnection,
    ids: &[i64],
    actor: Actor<'_>,
) -> Result<Vec<Transition>, Error> {
    let rows = sqlx::query(
        r#"
        WITH target AS MATERIALIZED (
            SELECT id, state, max_attempts FROM jobq.jobs
            WHERE id = ANY($1) AND state IN ('failed', 'cancelled')
            ORDER BY id
            FOR UPDATE
        ),
        upd AS (
            UPDATE jobq.jobs j
            SET state = 'pending', run_after = now(), finished_at = NULL,
                cancel_requested = false, locked_until = NULL, locked_by = NULL,
                max_attempts = greatest(j.max_attempts, j.attempts + 1)
            FROM target t
            WHERE j.id = t.id AND j.state IN ('failed', 'cancelled')
            RETURNING j.id, j.queue, j.attempts, t.state AS before_state,
                      'pending'::text AS after_state,
                      t.max_attempts AS max_before, j.max_attempts AS max_after
        ),
        audit AS (
            INSERT INTO jobq.job_audit
                (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT id, 'replay', $2, $3, before_state, after_state,
                   jsonb_build_object('attempts', attempts,
                                      'max_attempts_before', max_before,
                                      'max_attempts_after', max_after)
            FROM upd
        ),
        wake AS (
            SELECT pg_notify($4, q.queue) FROM (SELECT DISTINCT queue FROM upd) q
        )
        SELECT id, before_state, after_state, (SELECT count(*) FROM wake) AS woke
        FROM upd ORDER BY id
        "#,
    )
    .bind(ids)
    .bind(actor.name)
    .bind(actor.reason)
    .bind(NOTIFY_CHANNEL)
    .fetch_all(&mut *conn)
    .await?;
    transitions(rows)
}

/// Cancels a job: `scheduled`, `pending` or `failed` becomes `cancelled` at once; a `running` job gets
/// `cancel_requested` (its attempt finishes, then the runtime writes `cancelled` instead
/// of a retry, and its heartbeat cancels the attempt's context). Audited as `cancel` or
/// `cancel_requested`.
pub(crate) async fn job_cancel(
    conn: &mut PgConnection,
    id: i64,
    actor: Actor<'_>,
) -> Result<Option<Transition>, Error> {
    let rows = sqlx::query(
        r#"
        WITH target AS MATERIALIZED (
            SELECT id, state FROM jobq.jobs
            WHERE id = $1
              AND (state IN ('scheduled', 'pending', 'failed')
                   OR (state = 'running' AND NOT cancel_requested))
            FOR UPDATE
        ),
        upd AS (
            UPDATE jobq.jobs j
            SET state = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
                cancel_requested = true,
                finished_at = CASE WHEN t.state = 'running' THEN j.finished_at ELSE now() END
            FROM target t
            WHERE j.id = t.id AND j.state = t.state
            RETURNING j.id, t.state AS before_state, j.state AS after_state
        ),
        audit AS (
            INSERT INTO jobq.job_audit (job_id, action, actor, reason, before_state, after_state)
            SELECT id, CASE WHEN before_state = 'running' THEN 'cancel_requested' ELSE 'cancel' END,
                   $2, $3, before_state, after_state
            FROM upd
        )
        SELECT id, before_state, after_state FROM upd
        "#,
    )
    .bind(id)
    .bind(actor.name)
    .bind(actor.reason)
    .fetch_all(&mut *conn)
    .await?;
    Ok(transitions(rows)?.pop())
}

/// Makes a job that waits (`scheduled`: for its backoff or a scheduled time) `pending`
/// and due at `now`.
pub(crate) async fn job_retry_now(
    conn: &mut PgConnection,
    id: i64,
    actor: Actor<'_>,
    now: Option<DateTime<Utc>>,
) -> Result<Option<Transition>, Error> {
    let rows = sqlx::query(
        r#"
        WITH target AS MATERIALIZED (
            SELECT id, state, run_after FROM jobq.jobs
            WHERE id = $1 AND state IN ('scheduled', 'pending') AND run_after > coalesce($4, now())
            FOR UPDATE
        ),
        upd AS (
            UPDATE jobq.jobs j SET state = 'pending', run_after = coalesce($4, now())
            FROM target t
            WHERE j.id = t.id AND j.state = t.state
            RETURNING j.id, j.queue, t.run_after AS run_after_before,
                      t.state AS before_state, 'pending'::text AS after_state
        ),
        audit AS (
            INSERT INTO jobq.job_audit
                (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT id, 'retry_now', $2, $3, before_state, after_state,
                   jsonb_build_object('run_after_before', run_after_before)
            FROM upd
        ),
        wake AS (SELECT pg_notify($5, queue) FROM upd)
        SELECT id, before_state, after_state, (SELECT count(*) FROM wake) AS woke FROM upd
        "#,
    )
    .bind(id)
    .bind(actor.name)
    .bind(actor.reason)
    .bind(now)
    .bind(NOTIFY_CHANNEL)
    .fetch_all(&mut *conn)
    .await?;
    Ok(transitions(rows)?.pop())
}

/// Replaces the payload of a `failed` or `cancelled` job (to fix it before a replay).
/// The audit row keeps the payload before and after, so a correction can be undone.
pub(crate) async fn job_payload_update(
    conn: &mut PgConnection,
    id: i64,
    payload: &str,
    actor: Actor<'_>,
) -> Result<Option<Transition>, Error> {
    let rows = sqlx::query(
        r#"
        WITH target AS MATERIALIZED (
            SELECT id, state, payload FROM jobq.jobs
            WHERE id = $1 AND state IN ('failed', 'cancelled')
            FOR UPDATE
        ),
        upd AS (
            UPDATE jobq.jobs j SET payload = $4::text::jsonb
            FROM target t
            WHERE j.id = t.id AND j.state = t.state
            RETURNING j.id, t.state AS before_state, j.state AS after_state,
                      t.payload AS payload_before, j.payload AS payload_after
        ),
        audit AS (
            INSERT INTO jobq.job_audit
                (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT id, 'edit_payload', $2, $3, before_state, after_state,
                   jsonb_build_object('payload_before', payload_before,
                                      'payload_after', payload_after)
            FROM upd
        )
        SELECT id, before_state, after_state FROM upd
        "#,
    )
    .bind(id)
    .bind(actor.name)
    .bind(actor.reason)
    .bind(payload)
    .fetch_all(&mut *conn)
    .await?;
    Ok(transitions(rows)?.pop())
}

/// Pauses (`paused = true`) or resumes a queue, with an audit row (`pause` / `resume`,
/// before and after `active` / `paused`). Resuming wakes the queue's producers. Returns
/// whether the queue was paused before.
pub(crate) async fn queue_set_paused(
    conn: &mut PgConnection,
    queue: &str,
    paused: bool,
    actor: Actor<'_>,
) -> Result<bool, Error> {
    let was: bool = sqlx::query_scalar(
        r#"
        WITH before AS (
            SELECT coalesce((SELECT paused FROM jobq.queues WHERE name = $1 FOR UPDATE), false)
                AS paused
        ),
        up AS (
            INSERT INTO jobq.queues AS q (name, paused, paused_at, paused_by, reason, updated_at)
            VALUES ($1, $2, CASE WHEN $2 THEN now() END, CASE WHEN $2 THEN $3 END, $4, now())
            ON CONFLICT (name) DO UPDATE
            SET paused = EXCLUDED.paused,
                paused_at = CASE WHEN EXCLUDED.paused AND q.paused THEN q.paused_at
                                 ELSE EXCLUDED.paused_at END,
                paused_by = CASE WHEN EXCLUDED.paused AND q.paused THEN q.paused_by
                                 ELSE EXCLUDED.paused_by END,
                reason = EXCLUDED.reason,
                updated_at = now()
            RETURNING name
        ),
        audit AS (
            INSERT INTO jobq.job_audit (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT NULL, CASE WHEN $2 THEN 'pause' ELSE 'resume' END, $3, $4,
                   CASE WHEN b.paused THEN 'paused' ELSE 'active' END,
                   CASE WHEN $2 THEN 'paused' ELSE 'active' END,
                   jsonb_build_object('queue', $1)
            FROM up, before b
        ),
        wake AS (SELECT pg_notify($5, name) FROM up WHERE NOT $2)
        SELECT b.paused FROM before b, (SELECT count(*) FROM wake) w
        "#,
    )
    .bind(queue)
    .bind(paused)
    .bind(actor.name)
    .bind(actor.reason)
    .bind(NOTIFY_CHANNEL)
    .fetch_one(&mut *conn)
    .await?;
    Ok(was)
}

/// Whether `queue` is known: it has jobs, a live or recent worker serves it, or it has a
/// row in `jobq.queues`. Each test is an index probe (pending rows: the claim index, or
/// `jobs_blocked_queue_idx` for those waiting behind their ordering key; running rows: few; every other state: `jobs_queue_idx`), so a queue without jobs
/// costs no scan of the table.
pub(crate) async fn queue_exists(conn: &mut PgConnection, queue: &str) -> Result<bool, Error> {
    let known: bool = sqlx::query_scalar(
        r#"
        SELECT EXISTS (SELECT 1 FROM jobq.queues WHERE name = $1)
            OR EXISTS (SELECT 1 FROM jobq.workers WHERE queues ? $1)
            OR EXISTS (SELECT 1 FROM jobq.jobs
                       WHERE state = 'pending' AND blocked_by IS NULL AND queue = $1)
            OR EXISTS (SELECT 1 FROM jobq.jobs
                       WHERE state = 'pending' AND blocked_by IS NOT NULL AND queue = $1)
            OR EXISTS (SELECT 1 FROM jobq.jobs WHERE state = 'running' AND queue = $1)
            OR EXISTS (SELECT 1 FROM jobq.jobs
                       WHERE state IN ('scheduled', 'done', 'failed', 'cancelled')
                         AND queue = $1)
        "#,
    )
    .bind(queue)
    .fetch_one(&mut *conn)
    .await?;
    Ok(known)
}

/// One job, every column. The payload is fetched as text and parsed here, so a row serde
/// cannot parse is still displayable.
pub(crate) async fn job_get(conn: &mut PgConnection, id: i64) -> Result<Option<JobRow>, Error> {
    let row = sqlx::query_as::<_, JobRow>(
        "SELECT id, kind, queue, payload::text AS payload_text, payload_version, state, priority, attempts,
                max_attempts, run_after, locked_until, locked_by, idempotency_key,
                last_error_code, last_error, errors, cancel_requested, created_at, started_at,
                first_failed_at, last_failed_at, finished_at, output, trace_context,
                ordering_scope, ordering_key, blocked_by, ordering_skipped,
                CASE WHEN j.blocked_by IS NOT NULL AND j.state IN ('scheduled', 'pending') THEN
                    (SELECT f.id FROM jobq.jobs f
                     WHERE f.ordering_scope = j.ordering_scope AND f.ordering_key = j.ordering_key
                       AND f.id < j.id AND f.state = 'failed' AND NOT f.ordering_skipped
                     ORDER BY f.id LIMIT 1)
                END AS parked_behind
         FROM jobq.jobs j WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|mut row| {
        row.payload = serde_json::from_str(&row.payload_text).unwrap_or_default();
        row
    }))
}

/// The audit rows of one job, oldest first.
pub(crate) async fn audit_list_for_job(
    conn: &mut PgConnection,
    job_id: i64,
) -> Result<Vec<AuditRow>, Error> {
    Ok(sqlx::query_as::<_, AuditRow>(
        "SELECT id, job_id, action, actor, reason, before_state, after_state, detail, created_at
         FROM jobq.job_audit WHERE job_id = $1 ORDER BY id",
    )
    .bind(job_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// The most recent audit rows, newest first.
pub(crate) async fn audit_list_recent(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<AuditRow>, Error> {
    Ok(sqlx::query_as::<_, AuditRow>(
        "SELECT id, job_id, action, actor, reason, before_state, after_state, detail, created_at
         FROM jobq.job_audit ORDER BY created_at DESC, id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?)
}

/// Which terminal jobs a list or a bulk replay selects. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct TerminalFilter<'a> {
    /// `failed`, `cancelled`, or both.
    pub(crate) states: &'a [&'a str],
    pub(crate) kind: Option<&'a str>,
    pub(crate) queue: Option<&'a str>,
    pub(crate) code: Option<&'a str>,
    /// Finished at or after.
    pub(crate) since: Option<DateTime<Utc>>,
    /// Finished before.
    pub(crate) until: Option<DateTime<Utc>>,
}

const TERMINAL_WHERE: &str = "state = ANY($1)
      AND ($2::text IS NULL OR kind = $2)
      AND ($3::text IS NULL OR queue = $3)
      AND ($4::text IS NULL OR last_error_code = $4)
      AND finished_at >= coalesce($5, '-infinity'::timestamptz)
      AND finished_at < coalesce($6, 'infinity'::timestamptz)";

/// Terminal jobs matching `f`, newest first, at most `limit`.
pub(crate) async fn job_list_terminal(
    conn: &mut PgConnection,
    f: &TerminalFilter<'_>,
    limit: i64,
) -> Result<Vec<TerminalJob>, Error> {
    let sql = format!(
        "SELECT id, kind, queue, state, attempts, last_error_code, last_error, created_at,
                finished_at
         FROM jobq.jobs
         WHERE state IN ('failed', 'cancelled') AND {TERMINAL_WHERE}
         ORDER BY finished_at DESC, id DESC LIMIT $7"
    );
    Ok(sqlx::query_as::<_, TerminalJob>(sqlx::AssertSqlSafe(sql))
        .bind(f.states)
        .bind(f.kind)
        .bind(f.queue)
        .bind(f.code)
        .bind(f.since)
        .bind(f.until)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?)
}

/// Ids of terminal jobs matching `f` with an id above `after`, ascending, at most
/// `limit` (the keyset a bulk replay pages through).
pub(crate) async fn job_ids_terminal(
    conn: &mut PgConnection,
    f: &TerminalFilter<'_>,
    after: i64,
    limit: i64,
) -> Result<Vec<i64>, Error> {
    let sql = format!(
        "SELECT id FROM jobq.jobs
         WHERE state IN ('failed', 'cancelled') AND {TERMINAL_WHERE} AND id > $7
         ORDER BY id LIMIT $8"
    );
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(f.states)
        .bind(f.kind)
        .bind(f.queue)
        .bind(f.code)
        .bind(f.since)
        .bind(f.until)
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?)
}

/// How many terminal jobs match `f`.
pub(crate) async fn job_count_terminal(
    conn: &mut PgConnection,
    f: &TerminalFilter<'_>,
) -> Result<u64, Error> {
    let sql = format!(
        "SELECT count(*) FROM jobq.jobs
         WHERE state IN ('failed', 'cancelled') AND {TERMINAL_WHERE}"
    );
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(f.states)
        .bind(f.kind)
        .bind(f.queue)
        .bind(f.code)
        .bind(f.since)
        .bind(f.until)
        .fetch_one(&mut *conn)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A job's state, for explaining why an action did not apply (`None`: no such job).
pub(crate) async fn job_state_get(
    conn: &mut PgConnection,
    id: i64,
) -> Result<Option<String>, Error> {
    Ok(
        sqlx::query_scalar("SELECT state FROM jobq.jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?,
    )
}
