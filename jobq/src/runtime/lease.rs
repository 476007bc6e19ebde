//! Leases: the set of attempts this runtime is running, the heartbeat that extends their
//! leases in one statement per beat, and the watchdog that drops an attempt whose lease
//! this process can no longer vouch for.
//!
//! The heartbeat runs on a thread of its own, with its own single-threaded tokio runtime
//! and its own connection: a handler that blocks its tokio worker thread (a synchronous
//! call, `std::thread::sleep`, heavy CPU work) would otherwise starve the renewal of every
//! lease on that runtime, and its job would be rescued from a process that is alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::context::Deadline;
use crate::error::Error;
use crate::store::{self, LeaseRenewal, LeaseStatus};

/// One attempt in flight in this process.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// The attempt's lease generation (its fence).
    pub(crate) fence: i64,
    pub(crate) lease: Duration,
    /// The local deadline (see `AttemptLease::deadline`).
    pub(crate) deadline: Arc<Deadline>,
    /// The context's cancellation (cooperative).
    pub(crate) cancel: CancellationToken,
    pub(crate) signals: Arc<Signals>,
}

#[cfg(test)]
impl Running {
    /// An attempt of lease generation `fence` with a minute's lease, for tests.
    pub(crate) fn idle(fence: i64) -> Running {
        Running {
            fence,
            lease: Duration::from_secs(60),
            deadline: Arc::new(Deadline::new(Instant::now() + Duration::from_secs(60))),
            cancel: CancellationToken::new(),
            signals: Arc::default(),
        }
    }
}

/// What other tasks tell a running attempt, and it tells them; each signal, once raised,
/// stays raised. One allocation per attempt, where a cancellation token each took three.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    raised: AtomicU8,
    notify: Notify,
}

impl Signals {
    /// The lease is lost: the executor drops the handler's future.
    pub(crate) const LOST: u8 = 1;
    /// The shutdown's deadline: the executor drops the future and hands the job back.
    pub(crate) const INTERRUPT: u8 = 2;
    /// The attempt's outcome went to the completer. A lease found ended after that is the
    /// outcome's own write (or a fence the completer reports), not a loss.
    pub(crate) const SETTLED: u8 = 4;

    pub(crate) fn raise(&self, signal: u8) {
        self.raised.fetch_or(signal, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_raised(&self, signal: u8) -> bool {
        self.raised.load(Ordering::SeqCst) & signal != 0
    }

    /// Resolves once `signal` is raised.
    pub(crate) async fn raised(&self, signal: u8) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a raise between the two is not missed.
            notified.as_mut().enable();
            if self.is_raised(signal) {
                return;
            }
            notified.await;
        }
    }
}

/// The attempts in flight, by job id.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunningSet {
    inner: Arc<Mutex<HashMap<i64, Running>>>,
    handed_back: Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, the jobs claimed ahead that wait for a handler slot.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

impl RunningSet {
    pub(crate) fn insert(&self, id: i64, r: Running) {
        self.lock().insert(id, r);
    }

    /// Takes out the attempt of `id` fenced by `fence`; a later attempt at the same job
    /// (claimed again after this one's lease was lost) stays.
    pub(crate) fn remove(&self, id: i64, fence: i64) {
        let mut set = self.lock();
        if set.get(&id).is_some_and(|r| r.fence == fence) {
            set.remove(&id);
        }
    }

    pub(crate) fn count_handed_back(&self) {
        self.handed_back
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn handed_back(&self) -> usize {
        self.handed_back.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attempts whose handlers run (not those waiting for a slot).
    pub(crate) fn len(&self) -> usize {
        let all = self.lock().len();
        all.saturating_sub(self.waiting.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Runs `wait` (a job's wait for its handler slot) counted as waiting.
    pub(crate) async fn wait_for_slot<F: std::future::Future>(&self, wait: F) -> F::Output {
        struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _counted = Counted(&self.waiting);
        wait.await
    }

    pub(crate) fn snapshot(&self) -> Vec<(i64, Running)> {
        self.lock().iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Running>> {
        // A panic while holding this lock cannot leave the map inconsistent (every
        // operation is a single insert, remove or clone), so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Starts [`heartbeat`] on its own thread (see the module docs), connecting with `own`'s
/// connect options. The returned task ends when the thread does, after `stop`.
pub(crate) fn spawn_heartbeat(
    own: &PgPool,
    running: RunningSet,
    interval: Duration,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let options = (*own.connect_options()).clone();
    let (done, ended) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("jobq-heartbeat".to_owned())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    error!(error = %e, "could not start the heartbeat's runtime; leases will not be extended");
                    return;
                }
            };
            rt.block_on(async move {
                // Connections belong to the runtime that opened them, so this thread
                // opens its own: one, kept between beats.
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .min_connections(0)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .connect_lazy_with(options);
                heartbeat(pool.clone(), running, interval, stop).await;
                pool.close().await;
            });
            drop(done);
        })
        .map_err(|e| Error::Config(format!("could not start the heartbeat thread: {e}")))?;
    Ok(tokio::spawn(async move {
        let _ = ended.await;
    }))
}

/// Extends every running attempt's lease each `interval` until `stop`.
async fn heartbeat(pool: PgPool, running: RunningSet, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        beat(&pool, &running).await;
    }
}

/// One renewal of every running attempt's lease. Returns how many attempts it found had
/// lost their lease (and dropped); an attempt whose outcome was already on its way is
/// not one of them.
async fn beat(pool: &PgPool, running: &RunningSet) -> usize {
    let attempts = running.snapshot();
    if attempts.is_empty() {
        return 0;
    }
    let renewals: Vec<LeaseRenewal> = attempts
        .iter()
        .map(|(id, r)| LeaseRenewal {
            id: *id,
            fence: r.fence,
            lease_secs: r.lease.as_secs_f64(),
        })
        .collect();
    let sent = Instant::now();
    let result = async {
        let mut conn = pool.acquire().await?;
        store::lease_extend_many(&mut conn, &renewals).await
    }
    .await;
    let statuses = match result {
        Ok(s) => s,
        Err(e) => {
            // The watchdogs drop attempts whose local deadline passes meanwhile.
            warn!(error = %e, running = attempts.len(), "heartbeat failed; leases not extended");
            return 0;
        }
    };
    let mut lost = 0;
    for ((id, r), status) in attempts.iter().zip(statuses) {
        match status {
            LeaseStatus::Extended { cancel_requested } => {
                r.deadline.extend_to(sent + r.lease);
                if cancel_requested && !r.cancel.is_cancelled() {
                    debug!(job.id = id, "cancel requested by an operator");
                    r.cancel.cancel();
                }
            }
            LeaseStatus::Busy => {}
            // Completed (or handed back) between the snapshot and the renewal: under
            // load, many attempts of each beat.
            LeaseStatus::Lost if r.signals.is_raised(Signals::SETTLED) => {
                debug!(
                    job.id = id,
                    job.fence = r.fence,
                    "lease ended by the attempt's outcome"
                );
            }
            LeaseStatus::Lost => {
                warn!(
                    job.id = id,
                    job.fence = r.fence,
                    "lease lost: the job was rescued or changed elsewhere; dropping this attempt"
                );
                r.signals.raise(Signals::LOST);
                lost += 1;
            }
        }
    }
    lost
}

/// Resolves when the attempt must stop: its lease was reported lost, or its local
/// deadline passed without a renewal.
pub(crate) async fn watchdog(deadline: &Deadline, signals: &Signals) {
    loop {
        let at = deadline.get();
        tokio::select! {
            _ = signals.raised(Signals::LOST) => return,
            _ = tokio::time::sleep_until(at) => {
                if deadline.get() <= Instant::now() {
                    warn!("lease deadline passed without a successful heartbeat; dropping the attempt before another worker can claim the job");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(fence: i64) -> Running {
        Running::idle(fence)
    }

    #[tokio::test]
    async fn a_signal_wakes_only_who_waits_for_it_and_stays_raised() {
        let signals = Arc::new(Signals::default());
        let waiting = tokio::spawn({
            let signals = signals.clone();
            async move { signals.raised(Signals::INTERRUPT).await }
        });
        tokio::task::yield_now().await;
        signals.raise(Signals::SETTLED);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "woken by another signal");
        signals.raise(Signals::INTERRUPT);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("not woken by its signal")
            .unwrap();
        // Raised before anyone waits: resolves at once.
        tokio::time::timeout(Duration::from_secs(5), signals.raised(Signals::SETTLED))
            .await
            .expect("a raised signal is not seen");
        assert!(!signals.is_raised(Signals::LOST));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_sleeps_past_an_extension_and_ignores_an_earlier_deadline() {
        let start = Instant::now();
        let deadline = Arc::new(Deadline::new(start + Duration::from_secs(10)));
        tokio::spawn({
            let deadline = deadline.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                deadline.extend_to(start + Duration::from_secs(30));
                deadline.extend_to(start + Duration::from_secs(20));
            }
        });
        watchdog(&deadline, &Signals::default()).await;
        let fired = start.elapsed();
        assert!(
            fired >= Duration::from_secs(30) && fired < Duration::from_secs(31),
            "fired after {fired:?}"
        );
        // A lost lease stops it at once, whatever the deadline.
        let signals = Signals::default();
        signals.raise(Signals::LOST);
        let far = Deadline::new(Instant::now() + Duration::from_secs(3600));
        let before = Instant::now();
        watchdog(&far, &signals).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_settled_attempt_leaves_a_later_attempt_at_its_job_running() {
        // Attempt 1 lost its lease; the job was claimed again here (attempt 2) before
        // attempt 1's stale outcome was settled.
        let set = RunningSet::default();
        set.insert(7, running(2));
        set.remove(7, 1);
        assert_eq!(set.snapshot().len(), 1, "attempt 2 must keep its heartbeat");
        set.remove(7, 2);
        assert!(set.snapshot().is_empty());
    }

    #[tokio::test]
    async fn a_job_completed_during_a_beat_is_not_a_lost_lease() {
        let db = jobq_testing::TestDatabase::new().await.unwrap();
        // Attempt 1's outcome is committed: the row is `done`, the executor has not yet
        // taken the attempt out of the running set.
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobq.jobs (kind, payload, state, attempts, lease_gen, finished_at)
             VALUES ('k', '{}', 'done', 1, 1, now()) RETURNING id",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        let set = RunningSet::default();
        let r = running(1);
        r.signals.raise(Signals::SETTLED);
        set.insert(id, r.clone());
        assert_eq!(beat(db.pool(), &set).await, 0);
        assert!(!r.signals.is_raised(Signals::LOST));
        // The same row under an attempt whose outcome was never sent: that lease is lost.
        let r = running(1);
        set.insert(id, r.clone());
        assert_eq!(beat(db.pool(), &set).await, 1);
        assert!(r.signals.is_raised(Signals::LOST));
        db.close().await;
    }
}
