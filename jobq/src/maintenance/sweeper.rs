//! The ordering sweeper: the safety net of per-key ordering. The end of an ordered job
//! releases the next job of its key in a short step after the job's own write; a crash
//! between the two leaves the next job waiting behind a finished one. Each pass finds
//! such jobs and settles their keys (under the keys' locks, as the normal path does).
//! Safe on every node at once; a pass with nothing to do is one scan of the waiting
//! jobs' index.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::Error;
pub use crate::flow::ordering::SweepReport;

/// The sweeper's settings.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Time between passes (default 10 s).
    pub interval: Duration,
    /// The most stale keys one pass settles (default 1,000); a pass repeats until fewer
    /// are found.
    pub batch: i64,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(10),
            batch: 1000,
        }
    }
}

/// Releases ordered jobs left waiting behind finished ones.
#[derive(Debug, Clone)]
pub struct Sweeper {
    pool: PgPool,
    config: SweeperConfig,
}

impl Sweeper {
    /// A sweeper over `pool`.
    pub fn new(pool: PgPool, config: SweeperConfig) -> Self {
        Sweeper { pool, config }
    }

    /// One pass.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once(&self) -> Result<SweepReport, Error> {
        let mut total = SweepReport::default();
        loop {
            let r = crate::flow::ordering::sweep(&self.pool, self.config.batch).await?;
            total.stale += r.stale;
            total.released += r.released;
            if r.stale < u64::try_from(self.config.batch).unwrap_or(0) {
                return Ok(total);
            }
        }
    }

    /// Runs a pass every (jittered) interval until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let this = &self;
        super::every(self.config.interval, stop, || async move {
            match this.run_once().await {
                Ok(r) if r.stale > 0 => info!(
                    stale = r.stale,
                    released = r.released,
                    "ordering sweeper released jobs left waiting behind finished ones"
                ),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "ordering sweeper pass failed"),
            }
        })
        .await;
    }
}
