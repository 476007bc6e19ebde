//! Statements on leases: heartbeats and the reaper's rescue of expired ones.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::ERROR_HISTORY_LEN;
use crate::error::Error;

/// One running attempt whose lease a heartbeat extends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRenewal {
    pub(crate) id: i64,
    /// The attempt's lease generation (its fence).
    pub(crate) fence: i64,
    pub(crate) lease_secs: f64,
}

/// What a heartbeat found for one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseStatus {
    /// The lease was extended; `cancel_requested` tells whether an operator asked to
    /// cancel the job while it runs.
    Extended {
        /// An operator asked to cancel this job.
        cancel_requested: bool,
    },
    /// The attempt still holds the job, but its row is locked by the handler's own
    /// transaction (complete-in-transaction); try again on the next beat.
    Busy,
    /// The attempt no longer holds the job.
    Lost,
}

/// Extends the leases of many running attempts in one statement, each fenced by
/// `(id, lease generation)`. Rows locked by a handler's own transaction are skipped, not waited
/// for, so one long transaction cannot stall every other lease. Results are in input
/// order.
pub(crate) async fn lease_extend_many(
    conn: &mut PgConnection,
    leases: &[LeaseRenewal],
) -> Result<Vec<LeaseStatus>, Error> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
    let gens: Vec<i64> = leases.iter().map(|l| l.fence).collect();
    let secs: Vec<f64> = leases.iter().map(|l| l.lease_secs).collect();
    // Matching results to inputs happens here, not in SQL: joining the UPDATE's output
    // back to its input inside the statement is quadratic (CTEs carry no statistics).
    // The input `unnest(…)` drives one primary-key probe per lease, as in
    // `job_complete_many` (looking each row's values up with `array_position` was
    // quadratic in the batch); `IS TRUE` keeps the partial lease index, which statistics
    // saying that nothing runs would make the planner prefer, out of the plan. The locked
    // rows are joined, not tested with `IN`: a semi-join to the CTE, estimated at one
    // row, rescanned it for every candidate.
    let extended: Vec<(i64, bool)> = sqlx::query_as(
        r#"
        WITH lockable AS MATERIALIZED (
            SELECT j.id, f.fence, f.secs
            FROM unnest($1::bigint[], $2::int8[], $3::float8[]) AS f(id, fence, secs)
            JOIN jobq.jobs j ON j.id = f.id
            WHERE (j.state = 'running') IS TRUE AND j.lease_gen = f.fence
            FOR NO KEY UPDATE OF j SKIP LOCKED
        )
        UPDATE jobq.jobs j
        SET locked_until = now() + make_interval(secs => l.secs)
        FROM lockable l
        WHERE j.id = l.id AND (j.state = 'running') IS TRUE AND j.lease_gen = l.fence
        RETURNING j.id, j.cancel_requested
        "#,
    )
    .bind(&ids)
    .bind(&gens)
    .bind(&secs)
    .fetch_all(&mut *conn)
    .await?;
    let extended: std::collections::HashMap<i64, bool> = extended.into_iter().collect();
    let missed: Vec<&LeaseRenewal> = leases
        .iter()
        .filter(|l| !extended.contains_key(&l.id))
        .collect();
    // Not extended: locked by the handler's own transaction (still held), or lost.
    let held: std::collections::HashSet<i64> = if missed.is_empty() {
        std::collections::HashSet::new()
    } else {
        let ids: Vec<i64> = missed.iter().map(|l| l.id).collect();
        let gens: Vec<i64> = missed.iter().map(|l| l.fence).collect();
        sqlx::query_scalar::<_, i64>(
            r#"
            SELECT j.id FROM unnest($1::bigint[], $2::int8[]) AS f(id, fence)
            JOIN jobq.jobs j ON j.id = f.id
            WHERE (j.state = 'running') IS TRUE AND j.lease_gen = f.fence
            "#,
        )
        .bind(&ids)
        .bind(&gens)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect()
    };
    Ok(leases
        .iter()
        .map(|l| match extended.get(&l.id) {
            Some(cancel_requested) => LeaseStatus::Extended {
                cancel_requested: *cancel_requested,
            },
            None if held.contains(&l.id) => LeaseStatus::Busy,
            None => LeaseStatus::Lost,
        })
        .collect())
}

/// What one reaper pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Jobs whose lease expired and that went back to `pending`.
    pub rescued: u64,
    /// Jobs whose lease expired on their last attempt and that went to `failed`
    /// (code `lease_expired`).
    pub failed: u64,
}

/// Rescues up to `limit` running jobs whose lease expired before `now`. The update
/// re-checks `state = 'running'` and the expired lease on the row it changes, so a job that
/// completed (or was heartbeated) meanwhile is never touched; SKIP LOCKED lets every node
/// run it at once.
pub(crate) async fn job_reap(
    conn: &mut PgConnection,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<ReapReport, Error> {
    let rows = sqlx::query(
        r#"
        WITH expired AS MATERIALIZED (
            SELECT id FROM jobq.jobs
            WHERE state = 'running' AND locked_until < coalesce($2, now())
            ORDER BY locked_until
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE jobq.jobs j
        SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                         WHEN j.attempts >= j.max_attempts THEN 'failed'
                         ELSE 'pending' END,
            finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                               THEN coalesce($2, now()) ELSE NULL END,
            run_after = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                             THEN j.run_after ELSE coalesce($2, now()) END,
            locked_until = NULL,
            locked_by = NULL,
            last_error_code = 'lease_expired',
            last_error = 'lease held by ' || coalesce(j.locked_by, 'unknown worker')
                         || ' expired at ' || j.locked_until::text
                         || ' before the attempt finished (worker crashed, paused or cut off)',
            first_failed_at = coalesce(j.first_failed_at, coalesce($2, now())),
            last_failed_at = coalesce($2, now()),
            errors = (CASE WHEN jsonb_array_length(j.errors) >= $3
                           THEN j.errors - 0 ELSE j.errors END)
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', j.attempts, 'at', coalesce($2, now()),
                            'code', 'lease_expired',
                            'message', 'lease held by ' || coalesce(j.locked_by, 'unknown worker') || ' expired',
                            'disposition', 'retryable'))
        FROM expired e
        WHERE j.id = e.id AND (j.state = 'running') IS TRUE
          AND j.locked_until < coalesce($2, now())
        RETURNING j.state
        "#,
    )
    .bind(limit)
    .bind(now)
    .bind(ERROR_HISTORY_LEN)
    .fetch_all(&mut *conn)
    .await?;
    let mut report = ReapReport::default();
    for r in rows {
        let state: String = r.try_get("state")?;
        if state == "pending" {
            report.rescued += 1;
        } else {
            report.failed += 1;
        }
    }
    Ok(report)
}

/// Extends one attempt's lease by `lease_secs` from the database's now, fenced by
/// `(id, lease generation)`.
pub(crate) async fn lease_extend_one(
    conn: &mut PgConnection,
    id: i64,
    fence: i64,
    lease_secs: f64,
) -> Result<bool, Error> {
    let done = sqlx::query(
        "UPDATE jobq.jobs SET locked_until = now() + make_interval(secs => $3)
         WHERE id = $1 AND lease_gen = $2 AND (state = 'running') IS TRUE",
    )
    .bind(id)
    .bind(fence)
    .bind(lease_secs)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
