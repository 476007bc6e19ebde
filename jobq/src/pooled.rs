//! Enqueues on a pool (`enqueue(&pool)`): each is one statement, its own transaction,
//! committed before enqueue returns. What they share, per pool, lives here: how their
//! wake-ups are sent, and the connection they reuse.
//!
//! **Wake-ups.** The insert does not notify; its wake-up is sent after it committed,
//! by a task of the pool's, coalesced with those of other enqueues on the pool.
//! PostgreSQL holds a database-wide lock from the moment a notifying transaction starts
//! to commit until its WAL is flushed, so notifying inserts from many connections would
//! commit one at a time instead of sharing flushes; and even alone, an insert commits
//! faster without the notification than the notification costs sent apart (a
//! transaction that writes nothing else commits without waiting for a flush).
//!
//! **Connections.** Checking a connection out of an sqlx pool and back in costs a round
//! trip each way (a ping on every check-in, and on check-out unless the pool has
//! `test_before_acquire(false)`), nearly as much as the insert. An enqueue on a pool
//! therefore keeps its connection for the next one, for [`KEEP`] at most: a loop of
//! enqueues skips the check-outs, and a pool nobody enqueues on gets the connection
//! back a few milliseconds later.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::Notify;
use tracing::debug;

use crate::store::NOTIFY_CHANNEL;

/// Per-pool state, keyed by the address of the pool's options (clones of a pool share
/// them); an entry lives while anything in it is in use.
static POOLS: LazyLock<Mutex<HashMap<usize, PoolState>>> = LazyLock::new(Default::default);

#[derive(Default)]
struct PoolState {
    /// Enqueues on this pool now running.
    enqueues: usize,
    /// Whether a wake-up sender task runs for this pool.
    sending: bool,
    /// Queues whose wake-up the sender has yet to send.
    unsent: BTreeSet<String>,
    /// Wake-up requests since the sender last took `unsent`.
    requests: u64,
    /// Wakes the sender while it lingers with nothing to send.
    more: Arc<Notify>,
    /// Connections kept for the next enqueues.
    kept: Vec<PoolConnection<Postgres>>,
    /// Bumped whenever a connection is kept; the keeper task gives the connections back
    /// once it stops changing.
    kept_at: u64,
    /// Whether the keeper task runs for this pool.
    keeping: bool,
}

impl PoolState {
    fn unused(&self) -> bool {
        self.enqueues == 0 && !self.sending && !self.keeping && self.kept.is_empty()
    }
}

fn pools() -> MutexGuard<'static, HashMap<usize, PoolState>> {
    // The map holds no invariant a panic elsewhere could have broken halfway.
    POOLS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn remove_if_unused(pools: &mut HashMap<usize, PoolState>, key: usize) {
    if pools.get(&key).is_some_and(PoolState::unused) {
        pools.remove(&key);
    }
}

/// How long a connection is kept for the next enqueue on its pool.
const KEEP: Duration = Duration::from_millis(2);

/// The most connections kept per pool.
const MAX_KEPT: usize = 4;

/// After sending, a sender waits this long before it sends again: wake-ups requested
/// meanwhile go out together, at most this much later. Each notifying statement costs
/// the server a transaction of its own (its commit record is not waited for: it wrote
/// nothing else), and the application's two sides a round trip; a steady stream of
/// enqueues is thereby capped at a thousand of them a second, fewer once the pace grows
/// (see [`next_pace`]). (A fixed two milliseconds cut the cost at one client, 93 % → 96 %
/// of enqueues without wake-ups, but moved the p99 start latency at 500 jobs/s from 3.0
/// to 4.1 ms, too near its 5 ms target.)
const PACE: Duration = Duration::from_millis(1);

/// The longest pace, while enqueues keep arriving faster than wake-ups go out.
const MAX_PACE: Duration = Duration::from_millis(4);

/// How long a sender keeps its connection, waiting for more wake-ups, once it has
/// nothing to send.
const LINGER: Duration = Duration::from_millis(5);

/// One enqueue on a pool, from before its insert until it has committed.
pub(crate) struct PoolEnqueue<'p> {
    pool: &'p PgPool,
    key: usize,
}

impl<'p> PoolEnqueue<'p> {
    pub(crate) fn begin(pool: &'p PgPool) -> Self {
        let key = Arc::as_ptr(&pool.connect_options()) as usize;
        let mut pools = pools();
        pools.entry(key).or_default().enqueues += 1;
        PoolEnqueue { pool, key }
    }

    /// A connection kept by an earlier enqueue on this pool, or one from the pool.
    pub(crate) async fn connection(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let kept = pools().get_mut(&self.key).and_then(|e| e.kept.pop());
        match kept {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await,
        }
    }

    /// Keeps `conn`, whose statement succeeded, for the next enqueue on this pool.
    pub(crate) fn keep(&self, conn: PoolConnection<Postgres>) {
        let mut pools = pools();
        let Some(entry) = pools.get_mut(&self.key) else {
            return;
        };
        if entry.kept.len() >= MAX_KEPT {
            return;
        }
        entry.kept.push(conn);
        entry.kept_at += 1;
        if entry.keeping {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            entry.keeping = true;
            rt.spawn(give_back_when_unused(self.key));
        } else {
            entry.kept.clear();
        }
    }

    /// The insert has committed jobs due now in `queues`: wakes their producers. Returns
    /// at once; the pool's sender task sends the notification, right away when it is
    /// idle, otherwise with the next batch. Every request is followed by a notification
    /// sent after it was made, so coalescing loses none. A failure to send is logged and
    /// dropped: producers poll.
    pub(crate) fn committed<'q>(self, queues: impl IntoIterator<Item = &'q str>) {
        let mut pools = pools();
        let Some(entry) = pools.get_mut(&self.key) else {
            return;
        };
        entry.unsent.extend(queues.into_iter().map(str::to_owned));
        if entry.unsent.is_empty() {
            return;
        }
        entry.requests += 1;
        // A queue already waiting still makes sure a sender runs: one dropped with its
        // runtime may have left it there.
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
        }
        remove_if_unused(&mut pools, self.key);
    }
}

/// The keeper task of one pool: gives the kept connections back once no enqueue has
/// kept one for [`KEEP`].
async fn give_back_when_unused(key: usize) {
    // Also when the task is dropped unfinished (its tokio runtime shut down): the
    // connections must not stay in a process-wide map, nor `keeping` stay set for good.
    let _give_back = GiveBack(key);
    let mut seen = None;
    loop {
        tokio::time::sleep(KEEP).await;
        let pools = pools();
        let Some(entry) = pools.get(&key) else {
            return;
        };
        if seen == Some(entry.kept_at) || entry.kept.is_empty() {
            return;
        }
        seen = Some(entry.kept_at);
    }
}

struct GiveBack(usize);

impl Drop for GiveBack {
    fn drop(&mut self) {
        let mut pools = pools();
        let Some(entry) = pools.get_mut(&self.0) else {
            return;
        };
        let kept = std::mem::take(&mut entry.kept);
        entry.keeping = false;
        remove_if_unused(&mut pools, self.0);
        drop(pools);
        drop(kept);
    }
}

/// Clears a sender's `sending` flag if its task is dropped unfinished (its tokio runtime
/// shut down), so that the next wake-up starts a new one instead of waiting for a sender
/// that is gone.
struct Sending {
    key: usize,
    done: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut pools = pools();
        if let Some(entry) = pools.get_mut(&self.key) {
            entry.sending = false;
        }
        remove_if_unused(&mut pools, self.key);
    }
}

/// The wake-up sender task of one pool: sends what is unsent, no sooner than [`PACE`]
/// after its previous statement, until nothing has been for a while; then ends.
async fn send_wake_ups(pool: PgPool, key: usize, more: Arc<Notify>) {
    let mut sending = Sending { key, done: false };
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut last_sent: Option<Instant> = None;
    let mut pace = PACE;
    loop {
        let waiting = pools().get(&key).is_some_and(|e| !e.unsent.is_empty());
        if !waiting {
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
            // Under the same lock as the check above: a request from now on starts a
            // new sender.
            entry.sending = false;
            sending.done = true;
            remove_if_unused(&mut pools, key);
            return;
        }
        if let Some(since) = last_sent.map(|t| t.elapsed())
            && since < pace
        {
            tokio::time::sleep(pace - since).await;
        }
        let (queues, requests): (Vec<String>, u64) = match pools().get_mut(&key) {
            Some(entry) => (
                std::mem::take(&mut entry.unsent).into_iter().collect(),
                std::mem::take(&mut entry.requests),
            ),
            None => return,
        };
        pace = next_pace(pace, requests);
        if let Err(e) = send(&pool, &mut conn, &queues).await {
            conn = None;
            debug!(error = %e, ?queues, "sending a wake-up failed; producers will find the jobs by polling");
        }
        last_sent = Some(Instant::now());
    }
}

/// The pace after a send that carried `requests` wake-up requests. Several requests
/// in one pace mean enqueues arrive faster than wake-ups go out: the pace doubles, up to
/// [`MAX_PACE`], so a steady stream of thousands of enqueues a second sends a few hundred
/// notifications instead of a thousand (while producers are busy they do not wait for
/// them). A send carrying one or two resets it, so enqueues a few milliseconds apart
/// (hundreds a second) are each woken at [`PACE`].
fn next_pace(pace: Duration, requests: u64) -> Duration {
    if requests >= 3 {
        (pace * 2).min(MAX_PACE)
    } else {
        PACE
    }
}

async fn send(
    pool: &PgPool,
    conn: &mut Option<PoolConnection<Postgres>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_grows_while_enqueues_outrun_wake_ups_and_resets_when_they_do_not() {
        let mut pace = PACE;
        for _ in 0..5 {
            pace = next_pace(pace, 10);
        }
        assert_eq!(pace, MAX_PACE);
        assert_eq!(next_pace(pace, 2), PACE);
        // Enqueues a couple of milliseconds apart never slow their wake-ups.
        assert_eq!(next_pace(PACE, 1), PACE);
    }
}
