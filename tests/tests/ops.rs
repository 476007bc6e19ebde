//! Operating jobq against a real PostgreSQL: operator actions racing live workers, their
//! audit rows, rate-bounded bulk replay, pausing with jobs in flight, and retry-now and
//! payload correction.

use std::time::Duration;

use jobq::admin::{Admin, BulkReplay, Filter};
use jobq::{Job, JobContext, JobError, JobId, RetryPolicy, Runtime};
use jobq_testing::TestDatabase;
use sqlx::PgPool;
use tests::{Gate, N, eventually, init_tracing, job_state};

/// A worker that neither reaps, prunes nor heartbeats its leases (so a test decides when a
/// lease expires).
fn worker(pool: &PgPool, queue: &str, concurrency: usize) -> jobq::RuntimeBuilder {
    Runtime::builder(pool.clone())
        .auto_register(false)
        .queue(queue.to_owned(), concurrency)
        .poll_interval(Duration::from_millis(100))
        .reaper(None)
        .pruner(None)
}

async fn wait_state(pool: &PgPool, id: JobId, want: &str) -> bool {
    let ok = eventually(Duration::from_secs(15), || async {
        job_state(pool, id).await.0 == want
    })
    .await;
    if !ok {
        eprintln!("job {id} is {:?}, wanted {want}", job_state(pool, id).await);
    }
    ok
}

#[derive(sqlx::FromRow, Debug)]
struct Audit {
    job_id: Option<i64>,
    action: String,
    actor: String,
    reason: Option<String>,
    before_state: Option<String>,
    after_state: Option<String>,
    detail: Option<serde_json::Value>,
}

async fn audit(pool: &PgPool) -> Vec<Audit> {
    sqlx::query_as(
        "SELECT job_id, action, actor, reason, before_state, after_state, detail
         FROM jobq.job_audit ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Attempt n waits until the test releases attempt n (through the runtime's [`Gate`]). Attempt 1 then fails permanently
/// (so a stale write, if applied, would fail the job); later attempts succeed.
struct Gated;

impl Job for Gated {
    const KIND: &'static str = "gated";
    const RETRY: RetryPolicy = RetryPolicy::none();
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let gate = Gate::of(&ctx)?;
        gate.start_attempt(ctx.attempt());
        gate.wait(ctx.attempt()).await;
        if ctx.attempt() == 1 {
            return Err(JobError::permanent(
                "stale_attempt",
                "the first attempt fails late",
            ));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_racing_a_stale_lease_holder_changes_nothing_it_should_not() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let queue = "stale";
    let gate = Gate::new();
    let rt = worker(pool, queue, 2)
        .register::<Gated>()
        .state(gate.clone())
        .heartbeat_interval(Duration::from_secs(3600))
        .build()?
        .start()
        .await?;
    let job = Gated::with(N { n: 1 })
        .queue(queue)
        .idempotency_key("gated-1")
        .enqueue(pool)
        .await?;
    assert!(wait_state(pool, job.id, "running").await);
    let admin = Admin::new(pool.clone()).actor("alice");

    // A running job is never replayed or edited.
    let err = admin.replay(job.id, Some("too early")).await.unwrap_err();
    assert_eq!(err.code(), "wrong_state", "{err}");
    assert!(
        audit(pool).await.is_empty(),
        "a refused action is not audited"
    );

    // The worker is cut off: its lease expires and the reaper fails the job (no attempts
    // left), while attempt 1 is still running in the worker.
    sqlx::query("UPDATE jobq.jobs SET locked_until = now() - interval '1 second' WHERE id = $1")
        .bind(job.id.0)
        .execute(pool)
        .await?;
    let reaped = jobq::maintenance::Reaper::new(pool.clone(), Default::default())
        .run_once()
        .await?;
    assert_eq!(reaped.failed, 1);
    assert_eq!(job_state(pool, job.id).await, ("failed".to_owned(), 1));

    // The operator replays it: pending again, same id and key, one more attempt allowed.
    let t = admin.replay(job.id, Some("worker was partitioned")).await?;
    assert_eq!((t.before.as_str(), t.after.as_str()), ("failed", "pending"));
    // The worker claims it again as attempt 2, which waits.
    assert!(eventually(Duration::from_secs(10), || async { gate.started() == 2 }).await);
    assert_eq!(job_state(pool, job.id).await, ("running".to_owned(), 2));

    // Attempt 1 finally fails permanently: its fenced write must not touch attempt 2.
    gate.release(1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(job_state(pool, job.id).await, ("running".to_owned(), 2));
    let (code, errors): (Option<String>, serde_json::Value) =
        sqlx::query_as("SELECT last_error_code, errors FROM jobq.jobs WHERE id = $1")
            .bind(job.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(code.as_deref(), Some("lease_expired"));
    assert_eq!(errors.as_array().map(Vec::len), Some(1), "{errors}");

    gate.release(2);
    assert!(wait_state(pool, job.id, "done").await);
    let (key, max_attempts): (Option<String>, i32) =
        sqlx::query_as("SELECT idempotency_key, max_attempts FROM jobq.jobs WHERE id = $1")
            .bind(job.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(key.as_deref(), Some("gated-1"));
    assert_eq!(max_attempts, 2, "replay grants exactly one more attempt");

    let rows = audit(pool).await;
    assert_eq!(rows.len(), 1);
    let a = &rows[0];
    assert_eq!(a.job_id, Some(job.id.0));
    assert_eq!(a.action, "replay");
    assert_eq!(a.actor, "alice");
    assert_eq!(a.reason.as_deref(), Some("worker was partitioned"));
    assert_eq!(a.before_state.as_deref(), Some("failed"));
    assert_eq!(a.after_state.as_deref(), Some("pending"));
    let d = a.detail.clone().unwrap_or_default();
    assert_eq!(
        (
            d["max_attempts_before"].as_i64(),
            d["max_attempts_after"].as_i64()
        ),
        (Some(1), Some(2))
    );
    rt.shutdown().await;
    db.close().await;
    Ok(())
}

/// Waits for its context's cancellation, then fails retryably; or succeeds when its
/// [`Gate`] is released.
struct Cancellable;

impl Job for Cancellable {
    const KIND: &'static str = "cancellable";
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let gate = Gate::of(&ctx)?;
        loop {
            if ctx.is_cancelled() {
                return Err(JobError::retryable(
                    "interrupted",
                    "cancelled by an operator",
                ));
            }
            if gate.is_released(1) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_pending_failed_and_running_jobs_with_audit() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let admin = Admin::new(pool.clone()).actor("bob");
    let gate = Gate::new();

    // Pending (scheduled for later, on an unserved queue) and failed jobs: at once.
    let pending = Cancellable::with(N { n: 1 })
        .queue("elsewhere")
        .run_in(Duration::from_secs(3600))
        .enqueue(pool)
        .await?;
    let failed = Cancellable::with(N { n: 2 })
        .queue("elsewhere")
        .enqueue(pool)
        .await?;
    sqlx::query("UPDATE jobq.jobs SET state = 'failed', finished_at = now() WHERE id = $1")
        .bind(failed.id.0)
        .execute(pool)
        .await?;
    let t = admin.cancel(pending.id, Some("customer left")).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("scheduled", "cancelled")
    );
    let t = admin.cancel(failed.id, None).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("failed", "cancelled")
    );
    // Twice is refused, and so is an unknown id.
    assert_eq!(
        admin.cancel(pending.id, None).await.unwrap_err().code(),
        "wrong_state"
    );
    assert_eq!(
        admin.cancel(JobId(999_999), None).await.unwrap_err().code(),
        "not_found"
    );

    // A running job finishes its attempt (cut short by its context), then is cancelled
    // rather than retried.
    let rt = worker(pool, "cancel", 1)
        .register::<Cancellable>()
        .state(gate.clone())
        .heartbeat_interval(Duration::from_millis(100))
        .build()?
        .start()
        .await?;
    let running = Cancellable::with(N { n: 3 })
        .queue("cancel")
        .enqueue(pool)
        .await?;
    assert!(wait_state(pool, running.id, "running").await);
    let t = admin.cancel(running.id, Some("stop it")).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("running", "running")
    );
    assert!(wait_state(pool, running.id, "cancelled").await);
    assert_eq!(
        job_state(pool, running.id).await.1,
        1,
        "no retry after the cancel"
    );

    // A cancelled job can be replayed; the cancel request does not stick to it.
    let t = admin
        .replay(running.id, Some("cancelled by mistake"))
        .await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("cancelled", "pending")
    );
    gate.release(1);
    assert!(wait_state(pool, running.id, "done").await);
    rt.shutdown().await;

    let rows = audit(pool).await;
    type Line<'a> = (Option<i64>, &'a str, Option<&'a str>, Option<&'a str>);
    let summary: Vec<Line<'_>> = rows
        .iter()
        .map(|a| {
            (
                a.job_id,
                a.action.as_str(),
                a.before_state.as_deref(),
                a.after_state.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                Some(pending.id.0),
                "cancel",
                Some("scheduled"),
                Some("cancelled")
            ),
            (
                Some(failed.id.0),
                "cancel",
                Some("failed"),
                Some("cancelled")
            ),
            (
                Some(running.id.0),
                "cancel_requested",
                Some("running"),
                Some("running")
            ),
            (
                Some(running.id.0),
                "replay",
                Some("cancelled"),
                Some("pending")
            ),
        ]
    );
    assert!(rows.iter().all(|a| a.actor == "bob"));
    assert_eq!(rows[0].reason.as_deref(), Some("customer left"));
    db.close().await;
    Ok(())
}

/// Fails permanently with code `smtp_auth` for n < 100, else `bad_address`.
struct Mailer;

impl Job for Mailer {
    const KIND: &'static str = "mailer";
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: N) -> Result<(), JobError> {
        if args.n >= 1000 {
            return Ok(());
        }
        let code = if args.n < 100 {
            "smtp_auth"
        } else {
            "bad_address"
        };
        Err(JobError::permanent(
            code,
            format!("cannot send mail {}", args.n),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_replay_by_filter_is_rate_bounded_and_audited() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = worker(pool, "default", 4).register::<Mailer>().build()?;
    Mailer::enqueue_many(pool, (0..30).map(|n| N { n })).await?;
    Mailer::enqueue_many(pool, (100..105).map(|n| N { n })).await?;
    let drained = rt.drain(None).await?;
    assert_eq!(drained.failed(), 35);

    let admin = Admin::new(pool.clone()).actor("carol");
    let filter = Filter::default().kind("mailer").code("smtp_auth");
    assert_eq!(admin.failed(&filter, 100).await?.len(), 30);
    let dry = admin
        .replay_many(
            &filter,
            BulkReplay {
                dry_run: true,
                ..BulkReplay::at_rate(20.0)
            },
            None,
        )
        .await?;
    assert_eq!((dry.matched, dry.replayed), (30, 0));
    assert!(audit(pool).await.is_empty());

    let report = admin
        .replay_many(
            &filter,
            BulkReplay::at_rate(20.0),
            Some("SMTP password rotated"),
        )
        .await?;
    assert_eq!(
        (report.matched, report.replayed, report.skipped),
        (30, 30, 0)
    );
    // 30 jobs at 20/s in chunks of 2: the last chunk starts 1.4 s after the first.
    assert!(report.elapsed_secs >= 1.35, "too fast: {report:?}");

    let rows = audit(pool).await;
    assert_eq!(rows.len(), 30);
    assert!(rows.iter().all(|a| a.action == "replay"
        && a.actor == "carol"
        && a.reason.as_deref() == Some("SMTP password rotated")));
    // No one-second window holds more than the rate (plus one chunk of slack).
    let peak: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (
             SELECT (SELECT count(*) FROM jobq.job_audit b
                     WHERE b.created_at >= a.created_at
                       AND b.created_at < a.created_at + interval '1 second') AS n
             FROM jobq.job_audit a) x",
    )
    .fetch_one(pool)
    .await?;
    assert!(peak <= 22, "{peak} replays within one second");

    // Only the matching jobs moved; the others are still failed.
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM jobq.jobs GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await?;
    assert_eq!(
        states,
        vec![("failed".to_owned(), 5), ("pending".to_owned(), 30)]
    );
    // A second bulk replay finds nothing to do.
    let again = admin
        .replay_many(&filter, BulkReplay::at_rate(100.0), None)
        .await?;
    assert_eq!((again.matched, again.replayed), (0, 0));
    db.close().await;
    Ok(())
}

/// Waits until the test releases its [`Gate`].
struct Held;

impl Job for Held {
    const KIND: &'static str = "held";
    const QUEUE: &'static str = "work";
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let gate = Gate::of(&ctx)?;
        gate.count_start();
        gate.wait(1).await;
        Ok(())
    }
}

async fn count(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = $1")
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_with_jobs_in_flight_loses_nothing_and_resume_drains() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let admin = Admin::new(pool.clone()).actor("dave");
    assert_eq!(
        admin.pause("nowhere", None).await.unwrap_err().code(),
        "not_found"
    );

    // Two nodes, two slots each.
    let gate = Gate::new();
    let mut nodes = Vec::new();
    for i in 0..2 {
        let p = db.new_pool(5).await?;
        nodes.push(
            worker(&p, "work", 2)
                .register::<Held>()
                .state(gate.clone())
                .worker_id(format!("node-{i}"))
                .build()?
                .start()
                .await?,
        );
    }
    Held::enqueue_many(pool, (0..10).map(|n| N { n })).await?;
    assert!(
        eventually(Duration::from_secs(10), || async {
            count(pool, "running").await == 4
        })
        .await
    );

    let change = admin.pause("work", Some("provider outage")).await?;
    assert!(change.paused && !change.was_paused);
    // The four in flight finish; nothing new is claimed on any node.
    gate.release(1);
    assert!(
        eventually(Duration::from_secs(10), || async {
            count(pool, "done").await == 4
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(600)).await; // several poll intervals
    assert_eq!(gate.started(), 4);
    assert_eq!(
        (count(pool, "pending").await, count(pool, "running").await),
        (6, 0)
    );
    let stats = jobq::stats::stats(pool).await?;
    let q = stats.queues.iter().find(|q| q.queue == "work").unwrap();
    assert!(q.paused);
    assert_eq!(q.paused_by.as_deref(), Some("dave"));
    assert_eq!(q.due, 6);

    let change = admin.resume("work", None).await?;
    assert!(change.was_paused && !change.paused);
    assert!(
        eventually(Duration::from_secs(10), || async {
            count(pool, "done").await == 10
        })
        .await
    );
    for n in nodes {
        n.shutdown().await;
    }
    let rows = audit(pool).await;
    let actions: Vec<(&str, Option<&str>, Option<&str>)> = rows
        .iter()
        .map(|a| {
            (
                a.action.as_str(),
                a.before_state.as_deref(),
                a.after_state.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("pause", Some("active"), Some("paused")),
            ("resume", Some("paused"), Some("active"))
        ]
    );
    assert_eq!(rows[0].detail.as_ref().unwrap()["queue"], "work");
    assert_eq!(rows[0].job_id, None);
    db.close().await;
    Ok(())
}

/// Fails retryably with a one-hour backoff.
struct SlowRetry;

impl Job for SlowRetry {
    const KIND: &'static str = "slow_retry";
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::from_secs(3600)).max(5);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retryable("upstream_down", "try later"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn retry_now_makes_a_waiting_retry_due() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = worker(pool, "default", 1).register::<SlowRetry>().build()?;
    let job = SlowRetry::enqueue(pool, N { n: 1 }).await?;
    assert_eq!(rt.drain(None).await?.retried(), 1);
    assert_eq!(
        rt.drain(None).await?.attempts.len(),
        0,
        "waiting for its backoff"
    );

    let admin = Admin::new(pool.clone()).actor("erin");
    let t = admin.retry_now(job.id, Some("upstream is back")).await?;
    assert_eq!(
        (t.before.as_str(), t.after.as_str()),
        ("scheduled", "pending")
    );
    // Already due: refused.
    assert_eq!(
        admin.retry_now(job.id, None).await.unwrap_err().code(),
        "wrong_state"
    );
    assert_eq!(rt.drain(None).await?.done(), 1);
    let rows = audit(pool).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].action, "retry_now");
    assert!(rows[0].detail.as_ref().unwrap()["run_after_before"].is_string());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_failed_payload_is_corrected_validated_and_audited_then_replayed() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = worker(pool, "default", 1).register::<Mailer>().build()?;
    let job = Mailer::enqueue(pool, N { n: 5 }).await?;
    assert_eq!(rt.drain(None).await?.failed(), 1);

    let admin = Admin::new(pool.clone()).actor("frank").register::<Mailer>();
    let err = admin
        .edit_payload(job.id, serde_json::json!({"n": "not a number"}), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_payload", "{err}");
    let t = admin
        .edit_payload(
            job.id,
            serde_json::json!({"n": 1005}),
            Some("typo in address"),
        )
        .await?;
    assert_eq!((t.before.as_str(), t.after.as_str()), ("failed", "failed"));
    admin.replay(job.id, None).await?;
    assert_eq!(rt.drain(None).await?.done(), 1);

    let detail = admin.job(job.id).await?;
    assert_eq!(detail.job.state, "done");
    assert_eq!(detail.job.payload, serde_json::json!({"n": 1005}));
    assert_eq!(
        detail.job.errors.as_array().map(Vec::len),
        Some(1),
        "history kept"
    );
    let actions: Vec<&str> = detail.audit.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(actions, vec!["edit_payload", "replay"]);
    let d = detail.audit[0].detail.as_ref().unwrap();
    assert_eq!(d["payload_before"], serde_json::json!({"n": 5}));
    assert_eq!(d["payload_after"], serde_json::json!({"n": 1005}));
    db.close().await;
    Ok(())
}

/// Runs 5–25 ms; attempts 1 and 2 fail retryably half the time. Records each execution.
struct Churn;

impl Job for Churn {
    const KIND: &'static str = "churn";
    const QUEUE: &'static str = "churn";
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::from_millis(50)).max(3);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, args: N) -> Result<(), JobError> {
        let pool = ctx.pool().cloned().expect("attached context");
        sqlx::query("INSERT INTO executions (job_id, attempt) VALUES ($1, $2)")
            .bind(ctx.id().0)
            .bind(ctx.attempt() as i32)
            .execute(&pool)
            .await?;
        let ms = 5 + (args.n * 7 + i64::from(ctx.attempt()) * 3) % 20;
        tokio::time::sleep(Duration::from_millis(ms as u64)).await;
        if ctx.attempt() < 3 && rand::random::<bool>() {
            return Err(JobError::retryable("flaky", "try again"));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_racing_two_busy_workers_keep_every_invariant() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    sqlx::query("CREATE TABLE executions (job_id bigint NOT NULL, attempt int NOT NULL)")
        .execute(pool)
        .await?;
    let mut nodes = Vec::new();
    for i in 0..2 {
        let p = db.new_pool(6).await?;
        nodes.push(
            worker(&p, "churn", 4)
                .register::<Churn>()
                .worker_id(format!("churn-{i}"))
                .heartbeat_interval(Duration::from_millis(100))
                .build()?
                .start()
                .await?,
        );
    }
    let ids: Vec<i64> = Churn::enqueue_many(pool, (0..300).map(|n| N { n }))
        .await?
        .iter()
        .map(|e| e.id.0)
        .collect();

    // An operator hammers random jobs with every action while the workers churn.
    let admin = Admin::new(pool.clone()).actor("chaos");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut applied = 0;
    while tokio::time::Instant::now() < deadline {
        let id = JobId(ids[rand::random_range(0..ids.len())]);
        let result = match rand::random_range(0..3) {
            0 => admin.replay(id, None).await.map(drop),
            1 => admin.cancel(id, None).await.map(drop),
            _ => admin.retry_now(id, None).await.map(drop),
        };
        match result {
            Ok(()) => applied += 1,
            Err(e) if e.code() == "wrong_state" => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(applied > 10, "only {applied} actions applied");
    eprintln!("{applied} operator actions applied");

    let settled = eventually(Duration::from_secs(30), || async {
        count(pool, "pending").await + count(pool, "running").await == 0
    })
    .await;
    for n in nodes {
        n.shutdown().await;
    }
    assert!(settled, "jobs did not settle");

    // Every audited transition started from a state its action allows.
    let bad: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, before_state, after_state FROM jobq.job_audit
         WHERE NOT ((action = 'replay' AND before_state IN ('failed', 'cancelled') AND after_state = 'pending')
                 OR (action = 'cancel' AND before_state IN ('scheduled', 'pending', 'failed') AND after_state = 'cancelled')
                 OR (action = 'cancel_requested' AND before_state = 'running' AND after_state = 'running')
                 OR (action = 'retry_now' AND before_state IN ('scheduled', 'pending') AND after_state = 'pending'))",
    )
    .fetch_all(pool)
    .await?;
    assert!(bad.is_empty(), "{bad:?}");
    // No attempt ran twice (the fence held), and no job ran more attempts than it was
    // allowed.
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id, attempt FROM executions
                               GROUP BY 1, 2 HAVING count(*) > 1) x",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(twice, 0);
    let over: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs j
         WHERE j.attempts > j.max_attempts
            OR j.attempts <> (SELECT count(*) FROM executions e WHERE e.job_id = j.id)",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(over, 0, "attempts match executions and stay within budget");
    // A job whose last operator action was a cancel of a pending or failed job stayed
    // cancelled; one cancelled while running ended cancelled or done.
    let broken: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs j
         JOIN LATERAL (SELECT action FROM jobq.job_audit a WHERE a.job_id = j.id
                       ORDER BY a.id DESC LIMIT 1) last ON true
         WHERE (last.action = 'cancel' AND j.state <> 'cancelled')
            OR (last.action = 'cancel_requested' AND j.state NOT IN ('cancelled', 'done'))",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(broken, 0);
    db.close().await;
    Ok(())
}
