//! A worker for the limit tests, built only on jobq's public API: a runtime serving the
//! kinds of `limits_jobs` with 8 slots, polling every 200 ms, the reaper every 200 ms.
//! Configured by `DATABASE_URL`; runs until killed.

use std::time::Duration;

use jobq::Runtime;
use jobq::maintenance::ReaperConfig;
use sqlx::postgres::PgPoolOptions;

#[path = "../limits_jobs.rs"]
#[allow(dead_code)]
mod limits_jobs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    Runtime::builder(pool)
        .queue("default", 8)
        .poll_interval(Duration::from_millis(200))
        .reaper(Some(ReaperConfig {
            interval: Duration::from_millis(200),
            ..ReaperConfig::default()
        }))
        .build()?
        .run_until(std::future::pending::<()>())
        .await?;
    Ok(())
}
