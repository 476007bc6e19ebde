//! Wake-ups sent after the commit, per pool, and the connections enqueues on a pool
//! reuse.
//!
//! An enqueue on a pool (`enqueue(&pool)`) is one statement, its own transaction,
//! committed before enqueue returns. An enqueue in the caller's transaction commits when
//! the caller commits; if a pool *routes* wake-ups for its database ([`route_wake_ups`],
//! which a listening runtime does for its own pool), the insert returns its transaction's
//! id and this module watches for the commit.
//!
//! **Wake-ups.** Neither insert notifies; the wake-up is sent once the insert has
//! committed, by a task of the pool's, coalesced with those of other enqueues on the pool.
//! PostgreSQL holds a cluster-wide lock from the moment a notifying transaction starts
//! to commit until its WAL is flushed, so notifying inserts from many connections would
//! commit one at a time instead of sharing flushes; and even alone, an insert commits
//! faster without the notification than the notification costs sent apart (a
//! transaction that writes nothing else commits without waiting for a flush). For a
//! transaction of the caller's, the task asks PostgreSQL (`pg_xact_status`) whether it
//! has committed, at [`PACE`] after the insert and then less and less often while it
//! stays open; it wakes the queues of the committed ones and forgets the aborted ones.
//! Without a route, the insert notifies inside the transaction, as PostgreSQL's own
//! way of sending a notification on commit.
//!
//! **Connections.** Checking a connection out of an sqlx pool and back in costs a round
//! trip each way (a ping on every check-in, and on check-out unless the pool has
//! `test_before_acquire(false)`), nearly as much as the insert. An enqueue on a pool
//! therefore keeps its connection for the next one, for [`KEEP`] at most: a loop of
//! enqueues skips the check-outs, and a pool nobody enqueues on gets the connection
//! back a few milliseconds later.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use tokio::sync::Notify;
use tracing::debug;

use crate::error::Error;
use crate::store;

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
    /// Transactions of callers, with the queues to wake once they commit.
    watched: Vec<Watch>,
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

impl PoolState {
    /// Whether the sender has something to send at `now`, and when a watched
    /// transaction is next due for a look.
    fn due(&self, now: Instant) -> (bool, Option<Instant>) {
        let ready = !self.unsent.is_empty() || self.watched.iter().any(|w| w.next <= now);
        (ready, self.watched.iter().map(|w| w.next).min())
    }
}

/// A caller's transaction that inserted due jobs, waiting for its commit.
#[derive(Debug)]
struct Watch {
    xid: i64,
    queues: Vec<String>,
    since: Instant,
    /// When to look next.
    next: Instant,
    /// How long after that look the one after waits.
    wait: Duration,
}

impl Watch {
    /// Still open at the last look: looks again later, each wait twice the one before up
    /// to [`MAX_LOOK`]; gives up after [`WATCH_LIMIT`] (producers poll).
    fn again(mut self, now: Instant) -> Option<Watch> {
        if now.duration_since(self.since) > WATCH_LIMIT {
            return None;
        }
        self.next = now + self.wait;
        self.wait = (self.wait * 2).min(MAX_LOOK);
        Some(self)
    }
}

/// The longest wait between two looks at a transaction that stays open: a long
/// transaction's wake-up goes out at most this long after its commit.
const MAX_LOOK: Duration = Duration::from_millis(16);

/// How long a transaction is watched before its wake-up is left to polling.
const WATCH_LIMIT: Duration = Duration::from_secs(600);

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

/// Pools that route the wake-ups of enqueues in transactions on their database.
static ROUTES: LazyLock<Mutex<Vec<Route>>> = LazyLock::new(Default::default);

static NEXT_ROUTE: AtomicU64 = AtomicU64::new(0);

/// The longest a route goes without re-reading its database's name after a
/// transaction on a database of the same name found no route (see [`after_commit`]).
const ROUTE_RECHECK: Duration = Duration::from_secs(1);

struct Route {
    id: u64,
    /// The database, as `store::database_sql!` names it.
    database: String,
    /// The route's own pool of one connection.
    pool: PgPool,
    /// When the database's name was last asked for again, if ever.
    rechecked: Option<Instant>,
}

fn routes() -> MutexGuard<'static, Vec<Route>> {
    // The list holds no invariant a panic elsewhere could have broken halfway.
    ROUTES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends the wake-ups of enqueues run in transactions on `pool`'s database after they
/// commit, for as long as the returned guard lives.
///
/// Without a route, an enqueue inside a transaction notifies inside that transaction,
/// and PostgreSQL commits notifying transactions one at a time across the whole cluster
/// (about a fifth of commit throughput at four connections on a 2-core machine). With
/// one, the insert notifies nothing: a task checks whether the transaction has committed
/// (from 1 ms after the insert, then less and less often while it stays open, at most
/// 16 ms apart) and sends one coalesced notification for all the committed ones.
///
/// The task works on a connection of its own, opened now with `pool`'s connect options
/// (not its `after_connect` hooks) and closed with the guard: taken from `pool`, it would
/// make the application's transactions wait for a connection whenever the pool is busy.
///
/// A running [`Runtime`](crate::Runtime) that listens routes its own pool's database; a
/// process that only enqueues (a web server whose workers run elsewhere) calls this once
/// and keeps the guard:
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// let _wake_ups = jobq::route_wake_ups(&pool).await?;
/// // ... serve requests that enqueue in their transactions ...
/// # Ok(()) }
/// ```
///
/// A wake-up only spares the workers a poll: if this process exits between a commit and
/// its wake-up, the job waits for the next poll.
///
/// # Errors
///
/// [`Error::Database`] when asking the database for its name fails.
pub async fn route_wake_ups(pool: &PgPool) -> Result<WakeUpRoute, Error> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(PgConnectOptions::clone(&pool.connect_options()));
    // Asking through the route's own pool opens its connection now, not with the first
    // wake-up; the pool keeps it while idle.
    let database = store::database_of(&own).await?;
    let id = NEXT_ROUTE.fetch_add(1, Ordering::Relaxed);
    routes().push(Route {
        id,
        database,
        pool: own,
        rechecked: None,
    });
    Ok(WakeUpRoute { id })
}

/// A pool routing wake-ups (see [`route_wake_ups`]); dropping it ends the route.
#[must_use = "wake-ups are routed only while the guard lives"]
pub struct WakeUpRoute {
    id: u64,
}

impl fmt::Debug for WakeUpRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let database = routes()
            .iter()
            .find(|r| r.id == self.id)
            .map(|r| r.database.clone());
        f.debug_struct("WakeUpRoute")
            .field("database", &database)
            .finish()
    }
}

impl Drop for WakeUpRoute {
    fn drop(&mut self) {
        let mut routes = routes();
        let gone = routes
            .iter()
            .position(|r| r.id == self.id)
            .map(|i| routes.remove(i));
        drop(routes);
        // The pool's last handle may go with it: closing it needs no lock of ours.
        drop(gone);
    }
}

/// The databases routed now, for an insert in a transaction to compare its own with:
/// it notifies in the transaction unless its database is among them, and then returns
/// its transaction for [`after_commit`].
pub(crate) fn routed_databases() -> Vec<String> {
    routes().iter().map(|r| r.database.clone()).collect()
}

/// An insert in a transaction on `database` found it among no routes and notified in
/// its transaction. If a route serves a database of the same name, its server may have
/// restarted (the start time is part of the name): see [`recheck_namesakes`].
pub(crate) fn unrouted(database: &str) {
    recheck_namesakes(&mut routes(), database);
}

/// Hands the wake-up of `queues` to the pool routing `database`, to be sent once
/// transaction `xid` has committed; returns false when no pool routes it any more (the
/// caller then notifies in the transaction).
pub(crate) fn after_commit<'q>(
    database: &str,
    xid: i64,
    queues: impl IntoIterator<Item = &'q str>,
) -> bool {
    let mut queues: Vec<String> = queues.into_iter().map(str::to_owned).collect();
    queues.sort_unstable();
    queues.dedup();
    let routes = routes();
    let Some(route) = routes.iter().find(|r| r.database == database) else {
        return false;
    };
    if queues.is_empty() {
        return true;
    }
    let pool = route.pool.clone();
    drop(routes);
    let now = Instant::now();
    request(&pool, |entry| {
        let watch = Watch {
            xid,
            queues,
            since: now,
            next: now + PACE,
            wait: PACE,
        };
        // A sender waiting for an earlier look needs no wake-up now (woken for each
        // transaction, it would cost a thread wake-up per enqueue for nothing).
        let earlier = entry.watched.iter().any(|w| w.next <= watch.next);
        entry.watched.push(watch);
        !earlier
    });
    true
}

/// A transaction found no route, but some route serves a database of the same name:
/// its server may have restarted (the start time is part of the name), so those routes
/// ask again, each at most once per [`ROUTE_RECHECK`] (a process routing a database of
/// the same name on another server asks that often for nothing).
fn recheck_namesakes(serving: &mut [Route], database: &str) {
    let name = |d: &str| d.rsplit_once(' ').map_or(d, |(n, _)| n).to_owned();
    let wanted = name(database);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    for route in serving.iter_mut().filter(|r| name(&r.database) == wanted) {
        if route.rechecked.is_some_and(|t| t.elapsed() < ROUTE_RECHECK) {
            continue;
        }
        route.rechecked = Some(Instant::now());
        let (id, pool) = (route.id, route.pool.clone());
        rt.spawn(async move {
            match store::database_of(&pool).await {
                Ok(database) => {
                    if let Some(r) = routes().iter_mut().find(|r| r.id == id) {
                        r.database = database;
                    }
                }
                Err(e) => debug!(error = %e, "asking a routing pool for its database failed"),
            }
        });
    }
}

/// Runs `add` on `pool`'s state and makes sure its sender runs to act on it. `add`
/// returns whether a running sender must be told, which it need not be when it will
/// act on the request without (see [`PoolState::due`]).
fn request(pool: &PgPool, add: impl FnOnce(&mut PoolState) -> bool) {
    let key = Arc::as_ptr(&pool.connect_options()) as usize;
    let mut pools = pools();
    let entry = pools.entry(key).or_default();
    let tell = add(entry);
    entry.requests += 1;
    // A request already waiting still makes sure a sender runs: one dropped with its
    // runtime may have left it there.
    if entry.sending {
        if tell {
            entry.more.notify_one();
        }
        return;
    }
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        entry.sending = true;
        rt.spawn(send_wake_ups(pool.clone(), key, entry.more.clone()));
    } else {
        remove_if_unused(&mut pools, key);
    }
}

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
        let mut queues = queues.into_iter().peekable();
        if queues.peek().is_none() {
            return;
        }
        request(self.pool, |entry| {
            entry.unsent.extend(queues.map(str::to_owned));
            true
        });
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

/// The wake-up sender task of one pool: sends what is unsent, and looks at watched
/// transactions when they are due, no sooner than [`PACE`] after its previous statement,
/// until nothing has been to do for a while; then ends.
async fn send_wake_ups(pool: PgPool, key: usize, more: Arc<Notify>) {
    let mut sending = Sending { key, done: false };
    let mut conn: Option<PoolConnection<Postgres>> = None;
    let mut last_sent: Option<Instant> = None;
    let mut pace = PACE;
    loop {
        let now = Instant::now();
        let Some((ready, next_look)) = pools().get(&key).map(|e| e.due(now)) else {
            return;
        };
        if !ready {
            if let Some(at) = next_look {
                // Only open transactions are left: look again when the first is due
                // (or sooner, for a new request), keeping the connection only for a
                // short wait.
                if at.saturating_duration_since(now) > LINGER {
                    conn = None;
                }
                let _ = tokio::time::timeout_at(at.into(), more.notified()).await;
                continue;
            }
            if conn.is_some() && tokio::time::timeout(LINGER, more.notified()).await.is_ok() {
                continue;
            }
            let mut pools = pools();
            let Some(entry) = pools.get_mut(&key) else {
                return;
            };
            if !entry.unsent.is_empty() || !entry.watched.is_empty() {
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
        let now = Instant::now();
        let (queues, looks, requests) = match pools().get_mut(&key) {
            Some(entry) => (
                std::mem::take(&mut entry.unsent)
                    .into_iter()
                    .collect::<Vec<_>>(),
                entry
                    .watched
                    .extract_if(.., |w| w.next <= now)
                    .collect::<Vec<_>>(),
                std::mem::take(&mut entry.requests),
            ),
            None => return,
        };
        pace = next_pace(pace, requests);
        match send(&pool, &mut conn, &queues, &looks).await {
            Ok(open) => {
                let now = Instant::now();
                let again: Vec<Watch> = looks
                    .into_iter()
                    .filter(|w| open.contains(&w.xid))
                    .filter_map(|w| w.again(now))
                    .collect();
                if !again.is_empty()
                    && let Some(entry) = pools().get_mut(&key)
                {
                    entry.watched.extend(again);
                }
            }
            Err(e) => {
                conn = None;
                debug!(error = %e, ?queues, transactions = looks.len(), "sending a wake-up failed; producers will find the jobs by polling");
            }
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

/// Sends the wake-ups of `queues` and of the committed transactions among `looks`;
/// returns the xids of those still open.
async fn send(
    pool: &PgPool,
    conn: &mut Option<PoolConnection<Postgres>>,
    queues: &[String],
    looks: &[Watch],
) -> Result<Vec<i64>, Error> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(pool.acquire().await?),
    };
    let (xids, watched_queues): (Vec<i64>, Vec<&str>) = looks
        .iter()
        .flat_map(|w| w.queues.iter().map(|q| (w.xid, q.as_str())))
        .unzip();
    store::committed_notify(c, queues, &xids, &watched_queues).await
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

    #[test]
    fn an_open_transaction_is_looked_at_less_and_less_often_then_left_to_polling() {
        let t0 = Instant::now();
        let mut w = Watch {
            xid: 1,
            queues: vec!["default".to_owned()],
            since: t0,
            next: t0 + PACE,
            wait: PACE,
        };
        let mut now = w.next;
        let mut gaps = Vec::new();
        for _ in 0..7 {
            w = w.again(now).expect("still watched");
            gaps.push((w.next - now).as_millis());
            now = w.next;
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 16, 16]);
        assert!(w.again(t0 + WATCH_LIMIT + PACE).is_none());
    }
}
