//! The reaper: returns jobs whose lease expired to `pending` (or to `failed` with code
//! `lease_expired` when no attempts are left). Safe on every node at once: it skips rows
//! another node has locked, and re-checks state and lease on each row it changes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::Error;
use crate::store::{self, ReapReport};

/// The reaper's settings.
#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Time between passes (default 5 s).
    pub interval: Duration,
    /// The most rows one statement rescues (default 1,000); a pass repeats until less
    /// than a batch is found.
    pub batch: i64,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval: Duration::from_secs(5),
            batch: 1000,
        }
    }
}

/// Rescues expired leases.
#[derive(Debug, Clone)]
pub struct Reaper {
    pool: PgPool,
    config: ReaperConfig,
}

impl Reaper {
    /// A reaper over `pool`.
    pub fn new(pool: PgPool, config: ReaperConfig) -> Self {
        Reaper { pool, config }
    }

    /// One pass, by the database's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once(&self) -> Result<ReapReport, Error> {
        self.run_once_at(None).await
    }

    /// One pass as if the time were `now` (`None`: the database's clock).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once_at(&self, now: Option<DateTime<Utc>>) -> Result<ReapReport, Error> {
        let mut total = ReapReport::default();
        loop {
            let mut conn = self.pool.acquire().await?;
            let r = store::job_reap(&mut conn, self.config.batch, now).await?;
            total.rescued += r.rescued;
            total.failed += r.failed;
            if r.rescued + r.failed < u64::try_from(self.config.batch).unwrap_or(0) {
                return Ok(total);
            }
        }
    }

    /// Runs a pass every (jittered) interval until `stop`. A pass that has grown slow
    /// spaces out the next (see [`Pace`](super::Pace)): while a snapshot is held open, the
    /// lease index keeps an entry for every version of every running job since, most of
    /// them expired, and each pass walks them all.
    pub async fn run(self, stop: CancellationToken) {
        let this = &self;
        let pace = &super::Pace::default();
        super::every(self.config.interval, stop, || async move {
            let Some(pass) = super::paced(Some(pace), this.run_once()).await else {
                return;
            };
            match pass {
                Ok(r) if r.rescued + r.failed > 0 => info!(
                    rescued = r.rescued,
                    failed = r.failed,
                    "reaper returned jobs whose lease expired"
                ),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "reaper pass failed"),
            }
        })
        .await;
    }
}
