//! Stats on a seeded table with known answers, the pruner's batches and retention
//! policy, and leader handover when the leader's connection dies.

use std::collections::HashMap;
use std::time::Duration;

use jobq::maintenance::{Leader, PruneReport, Pruner, PrunerConfig, Retention, WorkerPresence};
use jobq::stats::{StatsOptions, stats_with};
use jobq_testing::TestDatabase;
use sqlx::PgPool;

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{e}: {sql}"));
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[tokio::test]
async fn stats_on_a_seeded_table_give_the_known_answers() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    exec(
        pool,
        r#"
        -- q1/a: three due (oldest due 10 min ago, created 20 min ago), one scheduled, one
        -- waiting for a retry after a timeout, two running.
        INSERT INTO jobq.jobs (kind, queue, payload, run_after, created_at) VALUES
            ('a', 'q1', '{}', now() - interval '10 minutes', now() - interval '20 minutes'),
            ('a', 'q1', '{}', now() - interval '5 minutes', now() - interval '5 minutes'),
            ('a', 'q1', '{}', now() - interval '1 minute', now() - interval '1 minute'),
            ('a', 'q1', '{}', now() + interval '1 hour', now());
        INSERT INTO jobq.jobs (kind, queue, payload, run_after, attempts, last_error_code, last_failed_at)
            VALUES ('a', 'q1', '{}', now() + interval '1 hour', 1, 'timeout', now() - interval '1 minute');
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, locked_until, started_at)
            SELECT 'a', 'q1', '{}', 'running', 1, now() + interval '1 minute', now()
            FROM generate_series(1, 2);
        -- q1/a finished in the window: 100 done taking 1..100 s; 4 failed (3 smtp_auth,
        -- 1 bad_address) and outside the window 50 done and 5 failed.
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
            SELECT 'a', 'q1', '{}', 'done', 1,
                   now() - interval '1 minute' - make_interval(secs => i),
                   now() - interval '1 minute'
            FROM generate_series(1, 100) i;
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, last_error_code, finished_at)
            SELECT 'a', 'q1', '{}', 'failed', 1,
                   CASE WHEN i <= 3 THEN 'smtp_auth' ELSE 'bad_address' END,
                   now() - interval '2 minutes'
            FROM generate_series(1, 4) i;
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
            SELECT 'a', 'q1', '{}', 'done', 1, now() - interval '3 hours', now() - interval '2 hours'
            FROM generate_series(1, 50);
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, last_error_code, finished_at)
            SELECT 'a', 'q1', '{}', 'failed', 1, 'smtp_auth', now() - interval '2 hours'
            FROM generate_series(1, 5);
        -- q1/b: two due, and no worker serves kind b. q2/c: one due, no worker at all.
        INSERT INTO jobq.jobs (kind, queue, payload, run_after)
            SELECT 'b', 'q1', '{}', now() - interval '30 seconds' FROM generate_series(1, 2);
        INSERT INTO jobq.jobs (kind, queue, payload) VALUES ('c', 'q2', '{}');
        -- d: fast (1 s each).
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
            SELECT 'd', 'q2', '{}', 'done', 1, now() - interval '61 seconds', now() - interval '60 seconds'
            FROM generate_series(1, 10);
        "#,
    )
    .await;
    // One live worker serves q1 with 4 slots, kind a with a 60 s lease.
    WorkerPresence::new(
        pool.clone(),
        "w1",
        [("q1", 4)],
        [("a", Duration::from_secs(60))],
        Default::default(),
    )
    .run_once()
    .await?;

    let mut opts = StatsOptions::default();
    opts.leases.insert("d".to_owned(), Duration::from_secs(10));
    let s = stats_with(pool, &opts).await?;

    let q1 = s.queues.iter().find(|q| q.queue == "q1").unwrap();
    assert_eq!(
        (
            q1.due,
            q1.scheduled,
            q1.retrying,
            q1.running,
            q1.concurrency
        ),
        (5, 1, 1, 2, Some(4))
    );
    assert_eq!((q1.done, q1.failed, q1.cancelled), (100, 4, 0));
    assert!(close(q1.oldest_due_age_secs.unwrap(), 600.0, 5.0), "{q1:?}");
    assert!(
        close(q1.oldest_due_created_age_secs.unwrap(), 1200.0, 5.0),
        "{q1:?}"
    );
    assert!(!q1.paused);
    let q2 = s.queues.iter().find(|q| q.queue == "q2").unwrap();
    assert_eq!((q2.due, q2.concurrency, q2.done), (1, None, 10));

    let kind = |q: &str, k: &str| {
        s.kinds
            .iter()
            .find(|x| x.queue == q && x.kind == k)
            .unwrap_or_else(|| panic!("no {q}/{k} in {:?}", s.kinds))
    };
    assert!(!kind("q1", "a").unserved);
    assert!(kind("q1", "b").unserved);
    assert!(kind("q2", "c").unserved);
    assert!(!kind("q2", "d").unserved, "nothing pending");
    assert_eq!(kind("q1", "b").due, 2);

    let failures: Vec<(&str, &str, &str, i64, i64)> = s
        .failures
        .iter()
        .map(|f| {
            (
                f.queue.as_str(),
                f.kind.as_str(),
                f.code.as_str(),
                f.failed,
                f.retrying,
            )
        })
        .collect();
    assert_eq!(
        failures,
        vec![
            ("q1", "a", "bad_address", 1, 0),
            ("q1", "a", "smtp_auth", 3, 0),
            ("q1", "a", "timeout", 0, 1),
        ]
    );

    let a = s.runtimes.iter().find(|r| r.kind == "a").unwrap();
    assert_eq!(a.samples, 100);
    assert!(close(a.p50_secs, 50.5, 0.01), "{a:?}");
    assert!(close(a.p99_secs, 99.01, 0.01), "{a:?}");
    assert!(close(a.max_secs, 100.0, 0.01), "{a:?}");
    assert_eq!(a.lease_secs, Some(60.0));
    assert!(a.lease_too_short, "p99 of 99 s is over half a 60 s lease");
    let d = s.runtimes.iter().find(|r| r.kind == "d").unwrap();
    assert_eq!(
        (d.samples, d.lease_secs, d.lease_too_short),
        (10, Some(10.0), false)
    );
    assert_eq!(s.workers.len(), 1);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn pruner_deletes_by_policy_in_batches_with_effects_and_an_audit_row() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    exec(
        pool,
        r#"
        CREATE FUNCTION pg_temp.seed(k text, s text, n int, age interval) RETURNS void AS $$
            INSERT INTO jobq.jobs (kind, payload, state, finished_at)
            SELECT k, '{}', s, now() - age FROM generate_series(1, n)
        $$ LANGUAGE sql;
        SELECT pg_temp.seed('x', 'done', 2500, '8 days');
        SELECT pg_temp.seed('x', 'done', 10, '1 day');
        SELECT pg_temp.seed('x', 'failed', 20, '20 days');
        SELECT pg_temp.seed('x', 'failed', 15, '40 days');
        SELECT pg_temp.seed('x', 'cancelled', 7, '31 days');
        SELECT pg_temp.seed('keep', 'done', 5, '8 days');
        SELECT pg_temp.seed('short', 'failed', 3, '2 days');
        INSERT INTO jobq.jobs (kind, payload) VALUES ('x', '{}');
        -- One effect per job.
        INSERT INTO jobq.job_effects (effect_key, job_id, attempt)
            SELECT 'effect-' || id, id, 1 FROM jobq.jobs;
        "#,
    )
    .await;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
        .fetch_one(pool)
        .await?;
    let mut per_kind = HashMap::new();
    per_kind.insert(
        "keep".to_owned(),
        Retention {
            done_after: Duration::from_secs(10 * 86400),
            ..Retention::default()
        },
    );
    per_kind.insert(
        "short".to_owned(),
        Retention {
            failed_after: Duration::from_secs(86400),
            ..Retention::default()
        },
    );
    let pruner = Pruner::new(
        pool.clone(),
        PrunerConfig {
            per_kind,
            batch: 1000,
            ..PrunerConfig::default()
        },
    );
    let dry = pruner.dry_run(None).await?;
    assert_eq!((dry.done, dry.failed, dry.cancelled), (2500, 18, 7));
    let report = pruner.run_once().await?;
    // Default rules: done in 3 batches (1000, 1000, 500), failed 1, cancelled 1; two
    // per-kind overrides, 3 statements each; one for the (empty) inbox.
    assert_eq!(
        report,
        PruneReport {
            done: 2500,
            failed: 18,
            cancelled: 7,
            batches: 12,
            inbox: 0
        }
    );
    let (jobs, effects, orphans): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobq.jobs), (SELECT count(*) FROM jobq.job_effects),
                (SELECT count(*) FROM jobq.job_effects e
                 WHERE NOT EXISTS (SELECT 1 FROM jobq.jobs j WHERE j.id = e.job_id))",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(jobs, total - 2525);
    assert_eq!(effects, jobs, "every kept job keeps its effect keys");
    assert_eq!(orphans, 0, "deleted jobs' effect keys went with them");
    let kept: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT kind, state, count(*) FROM jobq.jobs GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(pool)
            .await?;
    assert_eq!(
        kept,
        vec![
            ("keep".to_owned(), "done".to_owned(), 5),
            ("x".to_owned(), "done".to_owned(), 10),
            ("x".to_owned(), "failed".to_owned(), 20),
            ("x".to_owned(), "pending".to_owned(), 1),
        ]
    );
    let audit: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT action, actor, detail FROM jobq.job_audit ORDER BY id")
            .fetch_all(pool)
            .await?;
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].0.as_str(), audit[0].1.as_str()),
        ("prune", "pruner")
    );
    assert_eq!(audit[0].2["done"], 2500);
    // Nothing left to do: no deletes, no audit row.
    assert_eq!(pruner.run_once().await?.total(), 0);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.job_audit")
        .fetch_one(pool)
        .await?;
    assert_eq!(n, 1);
    db.close().await;
    Ok(())
}

/// A pass that fails halfway (here a trigger refuses one row of the third batch) keeps
/// what it deleted, and its audit row says exactly that: the row is written in the
/// transaction of each batch, not after the last one.
#[tokio::test]
async fn a_prune_pass_that_fails_halfway_has_audited_every_deletion_it_made() -> anyhow::Result<()>
{
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    exec(
        pool,
        r#"
        INSERT INTO jobq.jobs (kind, payload, state, finished_at)
            SELECT 'x', '{}', 'done', now() - interval '30 days' + n * interval '1 second'
            FROM generate_series(1, 25) AS n;
        CREATE FUNCTION refuse() RETURNS trigger AS $$
        BEGIN RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql;
        "#,
    )
    .await;
    // The 21st oldest: the first row of the third batch of ten.
    let refused: i64 =
        sqlx::query_scalar("SELECT id FROM jobq.jobs ORDER BY finished_at OFFSET 20 LIMIT 1")
            .fetch_one(pool)
            .await?;
    exec(
        pool,
        &format!(
            "CREATE TRIGGER refuse BEFORE DELETE ON jobq.jobs FOR EACH ROW
                 WHEN (OLD.id = {refused}) EXECUTE FUNCTION refuse();"
        ),
    )
    .await;
    let pruner = Pruner::new(
        pool.clone(),
        PrunerConfig {
            batch: 10,
            ..PrunerConfig::default()
        },
    );
    assert!(
        pruner.run_once().await.is_err(),
        "the third batch must fail"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
        .fetch_one(pool)
        .await?;
    assert_eq!(left, 5, "two batches of ten deleted and kept");
    let audit: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT detail FROM jobq.job_audit WHERE action = 'prune'")
            .fetch_all(pool)
            .await?;
    assert_eq!(audit.len(), 1, "the deletions that committed are audited");
    assert_eq!(audit[0]["done"], 20);
    db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_passes_to_another_node_when_the_leader_dies() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let key = jobq::maintenance::PRUNER_LOCK;
    let mut a = Leader::new(db.new_pool(2).await?, key);
    let mut b = Leader::new(db.new_pool(2).await?, key);
    assert!(a.check().await);
    assert!(!b.check().await, "one leader at a time");
    assert!(a.check().await, "the leader stays leader");

    // The leader's connection is cut (its process died, its network went away).
    let pid = a.backend_pid().await?;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(db.pool())
        .await?;
    assert!(killed);
    let mut b_leads = false;
    for _ in 0..100 {
        if b.check().await {
            b_leads = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(b_leads, "another node takes over");
    assert!(!a.check().await, "the old leader notices and follows");
    assert!(!a.is_leader());

    // The new leader goes away without resigning (dropped): the old one takes over.
    drop(b);
    let mut a_leads = false;
    for _ in 0..100 {
        if a.check().await {
            a_leads = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a_leads);
    a.resign().await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(db.pool())
    .await?;
    assert_eq!(held, 0, "resigning releases the lock");
    db.close().await;
    Ok(())
}

struct Noop;

impl jobq::Job for Noop {
    const KIND: &'static str = "noop";
    type Args = tests::N;
    type Error = jobq::JobError;
    async fn run(_ctx: jobq::JobContext, _args: tests::N) -> Result<(), jobq::JobError> {
        Ok(())
    }
}

async fn seed_old_done(pool: &PgPool, n: i64) {
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, finished_at)
         SELECT 'old', '{}', 'done', now() - interval '8 days' FROM generate_series(1, $1)",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

async fn old_left(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE kind = 'old'")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn prune_actors(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT actor FROM jobq.job_audit WHERE action = 'prune' ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runtime_prunes_at_a_time_and_another_takes_over_when_it_stops() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut handles = Vec::new();
    for name in ["node-a", "node-b"] {
        let p = db.new_pool(4).await?;
        let rt = jobq::Runtime::builder(p)
            .auto_register(false)
            .register::<Noop>()
            .worker_id(name)
            .reaper(None)
            .pruner(Some(PrunerConfig {
                interval: Duration::from_millis(100),
                batch: 100,
                actor: name.to_owned(),
                ..PrunerConfig::default()
            }))
            .build()?;
        handles.push(Some(rt.start().await?));
    }
    seed_old_done(pool, 450).await;
    assert!(
        tests::eventually(Duration::from_secs(10), || async {
            old_left(pool).await == 0
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let actors = prune_actors(pool).await;
    assert!(!actors.is_empty());
    let leader = actors[0].clone();
    assert!(
        actors.iter().all(|a| *a == leader),
        "only the leader prunes: {actors:?}"
    );

    // The leader's runtime stops; the other node becomes leader and prunes.
    let idx = usize::from(leader == "node-b");
    if let Some(h) = handles[idx].take() {
        h.shutdown().await;
    }
    seed_old_done(pool, 120).await;
    assert!(
        tests::eventually(Duration::from_secs(10), || async {
            old_left(pool).await == 0
        })
        .await
    );
    // The pass's audit row is written after its last batch.
    let n = actors.len();
    assert!(
        tests::eventually(Duration::from_secs(5), || async {
            prune_actors(pool).await.len() > n
        })
        .await
    );
    let actors = prune_actors(pool).await;
    let last = actors.last().cloned().unwrap_or_default();
    assert_ne!(last, leader, "the surviving node took over: {actors:?}");
    for h in handles.into_iter().flatten() {
        h.shutdown().await;
    }
    db.close().await;
    Ok(())
}
