//! A node for the periodic-job tests, built only on jobq's public API: a runtime serving
//! the `tick` kind, with the schedule `every_second` (`Schedule::every(1s)`, missed slots
//! all enqueued, up to 1,000) and a scheduler passing every 100 ms. Configured by
//! `DATABASE_URL`; runs until killed.

use std::time::Duration;

use jobq::maintenance::SchedulerConfig;
use jobq::{JobError, Missed, Runtime, Schedule};
use sqlx::postgres::PgPoolOptions;

#[jobq::job(kind = "tick")]
async fn tick(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    let schedule = Schedule::every(Duration::from_secs(1))
        .named("every_second")
        .missed(Missed::All { max: 1000 });
    Runtime::builder(pool)
        .periodic::<Tick>(schedule, ())
        .scheduler(Some(SchedulerConfig {
            interval: Duration::from_millis(100),
            ..SchedulerConfig::default()
        }))
        .build()?
        .run_until(std::future::pending::<()>())
        .await?;
    Ok(())
}
