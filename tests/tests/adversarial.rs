//! Misbehaving handlers and poison rows: a fence that never repeats, one bad row never
//! stalls its batch, jobq's own writes never wait behind the application's connections,
//! a handler that blocks its thread keeps its lease, no payload value in any log line or
//! stored error, and bad input is `Invalid` with a stable code.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use jobq::admin::Admin;
use jobq::maintenance::ReaperConfig;
use jobq::{Job, JobContext, JobError, RetryPolicy, Runtime};
use jobq_testing::TestDatabase;
use serde::{Deserialize, Serialize};
use tests::{N, eventually};
use tokio::sync::Notify;

/// Every log line of this test binary, at every level.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends every event of every level from every thread to [`LOG`].
fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(|| Capture)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
}

fn quiet_runtime(pool: &sqlx::PgPool) -> jobq::RuntimeBuilder {
    Runtime::builder(pool.clone())
        .auto_register(false)
        .poll_interval(Duration::from_millis(50))
        .pruner(None)
}

async fn count(pool: &sqlx::PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. A fencing token that never repeats.

/// What the two claims of [`Leftover`] share.
#[derive(Clone)]
struct Stage {
    pool: sqlx::PgPool,
    calls: Arc<AtomicUsize>,
    go: Arc<Notify>,
    leftover_done: Arc<Notify>,
    /// What the first claim's leftover task got from `effect_once` and `complete_in_tx`.
    leftover: Arc<Mutex<Option<(String, String)>>>,
    /// What the second claim got from `effect_once`.
    second: Arc<Mutex<Option<bool>>>,
}

/// Claim 1 spawns a task holding a clone of its context, then hangs until its runtime
/// hands the job back. Claim 2 (another runtime) lets that task try its fenced writes,
/// then records the effect itself.
struct Leftover;

impl Job for Leftover {
    const KIND: &'static str = "leftover";
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::ZERO).max(3);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let stage = ctx.state::<Stage>().unwrap().clone();
        if stage.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let stale = ctx.clone();
            let stage = stage.clone();
            tokio::spawn(async move {
                stage.go.notified().await;
                let mut tx = stage.pool.begin().await.unwrap();
                let effect = stale.effect_once(&mut tx, "leftover-effect").await;
                let complete = stale.complete_in_tx(&mut tx).await;
                let show = |r: Result<String, jobq::Error>| match r {
                    Ok(v) => format!("ok {v}"),
                    Err(e) => e.code().to_owned(),
                };
                let (effect, complete) = (
                    show(effect.map(|b| b.to_string())),
                    show(complete.map(|()| String::new())),
                );
                if effect.starts_with("ok") && complete.starts_with("ok") {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                *stage.leftover.lock().unwrap() = Some((effect, complete));
                stage.leftover_done.notify_one();
            });
            std::future::pending::<()>().await;
        }
        stage.go.notify_one();
        stage.leftover_done.notified().await;
        let mut tx = stage.pool.begin().await?;
        let fresh = ctx.effect_once(&mut tx, "leftover-effect").await?;
        *stage.second.lock().unwrap() = Some(fresh);
        tx.commit().await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_attempts_leftover_task_cannot_write_after_the_next_claim()
-> anyhow::Result<()> {
    capture_logs();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let stage = Stage {
        pool: pool.clone(),
        calls: Arc::default(),
        go: Arc::default(),
        leftover_done: Arc::default(),
        leftover: Arc::default(),
        second: Arc::default(),
    };
    let first = quiet_runtime(pool)
        .register::<Leftover>()
        .state(stage.clone())
        .shutdown_timeout(Duration::from_millis(100))
        .build()?
        .start()
        .await?;
    let job = Leftover::enqueue(pool, N { n: 1 }).await?;
    let calls = stage.calls.clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            calls.load(Ordering::SeqCst) == 1
        })
        .await
    );
    let report = first.shutdown().await;
    assert_eq!(report.handed_back, 1);
    // The hand-back refunded the attempt budget.
    assert_eq!(tests::job_state(pool, job.id).await, ("pending".into(), 0));

    let second = quiet_runtime(pool)
        .register::<Leftover>()
        .state(stage.clone())
        .build()?
        .start()
        .await?;
    assert!(tests::reaches_state(pool, job.id, "done", Duration::from_secs(30)).await);
    second.shutdown().await;

    let leftover = stage.leftover.lock().unwrap().clone();
    assert_eq!(
        leftover,
        Some(("lease_lost".to_owned(), "lease_lost".to_owned())),
        "the handed-back attempt's token was accepted after the job was claimed again"
    );
    assert_eq!(*stage.second.lock().unwrap(), Some(true));
    let effects = count(pool, "SELECT count(*) FROM jobq.job_effects").await;
    assert_eq!(effects, 1);
    db.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2. A row that does not decode fails alone, as `decode`.

/// A no-op job with a lease far longer than the test, so that only a decode failure, not
/// the reaper, can end a poison row.
struct Target;

impl Job for Target {
    const KIND: &'static str = "target";
    const LEASE: Duration = Duration::from_secs(600);
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::ZERO).max(3);
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

/// An older shape of `target`'s args, enqueued by a deploy that has not caught up:
/// its rows do not decode as `N`.
#[derive(Debug, Serialize, Deserialize)]
struct LegacyArgs {
    n: String,
}

struct LegacyTarget;

impl Job for LegacyTarget {
    const KIND: &'static str = "target";
    type Args = LegacyArgs;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: LegacyArgs) -> Result<(), JobError> {
        Ok(())
    }
}

/// `target` enqueued with any JSON at all.
struct RawTarget;

impl Job for RawTarget {
    const KIND: &'static str = "target";
    type Args = serde_json::Value;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: serde_json::Value) -> Result<(), JobError> {
        Ok(())
    }
}

fn nested(levels: usize) -> serde_json::Value {
    let mut v = serde_json::json!([]);
    for _ in 1..levels {
        v = serde_json::Value::Array(vec![v]);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_fail_alone_as_decode_and_the_rest_of_their_batch_runs() -> anyhow::Result<()> {
    capture_logs();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    // What the runtime could not decode is refused at enqueue.
    let deep = RawTarget::enqueue(pool, nested(200)).await.unwrap_err();
    assert_eq!(deep.code(), "payload_too_deep", "{deep}");
    assert!(matches!(deep, jobq::Error::Invalid { .. }));

    let mut poison = Vec::new();
    for n in 0..20 {
        let id = match n {
            5 => {
                sqlx::query_scalar::<_, i64>(
                    "INSERT INTO jobq.jobs (kind, payload) VALUES ('target', $1::text::jsonb) RETURNING id",
                )
                .bind(nested(200).to_string())
                .fetch_one(pool)
                .await?
            }
            11 => {
                sqlx::query_scalar::<_, i64>(
                    r#"INSERT INTO jobq.jobs (kind, payload) VALUES ('target', '{"n":1e400}') RETURNING id"#,
                )
                .fetch_one(pool)
                .await?
            }
            17 => LegacyTarget::enqueue(pool, LegacyArgs { n: "seventeen".into() }).await?.id.0,
            _ => Target::enqueue(pool, N { n }).await?.id.0,
        };
        if [5, 11, 17].contains(&n) {
            poison.push(id);
        }
    }
    // One producer with room for all twenty: they are claimed together.
    let handle = quiet_runtime(pool)
        .register::<Target>()
        .queue("default", 20)
        .build()?
        .start()
        .await?;
    let settled = eventually(Duration::from_secs(30), || async {
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE state IN ('pending', 'running')",
        )
        .await
            == 0
    })
    .await;
    handle.shutdown().await;
    assert!(settled, "the batch stalled: jobs still pending or running");
    let done = count(pool, "SELECT count(*) FROM jobq.jobs WHERE state = 'done'").await;
    assert_eq!(done, 17);
    let failed: Vec<(i64, String, i32)> = sqlx::query_as(
        "SELECT id, last_error_code, attempts FROM jobq.jobs WHERE state = 'failed' ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    let expected: Vec<(i64, String, i32)> = poison
        .iter()
        .map(|id| (*id, "decode".to_owned(), 1))
        .collect();
    assert_eq!(failed, expected);

    // Such a row is still displayable, as the text the database stored.
    let admin = Admin::new(pool.clone());
    let shown = admin.job(jobq::JobId(poison[0])).await?;
    assert_eq!(shown.job.payload, serde_json::Value::Null);
    assert!(
        shown.job.payload_text.starts_with("[[[[[["),
        "{}",
        shown.job.payload_text
    );
    let huge = admin.job(jobq::JobId(poison[1])).await?;
    assert!(
        huge.job.payload_text.contains("e+400")
            || huge.job.payload_text.contains("1e400")
            || huge.job.payload_text.contains("10000000000"),
        "{}",
        huge.job.payload_text
    );
    db.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3 and 4. jobq's own writes never wait behind the application's connections.

/// Loops `begin` / `SELECT 1` / `rollback` on the application's pool until its timeout
/// drops it, at a random point, possibly inside `begin` (launchbadge/sqlx#4393).
struct Begins;

impl Job for Begins {
    const KIND: &'static str = "begins";
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(7));
    const RETRY: RetryPolicy = RetryPolicy::none();
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let pool = ctx.pool().unwrap().clone();
        loop {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT 1").execute(&mut *tx).await?;
            tx.rollback().await?;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_cut_off_inside_begin_do_not_stall_the_runtime() -> anyhow::Result<()> {
    capture_logs();
    let db = TestDatabase::new().await?;
    let app = db.new_pool(4).await?;
    let handle = Runtime::builder(app.clone())
        .auto_register(false)
        .register::<Begins>()
        .register::<Target>()
        .queue("default", 8)
        .poll_interval(Duration::from_millis(50))
        .shutdown_timeout(Duration::from_secs(2))
        .pruner(None)
        .build()?
        .start()
        .await?;
    for n in 0..180 {
        Begins::enqueue(db.pool(), N { n }).await?;
    }
    for n in 0..20 {
        Target::enqueue(db.pool(), N { n }).await?;
    }
    let pool = db.pool();
    let settled = eventually(Duration::from_secs(60), || async {
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE state IN ('pending', 'running')",
        )
        .await
            == 0
    })
    .await;
    let shutdown = tokio::time::timeout(Duration::from_secs(30), handle.shutdown()).await;
    assert!(settled, "jobs stopped being claimed or completed");
    assert!(
        shutdown.is_ok(),
        "shutdown did not finish within its deadline"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE kind = 'target' AND state = 'done'"
        )
        .await,
        20
    );
    assert_eq!(
        count(pool, "SELECT count(*) FROM jobq.jobs WHERE kind = 'begins' AND state = 'failed' AND last_error_code = 'timeout'").await,
        180
    );
    app.close().await;
    db.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_while_the_application_holds_every_connection_of_its_pool() -> anyhow::Result<()> {
    capture_logs();
    let db = TestDatabase::new().await?;
    let app = db.new_pool(3).await?;
    let handle = quiet_runtime(&app)
        .register::<Target>()
        .build()?
        .start()
        .await?;
    // The application takes every connection of its pool and keeps them.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(app.acquire().await?);
    }
    for n in 0..20 {
        Target::enqueue(db.pool(), N { n }).await?;
    }
    let pool = db.pool();
    let done = eventually(Duration::from_secs(30), || async {
        count(pool, "SELECT count(*) FROM jobq.jobs WHERE state = 'done'").await == 20
    })
    .await;
    assert_eq!(app.size(), 3, "the application's pool grew");
    drop(held);
    let shutdown = tokio::time::timeout(Duration::from_secs(30), handle.shutdown()).await;
    assert!(
        done,
        "jobs were not claimed or completed while the application held its pool"
    );
    assert!(shutdown.is_ok());
    app.close().await;
    db.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 5. A handler that blocks its thread keeps its lease.

/// Blocks its tokio worker thread for three times its lease.
struct Blocks;

impl Job for Blocks {
    const KIND: &'static str = "blocks";
    const LEASE: Duration = Duration::from_secs(1);
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    }
}

#[test]
fn a_handler_blocking_its_thread_past_its_lease_is_not_rescued() -> anyhow::Result<()> {
    capture_logs();
    // The worker: two tokio threads, both blocked by the two handlers.
    let worker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The rescuer's runtime, which also hosts the test's own queries.
    let rescuer_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let db = rescuer_rt.block_on(TestDatabase::new())?;
    let rescuer_pool = db.pool().clone();
    let worker_pool = worker_rt.block_on(db.new_pool(4))?;
    let worker = worker_rt.block_on(async {
        quiet_runtime(&worker_pool)
            .register::<Blocks>()
            .queue("default", 2)
            .prefetch(0)
            .build()?
            .start()
            .await
    })?;
    let ids = worker_rt.block_on(async {
        let a = Blocks::enqueue(&worker_pool, N { n: 1 }).await?;
        let b = Blocks::enqueue(&worker_pool, N { n: 2 }).await?;
        anyhow::Ok([a.id.0, b.id.0])
    })?;
    // Both handlers block both worker threads. Then a rescuer starts: its reaper would
    // return a job whose lease expired (and the worker would run it a second time); its
    // own queue holds nothing.
    let running = rescuer_rt.block_on(eventually(Duration::from_secs(30), || async {
        count(
            &rescuer_pool,
            "SELECT count(*) FROM jobq.jobs WHERE state = 'running'",
        )
        .await
            == 2
    }));
    assert!(running, "the worker did not claim both jobs");
    let rescuer = rescuer_rt.block_on(async {
        quiet_runtime(&rescuer_pool)
            .register::<Blocks>()
            .queue("rescuer_only", 1)
            .reaper(Some(ReaperConfig {
                interval: Duration::from_millis(100),
                ..Default::default()
            }))
            .build()?
            .start()
            .await
    })?;
    let done = rescuer_rt.block_on(eventually(Duration::from_secs(60), || async {
        count(
            &rescuer_pool,
            "SELECT count(*) FROM jobq.jobs WHERE state = 'done'",
        )
        .await
            == 2
    }));
    let rows: Vec<(i64, String, i32, Option<String>)> = rescuer_rt.block_on(
        sqlx::query_as("SELECT id, state, attempts, last_error_code FROM jobq.jobs ORDER BY id")
            .fetch_all(&rescuer_pool),
    )?;
    worker_rt.block_on(worker.shutdown());
    rescuer_rt.block_on(rescuer.shutdown());
    assert!(done, "{rows:?}");
    let expected: Vec<(i64, String, i32, Option<String>)> = ids
        .iter()
        .map(|id| (*id, "done".to_owned(), 1, None))
        .collect();
    assert_eq!(rows, expected, "a blocked handler lost its lease");
    worker_rt.block_on(worker_pool.close());
    rescuer_rt.block_on(db.close());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. No payload value in any log line or stored error.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_does_not_decode_leaves_its_values_out_of_logs_and_errors()
-> anyhow::Result<()> {
    capture_logs();
    const SECRET: &str = "S3CR3T-4f9a1c-do-not-log";
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let job = LegacyTarget::enqueue(pool, LegacyArgs { n: SECRET.into() }).await?;
    let handle = quiet_runtime(pool)
        .register::<Target>()
        .build()?
        .start()
        .await?;
    assert!(tests::reaches_state(pool, job.id, "failed", Duration::from_secs(30)).await);
    handle.shutdown().await;
    let (code, last_error, errors): (String, String, String) = sqlx::query_as(
        "SELECT last_error_code, last_error, errors::text FROM jobq.jobs WHERE id = $1",
    )
    .bind(job.id.0)
    .fetch_one(pool)
    .await?;
    assert_eq!(code, "decode");
    assert!(
        last_error.contains("at `n`") && last_error.contains("expected i64"),
        "{last_error}"
    );
    assert!(!last_error.contains("S3CR3T"), "{last_error}");
    assert!(!errors.contains("S3CR3T"), "{errors}");
    std::io::stdout().flush()?;
    let log = String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned();
    assert!(log.contains("decode"), "the failure was not logged at all");
    assert!(!log.contains("S3CR3T"), "a payload value reached the log");
    db.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 7. Bad input is `Invalid` with a stable code, never `Database`.

struct NulKind;

impl Job for NulKind {
    const KIND: &'static str = "nul\0kind";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn bad_input_is_invalid_with_a_stable_code() -> anyhow::Result<()> {
    capture_logs();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let check = |e: jobq::Error, code: &str| {
        assert!(matches!(e, jobq::Error::Invalid { .. }), "{e:?}");
        assert_eq!(e.code(), code, "{e}");
        assert!(
            e.to_string().len() < 300,
            "unbounded message: {} bytes",
            e.to_string().len()
        );
    };
    check(
        NulKind::enqueue(pool, N { n: 1 }).await.unwrap_err(),
        "invalid_kind",
    );
    check(
        Target::with(N { n: 1 })
            .queue("mail\0x")
            .enqueue(pool)
            .await
            .unwrap_err(),
        "invalid_queue",
    );
    check(
        Target::with(N { n: 1 })
            .idempotency_key("k\0")
            .enqueue(pool)
            .await
            .unwrap_err(),
        "invalid_idempotency_key",
    );
    check(
        Target::with(N { n: 1 })
            .max_attempts(u32::MAX)
            .enqueue(pool)
            .await
            .unwrap_err(),
        "invalid_max_attempts",
    );
    // 4714 BC (chrono's year -4713): before the first day PostgreSQL's timestamptz holds.
    let bc = chrono::NaiveDate::from_ymd_opt(-4713, 6, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap()
        .and_utc();
    check(
        Target::with(N { n: 1 })
            .run_after(bc)
            .enqueue(pool)
            .await
            .unwrap_err(),
        "run_after_out_of_range",
    );
    let long = "q".repeat(10_000);
    let e = Target::with(N { n: 1 })
        .queue(long.clone())
        .enqueue(pool)
        .await
        .unwrap_err();
    check(e, "invalid_queue");
    let e = Runtime::builder(pool.clone())
        .register::<Target>()
        .queue(long, 1)
        .build()
        .unwrap_err();
    check(e, "invalid_queue");
    check(
        RawTarget::enqueue(pool, serde_json::json!({"s": "a\u{0}b"}))
            .await
            .unwrap_err(),
        "nul_in_payload",
    );
    assert_eq!(count(pool, "SELECT count(*) FROM jobq.jobs").await, 0);
    db.close().await;
    Ok(())
}
