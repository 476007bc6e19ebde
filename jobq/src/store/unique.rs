//! The general insert, for jobs that carry options of `0005_time` (a payload version, a
//! uniqueness rule with or without replacing a pending duplicate, a maximum age or a
//! deadline) or a trace context (`0010_traces`). Jobs without them take the plain
//! inserts of `jobs.rs`.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::{Db, NewJob, Wake, db_of};
use crate::error::Error;
use crate::ids::JobId;
use crate::options::Replace;
use crate::rows::Enqueued;

/// The options of `0005_time` one job carries.
#[derive(Debug, Clone)]
pub(crate) struct TimeOpts {
    /// `jobs.payload_version`.
    pub(crate) payload_version: i32,
    /// The uniqueness key's text (hashed with its period bucket by the database).
    pub(crate) unique_key: Option<String>,
    /// The states holding the key, as a bitmask (see `jobq.job_state_in`).
    pub(crate) unique_states: i16,
    /// The period bucket's length, if any.
    pub(crate) unique_period_secs: Option<f64>,
    /// What a duplicate of a pending job replaces.
    pub(crate) replace: Option<Replace>,
    /// `expires_at = created_at + max_age`.
    pub(crate) max_age_secs: Option<f64>,
    /// `expires_at` at most this.
    pub(crate) deadline: Option<DateTime<Utc>>,
    /// `jobs.concurrency_key` (`0009_limits`).
    pub(crate) concurrency_key: Option<String>,
    /// `jobs.rate_key` (`0009_limits`).
    pub(crate) rate_key: Option<String>,
}

impl Default for TimeOpts {
    fn default() -> Self {
        TimeOpts {
            payload_version: 1,
            unique_key: None,
            unique_states: 0,
            unique_period_secs: None,
            replace: None,
            max_age_secs: None,
            deadline: None,
            concurrency_key: None,
            rate_key: None,
        }
    }
}

impl TimeOpts {
    /// Whether the job needs none of them, so the plain insert does.
    pub(crate) fn is_plain(&self) -> bool {
        self.payload_version == 1
            && self.unique_key.is_none()
            && self.max_age_secs.is_none()
            && self.deadline.is_none()
            && self.concurrency_key.is_none()
            && self.rate_key.is_none()
    }
}

/// The uniqueness key as stored: md5 of the key's text and its period bucket, both taken
/// by the database's clock.
macro_rules! unique_key_sql {
    ($key:literal, $period:literal) => {
        concat!(
            "CASE WHEN ",
            $key,
            " IS NOT NULL THEN md5(",
            $key,
            " || coalesce('|' || floor(extract(epoch FROM now())::float8 / ",
            $period,
            ")::bigint::text, '')) END"
        )
    };
}

/// Inserts jobs of which at least one carries options of `0005_time`, in one statement,
/// in input order; a duplicate (by idempotency key or uniqueness rule, against existing
/// rows or earlier in the batch) comes back with the existing id. A job that replaces a
/// pending duplicate ([`Replace`]) takes a statement of its own.
pub(crate) async fn job_insert_timed(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<(Vec<Enqueued>, Db), Error> {
    if jobs.iter().any(|j| j.time.replace.is_some()) {
        let mut out = Vec::with_capacity(jobs.len());
        let mut db = None;
        for job in jobs {
            let (e, t) = match job.time.replace {
                Some(replace) => job_insert_replacing(conn, job, replace, wake).await?,
                None => {
                    let (mut e, t) =
                        Box::pin(job_insert_timed(conn, std::slice::from_ref(job), wake)).await?;
                    (e.remove(0), t)
                }
            };
            out.push(e);
            db = db.or(t);
        }
        return Ok((out, db));
    }
    let rows = sqlx::query(concat!(
        r#"
        WITH input AS (
            SELECT t.*, nextval('jobq.jobs_id_seq') AS new_id,
                   "#,
        unique_key_sql!("t.ukey", "t.uperiod"),
        r#" AS unique_key
            FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::int4[],
                        $6::timestamptz[], $7::float8[], $8::text[], $9::int4[], $10::text[],
                        $11::int2[], $12::float8[], $13::float8[], $14::timestamptz[],
                        $17::text[], $18::text[], $19::text[])
                 WITH ORDINALITY AS t(kind, queue, payload, priority, max_attempts,
                                      run_after, delay, idempotency_key, version, ukey,
                                      ustates, uperiod, max_age, deadline, trace, ckey, rkey,
                                      ord)
        ),
        ins AS (
            INSERT INTO jobq.jobs
                (id, kind, queue, payload, priority, max_attempts, run_after, idempotency_key,
                 payload_version, unique_key, unique_states, expires_at, trace_context,
                 concurrency_key, rate_key, state)
            SELECT new_id, kind, queue, payload::jsonb, priority, max_attempts, at,
                   idempotency_key, version, unique_key,
                   CASE WHEN unique_key IS NOT NULL THEN ustates END,
                   least(now() + make_interval(secs => max_age), deadline), trace::jsonb,
                   ckey, rkey, "#,
        state_sql!("at"),
        r#"
            FROM input,
                 LATERAL (SELECT coalesce(run_after,
                                          now() + make_interval(secs => coalesce(delay, 0))) AS at) t
            ORDER BY ord
            ON CONFLICT DO NOTHING
            RETURNING id, kind, idempotency_key, unique_key
        )
        SELECT i.ord,
               coalesce(n.id, dup.id) AS id,
               (n.id IS NULL) AS duplicate,
               "#,
        wake_columns_sql!("$15", "$16"),
        r#"
        FROM input i
        LEFT JOIN ins n ON n.id = i.new_id
        LEFT JOIN LATERAL (
            SELECT CASE WHEN n.id IS NULL THEN coalesce(
                (SELECT x.id FROM ins x
                 WHERE x.kind = i.kind
                   AND (x.idempotency_key = i.idempotency_key OR x.unique_key = i.unique_key)
                 LIMIT 1),
                (SELECT j.id FROM jobq.jobs j
                 WHERE i.idempotency_key IS NOT NULL
                   AND j.kind = i.kind AND j.idempotency_key = i.idempotency_key),
                (SELECT j.id FROM jobq.jobs j
                 WHERE i.unique_key IS NOT NULL AND j.kind = i.kind
                   AND j.unique_key = i.unique_key
                   AND jobq.job_state_in(j.unique_states, j.state)
                 LIMIT 1)
            ) END AS id
        ) dup ON n.id IS NULL
        ORDER BY i.ord
        "#
    ))
    .bind(jobs.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.payload.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.run_after).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.delay_secs).collect::<Vec<_>>())
    .bind(
        jobs.iter()
            .map(|j| j.idempotency_key.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.payload_version)
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.unique_key.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.unique_states)
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.unique_period_secs)
            .collect::<Vec<_>>(),
    )
    .bind(jobs.iter().map(|j| j.time.max_age_secs).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.time.deadline).collect::<Vec<_>>())
    .bind(wake.queues)
    .bind(wake.recent)
    .bind(
        jobs.iter()
            .map(|j| j.trace_context.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.concurrency_key.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(
        jobs.iter()
            .map(|j| j.time.rate_key.as_deref())
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *conn)
    .await?;
    let db = db_of(&rows)?;
    let mut out = Vec::with_capacity(jobs.len());
    for (job, row) in jobs.iter().zip(rows) {
        let id: Option<i64> = row.try_get("id")?;
        let duplicate: bool = row.try_get("duplicate")?;
        let id = match id {
            Some(id) => JobId(id),
            // The holder committed after this statement's snapshot: look again.
            None => job_find_duplicate(conn, job).await?,
        };
        out.push(Enqueued {
            id,
            duplicate,
            replaced: false,
        });
    }
    Ok((out, db))
}

/// Inserts one job whose duplicate, if pending, it replaces (args, `run_after` or both) in
/// the same statement. A duplicate in another listed state is left alone.
async fn job_insert_replacing(
    conn: &mut PgConnection,
    job: &NewJob,
    replace: Replace,
    wake: Wake<'_>,
) -> Result<(Enqueued, Db), Error> {
    let row = sqlx::query(concat!(
        r#"
        WITH ins AS (
            INSERT INTO jobq.jobs AS j
                (kind, queue, payload, priority, max_attempts, run_after, idempotency_key,
                 payload_version, unique_key, unique_states, expires_at, trace_context,
                 concurrency_key, rate_key, state)
            SELECT $1, $2, $3::text::jsonb, $4, $5, t.at, $8, $9,
                    "#,
        unique_key_sql!("$10::text", "$12::float8"),
        r#", $11, least(now() + make_interval(secs => $13), $14), $19::text::jsonb, $20, $21, "#,
        state_sql!("t.at"),
        r#"
            FROM (SELECT coalesce($6, now() + make_interval(secs => coalesce($7, 0))) AS at) t
            ON CONFLICT (kind, unique_key)
                WHERE unique_key IS NOT NULL AND jobq.job_state_in(unique_states, state)
            DO UPDATE SET
                payload = CASE WHEN $17 THEN EXCLUDED.payload ELSE j.payload END,
                payload_version = CASE WHEN $17 THEN EXCLUDED.payload_version
                                       ELSE j.payload_version END,
                run_after = CASE WHEN $18 THEN EXCLUDED.run_after ELSE j.run_after END,
                -- A new run_after may move the job between due and scheduled.
                state = CASE WHEN NOT $18 THEN j.state
                             WHEN EXCLUDED.run_after > now() THEN 'scheduled'
                             ELSE 'pending' END
            WHERE j.state IN ('pending', 'scheduled')
            RETURNING j.id, (j.xmax = 0) AS inserted
        )
        SELECT ins.id, ins.inserted, "#,
        wake_sql!("$15", "$16"),
        " AS woke, ",
        database_sql!(),
        r#" AS db
        FROM ins
        "#
    ))
    .bind(&job.kind)
    .bind(&job.queue)
    .bind(&job.payload)
    .bind(job.priority)
    .bind(job.max_attempts)
    .bind(job.run_after)
    .bind(job.delay_secs)
    .bind(&job.idempotency_key)
    .bind(job.time.payload_version)
    .bind(&job.time.unique_key)
    .bind(job.time.unique_states)
    .bind(job.time.unique_period_secs)
    .bind(job.time.max_age_secs)
    .bind(job.time.deadline)
    .bind(wake.queues)
    .bind(wake.recent)
    .bind(replace.args)
    .bind(replace.run_after)
    .bind(&job.trace_context)
    .bind(&job.time.concurrency_key)
    .bind(&job.time.rate_key)
    .fetch_optional(&mut *conn)
    .await?;
    match row {
        Some(row) => {
            let inserted: bool = row.try_get("inserted")?;
            let e = Enqueued {
                id: JobId(row.try_get("id")?),
                duplicate: !inserted,
                replaced: !inserted,
            };
            Ok((e, row.try_get("db")?))
        }
        // The duplicate is not pending (running, or another listed state): untouched.
        None => {
            let id = job_find_duplicate(conn, job).await?;
            tracing::debug!(kind = %job.kind, id = id.0, "duplicate is not pending; nothing replaced");
            Ok((
                Enqueued {
                    id,
                    duplicate: true,
                    replaced: false,
                },
                None,
            ))
        }
    }
}

/// The job `job` duplicates, found with a fresh snapshot.
async fn job_find_duplicate(conn: &mut PgConnection, job: &NewJob) -> Result<JobId, Error> {
    let id: Option<i64> = sqlx::query_scalar(concat!(
        r#"
        SELECT coalesce(
            (SELECT j.id FROM jobq.jobs j
             WHERE $2::text IS NOT NULL AND j.kind = $1 AND j.idempotency_key = $2),
            (SELECT j.id FROM jobq.jobs j
             WHERE $3::text IS NOT NULL AND j.kind = $1
               AND j.unique_key = "#,
        unique_key_sql!("$3::text", "$4::float8"),
        r#"
               AND jobq.job_state_in(j.unique_states, j.state)
             LIMIT 1))
        "#
    ))
    .bind(&job.kind)
    .bind(&job.idempotency_key)
    .bind(&job.time.unique_key)
    .bind(job.time.unique_period_secs)
    .fetch_one(&mut *conn)
    .await?;
    id.map(JobId).ok_or_else(|| {
        Error::invalid(
            "unique_conflict",
            format!(
                "job of kind `{}` conflicted on its key, but the existing row is not visible \
                 (is this a REPEATABLE READ transaction?)",
                job.kind
            ),
        )
    })
}
