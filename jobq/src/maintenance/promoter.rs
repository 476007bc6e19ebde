//! The promoter: moves `scheduled` jobs (enqueued for a future time, or retries waiting
//! for their backoff) to `pending` once they are due, so the claim only ever reads due
//! rows. The database is the clock: "due" is `run_after <= now()` on the server, whatever
//! the nodes' clocks say. Safe on every node at once: each batch skips rows another node
//! is promoting and re-checks the state, so a job is promoted exactly once and never early.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::Error;
use crate::store;

/// The promoter's settings.
#[derive(Debug, Clone)]
pub struct PromoterConfig {
    /// Time between passes (default 1 s): the most a scheduled job waits past its
    /// `run_after` before it can be claimed.
    pub interval: Duration,
    /// The most rows one statement promotes (default 1,000); a pass repeats until less
    /// than a batch is found.
    pub batch: i64,
}

impl Default for PromoterConfig {
    fn default() -> Self {
        PromoterConfig {
            interval: Duration::from_secs(1),
            batch: 1000,
        }
    }
}

/// What one promoter pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromoteReport {
    /// Jobs moved from `scheduled` to `pending`.
    pub promoted: u64,
    /// Statements run.
    pub batches: u64,
}

/// Promotes due scheduled jobs.
#[derive(Debug, Clone)]
pub struct Promoter {
    pool: PgPool,
    config: PromoterConfig,
}

impl Promoter {
    /// A promoter over `pool`.
    pub fn new(pool: PgPool, config: PromoterConfig) -> Self {
        Promoter { pool, config }
    }

    /// One pass, by the database's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once(&self) -> Result<PromoteReport, Error> {
        self.run_once_at(None).await
    }

    /// One pass as if the time were `now` (`None`: the database's clock).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once_at(&self, now: Option<DateTime<Utc>>) -> Result<PromoteReport, Error> {
        let mut conn = self.pool.acquire().await?;
        promote_all(&mut conn, self.config.batch, now).await
    }

    /// Runs a pass every (jittered) interval until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let this = &self;
        super::every(self.config.interval, stop, || async move {
            match this.run_once().await {
                Ok(r) if r.promoted > 0 => {
                    debug!(
                        promoted = r.promoted,
                        "promoter made scheduled jobs pending"
                    )
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "promoter pass failed"),
            }
        })
        .await;
    }
}

/// Promotes every due scheduled job in batches of `batch`, each its own statement (and
/// so its own short transaction on an idle connection).
pub(crate) async fn promote_all(
    conn: &mut sqlx::PgConnection,
    batch: i64,
    now: Option<DateTime<Utc>>,
) -> Result<PromoteReport, Error> {
    let batch = batch.max(1);
    let mut report = PromoteReport::default();
    loop {
        let n = store::job_promote_due(conn, batch, now).await?;
        report.promoted += n;
        report.batches += 1;
        if n < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(report);
        }
    }
}
