//! The `scheduled` state and its promoter, through the public API: scheduled jobs never
//! run early and always run once due (by the database's clock), promotion on many nodes
//! at once promotes each job once, operator actions and `jobq-testing` see the new state.

use std::time::Duration;

use jobq::admin::Admin;
use jobq::maintenance::{Promoter, PromoterConfig};
use jobq::{Job, Runtime};
use jobq_testing::{Drain, TestDatabase};
use sqlx::PgPool;
use tests::{Idle, N, eventually, init_tracing, job_state};

async fn db_now(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn count(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn scheduled_jobs_never_run_early_and_run_once_due() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let at = db_now(pool).await + chrono::Duration::seconds(2);
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(Idle::with(N { n }).run_after(at).enqueue(pool).await?.id);
    }
    assert_eq!(job_state(pool, ids[0]).await, ("scheduled".to_owned(), 0));
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Idle>()
        .queue("default", 4)
        .poll_interval(Duration::from_millis(50))
        .promoter(Some(PromoterConfig {
            interval: Duration::from_millis(50),
            ..PromoterConfig::default()
        }))
        .build()?
        .start()
        .await?;
    let all_done = eventually(Duration::from_secs(60), || async {
        count(pool, "done").await == 5
    })
    .await;
    handle.shutdown().await;
    assert!(all_done, "every scheduled job ran once due");
    // By the database's clock: no attempt started before its run_after, each ran once.
    let early: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE started_at < run_after OR attempts <> 1",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(early, 0);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn promoters_on_many_nodes_at_once_promote_each_job_once() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let at = db_now(pool).await + chrono::Duration::hours(1);
    // 3,000 jobs scheduled for `at`, as `run_after(at)` enqueues them.
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, run_after)
         SELECT 'idle', jsonb_build_object('n', i), 'scheduled', $1
         FROM generate_series(1, 3000) i",
    )
    .bind(at)
    .execute(pool)
    .await?;
    let config = PromoterConfig {
        batch: 100,
        ..PromoterConfig::default()
    };
    let nodes: Vec<Promoter> = (0..4)
        .map(|_| Promoter::new(pool.clone(), config.clone()))
        .collect();
    // A second early: nothing.
    let early = at - chrono::Duration::seconds(1);
    for p in &nodes {
        assert_eq!(p.run_once_at(Some(early)).await?.promoted, 0);
    }
    let passes =
        futures_util::future::join_all(nodes.iter().map(|p| p.run_once_at(Some(at)))).await;
    let mut promoted = 0;
    for p in passes {
        promoted += p?.promoted;
    }
    assert_eq!(promoted, 3000, "each job promoted by exactly one node");
    assert_eq!(count(pool, "pending").await, 3000);
    assert_eq!(nodes[0].run_once_at(Some(at)).await?.promoted, 0);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn scheduled_jobs_can_be_retried_now_cancelled_and_replayed() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let later = db_now(pool).await + chrono::Duration::hours(1);
    let a = Idle::with(N { n: 1 })
        .run_after(later)
        .enqueue(pool)
        .await?
        .id;
    let b = Idle::with(N { n: 2 })
        .run_after(later)
        .enqueue(pool)
        .await?
        .id;
    let admin = Admin::new(pool.clone()).actor("ops");

    let stats = jobq::stats::stats(pool).await?;
    let q = stats.queues.iter().find(|q| q.queue == "default").unwrap();
    assert_eq!((q.due, q.scheduled), (0, 2), "{q:?}");

    let t = admin.retry_now(a, None).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("scheduled", "pending")
    );
    let t = admin.cancel(b, None).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("scheduled", "cancelled")
    );
    let t = admin.replay(b, None).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("cancelled", "pending")
    );
    let drained = Drain::new(pool)
        .register::<Idle>()
        .auto_register(false)
        .run()
        .await?;
    assert_eq!(drained.done(), 2);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn jobq_testing_drain_sees_scheduled_jobs() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let later = db_now(pool).await + chrono::Duration::hours(1);
    let id = Idle::with(N { n: 1 })
        .run_after(later)
        .enqueue(pool)
        .await?
        .id;
    let drain = || Drain::new(pool).register::<Idle>().auto_register(false);
    assert_eq!(
        drain().run().await?.done(),
        0,
        "not due by the database's clock"
    );
    assert_eq!(job_state(pool, id).await.0, "scheduled");
    let seen = jobq_testing::assert_enqueued::<Idle>(pool, |a| a.n == 1).await;
    assert_eq!(seen.state, "scheduled");
    assert_eq!(drain().advance_clock(true).run().await?.done(), 1);
    assert_eq!(job_state(pool, id).await.0, "done");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_slow_bulk_replay_holds_no_connection_while_it_waits() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, max_attempts, finished_at)
         SELECT 'idle', jsonb_build_object('n', i), 'failed', 1, 1,
                now() - interval '1 second'
         FROM generate_series(1, 20) i",
    )
    .execute(db.pool())
    .await?;
    // A pool of one: a replay holding its connection through the pauses would starve
    // every other user of the pool until it ends (20 jobs at 5/s: about 4 s).
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!(
            "{}/{}",
            jobq_testing::database_url().rsplit_once('/').unwrap().0,
            db.name()
        ))
        .await?;
    let admin = Admin::new(one.clone());
    let replay = tokio::spawn(async move {
        admin
            .replay_many(
                &jobq::admin::Filter::default(),
                jobq::admin::BulkReplay::at_rate(5.0),
                None,
            )
            .await
    });
    let started = eventually(Duration::from_secs(30), || async {
        count(db.pool(), "pending").await > 0
    })
    .await;
    assert!(started);
    let conn = tokio::time::timeout(Duration::from_secs(30), one.acquire()).await??;
    assert!(
        !replay.is_finished(),
        "the pool's connection was free while the replay paused"
    );
    drop(conn);
    let report = replay.await??;
    assert_eq!((report.matched, report.replayed), (20, 20));
    assert_eq!(report.ids.len(), 20);
    assert!(report.ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(count(db.pool(), "pending").await, 20);
    one.close().await;
    db.close().await;
    Ok(())
}
