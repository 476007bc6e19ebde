//! Statements on `jobq.limits` and `jobq.rate_buckets` (`0009_limits`), and the claims
//! of limited kinds and queues, guarded by `jobq.limit_gens` (`0011_limit_gens`): one
//! statement that reads usage and claims for kind-wide limits; for per-key limits, a
//! transaction that locks each limited kind and queue (transaction-scoped advisory
//! locks), reads their usage, picks candidates, and claims, defers and charges in one
//! statement.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Row};

use super::{Actor, ClaimParams, ClaimedJob, claimed_from_rows};
use crate::error::Error;

/// One limit row as a runtime writes it from its code (`source = 'code'`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CodeLimit {
    /// `kind` or `queue`.
    pub(crate) scope: &'static str,
    pub(crate) name: String,
    pub(crate) concurrency: Option<i32>,
    pub(crate) per_key: bool,
    /// `(count, seconds)`.
    pub(crate) rate: Option<(i32, f64)>,
    pub(crate) burst: Option<i32>,
    pub(crate) rate_per_key: bool,
}

/// The limit in force for a kind or a queue: the operator's fields where set, else the
/// code's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitRow {
    /// `kind` or `queue`.
    pub scope: String,
    /// The kind's or queue's name.
    pub name: String,
    /// The most running jobs (per concurrency key when `per_key`).
    pub concurrency: Option<i32>,
    /// Whether the concurrency limit counts per `concurrency_key`.
    pub per_key: bool,
    /// Tokens per `rate_secs`.
    pub rate_count: Option<i32>,
    /// The rate's period in seconds.
    pub rate_secs: Option<f64>,
    /// The bucket's size (default: `rate_count`).
    pub burst: Option<i32>,
    /// Whether each `rate_key` has a bucket of its own.
    pub rate_per_key: bool,
    /// `code`, `operator`, or `code+operator` (an operator override of a code limit).
    pub source: String,
    /// When the row in force last changed.
    pub updated_at: DateTime<Utc>,
    /// Who changed it (the operator's name; `None` for code).
    pub updated_by: Option<String>,
}

/// A limit with its current usage, for `jobq limits`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitUsage {
    /// The limit in force.
    #[serde(flatten)]
    pub limit: LimitRow,
    /// Running jobs of the kind or queue now (all keys).
    pub running: i64,
    /// The most running jobs of one concurrency key (per-key limits only).
    pub busiest_key_running: Option<i64>,
    /// Tokens in the kind-wide bucket now (rate limits only; `None`: not limited).
    pub tokens: Option<f64>,
    /// When the kind-wide bucket has its next token, if it has none now.
    pub next_token_at: Option<DateTime<Utc>>,
    /// Buckets of rate keys (per-key rate limits), and how many are throttled now.
    pub key_buckets: i64,
    /// Buckets throttled now (`ctx.throttle`), kind-wide or per key.
    pub throttled: i64,
}

/// Writes the code's limits: upserts `rows` (`source = 'code'`), and deletes the code
/// rows of `kinds` and `queues` that no longer have one (this runtime serves them, and
/// its code says no limit). Operator rows are never touched.
pub(crate) async fn limits_seed(
    conn: &mut PgConnection,
    rows: &[CodeLimit],
    kinds: &[String],
    queues: &[String],
) -> Result<(), Error> {
    let scopes: Vec<&str> = rows.iter().map(|r| r.scope).collect();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let conc: Vec<Option<i32>> = rows.iter().map(|r| r.concurrency).collect();
    let per_key: Vec<bool> = rows.iter().map(|r| r.per_key).collect();
    let counts: Vec<Option<i32>> = rows.iter().map(|r| r.rate.map(|r| r.0)).collect();
    let secs: Vec<Option<f64>> = rows.iter().map(|r| r.rate.map(|r| r.1)).collect();
    let bursts: Vec<Option<i32>> = rows.iter().map(|r| r.burst).collect();
    let rate_per_key: Vec<bool> = rows.iter().map(|r| r.rate_per_key).collect();
    sqlx::query(
        r#"
        WITH input AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::bool[], $5::int4[],
                                 $6::float8[], $7::int4[], $8::bool[])
                AS t(scope, name, concurrency, per_key, rate_count, rate_secs, burst,
                     rate_per_key)
        ),
        gone AS (
            DELETE FROM jobq.limits l
            WHERE l.source = 'code'
              AND ((l.scope = 'kind' AND l.name = ANY($9)) OR (l.scope = 'queue' AND l.name = ANY($10)))
              AND NOT EXISTS (SELECT 1 FROM input i WHERE i.scope = l.scope AND i.name = l.name)
        )
        INSERT INTO jobq.limits AS l
            (scope, name, source, concurrency, per_key, rate_count, rate_secs, burst,
             rate_per_key, updated_at)
        SELECT scope, name, 'code', concurrency, per_key, rate_count, rate_secs, burst,
               rate_per_key, now()
        FROM input
        ON CONFLICT (scope, name, source) DO UPDATE
        SET concurrency = EXCLUDED.concurrency, per_key = EXCLUDED.per_key,
            rate_count = EXCLUDED.rate_count, rate_secs = EXCLUDED.rate_secs,
            burst = EXCLUDED.burst, rate_per_key = EXCLUDED.rate_per_key,
            updated_at = now()
        WHERE (l.concurrency, l.per_key, l.rate_count, l.rate_secs, l.burst, l.rate_per_key)
              IS DISTINCT FROM
              (EXCLUDED.concurrency, EXCLUDED.per_key, EXCLUDED.rate_count, EXCLUDED.rate_secs,
               EXCLUDED.burst, EXCLUDED.rate_per_key)
        "#,
    )
    .bind(&scopes)
    .bind(&names)
    .bind(&conc)
    .bind(&per_key)
    .bind(&counts)
    .bind(&secs)
    .bind(&bursts)
    .bind(&rate_per_key)
    .bind(kinds)
    .bind(queues)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// SQL of the limits in force, one row per (scope, name): the operator's fields over the
/// code's (`per_key` and `rate_per_key` come from the code when it has a row).
macro_rules! effective_sql {
    () => {
        r#"
        SELECT coalesce(o.scope, c.scope) AS scope, coalesce(o.name, c.name) AS name,
               coalesce(o.concurrency, c.concurrency) AS concurrency,
               coalesce(c.per_key, o.per_key) AS per_key,
               CASE WHEN o.rate_count IS NOT NULL THEN o.rate_count ELSE c.rate_count END
                   AS rate_count,
               CASE WHEN o.rate_count IS NOT NULL THEN o.rate_secs ELSE c.rate_secs END
                   AS rate_secs,
               CASE WHEN o.rate_count IS NOT NULL THEN o.burst ELSE c.burst END AS burst,
               coalesce(c.rate_per_key, o.rate_per_key) AS rate_per_key,
               concat_ws('+', CASE WHEN c.name IS NOT NULL THEN 'code' END,
                              CASE WHEN o.name IS NOT NULL THEN 'operator' END) AS source,
               greatest(o.updated_at, c.updated_at) AS updated_at,
               o.updated_by
        FROM (SELECT * FROM jobq.limits WHERE source = 'code') c
        FULL JOIN (SELECT * FROM jobq.limits WHERE source = 'operator') o
            ON o.scope = c.scope AND o.name = c.name
        "#
    };
}

fn limit_from_row(row: &sqlx::postgres::PgRow) -> Result<LimitRow, Error> {
    Ok(LimitRow {
        scope: row.try_get("scope")?,
        name: row.try_get("name")?,
        concurrency: row.try_get("concurrency")?,
        per_key: row.try_get("per_key")?,
        rate_count: row.try_get("rate_count")?,
        rate_secs: row.try_get("rate_secs")?,
        burst: row.try_get("burst")?,
        rate_per_key: row.try_get("rate_per_key")?,
        source: row.try_get("source")?,
        updated_at: row.try_get("updated_at")?,
        updated_by: row.try_get("updated_by")?,
    })
}

/// Every limit in force, by scope and name.
pub(crate) async fn limits_effective(conn: &mut PgConnection) -> Result<Vec<LimitRow>, Error> {
    let rows = sqlx::query(concat!(
        "SELECT * FROM (",
        effective_sql!(),
        ") e ORDER BY scope, name"
    ))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(limit_from_row).collect()
}

/// Kinds with a bucket throttled past `now` (`ctx.throttle`): the claim of such a kind
/// honours its throttles even when the kind has no rate limit.
pub(crate) async fn rate_throttled_kinds(
    conn: &mut PgConnection,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<String>, Error> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT kind FROM jobq.rate_buckets WHERE refilled_at > coalesce($1, now())",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await?)
}

/// Every limit in force with its usage now: running rows (the partial lease index holds
/// running rows only, so this reads as many rows as run), the kind-wide bucket, and the
/// count of key buckets and throttled buckets.
pub(crate) async fn limits_usage(
    conn: &mut PgConnection,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<LimitUsage>, Error> {
    let rows = sqlx::query(concat!(
        "WITH e AS (",
        effective_sql!(),
        r#"),
        run AS (
            SELECT kind, queue, coalesce(concurrency_key, '') AS ckey, count(*) AS n
            FROM jobq.jobs WHERE state = 'running' AND locked_until IS NOT NULL
            GROUP BY 1, 2, 3
        )
        SELECT e.*,
               coalesce((SELECT sum(n) FROM run r
                         WHERE (e.scope = 'kind' AND r.kind = e.name)
                            OR (e.scope = 'queue' AND r.queue = e.name)), 0)::int8 AS running,
               CASE WHEN e.per_key THEN
                   (SELECT max(s.n)::int8 FROM (SELECT sum(n) AS n FROM run r
                                         WHERE r.kind = e.name GROUP BY r.ckey) s)
               END AS busiest,
               b.tokens, b.refilled_at,
               (SELECT count(*) FROM jobq.rate_buckets k
                WHERE e.scope = 'kind' AND k.kind = e.name AND k.key <> e.name) AS key_buckets,
               (SELECT count(*) FROM jobq.rate_buckets k
                WHERE e.scope = 'kind' AND k.kind = e.name
                  AND k.refilled_at > coalesce($1, now())) AS throttled,
               coalesce($1, now()) AS at
        FROM e
        LEFT JOIN jobq.rate_buckets b ON e.scope = 'kind' AND b.kind = e.name AND b.key = e.name
        ORDER BY e.scope, e.name
        "#
    ))
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let limit = limit_from_row(row)?;
        let at: DateTime<Utc> = row.try_get("at")?;
        let bucket = bucket_of(row)?;
        let (tokens, next_token_at) = match (limit.rate_count, limit.rate_secs) {
            (Some(count), Some(secs)) => {
                let rate = BucketRate::new(count, secs, limit.burst);
                let now_tokens = rate.available(bucket.as_ref(), at);
                let next = (now_tokens < 1.0).then(|| rate.next_token(bucket.as_ref(), at, 0));
                (Some(now_tokens), next)
            }
            _ => (None, None),
        };
        out.push(LimitUsage {
            limit,
            running: row.try_get("running")?,
            busiest_key_running: row.try_get("busiest")?,
            tokens,
            next_token_at,
            key_buckets: row.try_get("key_buckets")?,
            throttled: row.try_get("throttled")?,
        });
    }
    Ok(out)
}

/// What an operator sets on a limit; `None` fields are left as they are.
#[derive(Debug, Clone, Default)]
pub(crate) struct LimitChange {
    pub(crate) concurrency: Option<i32>,
    /// `(count, seconds)`.
    pub(crate) rate: Option<(i32, f64)>,
    pub(crate) burst: Option<i32>,
}

/// Writes (or, with `change = None`, deletes) the operator's row of a limit, with an
/// audit row (`limit_set` / `limit_clear`, the limit in force before and after in
/// `detail`). A new rate without a burst takes the rate's default burst. Returns
/// whether anything changed (clearing a limit with no operator row changes nothing).
pub(crate) async fn limit_set(
    conn: &mut PgConnection,
    scope: &str,
    name: &str,
    change: Option<&LimitChange>,
    actor: Actor<'_>,
) -> Result<bool, Error> {
    let clear = change.is_none();
    let c = change.cloned().unwrap_or_default();
    let changed: bool = sqlx::query_scalar(concat!(
        "WITH before AS (SELECT to_jsonb(e) AS j FROM (",
        effective_sql!(),
        r#") e WHERE e.scope = $1 AND e.name = $2),
        gone AS (
            DELETE FROM jobq.limits
            WHERE $3 AND scope = $1 AND name = $2 AND source = 'operator'
            RETURNING 1
        ),
        up AS (
            INSERT INTO jobq.limits AS l
                (scope, name, source, concurrency, rate_count, rate_secs, burst, updated_at,
                 updated_by)
            SELECT $1, $2, 'operator', $4, $5, $6, $7, now(), $8 WHERE NOT $3
            ON CONFLICT (scope, name, source) DO UPDATE
            SET concurrency = coalesce(EXCLUDED.concurrency, l.concurrency),
                rate_count = coalesce(EXCLUDED.rate_count, l.rate_count),
                rate_secs = coalesce(EXCLUDED.rate_secs, l.rate_secs),
                burst = CASE WHEN EXCLUDED.burst IS NOT NULL THEN EXCLUDED.burst
                             WHEN EXCLUDED.rate_count IS NOT NULL THEN NULL
                             ELSE l.burst END,
                updated_at = now(), updated_by = EXCLUDED.updated_by
            RETURNING 1
        ),
        audit AS (
            INSERT INTO jobq.job_audit (job_id, action, actor, reason, detail)
            SELECT NULL, CASE WHEN $3 THEN 'limit_clear' ELSE 'limit_set' END, $8, $9,
                   jsonb_build_object('scope', $1, 'name', $2,
                                      'before', (SELECT j FROM before),
                                      'concurrency', $4, 'rate_count', $5, 'rate_secs', $6,
                                      'burst', $7)
            WHERE EXISTS (SELECT 1 FROM gone) OR EXISTS (SELECT 1 FROM up)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM audit)
        "#
    ))
    .bind(scope)
    .bind(name)
    .bind(clear)
    .bind(c.concurrency)
    .bind(c.rate.map(|r| r.0))
    .bind(c.rate.map(|r| r.1))
    .bind(c.burst)
    .bind(actor.name)
    .bind(actor.reason)
    .fetch_one(&mut *conn)
    .await?;
    Ok(changed)
}

/// Throttles the bucket `(kind, key)` until `until`: no token before it, then one, then
/// the bucket refills at its rate (a later throttle of the bucket is kept).
pub(crate) async fn rate_throttle(
    conn: &mut PgConnection,
    kind: &str,
    key: &str,
    until: DateTime<Utc>,
) -> Result<(), Error> {
    sqlx::query(
        r#"
        INSERT INTO jobq.rate_buckets AS b (kind, key, tokens, refilled_at)
        VALUES ($1, $2, 1, $3)
        ON CONFLICT (kind, key) DO UPDATE
        SET tokens = 1, refilled_at = EXCLUDED.refilled_at
        WHERE b.refilled_at < EXCLUDED.refilled_at
        "#,
    )
    .bind(kind)
    .bind(key)
    .bind(until)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BucketState {
    pub(crate) tokens: f64,
    pub(crate) refilled_at: DateTime<Utc>,
}

/// The bucket of a row with nullable `tokens` and `refilled_at` columns (`None`: the
/// bucket has no row, so it is full).
fn bucket_of(row: &sqlx::postgres::PgRow) -> Result<Option<BucketState>, Error> {
    let tokens: Option<f64> = row.try_get("tokens")?;
    let refilled_at: Option<DateTime<Utc>> = row.try_get("refilled_at")?;
    Ok(tokens
        .zip(refilled_at)
        .map(|(tokens, refilled_at)| BucketState {
            tokens,
            refilled_at,
        }))
}

/// A bucket's rate: tokens per second and the most it holds. An unlimited rate (a
/// throttle on a kind with no rate limit) has an infinite rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BucketRate {
    pub(crate) per_sec: f64,
    pub(crate) burst: f64,
}

impl BucketRate {
    /// `count` tokens every `secs` seconds, holding at most `burst` (default `count`).
    pub(crate) fn new(count: i32, secs: f64, burst: Option<i32>) -> Self {
        BucketRate {
            per_sec: f64::from(count) / secs,
            burst: f64::from(burst.unwrap_or(count).max(1)),
        }
    }

    /// No rate limit: only throttles hold a job back.
    pub(crate) const UNLIMITED: BucketRate = BucketRate {
        per_sec: f64::INFINITY,
        burst: f64::INFINITY,
    };

    /// The tokens the bucket holds at `now` (a missing bucket is full; a throttled one,
    /// `refilled_at` after `now`, is empty).
    pub(crate) fn available(&self, b: Option<&BucketState>, now: DateTime<Utc>) -> f64 {
        match b {
            None => self.burst,
            Some(b) if now < b.refilled_at => 0.0,
            Some(b) => {
                let secs = (now - b.refilled_at).as_seconds_f64();
                let grown = b.tokens + secs * self.per_sec;
                if grown.is_nan() {
                    self.burst
                } else {
                    grown.min(self.burst)
                }
            }
        }
    }

    /// When the bucket has its `n`-th next token (0: the first) after `charged` more
    /// have been taken at `now`.
    pub(crate) fn next_token(
        &self,
        b: Option<&BucketState>,
        now: DateTime<Utc>,
        n: u32,
    ) -> DateTime<Utc> {
        let (base, tokens) = match b {
            Some(b) if now < b.refilled_at => (b.refilled_at, b.tokens),
            _ => (now, self.available(b, now)),
        };
        let missing = (1.0 + f64::from(n) - tokens).max(0.0);
        if !self.per_sec.is_finite() || missing == 0.0 {
            return base;
        }
        let secs = (missing / self.per_sec).min(1.0e9);
        base + chrono::Duration::microseconds((secs * 1.0e6).ceil() as i64)
    }
}

/// Opens a limited claim's transaction and takes its advisory locks in the same round
/// trip (one simple query): one per key, in increasing order (so two claims never wait
/// for each other in a cycle), held until the transaction ends. The keys are numbers
/// ([`lock_key`]), so nothing but digits is written into the SQL.
pub(crate) async fn claim_begin<'c>(
    conn: &'c mut PgConnection,
    keys: &[i64],
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, Error> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    let locks: Vec<String> = keys
        .iter()
        .map(|k| format!("pg_advisory_xact_lock({k})"))
        .collect();
    let sql = format!("BEGIN; SELECT {}", locks.join(", "));
    Ok(sqlx::Connection::begin_with(conn, sqlx::AssertSqlSafe(sql)).await?)
}

/// The advisory-lock key of a limited kind or queue (`scope` is `kind` or `queue`): a
/// 64-bit FNV-1a hash of `jobq.limit.<scope>:<name>`, the same on every node.
pub(crate) fn lock_key(scope: &str, name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("jobq.limit.{scope}:{name}").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}

/// What a limited claim reads after its locks: for each served kind, its kind-wide
/// limits (`None` where it has none or they count per key).
#[derive(Debug, Clone)]
pub(crate) struct CandidateParams<'a> {
    pub(crate) queue: &'a str,
    pub(crate) kinds: &'a [String],
    /// The most jobs of each kind running at once (kind-wide concurrency limits).
    pub(crate) caps: &'a [Option<i64>],
    /// The kind-wide bucket of each kind: tokens per second and burst.
    pub(crate) rates: &'a [Option<BucketRate>],
    /// Kinds whose concurrency limit counts per key, and kinds with a bucket per key.
    pub(crate) per_key_kinds: &'a [String],
    pub(crate) key_bucket_kinds: &'a [String],
    pub(crate) queue_cap: Option<i64>,
    pub(crate) limit: i64,
    /// Each kind's lease in seconds.
    pub(crate) lease_secs: &'a [f64],
    pub(crate) now: Option<DateTime<Utc>>,
    /// Each kind's key in `jobq.limit_gens` ([`lock_key`]; `None`: the kind is not
    /// limited), and the queue's (`None`: the queue has no limit).
    pub(crate) gen_keys: &'a [Option<i64>],
    pub(crate) queue_gen_key: Option<i64>,
}

/// A due job a limited claim may take, with what its limits need to know.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) concurrency_key: Option<String>,
    /// The key of its bucket: its `rate_key` (or the kind) for per-key buckets, else the
    /// kind.
    pub(crate) bucket_key: String,
    /// Running jobs of its kind with its concurrency key (per-key kinds only, else 0).
    pub(crate) key_running: i64,
    pub(crate) bucket: Option<BucketState>,
}

/// One served kind as a limited claim found it.
#[derive(Debug, Clone)]
pub(crate) struct KindUsage {
    pub(crate) kind: String,
    /// Running jobs of the kind (all keys, all queues).
    pub(crate) running: i64,
    /// Its kind-wide bucket.
    pub(crate) bucket: Option<BucketState>,
    /// How many candidates were read: the claim's size, fewer for the free slots or
    /// tokens of kind-wide limits.
    pub(crate) window: i64,
    /// Its key and generation in `jobq.limit_gens` as read (`None`: not limited; no row).
    pub(crate) gen_key: Option<i64>,
    pub(crate) seen_gen: Option<i64>,
}

/// What [`claim_candidates`] read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClaimRead {
    /// The database's time.
    pub(crate) now: Option<DateTime<Utc>>,
    /// The claim's size within the queue's limit.
    pub(crate) total: i64,
    pub(crate) kinds: Vec<KindUsage>,
    /// In claim order.
    pub(crate) candidates: Vec<Candidate>,
    /// The queue's generation in `jobq.limit_gens` as read.
    pub(crate) queue_gen: Option<i64>,
    /// Whether the claim took nothing because a generation it read had changed (another
    /// claim of a kind or queue it limits committed meanwhile).
    pub(crate) conflict: bool,
}

impl CandidateParams<'_> {
    /// The kind-wide rates as the two columns `$4` (per second) and `$5` (burst).
    fn rate_columns(&self) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
        self.rates
            .iter()
            .map(|r| (r.map(|r| r.per_sec), r.map(|r| r.burst)))
            .unzip()
    }
}

/// Binds `$1`–`$13` of [`limited_cte_sql!`], as both limited claims number them.
trait BindCandidates<'q> {
    fn bind_candidates(
        self,
        p: &'q CandidateParams<'q>,
        per_sec: &'q [Option<f64>],
        burst: &'q [Option<f64>],
    ) -> Self;
}

impl<'q> BindCandidates<'q>
    for sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>
{
    fn bind_candidates(
        self,
        p: &'q CandidateParams<'q>,
        per_sec: &'q [Option<f64>],
        burst: &'q [Option<f64>],
    ) -> Self {
        self.bind(p.queue)
            .bind(p.kinds)
            .bind(p.caps)
            .bind(per_sec)
            .bind(burst)
            .bind(p.per_key_kinds)
            .bind(p.key_bucket_kinds)
            .bind(p.now)
            .bind(p.queue_cap)
            .bind(p.limit)
            .bind(p.lease_secs)
            .bind(p.gen_keys)
            .bind(p.queue_gen_key)
    }
}

/// The CTEs both limited claims share (`served`, `clock`, `run`, `tot`, `usage`,
/// `cand`): the served kinds with their kind-wide limits, leases and generation keys,
/// the database's time, running rows of the kinds and the queue, the claim's size
/// within the queue's limit, each kind's usage, generation and window, and the
/// candidates locked in claim order. Parameters as [`claim_candidates`] binds them.
macro_rules! limited_cte_sql {
    () => {
        r#"
        WITH served AS (
            SELECT * FROM unnest($2::text[], $3::int8[], $4::float8[], $5::float8[],
                                 $11::float8[], $12::int8[])
                AS s(kind, cap, per_sec, burst, lease, gkey)
        ),
        clock AS (SELECT coalesce($8, now()) AS now),
        run AS MATERIALIZED (
            SELECT j.kind, j.queue, coalesce(j.concurrency_key, '') AS ckey, count(*) AS n
            FROM jobq.jobs j
            WHERE j.state = 'running' AND j.locked_until IS NOT NULL
              AND (j.kind = ANY($2) OR j.queue = $1)
            GROUP BY 1, 2, 3
        ),
        tot AS (
            SELECT greatest(0, CASE WHEN $9::int8 IS NULL THEN $10::int8
                                    ELSE least($10::int8, $9::int8 - coalesce(
                                        (SELECT sum(n) FROM run WHERE queue = $1), 0)) END
                   )::int8 AS n
        ),
        usage AS (
            SELECT a.*, greatest(0, least(
                       (SELECT n FROM tot)::float8,
                       coalesce((a.cap - a.running)::float8, 'Infinity'),
                       floor(coalesce(a.avail, 'Infinity'))))::int8 AS win
            FROM (
            SELECT s.kind, s.cap, k.running, b.tokens, b.refilled_at, s.gkey, g.gen,
                   -- The kind-wide bucket's tokens now (`BucketRate::available`).
                   CASE WHEN s.per_sec IS NULL THEN NULL
                        WHEN b.kind IS NULL THEN s.burst
                        WHEN c.now < b.refilled_at THEN 0
                        ELSE least(s.burst, b.tokens + s.per_sec
                                   * extract(epoch FROM c.now - b.refilled_at)::float8)
                   END AS avail
            FROM served s
            CROSS JOIN clock c
            CROSS JOIN LATERAL (
                SELECT coalesce(sum(r.n), 0)::int8 AS running FROM run r WHERE r.kind = s.kind
            ) k
            LEFT JOIN jobq.rate_buckets b ON b.kind = s.kind AND b.key = s.kind
            LEFT JOIN jobq.limit_gens g ON g.key = s.gkey
            ) a
        ),
        cand AS MATERIALIZED (
            SELECT c.* FROM usage u
            CROSS JOIN LATERAL (
                SELECT j.id, j.kind, j.priority, j.run_after, j.concurrency_key,
                       CASE WHEN j.kind = ANY($7) THEN coalesce(j.rate_key, j.kind)
                            ELSE j.kind END AS bucket_key
                FROM jobq.jobs j
                WHERE j.state = 'pending' AND j.queue = $1 AND j.kind = u.kind
                  AND j.blocked_by IS NULL
                  AND j.run_after <= (SELECT now FROM clock)
                  AND (j.expires_at IS NULL OR j.expires_at > (SELECT now FROM clock))
                ORDER BY j.priority, j.run_after, j.id
                LIMIT u.win
                FOR UPDATE SKIP LOCKED
            ) c
            WHERE u.win > 0
              AND NOT EXISTS (SELECT 1 FROM jobq.queues q WHERE q.name = $1 AND q.paused)
        )
        "#
    };
}

/// The CTEs `bumped` and `gate` of a limited claim, after a CTE `want(key, seen)` of the
/// generations it claims under (each limited kind it takes jobs of, and the limited
/// queue): each generation goes up by one where it is still the value seen (a missing
/// row counts as 0, and a new row starts at 1), in key order, so two claims never wait
/// for each other in a cycle. `gate.ok`: every one went up, so no claim of these kinds
/// or this queue committed since this one read its usage; the claim takes nothing
/// otherwise. A claim that wants no generation writes nothing here.
macro_rules! gen_bump_sql {
    () => {
        r#"
        bumped AS (
            INSERT INTO jobq.limit_gens AS g (key, gen)
            SELECT key, coalesce(seen, 0) + 1 FROM want ORDER BY key
            ON CONFLICT (key) DO UPDATE SET gen = EXCLUDED.gen
            WHERE g.gen = EXCLUDED.gen - 1
            RETURNING g.key
        ),
        gate AS (
            SELECT (SELECT count(*) FROM bumped) = (SELECT count(*) FROM want) AS ok
        )
        "#
    };
}

/// Reads the usage columns of a limited claim's row (`ukind` … `at`) into `out`, once
/// per kind.
fn read_usage(row: &sqlx::postgres::PgRow, out: &mut ClaimRead) -> Result<(), Error> {
    out.now = row.try_get("at")?;
    out.total = row.try_get("total")?;
    out.queue_gen = row.try_get("qgen")?;
    out.conflict = !row.try_get::<Option<bool>, _>("ok")?.unwrap_or(true);
    let Some(kind) = row.try_get::<Option<String>, _>("ukind")? else {
        return Ok(());
    };
    if !out.kinds.iter().any(|k| k.kind == kind) {
        let tokens: Option<f64> = row.try_get("ktokens")?;
        let refilled_at: Option<DateTime<Utc>> = row.try_get("krefilled")?;
        out.kinds.push(KindUsage {
            kind,
            running: row.try_get("running")?,
            bucket: tokens
                .zip(refilled_at)
                .map(|(tokens, refilled_at)| BucketState {
                    tokens,
                    refilled_at,
                }),
            window: row.try_get("win")?,
            gen_key: row.try_get("gkey")?,
            seen_gen: row.try_get("gen")?,
        });
    }
    Ok(())
}

/// A limited claim of kinds whose limits are all kind-wide (no per-key concurrency, no
/// per-key bucket), in one statement that needs no transaction of its own: as
/// [`claim_candidates`] reads, then the candidates in claim order up to the claim's size
/// are claimed (the windows already hold them to the free slots and tokens), the
/// generations of the limited kinds taken from and of the limited queue go up
/// ([`gen_bump_sql!`]), and each kind-wide bucket is charged what was taken (a bucket
/// throttled meanwhile is kept). When another claim of these kinds or this queue
/// committed after this one read, nothing is claimed or charged and
/// [`ClaimRead::conflict`] says so. Returns the claimed jobs and the usage.
pub(crate) async fn claim_kind_wide(
    conn: &mut PgConnection,
    p: &CandidateParams<'_>,
    worker: &str,
) -> Result<(Vec<ClaimedJob>, ClaimRead), Error> {
    let (per_sec, burst) = p.rate_columns();
    let rows = sqlx::query(concat!(
        limited_cte_sql!(),
        r#",
        pick AS (
            SELECT id, kind FROM cand ORDER BY priority, run_after, id
            LIMIT (SELECT n FROM tot)
        ),
        qgen AS (SELECT gen FROM jobq.limit_gens WHERE key = $13::int8),
        want AS (
            SELECT u.gkey AS key, u.gen AS seen FROM usage u
            WHERE u.gkey IS NOT NULL AND u.kind IN (SELECT kind FROM pick)
            UNION
            SELECT $13::int8, (SELECT gen FROM qgen)
            WHERE $13::int8 IS NOT NULL AND EXISTS (SELECT 1 FROM pick)
        ),"#,
        gen_bump_sql!(),
        r#",
        claimed AS (
            UPDATE jobq.jobs j
            "#,
        claim_set_sql!("$14", "$8"),
        r#"
            FROM pick t, served s
            WHERE j.id = t.id AND s.kind = j.kind AND (SELECT ok FROM gate)
            "#,
        claim_returning_sql!(),
        r#"
        ),
        charged AS (
            INSERT INTO jobq.rate_buckets AS b (kind, key, tokens, refilled_at)
            SELECT u.kind, u.kind, u.avail - t.n, (SELECT now FROM clock)
            FROM usage u JOIN (SELECT kind, count(*) AS n FROM claimed GROUP BY kind) t
                ON t.kind = u.kind
            WHERE u.avail IS NOT NULL
            ON CONFLICT (kind, key) DO UPDATE
            SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at
            WHERE b.refilled_at <= EXCLUDED.refilled_at
        )
        SELECT c.*, NULL::text AS ukind, NULL::int8 AS running, NULL::float8 AS ktokens,
               NULL::timestamptz AS krefilled, NULL::int8 AS win, NULL::int8 AS gkey,
               NULL::int8 AS gen, (SELECT gen FROM qgen) AS qgen,
               (SELECT ok FROM gate) AS ok,
               (SELECT n FROM tot) AS total, (SELECT now FROM clock) AS at
        FROM claimed c
        UNION ALL
        SELECT NULL::int8, NULL::int8, NULL::int4, NULL::int4, NULL::text, NULL::text,
               NULL::text, NULL::int2, NULL::timestamptz, NULL::int4, NULL::text,
               NULL::float8, NULL::timestamptz,
               u.kind, u.running, u.tokens, u.refilled_at, u.win, u.gkey, u.gen,
               (SELECT gen FROM qgen), (SELECT ok FROM gate),
               (SELECT n FROM tot), (SELECT now FROM clock)
        FROM usage u
        "#
    ))
    .bind_candidates(p, &per_sec, &burst)
    .bind(worker)
    .fetch_all(&mut *conn)
    .await?;
    let mut read = ClaimRead::default();
    let mut jobs = Vec::new();
    for row in rows {
        read_usage(&row, &mut read)?;
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            jobs.push(row);
        }
    }
    Ok((claimed_from_rows(jobs)?, read))
}

/// Reads a limited claim's usage and locks its candidates in one statement (run after
/// [`claim_begin`], so no other locked claim of these kinds or this queue commits
/// meanwhile; a one-statement claim that does is caught by the generations read here
/// and bumped by [`claim_apply`]): running rows of the served kinds and the queue
/// through the partial lease index (as many rows as run, whatever the table holds), the
/// kind-wide buckets, and up to a window of due jobs per kind in claim order (`FOR UPDATE
/// SKIP LOCKED`, one probe of the claim index per kind, as `job_claim`): the claim's size
/// within the queue's limit, fewer for the free slots and tokens of kind-wide limits.
/// Each candidate comes with the running count of its concurrency key (`per_key_kinds`)
/// and its bucket (per rate key for `key_bucket_kinds`). No candidates when the queue is
/// paused.
pub(crate) async fn claim_candidates(
    conn: &mut PgConnection,
    p: &CandidateParams<'_>,
) -> Result<ClaimRead, Error> {
    let (per_sec, burst) = p.rate_columns();
    let rows = sqlx::query(concat!(
        limited_cte_sql!(),
        r#",
        keyed AS (
            SELECT kind, ckey, sum(n)::int8 AS n FROM run WHERE kind = ANY($6) GROUP BY 1, 2
        )
        SELECT u.kind AS ukind, u.running, u.tokens AS ktokens, u.refilled_at AS krefilled,
               u.win, u.gkey, u.gen, (SELECT n FROM tot) AS total,
               (SELECT now FROM clock) AS at,
               (SELECT gen FROM jobq.limit_gens WHERE key = $13::int8) AS qgen,
               NULL::bool AS ok, c.id, c.kind, c.concurrency_key, c.bucket_key,
               coalesce(r.n, 0)::int8 AS key_running, b.tokens, b.refilled_at
        FROM usage u
        LEFT JOIN cand c ON c.kind = u.kind
        LEFT JOIN keyed r ON r.kind = c.kind AND r.ckey = coalesce(c.concurrency_key, '')
        LEFT JOIN jobq.rate_buckets b ON b.kind = c.kind AND b.key = c.bucket_key
        ORDER BY c.priority, c.run_after, c.id
        "#
    ))
    .bind_candidates(p, &per_sec, &burst)
    .fetch_all(&mut *conn)
    .await?;
    let mut out = ClaimRead::default();
    for row in &rows {
        read_usage(row, &mut out)?;
        let Some(id) = row.try_get::<Option<i64>, _>("id")? else {
            continue;
        };
        out.candidates.push(Candidate {
            id,
            kind: row.try_get("kind")?,
            concurrency_key: row.try_get("concurrency_key")?,
            bucket_key: row.try_get("bucket_key")?,
            key_running: row.try_get("key_running")?,
            bucket: bucket_of(row)?,
        });
    }
    Ok(out)
}

/// What a limited claim decided: jobs to claim, jobs to defer (to `scheduled` at a
/// time: over a per-key limit), and buckets to charge (new tokens as of `at`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClaimPlan {
    pub(crate) take: Vec<i64>,
    pub(crate) defer: Vec<(i64, DateTime<Utc>)>,
    /// `(kind, key, tokens, at)`.
    pub(crate) charge: Vec<(String, String, f64, DateTime<Utc>)>,
}

/// Applies a [`ClaimPlan`] in one statement: claims `take` as `job_claim` does (running,
/// attempts + 1, a new lease generation, the kind's lease), moves `defer` to `scheduled`
/// at their times (no attempt counted), and writes the charged buckets (a bucket
/// throttled meanwhile, `refilled_at` later than the charge, is kept). `gens`: the
/// generations the plan was read with, `(key, seen)` ([`gen_bump_sql!`]); when one
/// changed meanwhile nothing is claimed or charged (the deferrals stand: a key found
/// full was at least that full).
pub(crate) async fn claim_apply(
    conn: &mut PgConnection,
    p: &ClaimParams<'_>,
    plan: &ClaimPlan,
    gens: &[(i64, Option<i64>)],
) -> Result<Vec<ClaimedJob>, Error> {
    let gen_keys: Vec<i64> = gens.iter().map(|g| g.0).collect();
    let gen_seen: Vec<Option<i64>> = gens.iter().map(|g| g.1).collect();
    let defer_ids: Vec<i64> = plan.defer.iter().map(|d| d.0).collect();
    let defer_at: Vec<DateTime<Utc>> = plan.defer.iter().map(|d| d.1).collect();
    let b_kind: Vec<&str> = plan.charge.iter().map(|c| c.0.as_str()).collect();
    let b_key: Vec<&str> = plan.charge.iter().map(|c| c.1.as_str()).collect();
    let b_tokens: Vec<f64> = plan.charge.iter().map(|c| c.2).collect();
    let b_at: Vec<DateTime<Utc>> = plan.charge.iter().map(|c| c.3).collect();
    let rows = sqlx::query(concat!(
        r#"
        WITH served AS (
            SELECT * FROM unnest($2::text[], $3::float8[]) AS s(kind, lease)
        ),
        deferred AS (
            UPDATE jobq.jobs j SET state = 'scheduled', run_after = d.at
            FROM unnest($7::int8[], $8::timestamptz[]) AS d(id, at)
            WHERE j.id = d.id AND j.state = 'pending'
            RETURNING 1
        ),
        want AS (SELECT * FROM unnest($13::int8[], $14::int8[]) AS w(key, seen)),"#,
        gen_bump_sql!(),
        r#",
        charged AS (
            INSERT INTO jobq.rate_buckets AS b (kind, key, tokens, refilled_at)
            SELECT * FROM unnest($9::text[], $10::text[], $11::float8[], $12::timestamptz[])
            WHERE (SELECT ok FROM gate)
            ON CONFLICT (kind, key) DO UPDATE
            SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at
            WHERE b.refilled_at <= EXCLUDED.refilled_at
            RETURNING 1
        )
        UPDATE jobq.jobs j
        "#,
        claim_set_sql!("$5", "$6"),
        r#"
        FROM unnest($4::int8[]) AS t(id), served s
        -- `deferred` and `charged` run to completion though nothing reads them.
        WHERE j.id = t.id AND s.kind = j.kind AND j.state = 'pending'
          AND (SELECT ok FROM gate)
        "#,
        claim_returning_sql!()
    ))
    .bind(p.queue)
    .bind(p.kinds)
    .bind(p.lease_secs)
    .bind(&plan.take)
    .bind(p.worker)
    .bind(p.now)
    .bind(&defer_ids)
    .bind(&defer_at)
    .bind(&b_kind)
    .bind(&b_key)
    .bind(&b_tokens)
    .bind(&b_at)
    .bind(&gen_keys)
    .bind(&gen_seen)
    .fetch_all(&mut *conn)
    .await?;
    claimed_from_rows(rows)
}
