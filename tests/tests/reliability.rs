//! Reliability properties: timeouts cancel before the next attempt, the database is the
//! clock (a worker whose clock is an hour off behaves), and a randomized run of payloads
//! and outcomes never breaks the state machine's invariants.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::{Job, JobContext, JobError, RetryPolicy, Runtime};
use jobq_testing::TestDatabase;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tests::{
    Chaos, ChaosArgs, N, eventually, init_tracing, install_invariant_checks, invariant_violations,
};
use tokio::time::Instant;

/// What the attempts of `TimesOut` observed, in order (the runtime's state).
#[derive(Debug, Default)]
struct Events(Mutex<Vec<(&'static str, Instant)>>);

impl Events {
    fn record(&self, what: &'static str) {
        self.0.lock().unwrap().push((what, Instant::now()));
    }
}

struct DropProbe(Arc<Events>);
impl Drop for DropProbe {
    fn drop(&mut self) {
        self.0.record("attempt 1 dropped");
    }
}

/// Attempt 1 hangs past its timeout, with work spawned on the context's token; attempt 2
/// succeeds.
struct TimesOut;

impl Job for TimesOut {
    const KIND: &'static str = "times_out";
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(200));
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::ZERO).max(2);
    type Args = N;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), JobError> {
        let events = ctx
            .state::<Arc<Events>>()
            .ok_or_else(|| JobError::permanent("no_events", "the runtime holds no Events"))?;
        if ctx.attempt() == 1 {
            let _probe = DropProbe(events.clone());
            let token = ctx.cancellation_token();
            let spawned = events.clone();
            tokio::spawn(async move {
                token.cancelled().await;
                spawned.record("attempt 1 spawned work cancelled");
            });
            std::future::pending::<()>().await;
        }
        events.record("attempt 2 started");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_attempt_is_cancelled_before_its_retry_starts() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let recorded = Arc::new(Events::default());
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<TimesOut>()
        .state(recorded.clone())
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?;
    let job = TimesOut::enqueue(pool, N { n: 1 }).await?;
    assert!(
        tests::reaches_state(pool, job.id, "done", Duration::from_secs(10)).await,
        "job never became done"
    );
    handle.shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let events = recorded.0.lock().unwrap().clone();
    let at = |what: &str| {
        events
            .iter()
            .find(|(w, _)| *w == what)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("no event {what:?} in {events:?}"))
    };
    let started = at("attempt 2 started");
    assert!(at("attempt 1 dropped") < started, "{events:?}");
    assert!(
        at("attempt 1 spawned work cancelled") < started,
        "{events:?}"
    );
    let (code, attempts): (Option<String>, i32) =
        sqlx::query_as("SELECT errors->0->>'code', attempts FROM jobq.jobs WHERE id = $1")
            .bind(job.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!((code.as_deref(), attempts), (Some("timeout"), 2));
    db.close().await;
    Ok(())
}

/// Where libfaketime's preload library is, if installed (`apt-get install faketime`).
fn libfaketime() -> Option<String> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_is_an_hour_off_behaves() -> anyhow::Result<()> {
    let Some(lib) = libfaketime() else {
        assert!(
            std::env::var("CI").is_err(),
            "libfaketime is missing in CI: .ci/run installs the faketime package"
        );
        println!("SKIPPED: install the faketime package to run the clock-skew test");
        return Ok(());
    };
    for offset in ["+1h", "-1h"] {
        let db = TestDatabase::new().await?;
        let pool = db.pool();
        sqlx::raw_sql(
            "CREATE TABLE attempts_log (job_id bigint, attempt int, n bigint, pid int, at timestamptz DEFAULT clock_timestamp());
             CREATE TABLE side_effects (n bigint, job_id bigint, attempt int, pid int, at timestamptz DEFAULT clock_timestamp());
             CREATE TABLE worker_clocks (pid int, local_now timestamptz, db_now timestamptz);",
        )
        .execute(pool)
        .await?;
        Chaos::enqueue_many(pool, (0..20).map(|n| ChaosArgs { n })).await?;
        // Due in 3 s by the database's clock: a worker an hour ahead must not run it early.
        let delayed = Chaos::with(ChaosArgs { n: 20 })
            .run_in(Duration::from_secs(3))
            .enqueue(pool)
            .await?;
        sqlx::query("UPDATE jobq.jobs SET queue = 'chaos'")
            .execute(pool)
            .await?;
        let url = {
            let base = jobq_testing::database_url();
            let root = base
                .rsplit_once('/')
                .map_or(base.clone(), |(r, _)| r.to_owned());
            format!("{root}/{}", db.name())
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_chaos_worker"))
            .env("DATABASE_URL", &url)
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_RESET", "1")
            .env("CHAOS_REPORT_CLOCK", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let p = pool.clone();
        let done = eventually(Duration::from_secs(30), || {
            let p = p.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobq.jobs WHERE state = 'done'")
                    .fetch_one(&p)
                    .await
                    .unwrap_or(0)
                    == 21
            }
        })
        .await;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let _ = child.wait();
        assert!(done, "clock {offset}: jobs did not finish");
        let skew: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM local_now - db_now)::float8 FROM worker_clocks",
        )
        .fetch_one(pool)
        .await?;
        let want = if offset.starts_with('+') {
            3600.0
        } else {
            -3600.0
        };
        assert!(
            (skew - want).abs() < 60.0,
            "the worker's clock was not shifted: {skew} s"
        );
        let (run_after, started): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
            "SELECT j.run_after, a.at FROM jobq.jobs j JOIN attempts_log a ON a.job_id = j.id WHERE j.id = $1",
        )
        .bind(delayed.id.0)
        .fetch_one(pool)
        .await?;
        assert!(
            started >= run_after,
            "clock {offset}: the delayed job started at {started}, before its run_after {run_after}"
        );
        let late = (started - run_after).num_milliseconds();
        assert!(late < 5_000, "clock {offset}: started {late} ms late");
        println!(
            "clock-skew {offset}: 21 jobs done, delayed job started {late} ms after its run_after"
        );
        db.close().await;
    }
    Ok(())
}

/// One scripted step of an attempt.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
enum Step {
    Ok,
    Retry,
    RetryAfter(u64),
    Permanent,
    Panic,
    Cancel,
    Hang,
}

#[derive(Debug, Serialize, Deserialize)]
struct Script {
    steps: Vec<Step>,
}

/// Follows its script: attempt k performs `steps[k-1]` (or succeeds past the end).
struct Scripted;

impl Job for Scripted {
    const KIND: &'static str = "scripted";
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(30));
    const RETRY: RetryPolicy = RetryPolicy::exponential(5)
        .base(Duration::from_secs(1))
        .cap(Duration::from_secs(60))
        .jitter(true);
    type Args = Script;
    type Error = JobError;
    async fn run(ctx: JobContext, script: Script) -> Result<(), JobError> {
        match script
            .steps
            .get(ctx.attempt() as usize - 1)
            .copied()
            .unwrap_or(Step::Ok)
        {
            Step::Ok => Ok(()),
            Step::Retry => Err(JobError::retryable("flaky", "try again")),
            Step::RetryAfter(s) => {
                Err(JobError::retryable("rate_limited", "later")
                    .retry_after(Duration::from_secs(s)))
            }
            Step::Permanent => Err(JobError::permanent("bad_input", "never")),
            Step::Panic => panic!("scripted panic"),
            Step::Cancel => Err(JobError::cancel("not needed any more")),
            Step::Hang => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(())
            }
        }
    }
}

/// What the state machine must end in for a script and a budget.
fn expected(steps: Option<&[Step]>, max: i32) -> (&'static str, i32, Option<&'static str>) {
    let Some(steps) = steps else {
        return ("failed", 1, Some("decode"));
    };
    let mut last_code = None;
    for attempt in 1..=max {
        let step = steps.get(attempt as usize - 1).copied().unwrap_or(Step::Ok);
        let code = match step {
            Step::Ok => return ("done", attempt, last_code),
            Step::Permanent => return ("failed", attempt, Some("bad_input")),
            Step::Cancel => return ("cancelled", attempt, Some("cancelled")),
            Step::Retry => "flaky",
            Step::RetryAfter(_) => "rate_limited",
            Step::Panic => "panic",
            Step::Hang => "timeout",
        };
        last_code = Some(code);
    }
    ("failed", max, last_code)
}

#[tokio::test]
async fn random_payloads_and_outcomes_keep_the_state_machine_invariants() -> anyhow::Result<()> {
    let seed: u64 = std::env::var("JOBQ_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("random_payloads_and_outcomes: JOBQ_PROPTEST_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    install_invariant_checks(pool).await;

    let mut cases: HashMap<i64, (Option<Vec<Step>>, i32)> = HashMap::new();
    for _ in 0..150 {
        let max = rng.random_range(1..=5);
        if rng.random_bool(0.1) {
            // Payloads that are not a Script: they must fail as `decode`, kept for inspection.
            let payload = match rng.random_range(0..4) {
                0 => serde_json::json!(null),
                1 => serde_json::json!(rng.random::<i32>()),
                2 => serde_json::json!({"steps": "not a list"}),
                _ => serde_json::json!({"steps": [{"Unknown": 1}]}),
            };
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO jobq.jobs (kind, payload, max_attempts) VALUES ('scripted', $1, $2) RETURNING id",
            )
            .bind(&payload)
            .bind(max)
            .fetch_one(pool)
            .await?;
            cases.insert(id, (None, max));
            continue;
        }
        let len = rng.random_range(0..=6);
        let steps: Vec<Step> = (0..len)
            .map(|_| match rng.random_range(0..100) {
                0..25 => Step::Ok,
                25..50 => Step::Retry,
                50..60 => Step::RetryAfter(rng.random_range(0..100)),
                60..72 => Step::Permanent,
                72..84 => Step::Panic,
                84..94 => Step::Cancel,
                _ => Step::Hang,
            })
            .collect();
        let e = Scripted::with(Script {
            steps: steps.clone(),
        })
        .max_attempts(max as u32)
        .enqueue(pool)
        .await?;
        cases.insert(e.id.0, (Some(steps), max));
    }

    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Scripted>()
        .build()?;
    // Drain, moving the clock to the next due retry, until nothing is pending.
    let mut now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    for _ in 0..100 {
        rt.drain(Some(now)).await?;
        let next: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT min(run_after) FROM jobq.jobs WHERE state IN ('pending', 'scheduled')",
        )
        .fetch_one(pool)
        .await?;
        match next {
            Some(t) => now = now.max(t),
            None => break,
        }
    }
    type Final = (i64, String, i32, i32, Option<String>, Option<DateTime<Utc>>);
    let snapshot = || async {
        sqlx::query_as::<_, Final>(
            "SELECT id, state, attempts, max_attempts, last_error_code, finished_at FROM jobq.jobs ORDER BY id",
        )
        .fetch_all(pool)
        .await
    };
    let rows = snapshot().await?;
    assert_eq!(rows.len(), cases.len());
    for (id, state, attempts, max, code, finished) in &rows {
        let (steps, budget) = &cases[id];
        let (want_state, want_attempts, want_code) = expected(steps.as_deref(), *budget);
        assert_eq!(
            (state.as_str(), *attempts, code.as_deref()),
            (want_state, want_attempts, want_code),
            "job {id} with script {steps:?} and {budget} attempts (seed {seed})"
        );
        assert!(attempts <= max, "job {id}: {attempts} attempts of {max}");
        assert!(
            finished.is_some(),
            "job {id} is terminal without finished_at"
        );
    }
    // Terminal jobs never change again: another full drain, far in the future, is a no-op.
    rt.drain(Some(now + chrono::Duration::days(365))).await?;
    assert_eq!(snapshot().await?, rows);
    let violations = invariant_violations(pool).await;
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    db.close().await;
    Ok(())
}
