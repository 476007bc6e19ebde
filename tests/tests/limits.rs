//! Cluster-wide limits with real worker processes (`limits_node`) and PostgreSQL: the
//! concurrency cap holds while workers are SIGKILLed (the reaper returns their slots),
//! the rate limit holds across three processes, and an operator's change reaches running
//! nodes. Usage is sampled from the database, never inferred from timings.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::admin::{Admin, LimitSet, LimitTarget};
use jobq_testing::TestDatabase;
use tests::{N, Nodes, count_in_state};

#[path = "../src/limits_jobs.rs"]
mod limits_jobs;
use limits_jobs::{Adjustable, Capped, Metered};

fn spawn_node(db: &TestDatabase) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_limits_node"))
        .env("DATABASE_URL", db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Samples the running rows of `kind` every 10 ms until stopped; returns the maximum.
struct Sampler {
    max: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(pool: &sqlx::PgPool, kind: &'static str) -> Self {
        let max = Arc::new(AtomicI64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s, pool) = (max.clone(), stop.clone(), pool.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                let n = count_in_state(&pool, kind, "running").await;
                m.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Sampler { max, stop, task }
    }

    async fn max(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        self.max.load(Ordering::Relaxed)
    }
}

async fn done(pool: &sqlx::PgPool, kind: &str) -> i64 {
    count_in_state(pool, kind, "done").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_cap_holds_while_workers_are_killed() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    Capped::enqueue_many(pool, (0..60).map(|n| N { n })).await?;
    let sampler = Sampler::start(pool, "capped");
    let mut nodes = Nodes(Vec::new());
    for _ in 0..4 {
        nodes.0.push(spawn_node(&db)?);
    }
    // Six SIGKILLs of a worker while it holds slots, each replaced by a fresh process.
    let mut killed = 0;
    for round in 0..6 {
        let busy = tests::eventually(Duration::from_secs(60), || async {
            count_in_state(pool, "capped", "running").await > 0
        })
        .await;
        if !busy {
            break;
        }
        let victim = &mut nodes.0[round % 4];
        victim.kill()?;
        victim.wait()?;
        killed += 1;
        nodes.0[round % 4] = spawn_node(&db)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let finished = tests::eventually(Duration::from_secs(120), || async {
        done(pool, "capped").await == 60
    })
    .await;
    let max = sampler.max().await;
    drop(nodes);
    assert!(killed > 0, "no worker was killed while holding a slot");
    assert!(
        finished,
        "the killed workers' slots did not come back: {} of 60 done",
        done(pool, "capped").await
    );
    assert!(max <= 3, "{max} capped jobs ran at once; the cap is 3");
    assert!(max >= 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds_across_three_processes() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    Metered::enqueue_many(pool, (0..100).map(|n| N { n })).await?;
    let mut nodes = Nodes(Vec::new());
    for _ in 0..3 {
        nodes.0.push(spawn_node(&db)?);
    }
    let finished = tests::eventually(Duration::from_secs(120), || async {
        done(pool, "metered").await == 100
    })
    .await;
    drop(nodes);
    assert!(finished, "100 metered jobs did not finish");
    // Claims are stamped by the database's clock, which the buckets use too: in every
    // window from the first start, starts <= burst + rate x window.
    let starts: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT started_at FROM jobq.jobs WHERE kind = 'metered' ORDER BY started_at",
    )
    .fetch_all(pool)
    .await?;
    let attempts: i64 =
        sqlx::query_scalar("SELECT max(attempts)::int8 FROM jobq.jobs WHERE kind = 'metered'")
            .fetch_one(pool)
            .await?;
    assert_eq!(attempts, 1, "a job over the rate was charged an attempt");
    for (i, from) in starts.iter().enumerate() {
        for (j, to) in starts.iter().enumerate().skip(i) {
            let secs = (*to - *from).as_seconds_f64();
            let allowed = 5.0 + 20.0 * secs;
            let started = (j - i + 1) as f64;
            assert!(
                started <= allowed + 1e-6,
                "{started} starts within {secs:.3} s; at most {allowed:.1} allowed"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_limit_reaches_running_nodes() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    Adjustable::enqueue_many(pool, (0..80).map(|n| N { n })).await?;
    let mut nodes = Nodes(Vec::new());
    for _ in 0..2 {
        nodes.0.push(spawn_node(&db)?);
    }
    // Unlimited, both nodes run several at once.
    let parallel = tests::eventually(Duration::from_secs(60), || async {
        count_in_state(pool, "adjustable", "running").await >= 2
    })
    .await;
    assert!(parallel, "the nodes never ran two jobs at once");
    let admin = Admin::new(pool.clone()).actor("ops");
    let change = LimitSet {
        concurrency: Some(1),
        ..LimitSet::default()
    };
    admin
        .limit_set(
            &LimitTarget::Kind("adjustable".into()),
            &change,
            Some("test"),
        )
        .await?;
    // Every node reads limits again within its poll interval (200 ms) and the jobs
    // already running end within 300 ms; from then on at most one runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sampler = Sampler::start(pool, "adjustable");
    let finished = tests::eventually(Duration::from_secs(120), || async {
        done(pool, "adjustable").await == 80
    })
    .await;
    let max = sampler.max().await;
    drop(nodes);
    assert!(finished, "the adjustable jobs did not finish");
    assert_eq!(max, 1, "after the change, {max} ran at once");
    Ok(())
}
