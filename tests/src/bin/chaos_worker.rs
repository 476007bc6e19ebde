//! A worker process for the failure-injection tests, built only on jobq's public API.
//!
//! It serves the `chaos` kind: each job logs its attempt, works for a while, then performs
//! its side effect through the effect ledger — for even jobs completing the job in the
//! same transaction, for odd jobs leaving completion to the runtime. It can kill itself
//! with SIGKILL at a chosen point of its k-th job, and hog its own pool as an application
//! might. Configured by environment variables:
//!
//! - `DATABASE_URL`: the database (required)
//! - `CHAOS_QUEUE`: the queue to serve (default `chaos`)
//! - `CHAOS_CONCURRENCY`: slots (default 8)
//! - `CHAOS_HANDLER_MS`: how long a handler works before its effect (default 2)
//! - `CHAOS_CRASH`: `none`, `after_claim`, `mid_handler` or `after_effect`
//! - `CHAOS_CRASH_ON`: the number of the job (counted in this process) to crash on
//! - `CHAOS_HOG_POOL`: `1` to take every pool connection it can for 2.5 s (past the
//!   2 s lease), first after 1 s, then every 6 s; each round is written to `hog_rounds`
//! - `CHAOS_POOL`: pool size (default 6)
//! - `CHAOS_REPORT_CLOCK`: `1` to write this process's wall clock to `worker_clocks`
//!
//! It runs until SIGTERM or SIGINT, then shuts down gracefully.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jobq::{Job, JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Serialize, Deserialize)]
struct ChaosArgs {
    n: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    None,
    AfterClaim,
    MidHandler,
    AfterEffect,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    crash: Crash,
    crash_on: u64,
    handler: Duration,
}

static HANDLED: AtomicU64 = AtomicU64::new(0);

fn die_here(point: &str) -> ! {
    eprintln!("chaos_worker {}: SIGKILL {point}", std::process::id());
    // kill(1) rather than kill(2): the workspace forbids `unsafe`. SIGKILL does not return.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    std::process::abort();
}

#[derive(Debug)]
struct Chaos;

impl Job for Chaos {
    const KIND: &'static str = "chaos";
    const LEASE: Duration = Duration::from_secs(2);
    // Short backoff: failures here come from injected faults, and a test waits for every
    // job to finish.
    const RETRY: jobq::RetryPolicy = jobq::RetryPolicy::exponential(25)
        .base(Duration::from_millis(100))
        .cap(Duration::from_secs(2))
        .jitter(true);
    type Args = ChaosArgs;
    type Error = JobError;

    async fn run(ctx: JobContext, args: ChaosArgs) -> Result<(), JobError> {
        let settings = *ctx
            .state::<Settings>()
            .ok_or_else(|| JobError::permanent("config", "no settings"))?;
        let pool = ctx
            .pool()
            .ok_or_else(|| JobError::permanent("config", "no pool"))?
            .clone();
        let k = HANDLED.fetch_add(1, Ordering::SeqCst) + 1;
        let crash_here = |point: Crash| settings.crash == point && settings.crash_on == k;
        if crash_here(Crash::AfterClaim) {
            die_here("after claim, before the handler");
        }
        sqlx::query("INSERT INTO attempts_log (job_id, attempt, n, pid) VALUES ($1, $2, $3, $4)")
            .bind(ctx.id().0)
            .bind(ctx.attempt() as i32)
            .bind(args.n)
            .bind(std::process::id() as i32)
            .execute(&pool)
            .await?;
        if crash_here(Crash::MidHandler) {
            tokio::time::sleep(settings.handler / 2).await;
            die_here("mid-handler");
        }
        tokio::time::sleep(settings.handler).await;

        let mut tx = pool.begin().await?;
        if ctx
            .effect_once(&mut tx, &format!("effect-{}", args.n))
            .await?
        {
            sqlx::query(
                "INSERT INTO side_effects (n, job_id, attempt, pid) VALUES ($1, $2, $3, $4)",
            )
            .bind(args.n)
            .bind(ctx.id().0)
            .bind(ctx.attempt() as i32)
            .bind(std::process::id() as i32)
            .execute(&mut *tx)
            .await?;
        }
        if args.n % 2 == 0 {
            ctx.complete_in_tx(&mut tx).await?;
        }
        tx.commit().await?;
        if crash_here(Crash::AfterEffect) {
            die_here("after the side effect, before completion");
        }
        Ok(())
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::var("DATABASE_URL")?;
    let crash = match std::env::var("CHAOS_CRASH").as_deref() {
        Ok("after_claim") => Crash::AfterClaim,
        Ok("mid_handler") => Crash::MidHandler,
        Ok("after_effect") => Crash::AfterEffect,
        _ => Crash::None,
    };
    let settings = Settings {
        crash,
        crash_on: env("CHAOS_CRASH_ON", 0),
        handler: Duration::from_millis(env("CHAOS_HANDLER_MS", 2)),
    };
    let pool_size: u32 = env("CHAOS_POOL", 6);
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await?;
    if env("CHAOS_REPORT_CLOCK", 0) == 1 {
        // Lets a test see this process's own idea of the time (libfaketime shifts it).
        sqlx::query("INSERT INTO worker_clocks (pid, local_now, db_now) VALUES ($1, $2, now())")
            .bind(std::process::id() as i32)
            .bind(chrono::Utc::now())
            .execute(&pool)
            .await?;
    }
    if env("CHAOS_HOG_POOL", 0) == 1 {
        let hog = pool.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_secs(1);
            loop {
                tokio::time::sleep(pause).await;
                pause = Duration::from_secs(3);
                // Take every connection as it comes free for half a second (without
                // queueing ahead of everyone else), then sit on them past the lease.
                let mut held = Vec::new();
                let grab_until = tokio::time::Instant::now() + Duration::from_millis(500);
                while held.len() < pool_size as usize && tokio::time::Instant::now() < grab_until {
                    match hog.try_acquire() {
                        Some(c) => held.push(c),
                        None => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
                tokio::time::sleep(Duration::from_millis(2500)).await;
                let took = held.len();
                drop(held);
                // The scenario's proof that the pool really ran dry (no table: not asked).
                let _ = sqlx::query("INSERT INTO hog_rounds (held, pool) VALUES ($1, $2)")
                    .bind(i32::try_from(took).unwrap_or(i32::MAX))
                    .bind(i32::try_from(pool_size).unwrap_or(i32::MAX))
                    .execute(&hog)
                    .await;
            }
        });
    }
    let queue = std::env::var("CHAOS_QUEUE").unwrap_or_else(|_| "chaos".into());
    let runtime = Runtime::builder(pool)
        .auto_register(false)
        .register::<Chaos>()
        .queue(queue, env("CHAOS_CONCURRENCY", 8))
        .state(settings)
        .poll_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(5))
        .reaper(Some(jobq::maintenance::ReaperConfig {
            interval: Duration::from_millis(250),
            ..Default::default()
        }))
        .build()?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    eprintln!("chaos_worker {} ready", std::process::id());
    runtime.run_until(stop).await?;
    Ok(())
}
