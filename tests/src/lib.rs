//! Shared helpers and job types for jobq's workspace-level tests.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Polls `check` every 20 ms until it returns `true` or `timeout` passes.
/// Returns whether it became true.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Installs a compact tracing subscriber once (honours `RUST_LOG`, default `warn`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// The state and attempts of job `id`.
pub async fn job_state(pool: &sqlx::PgPool, id: jobq::JobId) -> (String, i32) {
    sqlx::query_as("SELECT state, attempts FROM jobq.jobs WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("job {id} not found: {e}"))
}

/// Arguments carrying one number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct N {
    /// The number.
    pub n: i64,
}
