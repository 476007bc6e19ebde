//! A worker process for the per-key ordering test, built only on jobq's public API.
//!
//! It serves `ordered_step` jobs (queue `ordered`, `#[job(ordering = key)]`). Each attempt
//! records its start in `starts` (key, seq, job id, attempt, the database's clock),
//! works for a few milliseconds, and records its end in `ends`; a job whose key is listed
//! in `poisoned` fails permanently instead. Configured by environment variables:
//!
//! - `DATABASE_URL`: the database (required)
//! - `ORDERED_CONCURRENCY`: slots (default 4)
//!
//! It runs until SIGTERM or SIGINT (the test kills it with SIGKILL).

use std::time::Duration;

use jobq::{JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

/// One step of a key's sequence.
#[derive(Debug, Serialize, Deserialize)]
struct StepArgs {
    key: String,
    seq: i64,
}

#[jobq::job(
    kind = "ordered_step",
    queue = "ordered",
    ordering = key,
    lease = "2s",
    retry = "exp(max=50,base=50ms,cap=500ms)"
)]
async fn ordered_step(ctx: JobContext, args: StepArgs) -> Result<(), JobError> {
    let pool = ctx
        .pool()
        .ok_or_else(|| JobError::permanent("config", "no pool"))?
        .clone();
    sqlx::query(
        "INSERT INTO starts (key, seq, job_id, attempt, pid, at)
         VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
    )
    .bind(&args.key)
    .bind(args.seq)
    .bind(ctx.id().0)
    .bind(ctx.attempt() as i32)
    .bind(std::process::id() as i32)
    .execute(&pool)
    .await?;
    tokio::time::sleep(Duration::from_millis(5 + rand::random::<u64>() % 20)).await;
    let poisoned: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM poisoned WHERE key = $1)")
            .bind(&args.key)
            .fetch_one(&pool)
            .await?;
    if poisoned {
        return Err(JobError::permanent("poison", "this key is poisoned"));
    }
    sqlx::query("INSERT INTO ends (job_id, attempt, at) VALUES ($1, $2, clock_timestamp())")
        .bind(ctx.id().0)
        .bind(ctx.attempt() as i32)
        .execute(&pool)
        .await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let concurrency = std::env::var("ORDERED_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await?;
    let runtime = Runtime::builder(pool)
        .auto_register(false)
        .register::<OrderedStep>()
        .queue("ordered", concurrency)
        .poll_interval(Duration::from_millis(100))
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
    runtime.run_until(stop).await?;
    Ok(())
}
