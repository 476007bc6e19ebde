//! Statements on `jobq.jobs`: insert, claim, complete, fail, hand back.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::{Db, ERROR_HISTORY_LEN, NewEvent, NewJob, Wake, truncate_message};
use crate::error::{Disposition, Error};
use crate::ids::JobId;
use crate::rows::Enqueued;

/// The single insert of a job with an idempotency key: a duplicate key returns the
/// existing row. `$event` is nothing, or an outbox row's CTE (`"ev AS (", …, "), ",`)
/// written ahead of `ins`.
macro_rules! keyed_insert_sql {
    ($($event:tt)*) => {
        concat!(
            "WITH ", $($event)* r#"ins AS (
            INSERT INTO jobq.jobs
                (kind, queue, payload, priority, max_attempts, run_after, idempotency_key, state)
            SELECT $1, $2, $3::text::jsonb, $4, $5, t.at, $8, "#,
            state_sql!("t.at"),
            r#"
            FROM (SELECT coalesce($6, now() + make_interval(secs => coalesce($7, 0))) AS at) t
            ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id
        )
        SELECT ins.id, false AS duplicate, "#,
            wake_one_sql!("$9", "$10"),
            " AS woke, ",
            database_sql!(),
            r#" AS db
        FROM ins
        UNION ALL
        SELECT j.id, true, 0, NULL FROM jobq.jobs j
        WHERE $8::text IS NOT NULL AND j.kind = $1 AND j.idempotency_key = $8
          AND NOT EXISTS (SELECT 1 FROM ins)
        "#
        )
    };
}

/// The single insert of a job without an idempotency key, the common case: no conflict
/// is possible, so a plain `INSERT … VALUES … RETURNING`, without the CTE, sub-select
/// and conflict handling of [`keyed_insert_sql!`] (each cost a one-row insert a tenth or
/// so of its throughput). `due` leaves `run_after` and `state` to their defaults (now,
/// `pending`) and numbers the wake-up `$6`, `$7`; `timed` computes them from `$6`, `$7`
/// and numbers it `$8`, `$9`. `$event` is nothing, or `"WITH ev AS ("`, an outbox row,
/// `") "`.
macro_rules! unkeyed_insert_sql {
    (due; $($event:tt)*) => {
        concat!(
            $($event)* r#"INSERT INTO jobq.jobs (kind, queue, payload, priority, max_attempts)
            VALUES ($1, $2, $3::text::jsonb, $4, $5)
            RETURNING id, "#,
            wake_one_sql!("$6", "$7"),
            " AS woke, ",
            database_sql!(),
            " AS db"
        )
    };
    (timed; $($event:tt)*) => {
        concat!(
            $($event)* r#"INSERT INTO jobq.jobs
                (kind, queue, payload, priority, max_attempts, run_after, state)
            VALUES ($1, $2, $3::text::jsonb, $4, $5, "#,
            run_after_sql!("$6", "$7"),
            ", ",
            state_sql!(run_after_sql!("$6", "$7")),
            r#")
            RETURNING id, "#,
            wake_one_sql!("$8", "$9"),
            " AS woke, ",
            database_sql!(),
            " AS db"
        )
    };
}

/// A new job's `run_after` from its parameters: the time at `$at`, else now plus the
/// seconds at `$delay` (NULL: none).
macro_rules! run_after_sql {
    ($at:literal, $delay:literal) => {
        concat!(
            "coalesce(",
            $at,
            "::timestamptz, now() + make_interval(secs => coalesce(",
            $delay,
            "::float8, 0)))"
        )
    };
}

/// Inserts one job, absorbing a duplicate idempotency key, and wakes producers as `wake`
/// says if it inserted; returns the database it ran in (see [`Db`]). `events` are
/// written to `jobq.outbox` with it, duplicate or not: one event rides the job's own
/// statement (a CTE) when the job needs only one; otherwise as [`job_insert_batch`].
pub(crate) async fn job_insert(
    conn: &mut PgConnection,
    job: &NewJob,
    wake: Wake<'_>,
    events: &[NewEvent],
) -> Result<(Enqueued, Db), Error> {
    let one_statement = job.ordering.is_none() && job.is_plain();
    match events {
        [] if one_statement => job_insert_plain(conn, job, wake, None).await,
        [] => job_insert_general(conn, job, wake).await,
        [event] if one_statement => job_insert_plain(conn, job, wake, Some(event)).await,
        _ => {
            let (mut e, db) =
                job_insert_batch(conn, std::slice::from_ref(job), wake, events).await?;
            Ok((e.remove(0), db))
        }
    }
}

/// [`job_insert_many`] with `events` written to `jobq.outbox` before the jobs, both
/// inside a savepoint (a transaction on a connection with none open), so they stand or
/// fall together.
pub(crate) async fn job_insert_batch(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
    events: &[NewEvent],
) -> Result<(Vec<Enqueued>, Db), Error> {
    if events.is_empty() {
        return job_insert_many(conn, jobs, wake).await;
    }
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    super::outbox_insert(&mut tx, events).await?;
    let done = job_insert_many(&mut tx, jobs, wake).await?;
    tx.commit().await?;
    Ok(done)
}

/// A job with an ordering key or options beyond the plain columns: the statements of
/// `ordering.rs` and `unique.rs`.
async fn job_insert_general(
    conn: &mut PgConnection,
    job: &NewJob,
    wake: Wake<'_>,
) -> Result<(Enqueued, Db), Error> {
    let (mut e, db) = if job.ordering.is_some() {
        super::job_insert_ordered(conn, std::slice::from_ref(job), wake).await?
    } else {
        super::job_insert_timed(conn, std::slice::from_ref(job), wake).await?
    };
    Ok((e.remove(0), db))
}

/// A job with only the plain columns, in one statement, with `event` in a CTE of it.
async fn job_insert_plain(
    conn: &mut PgConnection,
    job: &NewJob,
    wake: Wake<'_>,
    event: Option<&NewEvent>,
) -> Result<(Enqueued, Db), Error> {
    if job.idempotency_key.is_none() {
        let q = if job.run_after.is_none() && job.delay_secs.is_none() {
            let q = match event {
                None => sqlx::query(unkeyed_insert_sql!(due;)),
                Some(_) => sqlx::query(unkeyed_insert_sql!(due;
                    "WITH ev AS (",
                    outbox_row_sql!("$8", "$9", "$10", "$11", "$12", "$13", "$14"),
                    ") ",
                )),
            };
            bind_columns_due(q, job)
        } else {
            let q = match event {
                None => sqlx::query(unkeyed_insert_sql!(timed;)),
                Some(_) => sqlx::query(unkeyed_insert_sql!(timed;
                    "WITH ev AS (",
                    outbox_row_sql!("$10", "$11", "$12", "$13", "$14", "$15", "$16"),
                    ") ",
                )),
            };
            bind_job(q, job)
        };
        let q = q.bind(wake.queues.first()).bind(wake.recent);
        let row = NewEvent::bind_opt(event, q).fetch_one(&mut *conn).await?;
        let enqueued = Enqueued {
            id: JobId(row.try_get("id")?),
            duplicate: false,
            replaced: false,
        };
        return Ok((enqueued, row.try_get("db")?));
    }
    let q = match event {
        None => sqlx::query(keyed_insert_sql!()),
        Some(_) => sqlx::query(keyed_insert_sql!(
            "ev AS (",
            outbox_row_sql!("$11", "$12", "$13", "$14", "$15", "$16", "$17"),
            "), ",
        )),
    };
    let q = bind_job(q, job)
        .bind(&job.idempotency_key)
        .bind(wake.queues.first())
        .bind(wake.recent);
    let row = NewEvent::bind_opt(event, q)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(row) = row {
        let enqueued = Enqueued {
            id: JobId(row.try_get("id")?),
            duplicate: row.try_get("duplicate")?,
            replaced: false,
        };
        return Ok((enqueued, row.try_get("db")?));
    }
    // The conflicting row was committed by a concurrent transaction after this
    // statement's snapshot was taken: look again with a fresh snapshot.
    let id = job_find_by_key(conn, &job.kind, job.idempotency_key.as_deref()).await?;
    match id {
        Some(id) => Ok((
            Enqueued {
                id,
                duplicate: true,
                replaced: false,
            },
            None,
        )),
        None => Err(Error::invalid(
            "idempotency_conflict",
            format!(
                "job of kind `{}` conflicted on its idempotency key, but the existing row is not visible (is this a REPEATABLE READ transaction?)",
                job.kind
            ),
        )),
    }
}

async fn job_find_by_key(
    conn: &mut PgConnection,
    kind: &str,
    key: Option<&str>,
) -> Result<Option<JobId>, Error> {
    let Some(key) = key else { return Ok(None) };
    let id: Option<i64> =
        sqlx::query_scalar("SELECT id FROM jobq.jobs WHERE kind = $1 AND idempotency_key = $2")
            .bind(kind)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(id.map(JobId))
}

/// A batch of jobs as column arrays, for `unnest(…)`.
struct Columns<'a> {
    kinds: Vec<&'a str>,
    queues: Vec<&'a str>,
    payloads: Vec<&'a str>,
    priorities: Vec<i16>,
    max_attempts: Vec<i32>,
    /// `None` when no job has one: a multi-argument `unnest` pads a NULL array with
    /// NULLs, so the usual batch sends no column of NULLs.
    run_afters: Option<Vec<Option<DateTime<Utc>>>>,
    /// As `run_afters`.
    delays: Option<Vec<Option<f64>>>,
    keys: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn of(jobs: &'a [NewJob]) -> Self {
        Columns {
            kinds: jobs.iter().map(|j| j.kind.as_str()).collect(),
            queues: jobs.iter().map(|j| j.queue.as_str()).collect(),
            payloads: jobs.iter().map(|j| j.payload.as_str()).collect(),
            priorities: jobs.iter().map(|j| j.priority).collect(),
            max_attempts: jobs.iter().map(|j| j.max_attempts).collect(),
            run_afters: jobs
                .iter()
                .any(|j| j.run_after.is_some())
                .then(|| jobs.iter().map(|j| j.run_after).collect()),
            delays: jobs
                .iter()
                .any(|j| j.delay_secs.is_some())
                .then(|| jobs.iter().map(|j| j.delay_secs).collect()),
            keys: jobs.iter().map(|j| j.idempotency_key.as_deref()).collect(),
        }
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds a job's columns as `$1`–`$7` (kind, queue, payload, priority, max_attempts,
/// run_after, delay in seconds), as the single-job inserts number them.
fn bind_job<'q>(q: PgQuery<'q>, job: &'q NewJob) -> PgQuery<'q> {
    bind_columns_due(q, job)
        .bind(job.run_after)
        .bind(job.delay_secs)
}

/// Binds `$1`–`$5` of [`bind_job`]: a job due at once needs no time columns.
fn bind_columns_due<'q>(q: PgQuery<'q>, job: &'q NewJob) -> PgQuery<'q> {
    q.bind(&job.kind)
        .bind(&job.queue)
        .bind(&job.payload)
        .bind(job.priority)
        .bind(job.max_attempts)
}

/// Binds a batch's column arrays as `$1`–`$7`, in the order of [`bind_job`].
fn bind_columns<'q>(q: PgQuery<'q>, c: &'q Columns<'q>) -> PgQuery<'q> {
    q.bind(&c.kinds)
        .bind(&c.queues)
        .bind(&c.payloads)
        .bind(&c.priorities)
        .bind(&c.max_attempts)
        .bind(&c.run_afters)
        .bind(&c.delays)
}

/// Inserts many jobs in one statement (UNNEST), in input order; duplicates by idempotency
/// key (against existing rows or earlier in the batch) come back with the existing id.
/// `wake` as for [`job_insert`].
pub(crate) async fn job_insert_many(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<(Vec<Enqueued>, Db), Error> {
    if jobs.iter().any(|j| j.ordering.is_some()) {
        return super::job_insert_ordered(conn, jobs, wake).await;
    }
    job_insert_many_unordered(conn, jobs, wake).await
}

/// [`job_insert_many`] without ordering keys (ordered jobs go through
/// [`job_insert_ordered`](super::job_insert_ordered), which calls this under their keys'
/// locks and chains them after).
pub(crate) async fn job_insert_many_unordered(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<(Vec<Enqueued>, Db), Error> {
    if jobs.is_empty() {
        return Ok((Vec::new(), None));
    }
    if jobs.iter().any(|j| !j.is_plain()) {
        return super::job_insert_timed(conn, jobs, wake).await;
    }
    if jobs.iter().all(|j| j.idempotency_key.is_none()) {
        return job_insert_many_unkeyed(conn, jobs, wake).await;
    }
    let n = jobs.len();
    let c = Columns::of(jobs);
    let rows = bind_columns(
        sqlx::query(concat!(
            r#"
        WITH input AS (
            -- Ids are drawn up front so each input row knows its own; a duplicate's
            -- drawn id is simply never used.
            SELECT t.*, nextval('jobq.jobs_id_seq') AS new_id
            FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                        $6::timestamptz[], $7::float8[], $8::text[])
                 WITH ORDINALITY AS t(kind, queue, payload, priority, max_attempts,
                                      run_after, delay, idempotency_key, ord)
        ),
        ins AS (
            INSERT INTO jobq.jobs
                (id, kind, queue, payload, priority, max_attempts, run_after, idempotency_key,
                 state)
            SELECT new_id, kind, queue, payload::jsonb, priority, max_attempts, at,
                   idempotency_key, "#,
            state_sql!("at"),
            r#"
            FROM input,
                 LATERAL (SELECT coalesce(run_after, CASE WHEN delay IS NULL THEN now()
                                          ELSE now() + make_interval(secs => delay) END) AS at) t
            ORDER BY ord
            ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id, kind, idempotency_key
        )
        SELECT i.ord,
               coalesce(n.id, dup.id) AS id,
               (n.id IS NULL) AS duplicate,
               "#,
            wake_columns_sql!("$9", "$10"),
            r#"
        FROM input i
        LEFT JOIN ins n ON n.id = i.new_id
        LEFT JOIN LATERAL (
            -- The CASE keeps the planner from scanning `ins` once per unkeyed row
            -- (quadratic in the batch size).
            SELECT CASE WHEN i.idempotency_key IS NOT NULL AND n.id IS NULL THEN coalesce(
                (SELECT x.id FROM ins x
                 WHERE x.kind = i.kind AND x.idempotency_key = i.idempotency_key),
                (SELECT j.id FROM jobq.jobs j
                 WHERE j.kind = i.kind AND j.idempotency_key = i.idempotency_key)
            ) END AS id
        ) dup ON n.id IS NULL
        ORDER BY i.ord
        "#
        )),
        &c,
    )
    .bind(&c.keys)
    .bind(wake.queues)
    .bind(wake.recent)
    .fetch_all(&mut *conn)
    .await?;
    let db = db_of(&rows)?;
    let mut out = Vec::with_capacity(n);
    for (job, row) in jobs.iter().zip(rows) {
        let id: Option<i64> = row.try_get("id")?;
        let duplicate: bool = row.try_get("duplicate")?;
        let id = match id {
            Some(id) => JobId(id),
            // Committed concurrently after our snapshot: look again.
            None => job_find_by_key(conn, &job.kind, job.idempotency_key.as_deref())
                .await?
                .ok_or_else(|| {
                    Error::invalid(
                        "idempotency_conflict",
                        format!(
                            "job of kind `{}` conflicted on its idempotency key, but the existing row is not visible",
                            job.kind
                        ),
                    )
                })?,
        };
        out.push(Enqueued {
            id,
            duplicate,
            replaced: false,
        });
    }
    Ok((out, db))
}

/// `job_insert_many` for a batch in which no job has an idempotency key, the common
/// bulk case: no conflict is possible, so the statement is a plain `INSERT … SELECT FROM
/// unnest(…)` with ids drawn up front, and returns them in input order as one array in
/// one row, without the general statement's per-row duplicate lookups.
async fn job_insert_many_unkeyed(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<(Vec<Enqueued>, Db), Error> {
    let n = jobs.len();
    let row = match uniform(jobs) {
        Some(first) => job_insert_many_uniform(conn, first, jobs, wake).await?,
        None => job_insert_many_columns(conn, jobs, wake).await?,
    };
    let db: Db = row.try_get("db")?;
    let ids: Vec<i64> = row.try_get("ids")?;
    if ids.len() != n {
        return Err(Error::invalid(
            "insert_count_mismatch",
            format!(
                "inserted a batch of {n} jobs but got {} ids back",
                ids.len()
            ),
        ));
    }
    let enqueued = ids
        .into_iter()
        .map(|id| Enqueued {
            id: JobId(id),
            duplicate: false,
            replaced: false,
        })
        .collect();
    Ok((enqueued, db))
}

/// The one result row of an unkeyed batch insert whose CTE `input` drew `new_id` for
/// each input row `ord`: the ids in input order, the wake-up ([`wake_sql!`]) and the
/// database.
macro_rules! unkeyed_batch_result_sql {
    ($queues:literal, $recent:literal) => {
        concat!(
            "SELECT (SELECT array_agg(new_id ORDER BY ord) FROM input) AS ids, ",
            wake_sql!($queues, $recent),
            " AS woke, ",
            database_sql!(),
            " AS db"
        )
    };
}

/// The first job of `jobs` if every job of the batch has its kind, queue, priority and
/// maximum attempts and none has a time: the batch `J::enqueue_many` makes with the
/// kind's defaults, which [`job_insert_many_uniform`] writes.
fn uniform(jobs: &[NewJob]) -> Option<&NewJob> {
    let first = jobs.first()?;
    jobs.iter()
        .all(|j| {
            j.kind == first.kind
                && j.queue == first.queue
                && j.priority == first.priority
                && j.max_attempts == first.max_attempts
                && j.run_after.is_none()
                && j.delay_secs.is_none()
        })
        .then_some(first)
}

/// The unkeyed batch insert of a [`uniform`] batch: the payloads are its only array and
/// every row is due at once, so the statement does what a hand-written `INSERT … SELECT
/// FROM unnest(…)` does (the per-row columns and time arithmetic of
/// [`job_insert_many_columns`] cost about a tenth of bulk throughput).
async fn job_insert_many_uniform(
    conn: &mut PgConnection,
    first: &NewJob,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<sqlx::postgres::PgRow, Error> {
    let payloads: Vec<&str> = jobs.iter().map(|j| j.payload.as_str()).collect();
    let row = sqlx::query(concat!(
        r#"
        WITH input AS (
            SELECT t.payload, t.ord, nextval('jobq.jobs_id_seq') AS new_id
            FROM unnest($1::text[]) WITH ORDINALITY AS t(payload, ord)
        ),
        ins AS (
            INSERT INTO jobq.jobs
                (id, kind, queue, payload, priority, max_attempts, run_after, state)
            SELECT new_id, $2, $3, payload::jsonb, $4, $5, now(), 'pending'
            FROM input
        )
        "#,
        unkeyed_batch_result_sql!("$6", "$7")
    ))
    .bind(&payloads)
    .bind(&first.kind)
    .bind(&first.queue)
    .bind(first.priority)
    .bind(first.max_attempts)
    .bind(wake.queues)
    .bind(wake.recent)
    .fetch_one(&mut *conn)
    .await?;
    Ok(row)
}

/// The unkeyed batch insert of any plain batch, each column an array.
async fn job_insert_many_columns(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<sqlx::postgres::PgRow, Error> {
    let c = Columns::of(jobs);
    let row = bind_columns(
        sqlx::query(concat!(
            r#"
        WITH input AS (
            SELECT t.*, nextval('jobq.jobs_id_seq') AS new_id
            FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                        $6::timestamptz[], $7::float8[])
                 WITH ORDINALITY AS t(kind, queue, payload, priority, max_attempts,
                                      run_after, delay, ord)
        ),
        ins AS (
            INSERT INTO jobq.jobs
                (id, kind, queue, payload, priority, max_attempts, run_after, state)
            SELECT new_id, kind, queue, payload::jsonb, priority, max_attempts, at,
                   "#,
            state_sql!("at"),
            r#"
            FROM input,
                 LATERAL (SELECT coalesce(run_after, CASE WHEN delay IS NULL THEN now()
                                          ELSE now() + make_interval(secs => delay) END) AS at) t
        )
        "#,
            unkeyed_batch_result_sql!("$8", "$9")
        )),
        &c,
    )
    .bind(wake.queues)
    .bind(wake.recent)
    .fetch_one(&mut *conn)
    .await?;
    Ok(row)
}

/// The `db` column of a batch insert's first row.
pub(crate) fn db_of(rows: &[sqlx::postgres::PgRow]) -> Result<Db, Error> {
    match rows.first() {
        Some(row) => Ok(row.try_get("db")?),
        None => Ok(None),
    }
}

/// A job as claimed by one attempt. `(id, fence)` is the attempt's fencing token.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedJob {
    pub(crate) id: i64,
    /// The claim's lease generation: no earlier claim of the job had it.
    pub(crate) fence: i64,
    pub(crate) attempt: i32,
    pub(crate) max_attempts: i32,
    /// Shared by every job of its claim with the same kind (and queue): the attempt's
    /// context, span and metric labels clone it without allocating.
    pub(crate) kind: Arc<str>,
    pub(crate) queue: Arc<str>,
    /// The payload as the database prints it: decoded by the executor, one job at a
    /// time, so a row serde cannot parse fails alone.
    pub(crate) payload: String,
    pub(crate) priority: i16,
    pub(crate) created_at: DateTime<Utc>,
    /// `jobs.payload_version`, for the kind's upgrades.
    pub(crate) payload_version: i32,
    /// `jobs.trace_context` as JSON text: the trace the attempt's span continues.
    pub(crate) trace_context: Option<String>,
    /// How long the job waited between becoming due (`run_after`) and this claim.
    pub(crate) wait_secs: f64,
    /// When the job became due: part of its [`ClaimPosition`].
    pub(crate) run_after: DateTime<Utc>,
}

/// What one claim asks for.
#[derive(Debug)]
pub(crate) struct ClaimParams<'a> {
    pub(crate) queue: &'a str,
    /// Kinds this worker serves, with each kind's lease in seconds (same order).
    pub(crate) kinds: &'a [String],
    pub(crate) lease_secs: &'a [f64],
    pub(crate) limit: i64,
    pub(crate) worker: &'a str,
    pub(crate) now: Option<DateTime<Utc>>,
    /// Per served kind (same order), where the claim starts: only jobs after the position
    /// in claim order are candidates (`None`: the kind's range from its start). `None`
    /// here: every kind from its start. Limited claims ignore it.
    pub(crate) after: Option<&'a [Option<ClaimPosition>]>,
}

/// A job's place in claim order: `(priority, run_after, id)`, the claim index's order
/// within a queue and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ClaimPosition {
    pub(crate) priority: i16,
    pub(crate) run_after: DateTime<Utc>,
    pub(crate) id: i64,
}

impl ClaimedJob {
    /// The job's place in claim order.
    pub(crate) fn position(&self) -> ClaimPosition {
        ClaimPosition {
            priority: self.priority,
            run_after: self.run_after,
            id: self.id,
        }
    }
}

/// The claim statement, its candidates limited per kind by `$after` (a condition on the
/// candidate `j` and the served kind `k`, or nothing).
macro_rules! job_claim_sql {
    ($($after:literal)?) => {
        concat!(
            r#"
        WITH served AS (
            SELECT * FROM unnest($2::text[], $3::float8[], $7::int2[], $8::timestamptz[],
                                 $9::int8[])
                AS s(kind, lease, after_priority, after_run, after_id)
        ),
        candidates AS MATERIALIZED (
            SELECT c.id FROM served k
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_after FROM jobq.jobs j
                WHERE j.state = 'pending' AND j.queue = $1 AND j.kind = k.kind
                  AND j.blocked_by IS NULL
                  AND j.run_after <= coalesce($6, now())
                  AND (j.expires_at IS NULL OR j.expires_at > coalesce($6, now()))
                  "#,
            $($after,)?
            r#"
                ORDER BY j.priority, j.run_after, j.id
                LIMIT $4
                FOR UPDATE SKIP LOCKED
            ) c
            WHERE NOT EXISTS (SELECT 1 FROM jobq.queues q WHERE q.name = $1 AND q.paused)
            ORDER BY c.priority, c.run_after, c.id
            LIMIT $4
        )
        UPDATE jobq.jobs j
        "#,
            claim_set_sql!("$5", "$6"),
            r#"
        FROM candidates c, served s
        WHERE j.id = c.id AND s.kind = j.kind
        "#,
            claim_returning_sql!()
        )
    };
}

/// The claim statement of [`job_claim`]: `$1` queue, `$2` served kinds, `$3` their
/// leases in seconds, `$4` limit, `$5` worker, `$6` now (`NULL`: the database's clock);
/// `$7`–`$9` are [`JOB_CLAIM_AFTER_SQL`]'s and unused here.
pub(crate) const JOB_CLAIM_SQL: &str = job_claim_sql!();

/// [`JOB_CLAIM_SQL`] starting each kind's candidates after a position in claim order:
/// `$7` priorities, `$8` run_after, `$9` ids, one per served kind (`NULL`s: from the
/// start). The row comparison is an index condition of `jobs_claim_kind_idx`, so the
/// scan begins at the position instead of walking the entries before it.
pub(crate) const JOB_CLAIM_AFTER_SQL: &str = job_claim_sql!(
    r#"AND (j.priority, j.run_after, j.id)
                      > (coalesce(k.after_priority, -32768), coalesce(k.after_run, '-infinity'),
                         coalesce(k.after_id, -9223372036854775808))"#
);

/// Claims up to `limit` due jobs of `queue` in one statement: the candidates are locked in
/// a MATERIALIZED CTE (`FOR UPDATE SKIP LOCKED LIMIT n`, so the planner cannot update more
/// rows than the limit), then moved to `running` with `attempts + 1` and a lease.
/// A queue an operator paused (`jobq.queues.paused`) yields nothing.
///
/// The candidates are found by one probe of `jobs_claim_kind_idx` per served kind, each
/// reading only due rows of that kind in claim order, so rows the claim will not take
/// cost it nothing: future and backoff rows are `scheduled` (not in the index), other
/// kinds are other index ranges, finished rows are not in it. With several kinds a probe
/// may lock rows the final `LIMIT` drops; they are unlocked when the statement ends.
///
/// With `p.after`, each probe starts after the kind's position: the index entries of
/// jobs claimed before it are not read. They are normally few (a claim marks the entries
/// of rows it finds dead, and vacuum removes them), but while an old snapshot is held
/// open nothing can mark or remove them and a probe from the start reads every job
/// claimed since (see `runtime::producer::Cursor`).
pub(crate) async fn job_claim(
    conn: &mut PgConnection,
    p: &ClaimParams<'_>,
) -> Result<Vec<ClaimedJob>, Error> {
    let (sql, after) = match p.after {
        Some(after) => (JOB_CLAIM_AFTER_SQL, after),
        None => (JOB_CLAIM_SQL, &[][..]),
    };
    let rows = sqlx::query(sql)
        .bind(p.queue)
        .bind(p.kinds)
        .bind(p.lease_secs)
        .bind(p.limit)
        .bind(p.worker)
        .bind(p.now)
        .bind(
            after
                .iter()
                .map(|a| a.map(|a| a.priority))
                .collect::<Vec<_>>(),
        )
        .bind(
            after
                .iter()
                .map(|a| a.map(|a| a.run_after))
                .collect::<Vec<_>>(),
        )
        .bind(after.iter().map(|a| a.map(|a| a.id)).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    claimed_from_rows(rows)
}

/// The claimed jobs of a claim's `RETURNING` rows, oldest first as the queue's order
/// says (`UPDATE … RETURNING` keeps no order). Columns are found by name once, on the
/// first row (every row of a statement has the same).
pub(crate) fn claimed_from_rows(
    rows: Vec<sqlx::postgres::PgRow>,
) -> Result<Vec<ClaimedJob>, Error> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let at = |name: &str| first.try_column(name).map(sqlx::Column::ordinal);
    let (id, fence, attempt, max_attempts) = (
        at("id")?,
        at("lease_gen")?,
        at("attempts")?,
        at("max_attempts")?,
    );
    let (kind, queue, payload, priority) =
        (at("kind")?, at("queue")?, at("payload")?, at("priority")?);
    let (created_at, payload_version, trace_context) = (
        at("created_at")?,
        at("payload_version")?,
        at("trace_context")?,
    );
    let (wait_secs, run_after) = (at("wait_secs")?, at("run_after")?);
    // A claim returns a few kinds and one queue: one allocation per distinct name.
    let mut names: Vec<Arc<str>> = Vec::new();
    let mut intern = |name: &str| -> Arc<str> {
        if let Some(n) = names.iter().find(|n| &***n == name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        names.push(n.clone());
        n
    };
    let mut jobs = Vec::with_capacity(rows.len());
    for row in rows {
        jobs.push(ClaimedJob {
            id: row.try_get(id)?,
            fence: row.try_get(fence)?,
            attempt: row.try_get(attempt)?,
            max_attempts: row.try_get(max_attempts)?,
            kind: intern(row.try_get(kind)?),
            queue: intern(row.try_get(queue)?),
            payload: row.try_get(payload)?,
            priority: row.try_get(priority)?,
            created_at: row.try_get(created_at)?,
            payload_version: row.try_get(payload_version)?,
            trace_context: row.try_get(trace_context)?,
            wait_secs: row.try_get(wait_secs)?,
            run_after: row.try_get(run_after)?,
        });
    }
    jobs.sort_by_key(|j| (j.priority, j.id));
    Ok(jobs)
}

/// What a fenced write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceResult {
    /// The attempt held the job; the write was applied.
    Applied,
    /// The attempt had already completed the job itself (in its own transaction).
    AlreadyDone,
    /// Another attempt, the reaper, or an operator owns the job now; nothing changed.
    Stale,
}

/// Marks jobs `done` in one statement, each fenced by `(id, lease generation)`. Returns one result
/// per input, in order.
///
/// The input `unnest(ids, attempts)` drives a nested loop over the primary key, one
/// probe per fence, linear in the batch (an `array_position` lookup per row would be
/// quadratic). The state test is written `IS TRUE` so that the partial lease index cannot be
/// chosen: statistics taken while the queue was full of pending jobs say almost nothing
/// runs, and a plan driven by that index rescanned the input for every running job. The UPDATE returns
/// the ids it applied to and the results are matched up here; only inputs it did not
/// apply to (rare: stale attempts, or jobs the attempt completed in its own transaction)
/// need the second statement that tells those two apart.
#[cfg(test)]
pub(crate) async fn job_complete_many(
    conn: &mut PgConnection,
    fences: &[(i64, i64)],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<FenceResult>, Error> {
    job_complete_with_outputs(conn, fences, &[], now).await
}

/// [`job_complete_many`], writing `outputs[i]` (serialized JSON) as the output of
/// `fences[i]` where given (`outputs` may be shorter; missing or `None` keep the column).
/// Then settles the ordering keys of the completed jobs that have one.
pub(crate) async fn job_complete_with_outputs(
    conn: &mut PgConnection,
    fences: &[(i64, i64)],
    outputs: &[Option<&str>],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<FenceResult>, Error> {
    let (results, ordered) = job_complete_unsettled(conn, fences, outputs, now).await?;
    super::ordering_settle_at(conn, &ordered, now).await?;
    Ok(results)
}

/// [`job_complete_with_outputs`] without the settle: also returns the completed jobs
/// that have an ordering key, which the caller must settle
/// ([`ordering_settle`](super::ordering_settle); the sweeper does if it cannot).
pub(crate) async fn job_complete_unsettled(
    conn: &mut PgConnection,
    fences: &[(i64, i64)],
    outputs: &[Option<&str>],
    now: Option<DateTime<Utc>>,
) -> Result<(Vec<FenceResult>, Vec<i64>), Error> {
    if fences.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let ids: Vec<i64> = fences.iter().map(|f| f.0).collect();
    let gens: Vec<i64> = fences.iter().map(|f| f.1).collect();
    // NULL when no job has an output (`unnest` pads it with NULLs).
    let outputs: Option<Vec<Option<&str>>> = outputs.iter().any(Option::is_some).then(|| {
        (0..fences.len())
            .map(|i| outputs.get(i).copied().flatten())
            .collect()
    });
    let applied: Vec<(i64, bool)> = sqlx::query_as(
        r#"
        UPDATE jobq.jobs j
        SET state = 'done', finished_at = coalesce($3, now()),
            locked_until = NULL, locked_by = NULL,
            output = coalesce(f.output::jsonb, j.output)
        FROM unnest($1::bigint[], $2::int8[], $4::text[]) AS f(id, fence, output)
        WHERE j.id = f.id AND (j.state = 'running') IS TRUE AND j.lease_gen = f.fence
        RETURNING j.id, j.ordering_key IS NOT NULL
        "#,
    )
    .bind(&ids)
    .bind(&gens)
    .bind(now)
    .bind(outputs)
    .fetch_all(&mut *conn)
    .await?;
    // Done jobs with an ordering key: the next job of each key is released after this
    // statement (its own short transaction, under the key's lock), by the caller.
    let mut ordered: Vec<i64> = applied.iter().filter(|a| a.1).map(|a| a.0).collect();
    let applied: std::collections::HashSet<i64> = applied.into_iter().map(|a| a.0).collect();
    let mut results: Vec<FenceResult> = fences
        .iter()
        .map(|(id, _)| {
            if applied.contains(id) {
                FenceResult::Applied
            } else {
                FenceResult::Stale
            }
        })
        .collect();
    let missed: Vec<(i64, i64)> = fences
        .iter()
        .filter(|(id, _)| !applied.contains(id))
        .copied()
        .collect();
    if missed.is_empty() {
        return Ok((results, ordered));
    }
    // Not applied: completed by the attempt itself (`complete_in_tx`), or stale. An
    // attempt's own completion cannot be undone and generations only grow, so a later
    // snapshot tells the two apart as well as the UPDATE's own would have.
    let ids: Vec<i64> = missed.iter().map(|f| f.0).collect();
    let gens: Vec<i64> = missed.iter().map(|f| f.1).collect();
    let done: Vec<(i64, bool)> = sqlx::query_as(
        r#"
        SELECT j.id, j.ordering_key IS NOT NULL FROM unnest($1::bigint[], $2::int8[]) AS f(id, fence)
        JOIN jobq.jobs j ON j.id = f.id
        WHERE (j.state = 'done') IS TRUE AND j.lease_gen = f.fence
        "#,
    )
    .bind(&ids)
    .bind(&gens)
    .fetch_all(&mut *conn)
    .await?;
    // Completed in the handler's own transaction: its key is released here too.
    ordered.extend(done.iter().filter(|d| d.1).map(|d| d.0));
    let done: std::collections::HashSet<i64> = done.into_iter().map(|d| d.0).collect();
    for ((id, _), r) in fences.iter().zip(results.iter_mut()) {
        if *r == FenceResult::Stale && done.contains(id) {
            *r = FenceResult::AlreadyDone;
        }
    }
    Ok((results, ordered))
}

/// One failed attempt to record.
#[derive(Debug, Clone)]
pub(crate) struct FailParams<'a> {
    pub(crate) id: i64,
    /// The attempt's lease generation (its fence).
    pub(crate) fence: i64,
    pub(crate) disposition: Disposition,
    pub(crate) code: &'a str,
    pub(crate) message: &'a str,
    /// When the job runs again, as [`crate::retry::next_state`] decided; `None`: it does
    /// not (`failed`, or `cancelled` for a cancel).
    pub(crate) retry_in_secs: Option<f64>,
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Records a failed attempt, fenced by `(id, lease generation)`, as the runtime decided
/// it ([`crate::retry::next_state`]): back to `scheduled` with `run_after = now + retry
/// in` (`pending` when that is zero), else `failed`. What only the database knows at
/// write time overrides that: `cancelled` when an operator asked for it while it ran (or
/// the job cancelled itself), `failed` with code `expired` when the retry would run past
/// the job's maximum age. Appends to the bounded `errors` history. Returns the new
/// state, or `None` when the fence did not match.
pub(crate) async fn job_fail(
    conn: &mut PgConnection,
    p: &FailParams<'_>,
) -> Result<Option<String>, Error> {
    let row: Option<(String, bool)> = sqlx::query_as(
        r#"
        WITH cur AS (
            SELECT id,
                   CASE WHEN cancel_requested OR $3 = 'cancel' THEN 'cancelled'
                        WHEN $6::float8 IS NULL THEN 'failed'
                        -- Past its age by the time the retry would run: not retried.
                        WHEN expires_at <= coalesce($7, now()) + make_interval(secs => $6)
                            THEN 'expired'
                        WHEN $6 > 0 THEN 'scheduled'
                        ELSE 'pending' END AS next_state,
                   coalesce($7, now()) AS at
            FROM jobq.jobs
            WHERE id = $1 AND lease_gen = $2 AND (state = 'running') IS TRUE
        )
        UPDATE jobq.jobs j
        -- `expired`: past its maximum age, the job is not retried whatever attempts remain.
        SET state = CASE WHEN cur.next_state = 'expired' THEN 'failed' ELSE cur.next_state END,
            run_after = CASE WHEN cur.next_state IN ('pending', 'scheduled')
                             THEN cur.at + make_interval(secs => $6) ELSE j.run_after END,
            locked_until = NULL,
            locked_by = NULL,
            last_error_code = CASE WHEN cur.next_state = 'expired' THEN 'expired' ELSE $4 END,
            last_error = CASE WHEN cur.next_state = 'expired'
                              THEN 'past its maximum age (not retried): ' || $5 ELSE $5 END,
            first_failed_at = coalesce(j.first_failed_at, cur.at),
            last_failed_at = cur.at,
            finished_at = CASE WHEN cur.next_state IN ('pending', 'scheduled')
                               THEN NULL ELSE cur.at END,
            errors = (CASE WHEN jsonb_array_length(j.errors) >= $8
                           THEN j.errors - 0 ELSE j.errors END)
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', j.attempts, 'at', cur.at, 'code', $4,
                            'message', $5, 'disposition', $3))
        FROM cur
        WHERE j.id = cur.id AND j.lease_gen = $2 AND (j.state = 'running') IS TRUE
        RETURNING j.state, j.ordering_key IS NOT NULL
        "#,
    )
    .bind(p.id)
    .bind(p.fence)
    .bind(p.disposition.as_str())
    .bind(p.code)
    .bind(truncate_message(p.message))
    .bind(p.retry_in_secs)
    .bind(p.now)
    .bind(ERROR_HISTORY_LEN)
    .fetch_optional(&mut *conn)
    .await?;
    // A cancelled job of a key releases the next one; a failed one parks the key (the
    // jobs behind it keep waiting), a retry keeps its place.
    if let Some((state, true)) = &row
        && state == "cancelled"
    {
        super::ordering_settle_at(conn, &[p.id], p.now).await?;
    }
    Ok(row.map(|r| r.0))
}

/// Gives a running job back to `pending` at once (graceful shutdown): the interrupted
/// attempt is not counted, so `attempts` goes back by one; the lease generation does not,
/// so the handed-back attempt's token stays stale for good. Fenced by
/// `(id, lease generation)`. Returns whether it applied.
pub(crate) async fn job_hand_back(
    conn: &mut PgConnection,
    id: i64,
    fence: i64,
) -> Result<bool, Error> {
    let done: Option<(bool,)> = sqlx::query_as(
        r#"
        UPDATE jobq.jobs
        SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END,
            finished_at = CASE WHEN cancel_requested THEN now() ELSE NULL END,
            attempts = attempts - 1, run_after = now(),
            locked_until = NULL, locked_by = NULL
        WHERE id = $1 AND lease_gen = $2 AND (state = 'running') IS TRUE
        RETURNING state = 'cancelled' AND ordering_key IS NOT NULL
        "#,
    )
    .bind(id)
    .bind(fence)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((true,)) = done {
        super::ordering_settle(conn, &[id]).await?;
    }
    Ok(done.is_some())
}
