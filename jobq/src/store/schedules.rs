//! Statements on `jobq.schedules` (periodic jobs) and the expiry of jobs past their
//! maximum age.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Row};

use super::{Actor, ERROR_HISTORY_LEN, NOTIFY_CHANNEL, NewJob};
use crate::error::Error;

/// A schedule as a runtime registers it.
#[derive(Debug)]
pub(crate) struct ScheduleUpsert<'a> {
    pub(crate) name: &'a str,
    pub(crate) expression: &'a str,
    pub(crate) tz: &'a str,
    pub(crate) missed: &'a str,
    /// The job each slot copies: kind, queue, args, version, priority, attempts, age.
    pub(crate) job: &'a NewJob,
    /// The first slot after now, for a new schedule or a changed expression.
    pub(crate) first_slot: DateTime<Utc>,
}

/// Writes a schedule's row: a new one starts at `first_slot`; a changed expression or
/// zone restarts there; otherwise the cursor, the last slot and the pause are kept.
pub(crate) async fn schedule_upsert(
    conn: &mut PgConnection,
    s: &ScheduleUpsert<'_>,
) -> Result<(), Error> {
    sqlx::query(
        r#"
        INSERT INTO jobq.schedules AS s
            (name, kind, queue, expression, tz, missed, args, payload_version, priority,
             max_attempts, max_age_secs, next_slot)
        VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9, $10, $11, $12)
        ON CONFLICT (name) DO UPDATE SET
            kind = EXCLUDED.kind, queue = EXCLUDED.queue, missed = EXCLUDED.missed,
            args = EXCLUDED.args, payload_version = EXCLUDED.payload_version,
            priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
            max_age_secs = EXCLUDED.max_age_secs,
            next_slot = CASE WHEN (s.expression, s.tz) IS DISTINCT FROM
                                  (EXCLUDED.expression, EXCLUDED.tz)
                             THEN EXCLUDED.next_slot ELSE s.next_slot END,
            expression = EXCLUDED.expression, tz = EXCLUDED.tz,
            updated_at = now()
        WHERE (s.kind, s.queue, s.expression, s.tz, s.missed, s.args, s.payload_version,
               s.priority, s.max_attempts, s.max_age_secs)
              IS DISTINCT FROM
              (EXCLUDED.kind, EXCLUDED.queue, EXCLUDED.expression, EXCLUDED.tz,
               EXCLUDED.missed, EXCLUDED.args, EXCLUDED.payload_version, EXCLUDED.priority,
               EXCLUDED.max_attempts, EXCLUDED.max_age_secs)
        "#,
    )
    .bind(s.name)
    .bind(&s.job.kind)
    .bind(&s.job.queue)
    .bind(s.expression)
    .bind(s.tz)
    .bind(s.missed)
    .bind(&s.job.payload)
    .bind(s.job.time.payload_version)
    .bind(s.job.priority)
    .bind(s.job.max_attempts)
    .bind(s.job.time.max_age_secs)
    .bind(s.first_slot)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Which of `names` are due at `now` (not paused, cursor reached).
pub(crate) async fn schedules_due(
    conn: &mut PgConnection,
    names: &[String],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<String>, Error> {
    Ok(sqlx::query_scalar(
        "SELECT name FROM jobq.schedules
         WHERE name = ANY($1) AND NOT paused AND next_slot <= coalesce($2, now())
         ORDER BY name",
    )
    .bind(names)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?)
}

/// A schedule's row as the pass that holds it sees it.
#[derive(Debug)]
pub(crate) struct ScheduleLocked {
    pub(crate) next_slot: DateTime<Utc>,
    pub(crate) paused: bool,
    /// The pass's "now".
    pub(crate) now: DateTime<Utc>,
}

/// Locks a schedule's row for this transaction, or `None` when another node holds it.
pub(crate) async fn schedule_lock(
    conn: &mut PgConnection,
    name: &str,
    now: Option<DateTime<Utc>>,
) -> Result<Option<ScheduleLocked>, Error> {
    let row = sqlx::query(
        "SELECT next_slot, paused, coalesce($2, now()) AS now FROM jobq.schedules
         WHERE name = $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(name)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| {
        Ok(ScheduleLocked {
            next_slot: r.try_get("next_slot")?,
            paused: r.try_get("paused")?,
            now: r.try_get("now")?,
        })
    })
    .transpose()
}

/// Moves a schedule's cursor to `next`, and records its last enqueued slot and job.
pub(crate) async fn schedule_advance(
    conn: &mut PgConnection,
    name: &str,
    next: DateTime<Utc>,
    last: Option<(DateTime<Utc>, i64)>,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE jobq.schedules
         SET next_slot = $2, last_slot = coalesce($3, last_slot),
             last_job_id = coalesce($4, last_job_id), updated_at = now()
         WHERE name = $1",
    )
    .bind(name)
    .bind(next)
    .bind(last.map(|l| l.0))
    .bind(last.map(|l| l.1))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Fails up to `batch` pending jobs past their maximum age or deadline with code
/// `expired`, without running them. Returns how many.
///
/// The update's state test is written `IS TRUE` so that it finds its rows by primary key:
/// with statistics that say almost nothing is pending (a queue kept empty by its workers),
/// the planner walked every `pending` entry of `jobs_state_id_idx` to join them to the few
/// due rows, which under a held snapshot is every job claimed since it was taken.
pub(crate) async fn job_expire_due(
    conn: &mut PgConnection,
    batch: i64,
    now: Option<DateTime<Utc>>,
) -> Result<u64, Error> {
    let done = sqlx::query(
        r#"
        WITH due AS (
            SELECT id FROM jobq.jobs
            WHERE state = 'pending' AND expires_at IS NOT NULL
              AND expires_at <= coalesce($2, now())
            ORDER BY expires_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE jobq.jobs j
        SET state = 'failed', last_error_code = 'expired',
            last_error = 'not run: past its maximum age or deadline (' || j.expires_at || ')',
            finished_at = coalesce($2, now()),
            first_failed_at = coalesce(j.first_failed_at, coalesce($2, now())),
            last_failed_at = coalesce($2, now()),
            errors = (CASE WHEN jsonb_array_length(j.errors) >= $3
                           THEN j.errors - 0 ELSE j.errors END)
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', j.attempts, 'at', coalesce($2, now()),
                            'code', 'expired', 'message', 'past its maximum age',
                            'disposition', 'permanent'))
        FROM due
        WHERE j.id = due.id AND (j.state = 'pending') IS TRUE
        "#,
    )
    .bind(batch)
    .bind(now)
    .bind(ERROR_HISTORY_LEN)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// A schedule as operators see it (`jobq schedules`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleRow {
    /// The stable name.
    pub name: String,
    /// The kind its jobs are.
    pub kind: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// The cron expression, or `every 15m`.
    pub expression: String,
    /// The time zone the expression is read in.
    pub tz: String,
    /// The missed-slot policy.
    pub missed: String,
    /// The earliest slot not yet handled.
    pub next_slot: DateTime<Utc>,
    /// The last slot enqueued.
    pub last_slot: Option<DateTime<Utc>>,
    /// The job of the last slot.
    pub last_job_id: Option<i64>,
    /// That job's state (`None` once pruned).
    pub last_job_state: Option<String>,
    /// Whether an operator paused it.
    pub paused: bool,
    /// Who paused it.
    pub paused_by: Option<String>,
}

/// Every schedule, by name.
pub(crate) async fn schedules_list(conn: &mut PgConnection) -> Result<Vec<ScheduleRow>, Error> {
    let rows = sqlx::query(
        r#"
        SELECT s.name, s.kind, s.queue, s.expression, s.tz, s.missed, s.next_slot,
               s.last_slot, s.last_job_id, j.state AS last_job_state, s.paused, s.paused_by
        FROM jobq.schedules s LEFT JOIN jobq.jobs j ON j.id = s.last_job_id
        ORDER BY s.name
        "#,
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ScheduleRow {
                name: r.try_get("name")?,
                kind: r.try_get("kind")?,
                queue: r.try_get("queue")?,
                expression: r.try_get("expression")?,
                tz: r.try_get("tz")?,
                missed: r.try_get("missed")?,
                next_slot: r.try_get("next_slot")?,
                last_slot: r.try_get("last_slot")?,
                last_job_id: r.try_get("last_job_id")?,
                last_job_state: r.try_get("last_job_state")?,
                paused: r.try_get("paused")?,
                paused_by: r.try_get("paused_by")?,
            })
        })
        .collect()
}

/// Pauses or resumes a schedule, with an audit row (`schedule_pause` / `schedule_resume`).
/// Returns whether it was paused before, or `None` for an unknown name.
pub(crate) async fn schedule_set_paused(
    conn: &mut PgConnection,
    name: &str,
    paused: bool,
    actor: Actor<'_>,
) -> Result<Option<bool>, Error> {
    Ok(sqlx::query_scalar(
        r#"
        WITH before AS (SELECT name, paused FROM jobq.schedules WHERE name = $1 FOR UPDATE),
        up AS (
            UPDATE jobq.schedules s
            SET paused = $2, paused_at = CASE WHEN $2 THEN now() END,
                paused_by = CASE WHEN $2 THEN $3 END, updated_at = now()
            FROM before b WHERE s.name = b.name
            RETURNING s.name
        ),
        audit AS (
            INSERT INTO jobq.job_audit (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT NULL, CASE WHEN $2 THEN 'schedule_pause' ELSE 'schedule_resume' END, $3, $4,
                   CASE WHEN b.paused THEN 'paused' ELSE 'active' END,
                   CASE WHEN $2 THEN 'paused' ELSE 'active' END,
                   jsonb_build_object('schedule', $1)
            FROM up, before b
        )
        SELECT b.paused FROM before b, (SELECT count(*) FROM up) u
        "#,
    )
    .bind(name)
    .bind(paused)
    .bind(actor.name)
    .bind(actor.reason)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Enqueues one job of a schedule now, outside its slots (keyed
/// `schedule:<name>:run-now:<time>`), with an audit row (`schedule_run_now`). Returns
/// the job's id, or `None` for an unknown name.
pub(crate) async fn schedule_run_now(
    conn: &mut PgConnection,
    name: &str,
    actor: Actor<'_>,
) -> Result<Option<i64>, Error> {
    Ok(sqlx::query_scalar(
        r#"
        WITH s AS (SELECT * FROM jobq.schedules WHERE name = $1),
        ins AS (
            INSERT INTO jobq.jobs
                (kind, queue, payload, payload_version, priority, max_attempts,
                 idempotency_key, expires_at)
            SELECT s.kind, s.queue, s.args, s.payload_version, s.priority, s.max_attempts,
                   'schedule:' || s.name || ':run-now:' || clock_timestamp(),
                   now() + make_interval(secs => s.max_age_secs)
            FROM s
            RETURNING id, queue
        ),
        audit AS (
            INSERT INTO jobq.job_audit (job_id, action, actor, reason, after_state, detail)
            SELECT ins.id, 'schedule_run_now', $2, $3, 'pending',
                   jsonb_build_object('schedule', $1)
            FROM ins
        ),
        wake AS (SELECT pg_notify($4, queue) FROM ins)
        SELECT ins.id FROM ins, (SELECT count(*) FROM wake) w
        "#,
    )
    .bind(name)
    .bind(actor.name)
    .bind(actor.reason)
    .bind(NOTIFY_CHANNEL)
    .fetch_optional(&mut *conn)
    .await?)
}
