//! The awkward tests: real worker processes (`chaos_worker`, built on jobq's public API)
//! killed, paused, cut off and starved while they drain a real PostgreSQL, with the
//! invariants checked after every scenario — every job terminal, none lost, each effect
//! recorded once, no completion by a stale attempt, retries counted.
//!
//! Sizes: `JOBQ_SOAK_JOBS` (default 2,000) and `JOBQ_SOAK_KILLS` (default 6); for a soak,
//! `JOBQ_SOAK_JOBS=10000 JOBQ_SOAK_KILLS=20 cargo test -p tests --test failure_injection
//! -- --nocapture`. Each scenario prints one summary line.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobq::Job;
use jobq_testing::TestDatabase;
use sqlx::PgPool;
use tests::{Chaos, ChaosArgs, eventually, install_invariant_checks, invariant_violations};

fn soak(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Harness {
    db: TestDatabase,
    url: String,
    workers: Vec<Child>,
}

impl Harness {
    async fn new(jobs: i64) -> anyhow::Result<Harness> {
        Harness::on(TestDatabase::new().await?, jobs).await
    }

    async fn on(db: TestDatabase, jobs: i64) -> anyhow::Result<Harness> {
        sqlx::raw_sql(
            "CREATE TABLE attempts_log (job_id bigint, attempt int, n bigint, pid int, at timestamptz DEFAULT clock_timestamp());
             CREATE TABLE side_effects (n bigint, job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp());",
        )
        .execute(db.pool())
        .await?;
        install_invariant_checks(db.pool()).await;
        let mut n = 0;
        while n < jobs {
            let end = (n + 1000).min(jobs);
            Chaos::enqueue_many(db.pool(), (n..end).map(|n| ChaosArgs { n })).await?;
            n = end;
        }
        sqlx::query("UPDATE jobq.jobs SET queue = 'chaos'")
            .execute(db.pool())
            .await?;
        let url = db.url().to_owned();
        Ok(Harness {
            db,
            url,
            workers: Vec::new(),
        })
    }

    fn pool(&self) -> &PgPool {
        self.db.pool()
    }

    fn spawn(&mut self, env: &[(&str, String)]) -> u32 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos_worker"));
        cmd.env("DATABASE_URL", &self.url)
            .env("CHAOS_QUEUE", "chaos")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning chaos_worker: {e}"));
        let pid = child.id();
        self.workers.push(child);
        pid
    }

    /// Reaps exited workers; returns how many exited since the last call.
    fn reap_exited(&mut self) -> usize {
        let before = self.workers.len();
        self.workers
            .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        before - self.workers.len()
    }

    async fn open_jobs(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM jobq.jobs WHERE state IN ('scheduled', 'pending', 'running')",
        )
        .fetch_one(self.pool())
        .await
        .unwrap_or(-1)
    }

    async fn stop_all(&mut self) {
        for c in &self.workers {
            signal(c.id(), "CONT");
            signal(c.id(), "TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.workers.is_empty() && Instant::now() < deadline {
            self.reap_exited();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for c in &mut self.workers {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.workers.clear();
    }

    /// Checks the invariants, prints the summary line, and fails on any loss, duplicate or
    /// stale completion.
    async fn verify(&self, name: &str, jobs: i64, kills: usize, extra: &str) -> Summary {
        let s: Summary = sqlx::query_as(
            r#"
            SELECT
              (SELECT count(*) FROM jobq.jobs) AS jobs,
              (SELECT count(*) FROM jobq.jobs WHERE state = 'done') AS done,
              (SELECT count(*) FROM jobq.jobs WHERE state <> 'done') AS not_done,
              (SELECT count(*) - count(DISTINCT n) FROM side_effects) AS duplicate_effects,
              (SELECT count(*) FROM generate_series(0, $1 - 1) g(n)
                 WHERE NOT EXISTS (SELECT 1 FROM side_effects e WHERE e.n = g.n)) AS missing_effects,
              (SELECT count(*) - count(DISTINCT effect_key) FROM jobq.job_effects) AS duplicate_ledger,
              (SELECT count(*) FROM side_effects e JOIN jobq.jobs j ON j.id = e.job_id
                 WHERE e.n % 2 = 0 AND e.attempt <> j.attempts) AS stale_completions,
              (SELECT coalesce(sum(attempts - 1), 0)::bigint FROM jobq.jobs) AS retries,
              (SELECT count(*) FROM attempts_log) AS executions
            "#,
        )
        .bind(jobs)
        .fetch_one(self.pool())
        .await
        .unwrap_or_else(|e| panic!("{name}: reading the invariants: {e}"));
        println!(
            "{name}: {} jobs, {kills} kills, {} lost, {} duplicate effects, {} retries{extra}",
            s.jobs,
            s.not_done + (jobs - s.jobs),
            s.duplicate_effects + s.duplicate_ledger,
            s.retries,
        );
        let violations = invariant_violations(self.pool()).await;
        assert!(violations.is_empty(), "{name}: {violations:#?}");
        assert_eq!(s.jobs, jobs, "{name}: jobs lost from the table");
        if s.not_done != 0 {
            let states: Vec<(String, i32, Option<String>, i64)> = sqlx::query_as(
                "SELECT state, attempts, last_error_code, count(*) FROM jobq.jobs
                 WHERE state <> 'done' GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 10",
            )
            .fetch_all(self.pool())
            .await
            .unwrap_or_default();
            panic!("{name}: jobs not done: {s:?}; by state, attempts, code: {states:?}");
        }
        assert_eq!(
            s.duplicate_effects, 0,
            "{name}: an effect happened twice: {s:?}"
        );
        assert_eq!(s.duplicate_ledger, 0, "{name}: {s:?}");
        assert_eq!(
            s.missing_effects, 0,
            "{name}: a done job has no effect: {s:?}"
        );
        assert_eq!(
            s.stale_completions, 0,
            "{name}: a job was completed by an attempt other than its last: {s:?}"
        );
        s
    }
}

#[derive(Debug, sqlx::FromRow)]
#[allow(dead_code)]
struct Summary {
    jobs: i64,
    done: i64,
    not_done: i64,
    duplicate_effects: i64,
    missing_effects: i64,
    duplicate_ledger: i64,
    stale_completions: i64,
    retries: i64,
    executions: i64,
}

/// Sends `sig` (`STOP`, `CONT`, `TERM`, `KILL`) to `pid` with kill(1): the workspace
/// forbids `unsafe`, and that includes a direct kill(2).
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Runs `workers` chaos workers over `jobs` jobs; `kills` of the processes SIGKILL
/// themselves at `crash`, each replaced by a fresh worker. `tick` runs every 200 ms.
async fn kill_scenario(name: &str, crash: &str, jobs: i64, kills: usize) -> anyhow::Result<()> {
    const WORKERS: usize = 3;
    let mut h = Harness::new(jobs).await?;
    // Spread the crashes over the run: each crashing worker dies on one of its first jobs.
    let per_crasher = (jobs as u64 / (WORKERS as u64 * (kills as u64 + 1))).max(2);
    let crasher = |h: &mut Harness| {
        let k = 1 + rand::random::<u64>() % per_crasher;
        h.spawn(&[
            ("CHAOS_CRASH", crash.to_owned()),
            ("CHAOS_CRASH_ON", k.to_string()),
            ("CHAOS_HANDLER_MS", "2".into()),
        ]);
    };
    let mut crashers_spawned = 0;
    for _ in 0..WORKERS {
        if crashers_spawned < kills {
            crasher(&mut h);
            crashers_spawned += 1;
        } else {
            h.spawn(&[]);
        }
    }
    let mut killed = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..h.reap_exited() {
            killed += 1;
            if crashers_spawned < kills {
                crasher(&mut h);
                crashers_spawned += 1;
            } else {
                h.spawn(&[]);
            }
        }
        if h.open_jobs().await == 0 || Instant::now() > deadline {
            break;
        }
    }
    h.stop_all().await;
    assert!(killed >= 1, "{name}: no worker was killed");
    let s = h.verify(name, jobs, killed, "").await;
    assert!(
        s.retries >= 1,
        "{name}: {killed} kills cost no retry, so no kill landed mid-job: {s:?}"
    );
    h.db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_effect_before_completion() -> anyhow::Result<()> {
    kill_scenario(
        "sigkill-after-effect",
        "after_effect",
        soak("JOBQ_SOAK_JOBS", 2000),
        soak("JOBQ_SOAK_KILLS", 6) as usize,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_claim_before_handler() -> anyhow::Result<()> {
    kill_scenario(
        "sigkill-after-claim",
        "after_claim",
        soak("JOBQ_SOAK_JOBS", 2000),
        soak("JOBQ_SOAK_KILLS", 6) as usize,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_handler() -> anyhow::Result<()> {
    kill_scenario(
        "sigkill-mid-handler",
        "mid_handler",
        soak("JOBQ_SOAK_JOBS", 2000),
        soak("JOBQ_SOAK_KILLS", 6) as usize,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_past_the_lease_then_sigcont() -> anyhow::Result<()> {
    let mut h = Harness::new(1).await?;
    // Worker A takes the job and works on it for 1.5 s before its effect.
    let a = h.spawn(&[
        ("CHAOS_HANDLER_MS", "1500".into()),
        ("CHAOS_CONCURRENCY", "1".into()),
    ]);
    let pool = h.pool().clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM attempts_log WHERE pid = $1")
                    .bind(a as i32)
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0)
                    == 1
            }
        })
        .await,
        "worker A never started the job"
    );
    // Pause A mid-handler, past its 2 s lease.
    signal(a, "STOP");
    let paused_at = Instant::now();
    let b = h.spawn(&[("CHAOS_CONCURRENCY", "1".into())]);
    let done = eventually(Duration::from_secs(20), || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM jobq.jobs")
                .fetch_one(&pool)
                .await
                .map(|s| s == "done")
                .unwrap_or(false)
        }
    })
    .await;
    let rescued_after = paused_at.elapsed();
    // Wake A: its attempt must neither record the effect nor complete the job.
    signal(a, "CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(done, "worker B never completed the rescued job");
    let effects: Vec<(i32, i32)> = sqlx::query_as("SELECT pid, attempt FROM side_effects")
        .fetch_all(h.pool())
        .await?;
    assert_eq!(
        effects,
        vec![(b as i32, 2)],
        "only B's attempt 2 performed the effect"
    );
    // A is alive and still serving after its pause.
    assert!(
        h.workers
            .iter_mut()
            .any(|c| c.id() == a && matches!(c.try_wait(), Ok(None))),
        "worker A died"
    );
    h.verify(
        "sigstop-past-lease",
        1,
        0,
        &format!(
            ", rescued {:.1}s after the pause",
            rescued_after.as_secs_f64()
        ),
    )
    .await;
    h.stop_all().await;
    h.db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_terminate_backend_on_the_workers_connections() -> anyhow::Result<()> {
    let jobs = soak("JOBQ_SOAK_JOBS", 2000);
    let mut h = Harness::new(jobs).await?;
    for _ in 0..3 {
        h.spawn(&[("CHAOS_HANDLER_MS", "5".into())]);
    }
    let mut terminated = 0_i64;
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut rounds = 0;
    while h.open_jobs().await != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(400)).await;
        if rounds < 10 {
            rounds += 1;
            terminated += sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
            )
            .fetch_one(h.pool())
            .await?;
        }
    }
    assert_eq!(
        h.reap_exited(),
        0,
        "a worker died from losing its connections"
    );
    h.stop_all().await;
    h.verify(
        "pg-terminate-backend",
        jobs,
        0,
        &format!(", {terminated} connections terminated in {rounds} rounds"),
    )
    .await;
    h.db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_exhausts_the_pool() -> anyhow::Result<()> {
    let jobs = soak("JOBQ_SOAK_JOBS", 2000) / 2;
    let mut h = Harness::new(jobs).await?;
    sqlx::raw_sql(
        "CREATE TABLE hog_rounds (held int, pool int, at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(h.pool())
    .await?;
    for _ in 0..2 {
        h.spawn(&[
            ("CHAOS_HOG_POOL", "1".into()),
            ("CHAOS_HANDLER_MS", "100".into()),
        ]);
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    while h.open_jobs().await != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.reap_exited(), 0, "a worker died when its pool ran dry");
    h.stop_all().await;
    let s = h.verify("pool-exhausted", jobs, 0, "").await;
    // jobq's own writes do not use the application's pool, so the hog costs handlers a
    // wait for their connection, never a lease; but it must have run dry while they ran.
    let dry: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hog_rounds
         WHERE held = pool AND at < (SELECT max(finished_at) FROM jobq.jobs)",
    )
    .fetch_one(h.pool())
    .await?;
    assert!(
        dry >= 1,
        "the pool was never exhausted while attempts ran, so the scenario tested nothing: {s:?}"
    );
    h.db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_held_open_for_the_whole_run() -> anyhow::Result<()> {
    let jobs = soak("JOBQ_SOAK_JOBS", 2000);
    let mut rates = Vec::new();
    for hold in [false, true] {
        let mut h = Harness::new(jobs).await?;
        // An idle-in-transaction session with a snapshot: vacuum cannot remove any dead
        // tuple created after it started, so every claim wades through more of them.
        let mut holder = h.pool().begin().await?;
        if hold {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *holder)
                .await?;
            sqlx::query("SELECT count(*) FROM jobq.jobs")
                .execute(&mut *holder)
                .await?;
        }
        let start = Instant::now();
        for _ in 0..2 {
            h.spawn(&[("CHAOS_HANDLER_MS", "0".into())]);
        }
        let deadline = Instant::now() + Duration::from_secs(240);
        while h.open_jobs().await != 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rate = jobs as f64 / start.elapsed().as_secs_f64();
        holder.rollback().await?;
        h.stop_all().await;
        let name = if hold {
            "held-xmin"
        } else {
            "held-xmin-baseline"
        };
        h.verify(name, jobs, 0, &format!(", {rate:.0} jobs/s"))
            .await;
        rates.push(rate);
        h.db.close().await;
    }
    println!(
        "held-xmin: throughput with a snapshot held open is {:.0}% of the baseline",
        100.0 * rates[1] / rates[0]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_restarts_mid_run() -> anyhow::Result<()> {
    // A private cluster, so stopping it disturbs nothing else on this machine.
    let cluster = jobq_testing::TempCluster::start().await?;
    let jobs = soak("JOBQ_SOAK_JOBS", 2000);
    let db = TestDatabase::on_server(&cluster.url(), 10).await?;
    let mut h = Harness::on(db, jobs).await?;
    for _ in 0..3 {
        h.spawn(&[("CHAOS_HANDLER_MS", "5".into())]);
    }
    // Let a part of the work happen, then take the database away for 3 s.
    let pool = h.pool().clone();
    assert!(
        eventually(Duration::from_secs(120), || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobq.jobs WHERE state = 'done'")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0)
                    >= jobs / 4
            }
        })
        .await,
        "workers made no progress before the restart"
    );
    cluster.stop().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.restart().await?;
    let deadline = Instant::now() + Duration::from_secs(240);
    while h.open_jobs().await != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        h.reap_exited(),
        0,
        "a worker died while the database was down"
    );
    h.stop_all().await;
    h.verify("database-restart", jobs, 0, ", database down for 3 s")
        .await;
    h.db.close().await;
    Ok(())
}
