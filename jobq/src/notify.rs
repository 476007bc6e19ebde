//! LISTEN/NOTIFY wake-ups. Enqueue notifies `jobq_insert` with the queue's name once the
//! job has committed; the listener wakes that queue's producer. A notification is only a
//! hint: producers also poll, so a lost one costs latency, never a job. After a lost
//! connection the listener reconnects and wakes every producer, since notifications sent
//! meanwhile are gone.
//!
//! How enqueue notifies depends on where it runs. Inside the caller's transaction the
//! insert statement itself notifies, so the wake-up is delivered only if that transaction
//! commits. On a pool, the insert is its own transaction and commits before enqueue
//! returns: an enqueue alone on its pool still notifies in its statement, but while
//! several run at once their wake-ups are sent after they committed, by a task of the
//! pool's, coalesced ([`PoolEnqueue`]). PostgreSQL holds a database-wide lock from the
//! moment a notifying transaction starts to commit until it has, so notifying inserts
//! from many connections commit one at a time, each waiting for its own WAL flush, where
//! plain inserts share flushes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

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

/// The enqueue side's wake-up bookkeeping per pool, keyed by the address of the pool's
/// options (clones of a pool share them); an entry lives while the pool has enqueues
/// running or wake-ups to send.
static POOLS: LazyLock<Mutex<HashMap<usize, PoolWakes>>> = LazyLock::new(Default::default);

#[derive(Default)]
struct PoolWakes {
    /// Enqueues on this pool now running.
    enqueues: usize,
    /// Whether a sender task runs for this pool.
    sending: bool,
    /// Queues whose wake-up the sender has yet to send.
    unsent: BTreeSet<String>,
    /// Wakes the sender while it lingers with nothing to send.
    more: Arc<Notify>,
}

fn pools() -> std::sync::MutexGuard<'static, HashMap<usize, PoolWakes>> {
    // The map holds no invariant a panic elsewhere could have broken halfway.
    POOLS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// After sending, a sender waits this long before it sends again: wake-ups requested
/// meanwhile go out together, at most this much later. Each notifying statement costs
/// the server a transaction of its own (with a WAL flush behind it); a steady stream of
/// concurrent enqueues is thereby capped at a thousand of them a second.
const PACE: Duration = Duration::from_millis(1);

/// How long a sender keeps its connection, waiting for more wake-ups, once it has
/// nothing to send, so a busy enqueuer's wake-ups skip the pool's check-out and ping.
const LINGER: Duration = Duration::from_millis(5);

/// One enqueue on a pool, from before its insert until it has committed; decides how its
/// wake-up is sent (see the module's documentation).
///
/// An enqueue alone on its pool notifies in its own statement: with no other notifying
/// transaction to wait for, that is the cheapest way. While other enqueues on the pool
/// run, or a sender is busy, its wake-up goes to the pool's sender instead, sent after
/// the commit and coalesced with the others': concurrent notifying transactions would
/// commit one at a time.
pub(crate) struct PoolEnqueue<'p> {
    pool: &'p PgPool,
    key: usize,
    in_statement: bool,
}

impl<'p> PoolEnqueue<'p> {
    pub(crate) fn begin(pool: &'p PgPool) -> Self {
        let key = Arc::as_ptr(&pool.connect_options()) as usize;
        let mut pools = pools();
        let entry = pools.entry(key).or_default();
        let in_statement = entry.enqueues == 0 && !entry.sending;
        entry.enqueues += 1;
        PoolEnqueue {
            pool,
            key,
            in_statement,
        }
    }

    /// Whether the insert statement should notify itself.
    pub(crate) fn in_statement(&self) -> bool {
        self.in_statement
    }

    /// The insert has committed jobs due now in `queues`: wakes their producers, unless
    /// the statement already did. Returns at once; the pool's sender task sends the
    /// notification, right away when it is idle, otherwise with the next batch. Every
    /// request is followed by a notification sent after it was made, so coalescing loses
    /// none. A failure to send is logged and dropped: producers poll.
    pub(crate) fn committed<'q>(self, queues: impl IntoIterator<Item = &'q str>) {
        if self.in_statement {
            return;
        }
        let mut pools = pools();
        let Some(entry) = pools.get_mut(&self.key) else {
            return;
        };
        let before = entry.unsent.len();
        entry.unsent.extend(queues.into_iter().map(str::to_owned));
        if entry.unsent.len() == before {
            return;
        }
        if entry.sending {
            entry.more.notify_one();
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            entry.sending = true;
            rt.spawn(send_wake_ups(
                self.pool.clone(),
                self.key,
                entry.more.clone(),
            ));
        }
    }
}

impl Drop for PoolEnqueue<'_> {
    fn drop(&mut self) {
        let mut pools = pools();
        if let Some(entry) = pools.get_mut(&self.key) {
            entry.enqueues -= 1;
            if entry.enqueues == 0 && !entry.sending {
                pools.remove(&self.key);
            }
        }
    }
}

/// The sender task of one pool: sends what is unsent until nothing has been for a
/// while, then ends.
async fn send_wake_ups(pool: PgPool, key: usize, more: Arc<Notify>) {
    let mut conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>> = None;
    loop {
        let queues: Vec<String> = {
            let mut pools = pools();
            let Some(entry) = pools.get_mut(&key) else {
                return;
            };
            std::mem::take(&mut entry.unsent).into_iter().collect()
        };
        if queues.is_empty() {
            if conn.is_some() && tokio::time::timeout(LINGER, more.notified()).await.is_ok() {
                continue;
            }
            let mut pools = pools();
            let Some(entry) = pools.get_mut(&key) else {
                return;
            };
            if !entry.unsent.is_empty() {
                continue;
            }
            entry.sending = false;
            if entry.enqueues == 0 {
                pools.remove(&key);
            }
            return;
        }
        if let Err(e) = send(&pool, &mut conn, &queues).await {
            conn = None;
            debug!(error = %e, ?queues, "sending a wake-up failed; producers will find the jobs by polling");
        }
        tokio::time::sleep(PACE).await;
    }
}

async fn send(
    pool: &PgPool,
    conn: &mut Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    queues: &[String],
) -> Result<(), sqlx::Error> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(pool.acquire().await?),
    };
    sqlx::query("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q")
        .bind(NOTIFY_CHANNEL)
        .bind(queues)
        .execute(&mut **c)
        .await?;
    Ok(())
}
