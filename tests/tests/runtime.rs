//! The runtime against a real PostgreSQL: concurrent runtimes, the retry schedule,
//! classified built-in failures, leases that expire under a running handler, graceful
//! shutdown, and wake-ups that survive a lost LISTEN connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::{Job, JobContext, JobError, RetryPolicy, Runtime, RuntimeHandle};
use jobq_testing::TestDatabase;
use sqlx::PgPool;
use tests::{
    Insert, N, eventually, init_tracing, listen_for_wake_ups, next_wake_up, woken_in_transaction_by,
};

/// Records every execution in a side table (through the pool the test gives the
/// runtime as state), so a test can count executions per job.
struct Record;

impl Job for Record {
    const KIND: &'static str = "record";
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, args: N) -> Result<(), JobError> {
        let pool = the_pool(&ctx)?;
        sqlx::query("INSERT INTO executions (job_id, attempt, n) VALUES ($1, $2, $3)")
            .bind(ctx.id().0)
            .bind(ctx.attempt() as i32)
            .bind(args.n)
            .execute(pool)
            .await?;
        Ok(())
    }
}

/// The pool a handler reaches the test's side tables with: the runtime's state.
fn the_pool(ctx: &JobContext) -> Result<&PgPool, JobError> {
    ctx.state::<PgPool>()
        .ok_or_else(|| JobError::permanent("no_pool", "the runtime holds no pool"))
}

async fn side_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE executions (job_id bigint NOT NULL, attempt int NOT NULL, n bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn states(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT state, count(*) FROM jobq.jobs GROUP BY state ORDER BY state")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runtimes_drain_5000_jobs_each_exactly_once() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::with_max_connections(10).await?;
    side_table(db.pool()).await;
    let queue = format!("q{}", db.name());

    let mut handles = Vec::new();
    for i in 0..3 {
        let pool = db.new_pool(8).await?;
        let rt = Runtime::builder(pool)
            .auto_register(false)
            .register::<Record>()
            .state(db.pool().clone())
            .queue(queue.clone(), 8)
            .worker_id(format!("worker-{i}"))
            .poll_interval(Duration::from_millis(200))
            .build()?;
        handles.push(rt.start().await?);
    }
    // Enqueue while the runtimes are already competing, in batches and one by one.
    for chunk in 0..49 {
        Record::enqueue_many(db.pool(), (0..100).map(|k| N { n: chunk * 100 + k })).await?;
    }
    for n in 4900..5000 {
        Record::with(N { n })
            .queue(queue.clone())
            .enqueue(db.pool())
            .await?;
    }
    // enqueue_many used the kind's default queue; move those to the served queue.
    sqlx::query("UPDATE jobq.jobs SET queue = $1 WHERE queue = 'default'")
        .bind(&queue)
        .execute(db.pool())
        .await?;

    let drained = tests::all_done(db.pool(), Duration::from_secs(120)).await;
    for h in handles {
        h.shutdown().await;
    }
    assert!(drained, "not drained: {:?}", states(db.pool()).await);

    let (jobs, executions, distinct, max_per_job): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobq.jobs),
                (SELECT count(*) FROM executions),
                (SELECT count(DISTINCT job_id) FROM executions),
                (SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM executions GROUP BY job_id) x)",
    )
    .fetch_one(db.pool())
    .await?;
    assert_eq!(
        (jobs, executions, distinct, max_per_job),
        (5000, 5000, 5000, 1)
    );
    let workers: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT attempt) FROM executions", // every job ran on its first attempt
    )
    .fetch_one(db.pool())
    .await?;
    assert_eq!(workers, 1);
    db.close().await;
    Ok(())
}

/// Always fails retryably.
struct Flaky;

impl Job for Flaky {
    const KIND: &'static str = "flaky";
    const RETRY: RetryPolicy = RetryPolicy::exponential(4)
        .base(Duration::from_secs(1))
        .cap(Duration::from_secs(3))
        .jitter(true);
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        Err(JobError::retryable(
            "provider_unavailable",
            format!("provider down for {}", args.n),
        ))
    }
}

/// Fails with a Retry-After of `n` seconds.
struct Throttled;

impl Job for Throttled {
    const KIND: &'static str = "throttled";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        Err(JobError::retryable("rate_limited", "slow down")
            .retry_after(Duration::from_secs(args.n as u64)))
    }
}

/// Fails permanently.
struct Doomed;

impl Job for Doomed {
    const KIND: &'static str = "doomed";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        Err(JobError::permanent(
            "invoice_missing",
            format!("invoice {} not found", args.n),
        ))
    }
}

#[derive(sqlx::FromRow, Debug)]
struct Row {
    state: String,
    attempts: i32,
    run_after: DateTime<Utc>,
    last_error_code: Option<String>,
    last_error: Option<String>,
    errors: serde_json::Value,
    first_failed_at: Option<DateTime<Utc>>,
    last_failed_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

async fn row(pool: &PgPool, id: jobq::JobId) -> Row {
    sqlx::query_as(
        "SELECT state, attempts, run_after, last_error_code, last_error, errors, first_failed_at,
                last_failed_at, finished_at FROM jobq.jobs WHERE id = $1",
    )
    .bind(id.0)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn retry_schedule_backoff_cap_retry_after_permanent_and_exhaustion() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Flaky>()
        .register::<Throttled>()
        .register::<Doomed>()
        .build()?;
    let flaky = Flaky::enqueue(pool, N { n: 1 }).await?;
    let throttled = Throttled::enqueue(pool, N { n: 42 }).await?;
    let doomed = Doomed::enqueue(pool, N { n: 7 }).await?;

    let mut now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    // Bounds of the delay after attempts 1, 2, 3: base 1 s doubling, equal jitter, cap 3 s.
    let bounds = [(500, 1000), (1000, 2000), (1500, 3000)];
    for (attempt, (lo, hi)) in (1..=3).zip(bounds) {
        let report = rt.drain(Some(now)).await?;
        assert!(
            report
                .attempts
                .iter()
                .any(|a| a.id == flaky.id && a.attempt == attempt)
        );
        let r = row(pool, flaky.id).await;
        assert_eq!(
            (r.state.as_str(), r.attempts),
            ("scheduled", attempt as i32)
        );
        assert_eq!(r.last_error_code.as_deref(), Some("provider_unavailable"));
        assert_eq!(r.last_error.as_deref(), Some("provider down for 1"));
        let delay = (r.run_after - now).num_milliseconds();
        assert!(
            (lo..=hi).contains(&delay),
            "attempt {attempt}: delay {delay} ms not in [{lo}, {hi}]"
        );
        assert_eq!(r.last_failed_at, Some(now));
        now = r.run_after;
    }
    // The fourth attempt is the last one: exhausted, terminal.
    rt.drain(Some(now)).await?;
    let r = row(pool, flaky.id).await;
    assert_eq!((r.state.as_str(), r.attempts), ("failed", 4));
    assert_eq!(r.errors.as_array().map(Vec::len), Some(4));
    assert_eq!(r.errors[3]["attempt"], 4);
    assert_eq!(r.errors[0]["code"], "provider_unavailable");
    assert!(r.first_failed_at < r.last_failed_at);
    assert_eq!(r.finished_at, r.last_failed_at);

    // Retry-After wins over the policy: exactly 42 s after the failure.
    let t = row(pool, throttled.id).await;
    assert_eq!(t.state, "scheduled");
    assert_eq!(t.last_error_code.as_deref(), Some("rate_limited"));
    assert_eq!((t.run_after - t.last_failed_at.unwrap()).num_seconds(), 42);

    // Permanent: failed after one attempt, never retried.
    let d = row(pool, doomed.id).await;
    assert_eq!((d.state.as_str(), d.attempts), ("failed", 1));
    assert_eq!(d.last_error_code.as_deref(), Some("invoice_missing"));
    assert!(d.finished_at.is_some());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn error_history_is_bounded() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Throttled>()
        .build()?;
    let job = Throttled::with(N { n: 0 })
        .max_attempts(30)
        .enqueue(pool)
        .await?;
    // Retry-After 0: every drain pass retries at once.
    rt.drain(None).await?;
    let r = row(pool, job.id).await;
    assert_eq!((r.state.as_str(), r.attempts), ("failed", 30));
    let errors = r.errors.as_array().unwrap();
    assert_eq!(errors.len(), 20, "history keeps the last 20 entries");
    assert_eq!(errors[0]["attempt"], 11);
    assert_eq!(errors[19]["attempt"], 30);
    db.close().await;
    Ok(())
}

/// Panics.
struct Panics;
impl Job for Panics {
    const KIND: &'static str = "panics";
    const RETRY: RetryPolicy = RetryPolicy::exponential(3);
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        if args.n >= 0 {
            panic!("boom {}", args.n);
        }
        Ok(())
    }
}

/// Sleeps past its timeout.
struct Slow;
impl Job for Slow {
    const KIND: &'static str = "slow";
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(100));
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_secs(args.n as u64)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_timeout_and_undecodable_payload_are_classified_and_the_runtime_keeps_serving()
-> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    side_table(pool).await;
    let queue = format!("q{}", db.name());
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Panics>()
        .register::<Slow>()
        .register::<Record>()
        .state(pool.clone())
        .queue(queue.clone(), 4)
        .build()?
        .start()
        .await?;
    let panics = Panics::with(N { n: 1 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    let slow = Slow::with(N { n: 30 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    // A payload written by an older version of the code: it no longer decodes.
    let undecodable: i64 = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, queue, payload) VALUES ('record', $1, '{\"number\": \"seven\"}') RETURNING id",
    )
    .bind(&queue)
    .fetch_one(pool)
    .await?;
    let healthy = Record::with(N { n: 5 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;

    let p = pool.clone();
    let ids = [panics.id.0, slow.id.0, undecodable, healthy.id.0];
    let settled = eventually(Duration::from_secs(20), || {
        let p = p.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM jobq.jobs WHERE id = ANY($1) AND (state IN ('done', 'failed') OR (state IN ('pending', 'scheduled') AND attempts > 0))",
            )
            .bind(&ids[..])
            .fetch_one(&p)
            .await
            .unwrap();
            n == 4
        }
    })
    .await;
    assert!(settled, "{:?}", states(pool).await);

    let r = row(pool, panics.id).await;
    assert_eq!(r.last_error_code.as_deref(), Some("panic"));
    assert!(r.last_error.unwrap().contains("boom 1"));
    assert!(["pending", "scheduled", "failed"].contains(&r.state.as_str()));

    let r = row(pool, slow.id).await;
    assert_eq!(r.last_error_code.as_deref(), Some("timeout"));
    assert!(
        ["pending", "scheduled"].contains(&r.state.as_str()),
        "a timeout is retryable"
    );

    let r = row(pool, jobq::JobId(undecodable)).await;
    assert_eq!((r.state.as_str(), r.attempts), ("failed", 1));
    assert_eq!(r.last_error_code.as_deref(), Some("decode"));
    let payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM jobq.jobs WHERE id = $1")
            .bind(undecodable)
            .fetch_one(pool)
            .await?;
    assert_eq!(
        payload,
        serde_json::json!({"number": "seven"}),
        "payload kept for inspection"
    );

    assert_eq!(tests::job_state(pool, healthy.id).await.0, "done");
    // Still serving after all of that.
    let later = Record::with(N { n: 6 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(
        tests::reaches_state(pool, later.id, "done", Duration::from_secs(10)).await,
        "job never became done"
    );
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

/// The first attempt hangs with its heartbeats stopped, as a paused process's would; a
/// task it spawned tries to complete the job late.
struct Hangs;

/// What the test learns from [`Hangs`], given to both runtimes as state.
#[derive(Debug, Default)]
struct HangProbe {
    /// Attempt 1's future was dropped.
    dropped: AtomicBool,
    /// Attempt 2 started after that.
    second_saw_drop: AtomicBool,
    /// What attempt 1's late writes got back.
    late: std::sync::Mutex<Option<String>>,
}

struct SetOnDrop(Arc<HangProbe>);
impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

impl Job for Hangs {
    const KIND: &'static str = "hangs";
    const LEASE: Duration = Duration::from_secs(1);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let pool = the_pool(&ctx)?;
        let probe = ctx
            .state::<Arc<HangProbe>>()
            .ok_or_else(|| JobError::permanent("no_probe", "the runtime holds no HangProbe"))?;
        if ctx.attempt() == 1 {
            let _guard = SetOnDrop(probe.clone());
            let late = ctx.clone();
            let late_pool = pool.clone();
            let probe = probe.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                let mut tx = late_pool.begin().await.unwrap();
                let effect = late.effect_once(&mut tx, "hangs-effect").await;
                let done = late.complete_in_tx(&mut tx).await;
                tx.commit().await.unwrap();
                *probe.late.lock().unwrap() = Some(format!(
                    "{}/{}",
                    effect.map_err(|e| e.code()).err().unwrap_or("ok"),
                    done.map_err(|e| e.code()).err().unwrap_or("ok"),
                ));
            });
            std::future::pending::<()>().await;
            unreachable!();
        }
        probe
            .second_saw_drop
            .store(probe.dropped.load(Ordering::SeqCst), Ordering::SeqCst);
        let mut tx = pool.begin().await?;
        assert!(ctx.effect_once(&mut tx, "hangs-effect").await?);
        ctx.complete_in_tx(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiring_under_a_running_handler_is_rescued_and_the_late_attempt_changes_nothing()
-> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let queue = format!("q{}", db.name());
    let probe = Arc::new(HangProbe::default());
    // Worker A: heartbeats effectively stopped, no reaper.
    let a = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Hangs>()
        .state(pool.clone())
        .state(probe.clone())
        .queue(queue.clone(), 1)
        .worker_id("worker-a")
        .heartbeat_interval(Duration::from_secs(3600))
        .reaper(None)
        .build()?
        .start()
        .await?;
    let job = Hangs::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(
        tests::reaches_state(pool, job.id, "running", Duration::from_secs(5)).await,
        "job never became running"
    );
    // Worker B: a reaper every 100 ms.
    let b = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Hangs>()
        .state(pool.clone())
        .state(probe.clone())
        .queue(queue.clone(), 1)
        .worker_id("worker-b")
        .poll_interval(Duration::from_millis(100))
        .reaper(Some(jobq::maintenance::ReaperConfig {
            interval: Duration::from_millis(100),
            ..Default::default()
        }))
        .build()?
        .start()
        .await?;
    assert!(
        tests::reaches_state(pool, job.id, "done", Duration::from_secs(10)).await,
        "job never became done"
    );
    // Wait for the first attempt's late writes.
    assert!(
        eventually(Duration::from_secs(10), || async {
            probe.late.lock().unwrap().is_some()
        })
        .await
    );
    assert_eq!(
        probe.late.lock().unwrap().as_deref(),
        Some("lease_lost/lease_lost"),
        "the stale attempt could neither record the effect nor complete the job"
    );
    assert!(
        probe.second_saw_drop.load(Ordering::SeqCst),
        "attempt 1 was dropped before attempt 2 started"
    );
    let (state, attempts) = tests::job_state(pool, job.id).await;
    assert_eq!((state.as_str(), attempts), ("done", 2));
    let effects: Vec<(i64, i32)> = sqlx::query_as(
        "SELECT job_id, attempt FROM jobq.job_effects WHERE effect_key = 'hangs-effect'",
    )
    .fetch_all(pool)
    .await?;
    assert_eq!(effects, vec![(job.id.0, 2)]);
    let first: serde_json::Value =
        sqlx::query_scalar("SELECT errors->0 FROM jobq.jobs WHERE id = $1")
            .bind(job.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(first["code"], "lease_expired");
    a.shutdown().await;
    b.shutdown().await;
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn reaper_fails_a_job_whose_last_attempt_lost_its_lease() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    // Two jobs abandoned mid-attempt by a crashed worker: one with attempts left, one without.
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, max_attempts, locked_until, locked_by)
         VALUES ('x', '{}', 'running', 1, 3, now() - interval '1 second', 'dead-worker'),
                ('x', '{}', 'running', 3, 3, now() - interval '1 second', 'dead-worker'),
                ('x', '{}', 'running', 1, 3, now() + interval '1 hour', 'live-worker')",
    )
    .execute(pool)
    .await?;
    let reaper = jobq::maintenance::Reaper::new(pool.clone(), Default::default());
    let report = reaper.run_once().await?;
    assert_eq!((report.rescued, report.failed), (1, 1));
    let rows: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT state, last_error_code, locked_by FROM jobq.jobs ORDER BY id")
            .fetch_all(pool)
            .await?;
    assert_eq!(
        rows,
        vec![
            ("pending".into(), Some("lease_expired".into()), None),
            ("failed".into(), Some("lease_expired".into()), None),
            ("running".into(), None, Some("live-worker".into())),
        ]
    );
    // Running it again, or on many nodes at once, changes nothing more.
    let again = tokio::join!(reaper.run_once(), reaper.run_once());
    assert_eq!(again.0?.rescued + again.1?.rescued, 0);
    db.close().await;
    Ok(())
}

/// Sleeps `n` milliseconds.
struct Sleeper;
impl Job for Sleeper {
    const KIND: &'static str = "sleeper";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(args.n as u64)).await;
        Ok(())
    }
}

/// A runtime of `Sleeper` on `queue` with `slots` slots that polls once an hour: what it
/// starts sooner, a wake-up (or a claim trailing one) started.
async fn woken_only(pool: PgPool, queue: &str, slots: usize) -> anyhow::Result<RuntimeHandle> {
    Ok(Runtime::builder(pool)
        .auto_register(false)
        .register::<Sleeper>()
        .queue(queue, slots)
        .poll_interval(Duration::from_secs(3600))
        .build()?
        .start()
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_short_attempts_and_hands_back_long_ones() -> anyhow::Result<()>
{
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let queue = format!("q{}", db.name());
    let rt = || {
        Runtime::builder(pool.clone())
            .auto_register(false)
            .register::<Sleeper>()
            .queue(queue.clone(), 4)
            // Ten times the short job: room for its completion on a loaded machine
            // (at 700 ms it was handed back too when four test binaries ran at once).
            .shutdown_timeout(Duration::from_secs(3))
    };
    let handle = rt().build()?.start().await?;
    let short = Sleeper::with(N { n: 300 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    let long = Sleeper::with(N { n: 60_000 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    let p = pool.clone();
    assert!(
        eventually(Duration::from_secs(5), || {
            let p = p.clone();
            async move {
                tests::job_state(&p, short.id).await.0 == "running"
                    && tests::job_state(&p, long.id).await.0 == "running"
            }
        })
        .await
    );
    // Claimed is not started: a job whose task has not taken its slot yet when claiming
    // stops is handed back without running (under load, both were).
    assert!(eventually(Duration::from_secs(5), || async { handle.running() == 2 }).await);
    let report = handle.shutdown().await;
    assert_eq!(report.handed_back, 1);
    assert_eq!(
        tests::job_state(pool, short.id).await,
        ("done".to_owned(), 1)
    );
    let (state, attempts, locked_by, due): (String, i32, Option<String>, bool) = sqlx::query_as(
        "SELECT state, attempts, locked_by, run_after <= now() FROM jobq.jobs WHERE id = $1",
    )
    .bind(long.id.0)
    .fetch_one(pool)
    .await?;
    assert_eq!(
        (state.as_str(), attempts, locked_by, due),
        ("pending", 0, None, true),
        "handed back at once, the interrupted attempt not counted"
    );
    // Another worker picks it up immediately, not after a lease expiry.
    sqlx::query("UPDATE jobq.jobs SET payload = '{\"n\": 1}' WHERE id = $1")
        .bind(long.id.0)
        .execute(pool)
        .await?;
    let handle = rt().build()?.start().await?;
    assert!(
        tests::reaches_state(pool, long.id, "done", Duration::from_secs(3)).await,
        "job never became done"
    );
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_wake_workers_and_the_listener_reconnects() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let queue = format!("q{}", db.name());
    let handle = woken_only(pool.clone(), &queue, 2).await?;
    let wait_done =
        |id: jobq::JobId| tests::reaches_state(pool, id, "done", Duration::from_secs(5));
    // Let the listener connect.
    assert!(tests::listening(pool, 1).await);
    let a = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(wait_done(a.id).await, "woken by NOTIFY");

    // Kill the listener's connection, as a database restart or a proxy would.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'LISTEN%') t",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(killed, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(
        wait_done(b.id).await,
        "woken after the listener reconnected"
    );
    let c = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(wait_done(c.id).await);

    // In a transaction the wake-up goes out with the commit, not before.
    let mut tx = pool.begin().await?;
    let d = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(&mut tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await?;
    assert!(wait_done(d.id).await, "woken by the transaction's commit");

    // Without a wake-up the job waits for a poll (an hour here)... once the claims that
    // trail d's (63 ms in all) are over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quiet = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .wake(false)
        .enqueue(pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let state: String = sqlx::query_scalar("SELECT state FROM jobq.jobs WHERE id = $1")
        .bind(quiet.id.0)
        .fetch_one(pool)
        .await?;
    assert_eq!(state, "pending", "wake(false) sent no wake-up");
    // ...or for the next wake-up of its queue, which claims everything due.
    let e = Sleeper::with(N { n: 0 })
        .queue(queue.clone())
        .enqueue(pool)
        .await?;
    assert!(wait_done(e.id).await);
    assert!(wait_done(quiet.id).await);

    // Each form of the single insert wakes: with an idempotency key, with a run_after
    // already past, with a zero delay (each after the trailing claims are over).
    let forms = [
        Sleeper::with(N { n: 1 }).idempotency_key("woken"),
        Sleeper::with(N { n: 2 }).run_after(chrono::Utc::now() - chrono::Duration::seconds(1)),
        Sleeper::with(N { n: 3 }).run_in(Duration::ZERO),
    ];
    for (i, form) in forms.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let job = form.queue(queue.clone()).enqueue(pool).await?;
        assert!(wait_done(job.id).await, "form {i} was not woken");
    }
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

/// A burst of enqueues from many tasks skips most wake-ups (the cooldown): it must still
/// leave no job waiting for a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_wake_ups_from_a_burst_of_pool_enqueues_lose_none() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let handle = woken_only(pool.clone(), "default", 4).await?;
    // The first claim finds nothing; from then on only wake-ups start jobs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 0..5 {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    Sleeper::enqueue(&pool, N { n: 0 }).await?;
                }
                anyhow::Ok(())
            }));
        }
        Sleeper::enqueue_many(pool, (0..10).map(|_| N { n: 0 })).await?;
        for t in tasks {
            t.await??;
        }
        assert!(
            tests::all_done(pool, Duration::from_secs(10)).await,
            "round {round}: a job was left waiting for a poll"
        );
    }
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn only_registered_kinds_are_claimed_and_priority_orders_claims() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    sqlx::query("INSERT INTO jobq.jobs (kind, payload) VALUES ('nobody_serves_this', '{}')")
        .execute(pool)
        .await?;
    let low = Sleeper::with(N { n: 0 }).priority(5).enqueue(pool).await?;
    let high = Sleeper::with(N { n: 0 }).priority(-5).enqueue(pool).await?;
    let mid = Sleeper::with(N { n: 0 }).enqueue(pool).await?;
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Sleeper>()
        .build()?;
    let report = rt.drain(None).await?;
    let order: Vec<jobq::JobId> = report.attempts.iter().map(|a| a.id).collect();
    assert_eq!(order, vec![high.id, mid.id, low.id]);
    let unserved: (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM jobq.jobs WHERE kind = 'nobody_serves_this'")
            .fetch_one(pool)
            .await?;
    assert_eq!(
        unserved,
        ("pending".to_owned(), 0),
        "never claimed, never dropped"
    );
    db.close().await;
    Ok(())
}

struct SameKindA;
struct SameKindB;
impl Job for SameKindA {
    const KIND: &'static str = "same_kind";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}
impl Job for SameKindB {
    const KIND: &'static str = "same_kind";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn two_types_for_one_kind_refuse_to_build() -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy(&jobq_testing::database_url())?;
    let err = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<SameKindA>()
        .register::<SameKindB>()
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "duplicate_kind");
    let msg = err.to_string();
    assert!(
        msg.contains("SameKindA") && msg.contains("SameKindB"),
        "{msg}"
    );
    // The same type twice is fine.
    Runtime::builder(pool)
        .auto_register(false)
        .register::<SameKindA>()
        .register::<SameKindA>()
        .build()?;
    Ok(())
}

/// Records every span's name and fields, and every event's fields, as text.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<String>>>);

struct FieldText<'a>(&'a mut String);
impl tracing::field::Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut text = format!("span {}", attrs.metadata().name());
        attrs.record(&mut FieldText(&mut text));
        self.0.lock().unwrap().push(text);
    }
    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let name = ctx.span(id).map(|s| s.name()).unwrap_or("?");
        let mut text = format!("record {name}");
        values.record(&mut FieldText(&mut text));
        self.0.lock().unwrap().push(text);
    }
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut text = "event".to_owned();
        event.record(&mut FieldText(&mut text));
        self.0.lock().unwrap().push(text);
    }
}

/// Does nothing.
struct Noop;
impl Job for Noop {
    const KIND: &'static str = "noop";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn one_span_per_attempt_with_its_fields_and_never_the_payload() -> anyhow::Result<()> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    let capture = Capture::default();
    // What a production subscriber would see of jobq: its own targets, INFO and up.
    let subscriber = tracing_subscriber::registry().with(capture.clone().with_filter(
        tracing_subscriber::filter::filter_fn(|m| {
            m.target().starts_with("jobq") && *m.level() <= tracing::Level::INFO
        }),
    ));
    let _guard = tracing::subscriber::set_default(subscriber);

    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let ok = Noop::enqueue(pool, N { n: 424_242 }).await?;
    let failed = Doomed::enqueue(pool, N { n: 737_373 }).await?;
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Noop>()
        .register::<Doomed>()
        .build()?;
    rt.drain(None).await?;
    let lines = capture.0.lock().unwrap().clone();
    let spans: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("span jobq.job"))
        .collect();
    assert_eq!(spans.len(), 2, "{lines:#?}");
    assert!(
        spans[0].contains(&format!("job.id={}", ok.id))
            && spans[0].contains("job.kind=noop")
            && spans[0].contains("job.queue=default")
            && spans[0].contains("job.attempt=1"),
        "{}",
        spans[0]
    );
    assert!(
        spans[1].contains(&format!("job.id={}", failed.id)),
        "{}",
        spans[1]
    );
    let outcomes: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("record jobq.job") && l.contains("job.outcome"))
        .collect();
    assert_eq!(outcomes.len(), 2, "{lines:#?}");
    assert!(
        outcomes[0].contains("job.outcome=\"done\""),
        "{}",
        outcomes[0]
    );
    assert!(
        outcomes[1].contains("job.outcome=\"permanent\""),
        "{}",
        outcomes[1]
    );
    // The payloads' distinctive numbers appear nowhere, except in the error message the
    // handler itself wrote.
    assert!(!lines.iter().any(|l| l.contains("424242")), "{lines:#?}");
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("737373"))
            .all(|l| l.contains("invoice 737373 not found")),
        "{lines:#?}"
    );
    db.close().await;
    Ok(())
}

/// A busy producer and completer keep their connections checked out between statements;
/// once the queue is idle they must give them back to the application's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runtime_gives_its_connections_back_to_the_pool() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.new_pool(6).await?;
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Sleeper>()
        .queue("default", 8)
        .build()?
        .start()
        .await?;
    let checked_out = |p: &PgPool| p.size() as usize - p.num_idle();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at_rest = checked_out(&pool);
    Sleeper::enqueue_many(&pool, (0..300).map(|_| N { n: 0 })).await?;
    assert!(tests::all_done(&pool, Duration::from_secs(10)).await);
    let p = pool.clone();
    assert!(
        eventually(Duration::from_secs(2), || {
            let p = p.clone();
            async move { checked_out(&p) <= at_rest }
        })
        .await,
        "{} connections still checked out once idle, {at_rest} at rest",
        checked_out(&pool)
    );
    handle.shutdown().await;
    pool.close().await;
    db.close().await;
    Ok(())
}

/// Blocks until the runtime drops it, counting starts; a lease short enough for a test to
/// outlive it.
struct Gate;

/// The ids of the [`Gate`] jobs that started, in order (the runtime's state).
#[derive(Debug, Default)]
struct GateStarts(std::sync::Mutex<Vec<i64>>);

impl GateStarts {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}
impl Job for Gate {
    const KIND: &'static str = "gate";
    const LEASE: Duration = Duration::from_secs(1);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let starts = ctx
            .state::<Arc<GateStarts>>()
            .ok_or_else(|| JobError::permanent("no_starts", "the runtime holds no GateStarts"))?;
        starts.0.lock().unwrap().push(ctx.id().0);
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(())
    }
}

async fn count_running(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = 'running' AND kind = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Fast handlers make a queue claim ahead of its free slots. The jobs claimed ahead wait
/// for a slot without starting, their leases kept alive past their length by the
/// heartbeat; one an operator cancels meanwhile is cancelled without starting, and a
/// graceful shutdown hands the rest back at once, uncounted, instead of starting them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_claimed_ahead_wait_for_a_slot_keep_their_leases_and_are_handed_back()
-> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let starts = Arc::new(GateStarts::default());
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Noop>()
        .register::<Gate>()
        .state(starts.clone())
        .queue("default", 2)
        .prefetch(8)
        .reaper(Some(jobq::maintenance::ReaperConfig {
            interval: Duration::from_millis(100),
            batch: 1000,
        }))
        .shutdown_timeout(Duration::from_millis(300))
        .build()?
        .start()
        .await?;
    // Jobs are claimed in id order: the no-op jobs first, so the queue is fast when it
    // reaches the gates, and claims some of them ahead of its two slots.
    Noop::enqueue_many(pool, (0..3000).map(|n| N { n })).await?;
    let gates = Gate::enqueue_many(pool, (0..8).map(|n| N { n })).await?;
    assert!(
        eventually(Duration::from_secs(30), || async {
            count_running(pool, Gate::KIND).await > 2
        })
        .await,
        "no gate was claimed ahead of the two slots"
    );
    // An attempt counts as running once it has its slot, a moment before its handler
    // records its start.
    assert!(
        eventually(Duration::from_secs(5), || async {
            handle.running() == 2 && starts.count() == 2
        })
        .await,
        "two slots, two starts"
    );

    // Three lease lengths later, the reaper (every 100 ms) has rescued nothing: every
    // gate is still held by its first attempt, or was never claimed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT state, attempts FROM jobq.jobs WHERE kind = 'gate'")
            .fetch_all(pool)
            .await?;
    for row in &rows {
        assert!(
            matches!((row.0.as_str(), row.1), ("running", 1) | ("pending", 0)),
            "a waiting job's lease lapsed: {row:?}"
        );
    }
    let held = count_running(pool, Gate::KIND).await;
    assert!(held > 2);
    // Slots are taken in claim order: no no-op job claimed before the gates waits
    // behind them.
    let noops_left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE kind = 'noop' AND state <> 'done'",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(
        noops_left, 0,
        "no-op jobs claimed earlier wait behind the gates"
    );
    assert_eq!(handle.running(), 2);
    assert_eq!(starts.count(), 2);

    // An operator cancels one that waits: the heartbeat carries the request, and the job
    // is cancelled without its handler starting.
    let started = starts.0.lock().unwrap().clone();
    let waiting: i64 = sqlx::query_scalar(
        "SELECT id FROM jobq.jobs WHERE kind = 'gate' AND state = 'running'
         AND NOT (id = ANY($1)) ORDER BY id DESC LIMIT 1",
    )
    .bind(&started)
    .fetch_one(pool)
    .await?;
    jobq::admin::Admin::new(pool.clone())
        .cancel(jobq::JobId(waiting), Some("not needed"))
        .await?;
    assert!(
        tests::reaches_state(
            pool,
            jobq::JobId(waiting),
            "cancelled",
            Duration::from_secs(5)
        )
        .await,
        "a cancelled job waiting for its slot stayed running"
    );
    assert_eq!(
        tests::job_state(pool, jobq::JobId(waiting)).await,
        ("cancelled".to_owned(), 0)
    );
    assert_eq!(starts.count(), 2);

    // The slot the cancelled job held may go to a gate not claimed yet (when the first
    // claims did not take all eight): count what the runtime holds now.
    // The producer may still claim one more until the shutdown stops it, so the count is
    // a floor; what was handed back is checked row by row below.
    let held_now = count_running(pool, Gate::KIND).await;
    assert!(held_now >= held - 1);
    let report = handle.shutdown().await;
    assert!(
        (usize::try_from(held_now)?..gates.len()).contains(&report.handed_back),
        "handed back {} with {held_now} held just before",
        report.handed_back
    );
    assert_eq!(starts.count(), 2, "a waiting job started");
    for gate in gates.iter().filter(|g| g.id.0 != waiting) {
        assert_eq!(
            tests::job_state(pool, gate.id).await,
            ("pending".to_owned(), 0),
            "every other gate back in the queue, no attempt counted"
        );
    }
    db.close().await;
    Ok(())
}

/// Held until the test opens it (the runtime's state), counting starts.
#[derive(Debug)]
struct Latch {
    open: tokio::sync::Semaphore,
    starts: std::sync::atomic::AtomicUsize,
}

impl Default for Latch {
    fn default() -> Self {
        Latch {
            open: tokio::sync::Semaphore::new(0),
            starts: Default::default(),
        }
    }
}

/// A [`Gate`] that ends when its [`Latch`] opens.
struct Latched;
impl Job for Latched {
    const KIND: &'static str = "latched";
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let latch = ctx
            .state::<Arc<Latch>>()
            .ok_or_else(|| JobError::permanent("no_latch", "the runtime holds no Latch"))?;
        latch.starts.fetch_add(1, Ordering::SeqCst);
        let _ = latch.open.acquire().await;
        Ok(())
    }
}

/// Jobs claimed ahead are handed back as soon as claiming stops; the shutdown's report
/// counts them even when every running attempt finishes before the deadline (it counted
/// only hand-backs at the deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_reports_the_jobs_claimed_ahead_it_handed_back() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let latch = Arc::new(Latch::default());
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Noop>()
        .register::<Latched>()
        .state(latch.clone())
        .queue("default", 2)
        .prefetch(8)
        .shutdown_timeout(Duration::from_secs(30))
        .build()?
        .start()
        .await?;
    // As in the test above: fast no-op jobs first, so the queue claims latched jobs ahead.
    Noop::enqueue_many(pool, (0..3000).map(|n| N { n })).await?;
    let latched = Latched::enqueue_many(pool, (0..8).map(|n| N { n })).await?;
    assert!(
        eventually(Duration::from_secs(30), || async {
            count_running(pool, Latched::KIND).await > 2
        })
        .await,
        "no latched job was claimed ahead of the two slots"
    );
    assert!(eventually(Duration::from_secs(5), || async { handle.running() == 2 }).await);
    let shutdown = tokio::spawn(handle.shutdown());
    // Claiming has stopped once nothing is claimed any more and the waiting jobs are
    // back; then the two running attempts may finish, long before the deadline.
    assert!(
        eventually(Duration::from_secs(10), || async {
            count_running(pool, Latched::KIND).await == 2
        })
        .await,
        "the jobs waiting for a slot were not handed back"
    );
    latch.open.add_permits(2);
    let report = shutdown.await?;
    assert_eq!(
        latch.starts.load(Ordering::SeqCst),
        2,
        "a waiting job started"
    );
    let back: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE kind = 'latched' AND state = 'pending' AND attempts = 0",
    )
    .fetch_one(pool)
    .await?;
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE kind = 'latched' AND state = 'done'",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(done, 2);
    assert_eq!(back, i64::try_from(latched.len())? - 2);
    // Those never claimed are pending too; the report counts the ones handed back.
    assert!(report.handed_back > 0 && report.handed_back <= latched.len() - 2);
    db.close().await;
    Ok(())
}

/// A busy producer has claims in flight at almost any moment (two at once, overlapping);
/// a shutdown lets them finish and hands their jobs back. Dropped mid-statement, a claim
/// could commit jobs that no attempt holds, left `running` until their leases expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_in_a_busy_drain_leaves_no_job_running() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let total = 30_000;
    Noop::enqueue_many(pool, (0..total).map(|n| N { n })).await?;
    let done = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobq.jobs WHERE state = 'done'")
            .fetch_one(pool)
            .await
            .unwrap_or(0)
    };
    // Three shutdowns at whatever moment the drain is in, each checked.
    for round in 1..=3 {
        let handle = Runtime::builder(pool.clone())
            .auto_register(false)
            .register::<Noop>()
            .queue("default", 128)
            .prefetch(64)
            .build()?
            .start()
            .await?;
        let before = done().await;
        assert!(
            eventually(Duration::from_secs(60), || async {
                done().await >= before + 2_000
            })
            .await
        );
        handle.shutdown().await;
        let rows: Vec<(String, i32, i64)> = sqlx::query_as(
            "SELECT state::text, attempts, count(*) FROM jobq.jobs GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(pool)
        .await?;
        let done = done().await;
        assert!(done < total, "the drain ended before shutdown {round}");
        assert_eq!(
            rows,
            vec![
                ("done".to_owned(), 1, done),
                ("pending".to_owned(), 0, total - done),
            ],
            "after shutdown {round}, every job is done once or pending as never attempted"
        );
    }
    db.close().await;
    Ok(())
}

/// Handlers that take their time free slots slowly, so the queue claims nothing ahead:
/// no job waits in one worker while another could start it. (A burst of starts into idle
/// slots must not count as a fast queue.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_get_no_jobs_claimed_ahead() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Sleeper>()
        .queue("default", 2)
        .prefetch(8)
        .build()?
        .start()
        .await?;
    Sleeper::enqueue_many(pool, (0..6).map(|_| N { n: 1_000 })).await?;
    // Until the first handlers return, the two slots are all that may be claimed.
    let mut most = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(800);
    while tokio::time::Instant::now() < deadline {
        most = most.max(count_running(pool, Sleeper::KIND).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(most, 2, "slow jobs were claimed ahead of free slots");
    assert!(tests::all_done(pool, Duration::from_secs(10)).await);
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

/// An enqueue inside a transaction notifies in that transaction, through each of the
/// insert statements: the wake-up comes from the transaction's own backend when it
/// commits — never before, and never for one that rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_of_enqueues_in_transactions_ride_in_the_transaction() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    for insert in [
        Insert::One,
        Insert::OneKeyed,
        Insert::Many,
        Insert::ManyKeyed,
    ] {
        let (from, tx) = woken_in_transaction_by(pool, insert).await?;
        assert_eq!(from, tx, "{insert:?}: notified in the transaction");
    }

    let handle = woken_only(db.new_pool(4).await?, "default", 2).await?;
    let mut listener = listen_for_wake_ups(pool).await?;
    assert!(tests::listening(pool, 2).await);
    // Past any cooldown of the inserts above.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut tx = pool.begin().await?;
    let job = Sleeper::enqueue(&mut tx, N { n: 0 }).await?;
    assert_eq!(
        next_wake_up(&mut listener, Duration::from_millis(300)).await,
        None,
        "no wake-up while the transaction is open"
    );
    tx.commit().await?;
    let (payload, _) = next_wake_up(&mut listener, Duration::from_secs(5))
        .await
        .expect("a wake-up at the commit");
    assert_eq!(payload, "default");
    assert!(
        tests::reaches_state(pool, job.id, "done", Duration::from_secs(5)).await,
        "the runtime was woken"
    );

    // A transaction that rolls back wakes nothing.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut tx = pool.begin().await?;
    Sleeper::enqueue(&mut tx, N { n: 0 }).await?;
    tx.rollback().await?;
    assert_eq!(
        next_wake_up(&mut listener, Duration::from_millis(300)).await,
        None
    );

    // A batch, and several transactions at once.
    let mut txs = Vec::new();
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let mut tx = pool.begin().await?;
        jobs.extend(Sleeper::enqueue_many(&mut *tx, (0..5).map(|_| N { n: 0 })).await?);
        txs.push(tx);
    }
    for tx in txs {
        tx.commit().await?;
    }
    // (The first step's jobs are of kinds nobody runs: only these must be done.)
    for job in jobs {
        assert!(
            tests::reaches_state(pool, job.id, "done", Duration::from_secs(10)).await,
            "a job was left waiting for a poll"
        );
    }
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

/// A batch whose jobs are all duplicates of existing ones inserts nothing and wakes no
/// producer, whichever batch statement writes it (idempotency keys; uniqueness).
#[tokio::test]
async fn a_batch_of_duplicates_wakes_no_one() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut listener = listen_for_wake_ups(pool).await?;
    tests::IdleKeyed::enqueue(pool, N { n: 1 }).await?;
    tests::Idle::with(N { n: 1 })
        .unique(jobq::Unique::new())
        .enqueue(pool)
        .await?;
    // (The second may skip its wake-up within the first's cooldown.)
    while next_wake_up(&mut listener, Duration::from_millis(300))
        .await
        .is_some()
    {}
    for round in 0..2 {
        // Past the cooldown of the enqueue before (see `jobq::notify`).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let out = if round == 0 {
            tests::IdleKeyed::enqueue_many(pool, [N { n: 1 }, N { n: 1 }]).await?
        } else {
            tests::Idle::enqueue_many_with(
                pool,
                [tests::Idle::with(N { n: 1 }).unique(jobq::Unique::new())],
            )
            .await?
        };
        assert!(out.iter().all(|e| e.duplicate), "{out:?}");
        assert_eq!(
            next_wake_up(&mut listener, Duration::from_millis(300)).await,
            None,
            "round {round}: a batch of duplicates woke producers"
        );
    }
    // A batch with one new job among duplicates wakes them.
    tokio::time::sleep(Duration::from_millis(50)).await;
    tests::IdleKeyed::enqueue_many(pool, [N { n: 1 }, N { n: 2 }]).await?;
    assert!(
        next_wake_up(&mut listener, Duration::from_secs(5))
            .await
            .is_some()
    );
    db.close().await;
    Ok(())
}

/// An enqueue right after another of the same queue skips its wake-up (the cooldown);
/// the producer woken by the first finds the second's job by the claims it makes after
/// the queue ran dry — polling alone would take an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_wake_up_is_covered_by_the_claim_after_the_one_before() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let handle = woken_only(db.new_pool(4).await?, "default", 2).await?;
    let mut listener = listen_for_wake_ups(pool).await?;
    assert!(tests::listening(pool, 2).await);
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The transaction begins first, so the second enqueue follows the first at once.
    let mut tx = pool.begin().await?;
    let first = Sleeper::enqueue(pool, N { n: 0 }).await?;
    let second = Sleeper::enqueue(&mut tx, N { n: 0 }).await?;
    tokio::time::sleep(Duration::from_millis(3)).await;
    tx.commit().await?;
    assert!(
        next_wake_up(&mut listener, Duration::from_secs(5))
            .await
            .is_some()
    );
    assert_eq!(
        next_wake_up(&mut listener, Duration::from_millis(300)).await,
        None,
        "the second enqueue skipped its wake-up"
    );
    for job in [first, second] {
        assert!(
            tests::reaches_state(pool, job.id, "done", Duration::from_secs(5)).await,
            "job {} was left for the poll",
            job.id
        );
    }
    handle.shutdown().await;
    db.close().await;
    Ok(())
}

/// The cooldown is per database: an enqueue right after one in another database still
/// wakes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_in_one_database_does_not_hold_back_another() -> anyhow::Result<()> {
    init_tracing();
    let one = TestDatabase::new().await?;
    let other = TestDatabase::new().await?;
    let mut listener = listen_for_wake_ups(other.pool()).await?;
    Sleeper::enqueue(one.pool(), N { n: 0 }).await?;
    Sleeper::enqueue(other.pool(), N { n: 0 }).await?;
    assert!(
        next_wake_up(&mut listener, Duration::from_secs(5))
            .await
            .is_some(),
        "the other database's queue was not woken"
    );
    one.close().await;
    other.close().await;
    Ok(())
}

/// Returns at once; a lease of one second.
struct QuickShortLease;
impl Job for QuickShortLease {
    const KIND: &'static str = "quick_short_lease";
    const LEASE: Duration = Duration::from_secs(1);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        if let Some(ran) = ctx.state::<Arc<std::sync::atomic::AtomicUsize>>() {
            ran.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// An attempt ends when its handler returns, before its outcome is written: until the
/// completer has written it, the heartbeat keeps the job's lease, and a graceful shutdown
/// waits for that write before it stops the heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_waiting_for_its_write_keeps_its_lease_through_shutdown() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    // Completions fail while `hold` says so; lease extensions and rescues do not.
    sqlx::raw_sql(
        "CREATE TABLE hold (on_ bool NOT NULL); INSERT INTO hold VALUES (true);
         CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.state = 'done' AND (SELECT on_ FROM public.hold) THEN
             RAISE EXCEPTION 'completions are held';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_done BEFORE UPDATE ON jobq.jobs
           FOR EACH ROW EXECUTE FUNCTION refuse_done();",
    )
    .execute(pool)
    .await?;
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<QuickShortLease>()
        .state(ran.clone())
        .queue("default", 4)
        .reaper(None)
        .shutdown_timeout(Duration::from_secs(30))
        .build()?
        .start()
        .await?;
    let jobs = QuickShortLease::enqueue_many(pool, (0..3).map(|n| N { n })).await?;
    assert!(
        eventually(Duration::from_secs(5), || async {
            ran.load(Ordering::SeqCst) == 3
        })
        .await
    );
    // Another node's reaper, every 100 ms, rescues any lease that lapses.
    let reaping = Arc::new(AtomicBool::new(true));
    let reaper = tokio::spawn({
        let (pool, reaping) = (pool.clone(), reaping.clone());
        async move {
            let reaper = jobq::maintenance::Reaper::new(pool, Default::default());
            let mut rescued = 0;
            while reaping.load(Ordering::SeqCst) {
                rescued += reaper.run_once().await.map_or(0, |r| r.rescued + r.failed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            rescued
        }
    });
    // Two and a half leases with the handlers returned and nothing written...
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // ...and as long again into a shutdown that waits for the writes.
    let shutdown = tokio::spawn(handle.shutdown());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !shutdown.is_finished(),
        "shutdown returned before the outcomes were written"
    );
    sqlx::query("UPDATE hold SET on_ = false")
        .execute(pool)
        .await?;
    shutdown.await?;
    reaping.store(false, Ordering::SeqCst);
    assert_eq!(reaper.await?, 0, "a lease lapsed while its outcome waited");
    for job in &jobs {
        assert_eq!(tests::job_state(pool, job.id).await, ("done".to_owned(), 1));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    db.close().await;
    Ok(())
}
