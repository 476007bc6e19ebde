//! Statements of per-key ordering (`0008_ordering`): the key lock, chaining new jobs
//! behind their key's tail, settling a key after one of its jobs left the chain, the
//! sweep, unpark, and the reads behind the parked counts.
//!
//! A key's *chain* is its jobs in states `scheduled`, `pending`, `running` and `failed`
//! (not skipped by unpark), in id order: what `jobs_ordering_idx` holds. Each member's
//! `blocked_by` names the nearest member below it (NULL for the lowest, the head), and the
//! claim takes only `blocked_by IS NULL` rows. Every write that changes a chain takes the
//! key's advisory lock in a statement of its own first, so the statement after it sees
//! every enqueue of the key that committed before the lock was granted. Enqueues wait for
//! their keys' locks (in one order); settles only try them, so neither can deadlock.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, PgConnection, Row};

use super::admin::Actor;
use super::{Db, NOTIFY_CHANNEL, NewJob, Wake};
use crate::error::Error;
use crate::rows::Enqueued;

/// The first half of every key lock (`pg_advisory_xact_lock(int4, int4)`, a key space
/// apart from the single-`bigint` locks jobq takes elsewhere): "ordq" in ASCII.
const LOCK_CLASS: i32 = 0x6f72_6471;

/// The states of a chain member, as SQL.
macro_rules! member_sql {
    ($t:literal) => {
        concat!(
            "NOT ",
            $t,
            ".ordering_skipped AND ",
            $t,
            ".state IN ('scheduled', 'pending', 'running', 'failed')"
        )
    };
}

/// The nearest chain member below row `s`: the job `s` must wait for (NULL: none).
macro_rules! below_sql {
    () => {
        concat!(
            "(SELECT t.id FROM jobq.jobs t
              WHERE t.ordering_scope = s.ordering_scope AND t.ordering_key = s.ordering_key
                AND t.id < s.id AND ",
            member_sql!("t"),
            " ORDER BY t.id DESC LIMIT 1)"
        )
    };
}

/// The ordering key of a new job: its scope (the kind, or a named scope) and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewOrdering {
    pub(crate) scope: String,
    pub(crate) key: String,
}

/// Takes the advisory locks of the given keys (pairs of `scopes[i]`, `keys[i]`), in one
/// order for every caller, until the transaction ends; refuses a transaction above READ
/// COMMITTED, whose snapshot could not see an enqueue of the key that committed while
/// this one waited for the lock.
pub(crate) async fn ordering_lock(
    conn: &mut PgConnection,
    scopes: &[&str],
    keys: &[&str],
) -> Result<(), Error> {
    let isolation: String = sqlx::query_scalar(
        r#"
        SELECT current_setting('transaction_isolation')
        FROM (SELECT count(pg_advisory_xact_lock($3, h)) AS n
              FROM (SELECT DISTINCT hashtext(s || chr(31) || k) AS h
                    FROM unnest($1::text[], $2::text[]) AS u(s, k) ORDER BY h) x) l
        "#,
    )
    .bind(scopes)
    .bind(keys)
    .bind(LOCK_CLASS)
    .fetch_one(&mut *conn)
    .await?;
    if isolation != "read committed" {
        return Err(Error::invalid(
            "ordering_isolation",
            format!(
                "an ordered job must be enqueued in a READ COMMITTED transaction (this one is {isolation}): a later snapshot could not see the key's last job"
            ),
        ));
    }
    Ok(())
}

/// Tries to take the advisory locks of the keys of jobs `ids` (unordered ones have
/// none) without waiting; returns the keys' lock halves (`hashtext`) it could not take.
async fn ordering_try_lock_of(conn: &mut PgConnection, ids: &[i64]) -> Result<Vec<i32>, Error> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT h FROM (SELECT DISTINCT hashtext(ordering_scope || chr(31) || ordering_key) AS h
                       FROM jobq.jobs WHERE id = ANY($1) AND ordering_key IS NOT NULL) x
        WHERE NOT pg_try_advisory_xact_lock($2, h)
        "#,
    )
    .bind(ids)
    .bind(LOCK_CLASS)
    .fetch_all(&mut *conn)
    .await?)
}

/// Tries again to take the key locks `hashes` without waiting; returns those it could not.
async fn ordering_try_lock_again(
    conn: &mut PgConnection,
    hashes: &[i32],
) -> Result<Vec<i32>, Error> {
    Ok(sqlx::query_scalar(
        "SELECT h FROM unnest($1::int4[]) AS h WHERE NOT pg_try_advisory_xact_lock($2, h)",
    )
    .bind(hashes)
    .bind(LOCK_CLASS)
    .fetch_all(&mut *conn)
    .await?)
}

/// How long a settle waits for the locks of keys an open enqueue holds before it leaves
/// them to the sweeper: a completion never stalls behind a long transaction.
pub(crate) const SETTLE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes the ordering key of new jobs `ids` and chains each behind its predecessor:
/// `prevs[i]` (the job of the same key before it in the same enqueue) or else the key's
/// tail, its highest chain member. Run under the keys' locks.
async fn ordering_chain(
    conn: &mut PgConnection,
    ids: &[i64],
    scopes: &[&str],
    keys: &[&str],
    prevs: &[Option<i64>],
) -> Result<(), Error> {
    sqlx::query(concat!(
        r#"
        UPDATE jobq.jobs s
        SET ordering_scope = i.scope, ordering_key = i.key,
            blocked_by = coalesce(i.prev, (
                SELECT t.id FROM jobq.jobs t
                WHERE t.ordering_scope = i.scope AND t.ordering_key = i.key
                  AND t.id < i.id AND "#,
        member_sql!("t"),
        r#"
                ORDER BY t.id DESC LIMIT 1))
        FROM unnest($1::int8[], $2::text[], $3::text[], $4::int8[]) AS i(id, scope, key, prev)
        WHERE s.id = i.id
        "#
    ))
    .bind(ids)
    .bind(scopes)
    .bind(keys)
    .bind(prevs)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts jobs of which some have an ordering key, in a transaction of their own (a
/// savepoint inside the caller's): the keys' locks, the plain insert of the batch, then
/// each new ordered job chained behind its key's tail. Duplicates (idempotency,
/// uniqueness) are not chained again.
pub(crate) async fn job_insert_ordered(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    wake: Wake<'_>,
) -> Result<(Vec<Enqueued>, Db), Error> {
    let mut tx = conn.begin().await?;
    let ordered: Vec<&NewOrdering> = jobs.iter().filter_map(|j| j.ordering.as_ref()).collect();
    let scopes: Vec<&str> = ordered.iter().map(|o| o.scope.as_str()).collect();
    let keys: Vec<&str> = ordered.iter().map(|o| o.key.as_str()).collect();
    ordering_lock(&mut tx, &scopes, &keys).await?;
    let (done, of) = super::job_insert_many_unordered(&mut tx, jobs, wake).await?;
    let mut last: HashMap<(&str, &str), i64> = HashMap::new();
    let (mut ids, mut scopes, mut keys, mut prevs) = (vec![], vec![], vec![], vec![]);
    for (job, e) in jobs.iter().zip(&done) {
        let Some(o) = &job.ordering else { continue };
        if e.duplicate {
            continue;
        }
        prevs.push(last.insert((&o.scope, &o.key), e.id.0));
        ids.push(e.id.0);
        scopes.push(o.scope.as_str());
        keys.push(o.key.as_str());
    }
    if !ids.is_empty() {
        ordering_chain(&mut tx, &ids, &scopes, &keys, &prevs).await?;
    }
    tx.commit().await?;
    Ok((done, of))
}

/// Settles the keys of jobs `ids` after they changed state (finished, cancelled,
/// replayed, skipped): under the keys' locks (taken without waiting, retried for up to
/// [`SETTLE_PATIENCE`]; a key still held by an open enqueue then is left to the sweeper), each live job among `ids` and each one
/// waiting behind one of them gets its nearest chain member below as its new
/// `blocked_by`, and the queues of jobs that became claimable are woken. Safe to call
/// for any ids, any number of times; unordered ids cost one lock statement that locks
/// nothing. Returns how many jobs became claimable (or due to, when scheduled).
///
/// A job that becomes claimable here becomes due no earlier than now (its `run_after`
/// moves up to now, as a handed-back job's does): it takes its place in claim order
/// among the jobs due now, not among the jobs enqueued with it. Left at its enqueue time,
/// it fell behind the positions claims start from while claims are slow (see
/// `runtime::producer::Cursor`), and every ordered job after a key's first waited for
/// the next claim from the start. "Now" is the moment of the update, not the start of
/// its transaction, which may have waited for keys' locks: a release timed at the start
/// commits behind jobs released and claimed meanwhile.
pub(crate) async fn ordering_settle(conn: &mut PgConnection, ids: &[i64]) -> Result<u64, Error> {
    ordering_settle_at(conn, ids, None).await
}

/// [`ordering_settle`] with `now` as the time (`None`: the database's clock).
pub(crate) async fn ordering_settle_at(
    conn: &mut PgConnection,
    ids: &[i64],
    now: Option<DateTime<Utc>>,
) -> Result<u64, Error> {
    ordering_settle_within(conn, ids, SETTLE_PATIENCE, now).await
}

/// [`ordering_settle_at`], waiting up to `patience` for held keys.
pub(crate) async fn ordering_settle_within(
    conn: &mut PgConnection,
    ids: &[i64],
    patience: std::time::Duration,
    now: Option<DateTime<Utc>>,
) -> Result<u64, Error> {
    let freed = ordering_settle_freed(conn, ids, patience, now).await?;
    Ok(u64::try_from(freed.len()).unwrap_or(u64::MAX))
}

/// A job a settle made claimable (or due to, when scheduled), and its place in claim
/// order: the runtime whose completer settled it rewinds its claims to it (see
/// `runtime::producer::Rewinds`).
#[derive(Debug, Clone)]
pub(crate) struct Freed {
    pub(crate) queue: String,
    pub(crate) kind: String,
    /// `pending` (claimable now) rather than `scheduled`.
    pub(crate) pending: bool,
    pub(crate) position: super::ClaimPosition,
}

/// [`ordering_settle_within`], returning the jobs it freed.
pub(crate) async fn ordering_settle_freed(
    conn: &mut PgConnection,
    ids: &[i64],
    patience: std::time::Duration,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<Freed>, Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = conn.begin().await?;
    // Never waiting for a lock while holding others: no deadlock with an enqueue that
    // holds several keys, and no completion stuck behind a long transaction.
    let mut missing = ordering_try_lock_of(&mut tx, ids).await?;
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(2);
    while !missing.is_empty() && started.elapsed() < patience {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
        missing = ordering_try_lock_again(&mut tx, &missing).await?;
    }
    if !missing.is_empty() {
        tracing::debug!(
            keys = missing.len(),
            "ordering keys held by open transactions; the sweeper settles them"
        );
    }
    let freed: Vec<(String, String, String, i16, DateTime<Utc>, i64)> = sqlx::query_as(concat!(
        r#"
        WITH moved AS (
            UPDATE jobq.jobs s SET blocked_by = "#,
        below_sql!(),
        r#",
                run_after = CASE
                    WHEN s.state IN ('pending', 'scheduled') AND "#,
        below_sql!(),
        r#" IS NULL
                    THEN greatest(s.run_after, coalesce($4, clock_timestamp()))
                    ELSE s.run_after END
            WHERE (s.blocked_by = ANY($1) OR s.id = ANY($1)) AND s.ordering_key IS NOT NULL
              AND NOT hashtext(s.ordering_scope || chr(31) || s.ordering_key) = ANY($3)
              AND "#,
        member_sql!("s"),
        r#"
            RETURNING s.queue, s.kind, s.state, s.blocked_by, s.priority, s.run_after, s.id
        ),
        wake AS (
            SELECT pg_notify($2, q.queue)
            FROM (SELECT DISTINCT queue FROM moved
                  WHERE blocked_by IS NULL AND state = 'pending') q
        )
        -- Every queue woken is a freed job's, so the wake-ups are sent whenever a row
        -- is returned (the one-row join reads all of `wake`).
        SELECT m.queue, m.kind, m.state, m.priority, m.run_after, m.id
        FROM moved m, (SELECT count(*) FROM wake) w
        WHERE m.blocked_by IS NULL AND m.state IN ('pending', 'scheduled')
        "#
    ))
    .bind(ids)
    .bind(NOTIFY_CHANNEL)
    .bind(&missing)
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(freed
        .into_iter()
        .map(|(queue, kind, state, priority, run_after, id)| Freed {
            queue,
            kind,
            pending: state == "pending",
            position: super::ClaimPosition {
                priority,
                run_after,
                id,
            },
        })
        .collect())
}

/// The jobs up to `limit` waiting jobs wait behind that are no chain members any more
/// (finished, cancelled, skipped or pruned) — left so by a crash between a job's end and
/// its [`ordering_settle`]. The sweep settles them.
pub(crate) async fn ordering_stale_blockers(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<i64>, Error> {
    let ids: Vec<i64> = sqlx::query_scalar(concat!(
        r#"
        SELECT DISTINCT b.blocked_by FROM (
            SELECT s.blocked_by FROM jobq.jobs s
            WHERE s.blocked_by IS NOT NULL AND s.state IN ('scheduled', 'pending')
              AND NOT EXISTS (SELECT 1 FROM jobq.jobs t WHERE t.id = s.blocked_by AND "#,
        member_sql!("t"),
        r#")
            LIMIT $1
        ) b
        "#
    ))
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    Ok(ids)
}

/// What `unpark --skip-failed` did to one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Unparked {
    /// The failed jobs that stopped blocking their key (they stay `failed`).
    pub skipped: Vec<i64>,
    /// The jobs that became claimable.
    pub released: u64,
}

/// Marks the failed chain members of `key` (in `scope`, or in every scope) skipped —
/// they stay `failed` and keep their history but no longer block — with one `unpark`
/// audit row each, and settles the key so the jobs behind them proceed.
pub(crate) async fn ordering_unpark(
    conn: &mut PgConnection,
    scope: Option<&str>,
    key: &str,
    actor: Actor<'_>,
) -> Result<Unparked, Error> {
    let mut tx = conn.begin().await?;
    sqlx::query(
        r#"
        SELECT count(pg_advisory_xact_lock($3, h))
        FROM (SELECT DISTINCT hashtext(ordering_scope || chr(31) || ordering_key) AS h
              FROM jobq.jobs
              WHERE state = 'failed' AND ordering_key IS NOT NULL AND NOT ordering_skipped
                AND ordering_key = $1 AND ($2::text IS NULL OR ordering_scope = $2)
              ORDER BY h) x
        "#,
    )
    .bind(key)
    .bind(scope)
    .bind(LOCK_CLASS)
    .execute(&mut *tx)
    .await?;
    let skipped: Vec<i64> = sqlx::query_scalar(
        r#"
        WITH f AS (
            UPDATE jobq.jobs SET ordering_skipped = true
            WHERE state = 'failed' AND ordering_key IS NOT NULL AND NOT ordering_skipped
              AND ordering_key = $1 AND ($2::text IS NULL OR ordering_scope = $2)
            RETURNING id, ordering_scope
        ),
        audit AS (
            INSERT INTO jobq.job_audit
                (job_id, action, actor, reason, before_state, after_state, detail)
            SELECT id, 'unpark', $3, $4, 'failed', 'failed',
                   jsonb_build_object('ordering_scope', ordering_scope, 'ordering_key', $1,
                                      'skip_failed', true)
            FROM f
        )
        SELECT id FROM f ORDER BY id
        "#,
    )
    .bind(key)
    .bind(scope)
    .bind(actor.name)
    .bind(actor.reason)
    .fetch_all(&mut *tx)
    .await?;
    let released = ordering_settle(&mut tx, &skipped).await?;
    tx.commit().await?;
    Ok(Unparked { skipped, released })
}

/// Jobs parked behind a failed job of their key, per (queue, kind).
#[derive(Debug, Clone)]
pub(crate) struct ParkedCount {
    pub(crate) queue: String,
    pub(crate) kind: String,
    pub(crate) parked: i64,
}

/// The first failed chain member of each parked key, as a CTE `heads(id, ordering_scope,
/// ordering_key, kind, queue, last_error_code, finished_at)`, from `jobs_parked_idx`.
const HEADS: &str = r#"
    WITH heads AS (
        SELECT DISTINCT ON (ordering_scope, ordering_key)
               id, ordering_scope, ordering_key, kind, queue, last_error_code, finished_at
        FROM jobq.jobs
        WHERE state = 'failed' AND ordering_key IS NOT NULL AND NOT ordering_skipped
        ORDER BY ordering_scope, ordering_key, id
    )
"#;

/// Counts parked jobs (chain members above a failed member of their key) per queue and
/// kind: a scan of the failed ordered jobs, then one range of `jobs_ordering_idx` per
/// parked key.
pub(crate) async fn ordering_parked_counts(
    conn: &mut PgConnection,
) -> Result<Vec<ParkedCount>, Error> {
    let sql = format!(
        r#"{HEADS}
        SELECT b.queue, b.kind, count(*) AS parked
        FROM heads h
        JOIN jobq.jobs b ON b.ordering_scope = h.ordering_scope
                        AND b.ordering_key = h.ordering_key AND b.id > h.id
        WHERE NOT b.ordering_skipped AND b.state IN ('scheduled', 'pending')
        GROUP BY b.queue, b.kind
        ORDER BY b.queue, b.kind
        "#
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ParkedCount {
                queue: r.try_get("queue")?,
                kind: r.try_get("kind")?,
                parked: r.try_get("parked")?,
            })
        })
        .collect()
}

/// A key parked behind one of its failed jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedKey {
    /// The key's scope (a kind, or the name given by `ordering_scope`).
    pub scope: String,
    /// The key.
    pub key: String,
    /// The failed job the key waits behind (its lowest one).
    pub blocker: i64,
    /// The blocker's kind.
    pub blocker_kind: String,
    /// The blocker's queue.
    pub blocker_queue: String,
    /// The blocker's error code.
    pub code: Option<String>,
    /// When the blocker failed.
    pub since: Option<DateTime<Utc>>,
    /// Jobs of the key waiting behind it.
    pub parked: i64,
}

/// Parked keys, oldest blocker first, at most `limit`.
pub(crate) async fn ordering_parked_keys(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<ParkedKey>, Error> {
    let sql = format!(
        r#"{HEADS}
        SELECT h.ordering_scope, h.ordering_key, h.id, h.kind, h.queue, h.last_error_code,
               h.finished_at,
               (SELECT count(*) FROM jobq.jobs b
                WHERE b.ordering_scope = h.ordering_scope AND b.ordering_key = h.ordering_key
                  AND b.id > h.id AND NOT b.ordering_skipped
                  AND b.state IN ('scheduled', 'pending')) AS parked
        FROM heads h
        ORDER BY h.id
        LIMIT $1
        "#
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ParkedKey {
                scope: r.try_get("ordering_scope")?,
                key: r.try_get("ordering_key")?,
                blocker: r.try_get("id")?,
                blocker_kind: r.try_get("kind")?,
                blocker_queue: r.try_get("queue")?,
                code: r.try_get("last_error_code")?,
                since: r.try_get("finished_at")?,
                parked: r.try_get("parked")?,
            })
        })
        .collect()
}
