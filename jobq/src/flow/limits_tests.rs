//! The limited claim against PostgreSQL, with the clock as a parameter.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::limits::*;
use crate::store::{self, Actor, ClaimParams, LimitChange};

const KINDS: [&str; 2] = ["k", "other"];

async fn db_now(conn: &mut PgConnection) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// `n` due jobs of `kind` in `queue` with the given keys.
async fn pending(
    conn: &mut PgConnection,
    kind: &str,
    queue: &str,
    n: i32,
    ckey: Option<&str>,
    rkey: Option<&str>,
) {
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, run_after, concurrency_key, rate_key)
         SELECT $1, $2, '{}', 'pending', now() - interval '1 hour', $4, $5
         FROM generate_series(1, $3)",
    )
    .bind(kind)
    .bind(queue)
    .bind(n)
    .bind(ckey)
    .bind(rkey)
    .execute(conn)
    .await
    .unwrap();
}

async fn running(conn: &mut PgConnection, kind: &str, queue: &str, n: i32, ckey: Option<&str>) {
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, locked_until, locked_by,
                                concurrency_key)
         SELECT $1, $2, '{}', 'running', 1, now() + interval '1 hour', 'w', $4
         FROM generate_series(1, $3)",
    )
    .bind(kind)
    .bind(queue)
    .bind(n)
    .bind(ckey)
    .execute(conn)
    .await
    .unwrap();
}

async fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn effective(conn: &mut PgConnection, now: Option<DateTime<Utc>>) -> Effective {
    let cache = LimitCache::new(
        Vec::<(String, KindLimits)>::new(),
        Vec::new(),
        Duration::ZERO,
    );
    (*cache.get(conn, now).await.unwrap()).clone()
}

async fn claim_at(
    conn: &mut PgConnection,
    queue: &str,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Vec<i64> {
    let kinds: Vec<String> = KINDS.iter().map(|k| (*k).to_owned()).collect();
    let limits = effective(conn, now).await;
    let jobs = claim(
        conn,
        &ClaimParams {
            queue,
            kinds: &kinds,
            lease_secs: &[60.0, 60.0],
            limit,
            worker: "w",
            now,
            after: None,
        },
        &limits,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    jobs.jobs.iter().map(|j| j.id).collect()
}

async fn seed(conn: &mut PgConnection, limits: KindLimits, queue_limit: Option<u32>) {
    let cache = LimitCache::new(
        [("k".to_owned(), limits)],
        [("default".to_owned(), queue_limit)],
        Duration::ZERO,
    );
    cache.get(conn, None).await.unwrap();
}

#[tokio::test]
async fn a_kind_limit_caps_running_jobs() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(3), None).await;
    running(&mut conn, "k", "default", 2, None).await;
    pending(&mut conn, "k", "default", 10, None, None).await;
    pending(&mut conn, "other", "default", 2, None, None).await;
    let got = claim_at(&mut conn, "default", 10, None).await;
    // One slot of `k` is free; `other` has no limit.
    assert_eq!(got.len(), 3);
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 0);
    let running_k = "SELECT count(*) FROM jobq.jobs WHERE kind = 'k' AND state = 'running'";
    assert_eq!(count(&mut conn, running_k).await, 3);
    // Nothing was deferred or charged an attempt.
    let untouched =
        "SELECT count(*) FROM jobq.jobs WHERE kind = 'k' AND state = 'pending' AND attempts = 0";
    assert_eq!(count(&mut conn, untouched).await, 9);
    // A finished (or reaped) job frees its slot.
    sqlx::query("UPDATE jobq.jobs SET state = 'done', locked_until = NULL WHERE id = (SELECT min(id) FROM jobq.jobs WHERE state = 'running' AND kind = 'k')")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 1);
}

#[tokio::test]
async fn concurrent_claims_never_pass_the_limit() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(3), None).await;
    pending(&mut conn, "k", "default", 50, None, None).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let pool = db.pool().clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            claim_at(&mut conn, "default", 2, None).await.len()
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 3);
}

/// Waits until a limited claim of this database waits for a lock (its text is cut
/// before `limit_gens` in `pg_stat_activity`, so it is known by its first CTE).
async fn wait_for_gen_lock(conn: &mut PgConnection) {
    loop {
        let waiting = count(
            conn,
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%WITH served AS%'
               AND datname = current_database()",
        )
        .await;
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_one_statement_claim_overtaken_by_another_takes_nothing_it_should_not() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(3), None).await;
    pending(&mut conn, "k", "default", 10, None, None).await;
    let key = store::lock_key("kind", "k");
    sqlx::query("INSERT INTO jobq.limit_gens (key, gen) VALUES ($1, 1)")
        .bind(key)
        .execute(&mut *conn)
        .await
        .unwrap();
    // Another node's claim of the last 3 slots, not yet committed.
    let mut other = db.pool().begin().await.unwrap();
    sqlx::query(
        "UPDATE jobq.jobs SET state = 'running', attempts = 1,
                locked_until = now() + interval '1 hour', locked_by = 'x'
         WHERE id IN (SELECT id FROM jobq.jobs WHERE kind = 'k' ORDER BY id LIMIT 3)",
    )
    .execute(&mut *other)
    .await
    .unwrap();
    sqlx::query("UPDATE jobq.limit_gens SET gen = gen + 1 WHERE key = $1")
        .bind(key)
        .execute(&mut *other)
        .await
        .unwrap();
    // This claim reads its usage (nothing running) before the other commits, and waits
    // for the generation's row.
    let pool = db.pool().clone();
    let claim = tokio::spawn(async move {
        let mut conn = pool.acquire().await.unwrap();
        claim_at(&mut conn, "default", 10, None).await
    });
    wait_for_gen_lock(&mut conn).await;
    other.commit().await.unwrap();
    // It finds the generation changed and claims again under the locks: the limit is
    // full.
    assert_eq!(claim.await.unwrap(), Vec::<i64>::new());
    let running_k = "SELECT count(*) FROM jobq.jobs WHERE kind = 'k' AND state = 'running'";
    assert_eq!(count(&mut conn, running_k).await, 3);
}

#[tokio::test]
async fn a_claim_that_takes_nothing_writes_nothing() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(2), None).await;
    pending(&mut conn, "k", "default", 5, None, None).await;
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 2);
    let gens = "SELECT coalesce(sum(gen), 0)::int8 FROM jobq.limit_gens";
    assert_eq!(count(&mut conn, gens).await, 1);
    // The limit is full: looking again writes no row version.
    let versions = "SELECT ((SELECT coalesce(sum(xmin::text::int8), 0) FROM jobq.jobs)
                          + (SELECT coalesce(sum(xmin::text::int8), 0) FROM jobq.limit_gens)
                          + (SELECT count(*) FROM jobq.rate_buckets))::int8";
    let before = count(&mut conn, versions).await;
    for _ in 0..3 {
        assert!(claim_at(&mut conn, "default", 10, None).await.is_empty());
    }
    assert_eq!(count(&mut conn, gens).await, 1);
    assert_eq!(count(&mut conn, versions).await, before);
}

#[tokio::test]
async fn a_per_key_limit_defers_saturated_keys_without_an_attempt() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(2).per_key(), None).await;
    running(&mut conn, "k", "default", 1, Some("a")).await;
    pending(&mut conn, "k", "default", 5, Some("a"), None).await;
    pending(&mut conn, "k", "default", 3, Some("b"), None).await;
    let now = db_now(&mut conn).await;
    let got = claim_at(&mut conn, "default", 10, Some(now)).await;
    assert_eq!(got.len(), 3, "one more of a, two of b");
    let per_key = "SELECT count(*) FROM jobq.jobs WHERE state = 'running' GROUP BY concurrency_key ORDER BY 1 DESC LIMIT 1";
    assert_eq!(count(&mut conn, per_key).await, 2);
    // The rest of `a` and `b` wait a second as `scheduled`, attempts untouched.
    let deferred = "SELECT count(*) FROM jobq.jobs WHERE state = 'scheduled' AND attempts = 0 AND run_after > now()";
    assert_eq!(count(&mut conn, deferred).await, 5);
    assert_eq!(claim_at(&mut conn, "default", 10, Some(now)).await.len(), 0);
}

#[tokio::test]
async fn a_queue_limit_caps_the_queue() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE, Some(4)).await;
    running(&mut conn, "other", "default", 1, None).await;
    running(&mut conn, "other", "elsewhere", 5, None).await;
    pending(&mut conn, "k", "default", 5, None, None).await;
    pending(&mut conn, "other", "default", 5, None, None).await;
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 3);
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 0);
}

#[tokio::test]
async fn a_rate_limit_charges_a_bucket_by_the_clock() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(
        &mut conn,
        KindLimits::NONE.rate(Rate::per_second(2)).burst(3),
        None,
    )
    .await;
    pending(&mut conn, "k", "default", 20, None, None).await;
    let t0 = db_now(&mut conn).await;
    let at = |ms: i64| Some(t0 + chrono::Duration::milliseconds(ms));
    assert_eq!(
        claim_at(&mut conn, "default", 10, at(0)).await.len(),
        3,
        "the burst"
    );
    assert_eq!(claim_at(&mut conn, "default", 10, at(0)).await.len(), 0);
    assert_eq!(claim_at(&mut conn, "default", 10, at(400)).await.len(), 0);
    assert_eq!(claim_at(&mut conn, "default", 10, at(500)).await.len(), 1);
    assert_eq!(claim_at(&mut conn, "default", 10, at(1500)).await.len(), 2);
    assert_eq!(
        claim_at(&mut conn, "default", 10, at(60_000)).await.len(),
        3
    );
    // Jobs over the kind-wide rate stay pending, no attempt counted.
    let waiting = "SELECT count(*) FROM jobq.jobs WHERE state = 'pending' AND attempts = 0";
    assert_eq!(count(&mut conn, waiting).await, 11);
}

#[tokio::test]
async fn a_per_key_rate_defers_jobs_to_their_tokens() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(
        &mut conn,
        KindLimits::NONE
            .rate(Rate::per_second(1))
            .burst(1)
            .rate_per_key(),
        None,
    )
    .await;
    pending(&mut conn, "k", "default", 3, None, Some("a")).await;
    pending(&mut conn, "k", "default", 1, None, Some("b")).await;
    let t0 = db_now(&mut conn).await;
    assert_eq!(claim_at(&mut conn, "default", 10, Some(t0)).await.len(), 2);
    let times: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT run_after FROM jobq.jobs WHERE state = 'scheduled' AND attempts = 0 ORDER BY run_after",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        times,
        vec![
            t0 + chrono::Duration::seconds(1),
            t0 + chrono::Duration::seconds(2)
        ]
    );
}

#[tokio::test]
async fn a_throttle_holds_every_job_of_its_key() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    // `k` has a kind-wide rate; `other` has no limit at all.
    seed(
        &mut conn,
        KindLimits::NONE.rate(Rate::per_second(100)),
        None,
    )
    .await;
    pending(&mut conn, "k", "default", 5, None, None).await;
    pending(&mut conn, "other", "default", 2, None, Some("api")).await;
    pending(&mut conn, "other", "default", 1, None, Some("elsewhere")).await;
    let t0 = db_now(&mut conn).await;
    let until = t0 + chrono::Duration::seconds(30);
    store::rate_throttle(&mut conn, "k", "k", until)
        .await
        .unwrap();
    store::rate_throttle(&mut conn, "other", "api", until)
        .await
        .unwrap();
    // An earlier throttle does not shorten a later one.
    store::rate_throttle(&mut conn, "k", "k", t0).await.unwrap();
    let got = claim_at(&mut conn, "default", 10, Some(t0)).await;
    assert_eq!(got.len(), 1, "only `other`'s job of another key");
    let at_end = claim_at(&mut conn, "default", 10, Some(until)).await;
    // At the throttle's end: one token of `k`, and `other`'s deferred jobs are due then
    // (they come back through the promoter).
    assert_eq!(at_end.len(), 1);
    let deferred: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT run_after FROM jobq.jobs WHERE kind = 'other' AND state = 'scheduled'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(deferred, vec![until, until]);
}

#[tokio::test]
async fn an_operator_limit_wins_until_cleared() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(5), None).await;
    let actor = Actor {
        name: "ops",
        reason: Some("provider asked"),
    };
    let change = LimitChange {
        concurrency: Some(1),
        ..LimitChange::default()
    };
    assert!(
        store::limit_set(&mut conn, "kind", "k", Some(&change), actor)
            .await
            .unwrap()
    );
    // A runtime starting with the code's limit does not undo the operator's.
    seed(&mut conn, KindLimits::NONE.concurrency(7), None).await;
    let e = effective(&mut conn, None).await;
    assert_eq!(e.kinds["k"].concurrency, Some(1));
    pending(&mut conn, "k", "default", 5, None, None).await;
    assert_eq!(claim_at(&mut conn, "default", 10, None).await.len(), 1);
    assert!(
        store::limit_set(&mut conn, "kind", "k", None, actor)
            .await
            .unwrap()
    );
    assert!(
        !store::limit_set(&mut conn, "kind", "k", None, actor)
            .await
            .unwrap()
    );
    assert_eq!(
        effective(&mut conn, None).await.kinds["k"].concurrency,
        Some(7)
    );
    let audit = "SELECT count(*) FROM jobq.job_audit WHERE action IN ('limit_set', 'limit_clear') AND actor = 'ops' AND reason = 'provider asked'";
    assert_eq!(count(&mut conn, audit).await, 2);
    // A code limit removed from the code goes away; the claim is unlimited again.
    seed(&mut conn, KindLimits::NONE, None).await;
    assert!(effective(&mut conn, None).await.kinds.is_empty());
}

#[tokio::test]
async fn a_limited_claim_never_takes_a_job_waiting_behind_its_ordering_key() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(10), None).await;
    // The head of a key and the job waiting behind it.
    let head: i64 = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, run_after, ordering_scope, ordering_key)
         VALUES ('k', '{}', 'pending', now() - interval '1 hour', 'k', 'acct') RETURNING id",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, run_after, ordering_scope, ordering_key,
                                blocked_by)
         VALUES ('k', '{}', 'pending', now() - interval '1 hour', 'k', 'acct', $1)",
    )
    .bind(head)
    .execute(&mut *conn)
    .await
    .unwrap();
    assert_eq!(claim_at(&mut conn, "default", 10, None).await, vec![head]);
    assert!(claim_at(&mut conn, "default", 10, None).await.is_empty());
}

/// Limited claims run on sessions that plan them once ([`crate::runtime::limited_pool`]):
/// planning the statement for every claim cost more than running it. The one plan is made
/// on the table as it is at the first claims, so it must reach rows through indexes:
/// made on a table of 20,000 rows, a plan free to choose updated the claimed rows through
/// a scan of the whole table, which grows with it.
#[tokio::test]
async fn limited_claims_keep_one_plan_that_uses_indexes() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed(&mut conn, KindLimits::NONE.concurrency(10_000), None).await;
    pending(&mut conn, "k", "default", 20_000, None, None).await;
    sqlx::query("ANALYZE jobq.jobs")
        .execute(&mut *conn)
        .await
        .unwrap();
    let limited = crate::runtime::limited_pool(db.pool(), 1);
    let mut lc = limited.acquire().await.unwrap();
    for _ in 0..7 {
        assert_eq!(claim_at(&mut lc, "default", 100, None).await.len(), 100);
    }
    let (name, generic, custom): (String, i64, i64) = sqlx::query_as(
        "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements
         WHERE statement LIKE '%jobq.limit_gens%' AND statement LIKE '%claimed AS%'
           AND statement NOT LIKE '%pg_prepared_statements%'",
    )
    .fetch_one(&mut *lc)
    .await
    .unwrap();
    assert_eq!((generic, custom), (7, 0));
    // The plan it keeps: no scan of the whole of jobq.jobs anywhere.
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN EXECUTE {name}('default', '{{k,other}}', '{{10000,NULL}}', '{{NULL,NULL}}',
         '{{NULL,NULL}}', '{{}}', '{{}}', NULL, NULL, 10, '{{60,60}}', '{{1,NULL}}', NULL, 'w')"
    )))
    .fetch_all(&mut *lc)
    .await
    .unwrap();
    assert!(
        !plan.iter().any(|l| l.contains("Seq Scan on jobs")),
        "{}",
        plan.join("\n")
    );
}
