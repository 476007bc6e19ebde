//! Worker presence: each runtime upserts its row in `jobq.workers` (queues with
//! concurrency, kinds with leases) every interval, deletes rows of workers unseen for a
//! while, and refreshes the queue gauges (`jobq_queue_depth`,
//! `jobq_queue_oldest_age_seconds`). On shutdown it deletes its own row. Stats compare
//! pending kinds with the kinds live workers serve.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::error::Error;
use crate::store;

/// Worker presence's settings.
#[derive(Debug, Clone)]
pub struct WorkerPresenceConfig {
    /// Time between beats (default 5 s).
    pub interval: Duration,
    /// A row unseen for this long is deleted (default 60 s).
    pub forget_after: Duration,
}

impl Default for WorkerPresenceConfig {
    fn default() -> Self {
        WorkerPresenceConfig {
            interval: Duration::from_secs(5),
            forget_after: Duration::from_secs(60),
        }
    }
}

/// One runtime's row in `jobq.workers`, and the queue gauges. (Not the lease heartbeat,
/// which renews the leases of running jobs: see `RuntimeBuilder::heartbeat_interval`.)
#[derive(Debug, Clone)]
pub struct WorkerPresence {
    pool: PgPool,
    id: String,
    queues: serde_json::Value,
    kinds: serde_json::Value,
    served_queues: Vec<String>,
    config: WorkerPresenceConfig,
}

impl WorkerPresence {
    /// The presence of worker `id`, serving `queues` (name, concurrency) and `kinds`
    /// (kind, lease).
    pub fn new<'a>(
        pool: PgPool,
        id: impl Into<String>,
        queues: impl IntoIterator<Item = (&'a str, usize)>,
        kinds: impl IntoIterator<Item = (&'a str, Duration)>,
        config: WorkerPresenceConfig,
    ) -> Self {
        let queues: serde_json::Map<String, serde_json::Value> = queues
            .into_iter()
            .map(|(q, c)| (q.to_owned(), serde_json::Value::from(c)))
            .collect();
        let served_queues = queues.keys().cloned().collect();
        let kinds: serde_json::Map<String, serde_json::Value> = kinds
            .into_iter()
            .map(|(k, l)| (k.to_owned(), serde_json::Value::from(l.as_secs_f64())))
            .collect();
        WorkerPresence {
            pool,
            id: id.into(),
            queues: serde_json::Value::Object(queues),
            kinds: serde_json::Value::Object(kinds),
            served_queues,
            config,
        }
    }

    /// One beat: upsert this worker's row, forget stale workers, refresh the gauges (depth,
    /// oldest age, parked).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn run_once(&self) -> Result<(), Error> {
        self.beat(None).await
    }

    /// One beat; with `depths`, the depth gauges only when that pace says they are due.
    async fn beat(&self, depths: Option<&super::Pace>) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        store::worker_upsert(&mut conn, &self.id, &self.queues, &self.kinds).await?;
        store::worker_delete_stale(&mut conn, self.config.forget_after.as_secs_f64()).await?;
        let read = super::paced(depths, store::queue_depths(&mut conn, &self.served_queues));
        if let Some(read) = read.await.transpose()? {
            for q in &self.served_queues {
                let (depth, age) = read
                    .iter()
                    .find(|(name, _, _)| name == q)
                    .map_or((0, 0.0), |(_, d, a)| (*d, a.unwrap_or(0.0)));
                crate::metrics::queue_gauges(q, depth, age);
            }
        }
        let parked = store::ordering_parked_counts(&mut conn).await?;
        for q in &self.served_queues {
            let n = parked
                .iter()
                .filter(|p| &p.queue == q)
                .map(|p| p.parked)
                .sum();
            crate::metrics::parked_gauge(q, n);
        }
        Ok(())
    }

    /// Beats every (jittered) interval until `stop`, then deletes this worker's row.
    /// Depth gauges whose count has grown slow are refreshed less often (see
    /// [`Pace`](super::Pace)); the beat itself is not.
    pub async fn run(self, stop: CancellationToken) {
        let this = &self;
        let depths = &super::Pace::default();
        super::every(self.config.interval, stop, || async move {
            if let Err(e) = this.beat(Some(depths)).await {
                warn!(error = %e, "worker heartbeat failed");
            }
        })
        .await;
        match self.pool.acquire().await {
            Ok(mut conn) => {
                if let Err(e) = store::worker_delete(&mut conn, &self.id).await {
                    warn!(error = %e, "could not delete this worker's heartbeat row");
                }
            }
            Err(e) => warn!(error = %e, "could not delete this worker's heartbeat row"),
        }
    }
}

/// The former name of [`WorkerPresence`].
#[deprecated(
    since = "0.2.0",
    note = "renamed WorkerPresence: \"heartbeat\" is the lease renewal"
)]
pub type WorkerHeartbeat = WorkerPresence;

/// The former name of [`WorkerPresenceConfig`].
#[deprecated(since = "0.2.0", note = "renamed WorkerPresenceConfig")]
pub type WorkerHeartbeatConfig = WorkerPresenceConfig;
