//! LISTEN/NOTIFY wake-ups. Enqueue notifies `jobq_insert` with the queue's name once the
//! job has committed; the listener wakes that queue's producer. A notification is only a
//! hint: producers also poll, so a lost one costs latency, never a job. After a lost
//! connection the listener reconnects and wakes every producer, since notifications sent
//! meanwhile are gone.
//!
//! How enqueue notifies depends on where it runs: see [`crate::pooled`]. While it
//! listens, the listener routes wake-ups for its pool's database
//! ([`crate::route_wake_ups`]), so that enqueues inside transactions in this process
//! are woken after their commit instead of notifying in it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::pooled::{WakeUpRoute, route_wake_ups};
use crate::store::NOTIFY_CHANNEL;

/// One wake-up signal per queue this runtime serves.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    by_queue: HashMap<String, Arc<Notify>>,
}

impl Wakers {
    pub(crate) fn new<'a>(queues: impl IntoIterator<Item = &'a str>) -> Self {
        Wakers {
            by_queue: queues
                .into_iter()
                .map(|q| (q.to_owned(), Arc::new(Notify::new())))
                .collect(),
        }
    }

    pub(crate) fn get(&self, queue: &str) -> Option<Arc<Notify>> {
        self.by_queue.get(queue).cloned()
    }

    /// Wakes `queue`'s producer; a wake-up that arrives while it is busy is kept for its
    /// next wait, so none is lost.
    pub(crate) fn wake(&self, queue: &str) {
        if let Some(n) = self.by_queue.get(queue) {
            n.notify_one();
        }
    }

    pub(crate) fn wake_all(&self) {
        for n in self.by_queue.values() {
            n.notify_one();
        }
    }
}

/// Listens until `stop`, reconnecting with backoff.
pub(crate) async fn listen(pool: PgPool, wakers: Arc<Wakers>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    // Held while listening; taken again after each reconnection, which follows a server
    // restart or failover (whose database has a new name, see `store::database_sql!`).
    let mut route: Option<WakeUpRoute> = None;
    loop {
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            l = connect(&pool) => match l {
                Ok(l) => l,
                Err(e) => {
                    warn!(error = %e, "LISTEN connection failed; producers keep polling, retrying in {backoff:?}");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        debug!("listening on {NOTIFY_CHANNEL}");
        backoff = Duration::from_millis(100);
        drop(route.take());
        route = match route_wake_ups(&pool).await {
            Ok(r) => Some(r),
            Err(e) => {
                // Enqueues in transactions notify in them instead: slower, not lost.
                debug!(error = %e, "routing wake-ups through the runtime's pool failed");
                None
            }
        };
        // Anything enqueued while we were not listening has been missed.
        wakers.wake_all();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                msg = listener.try_recv() => match msg {
                    Ok(Some(n)) => wakers.wake(n.payload()),
                    Ok(None) => {
                        // sqlx has already reconnected and listens again.
                        warn!("LISTEN connection lost and re-established");
                        wakers.wake_all();
                    }
                    Err(e) => {
                        warn!(error = %e, "LISTEN connection failed; reconnecting");
                        wakers.wake_all();
                        break;
                    }
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}
