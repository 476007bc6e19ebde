//! Maintenance services. Each has one shape: a config with defaults, a `run_once()` that
//! does one pass and returns what it did (testable without timers), and a loop around it
//! with an interval, jitter and cancellation — and, where only one node may act, a
//! [`Leader`] gate.

mod leader;
mod promoter;
mod pruner;
mod reaper;
mod scheduler;
mod sweeper;
mod workers;

pub use crate::store::ReapReport;
pub use leader::Leader;
pub(crate) use promoter::promote_all;
pub use promoter::{PromoteReport, Promoter, PromoterConfig};
pub use pruner::{PRUNER_LOCK, PruneReport, Pruner, PrunerConfig, Retention};
pub use reaper::{Reaper, ReaperConfig};
pub(crate) use scheduler::Periodic;
pub use scheduler::{Missed, Schedule, Scheduler, SchedulerConfig, SchedulerReport};
pub use sweeper::{SweepReport, Sweeper, SweeperConfig};
#[allow(deprecated)]
pub use workers::{WorkerHeartbeat, WorkerHeartbeatConfig};
pub use workers::{WorkerPresence, WorkerPresenceConfig};

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Spaces a statement that has grown slow: after a run that took `t` (longer than
/// [`Pace::FREE`]), the next is due `RATIO × t` after the run started (at most
/// [`Pace::CAP`] later), so that it takes at most a twentieth of its connection's time.
///
/// What grows slow is a scan whose index holds entries nothing may remove: while a
/// snapshot is held open (a forgotten transaction, a stuck replication slot), every row
/// a claim, a completion or the pruner moves leaves an entry that each later scan of the
/// index walks past, so a statement that took a millisecond takes a second after a few
/// minutes, and run every second it takes a core the workers need.
#[derive(Debug, Default)]
pub(crate) struct Pace(Mutex<Option<Instant>>);

impl Pace {
    /// A run shorter than this does not space the next.
    pub(crate) const FREE: Duration = Duration::from_millis(5);
    /// After a longer run, the next waits this many times as long...
    pub(crate) const RATIO: u32 = 20;
    /// ...but never longer than this.
    pub(crate) const CAP: Duration = Duration::from_secs(60);

    /// Whether a run may start at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.0
            .lock()
            .map_or(true, |next| next.is_none_or(|next| now >= next))
    }

    /// How long from `now` until a run is due: zero when it is due already (as
    /// [`Pace::due`] says).
    pub(crate) fn due_in(&self, now: Instant) -> Duration {
        self.0.lock().map_or(Duration::ZERO, |next| {
            next.map_or(Duration::ZERO, |next| next.saturating_duration_since(now))
        })
    }

    /// Records a run that started at `started` and took `took`.
    pub(crate) fn ran(&self, started: Instant, took: Duration) {
        let next = (took >= Self::FREE).then(|| started + (took * Self::RATIO).min(Self::CAP));
        if let Ok(mut n) = self.0.lock() {
            *n = next;
        }
    }
}

/// Where a read that walks an index in order starts: from the oldest ("full"), or, once
/// a full read has grown slow ([`Pace`]), from the position the reads before it reached,
/// until a full read is due again.
///
/// While a snapshot is held open, the index entries of the rows earlier reads passed
/// (deleted, published) stay, and every read from the oldest walks all of them; a read
/// from the position does not. A row that appears behind the position (skipped as
/// locked, or in a transaction that committed late) waits for the next full read. The
/// claims' own `runtime::producer::Cursor` follows the same rule per served kind.
#[derive(Debug, Default)]
pub(crate) struct Resume<T> {
    at: Mutex<Option<T>>,
    full: Pace,
}

impl<T: Copy> Resume<T> {
    /// Where a read starting `now` starts: `None` for a full read, else the position
    /// (itself `None` while no read has reached one).
    pub(crate) fn start(&self, now: Instant) -> Option<Option<T>> {
        if self.full.due(now) {
            return None;
        }
        Some(*self.at.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Records a full read that started at `started` and took `took`.
    pub(crate) fn ran_full(&self, started: Instant, took: Duration) {
        self.full.ran(started, took);
    }

    /// Moves the position to `at`, when a read reached one.
    pub(crate) fn reached(&self, at: Option<T>) {
        if at.is_some() {
            *self.at.lock().unwrap_or_else(|p| p.into_inner()) = at;
        }
    }
}

/// Runs `pass` unless `pace` says it is not due yet (`None`: always), and records its
/// run on the pace. `None` when it did not run.
pub(crate) async fn paced<T>(
    pace: Option<&Pace>,
    pass: impl std::future::Future<Output = T>,
) -> Option<T> {
    let started = Instant::now();
    if !pace.is_none_or(|p| p.due(started)) {
        return None;
    }
    let out = pass.await;
    if let Some(p) = pace {
        p.ran(started, started.elapsed());
    }
    Some(out)
}

/// The loop every service shares: `pass`, then a wait of `interval` spread by ±10 %,
/// until `stop` is cancelled (checked between passes, never during one).
pub(crate) async fn every<F, Fut>(interval: Duration, stop: CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        pass().await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jittered(interval)) => {}
        }
    }
}

/// `interval` spread by ±10 %, so services on many nodes do not beat in step.
pub(crate) fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + rand::random::<f64>() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_pass_spaces_out_the_next_and_a_fast_one_does_not() {
        let slow = || tokio::time::sleep(Duration::from_millis(100));
        let pace = Pace::default();
        assert_eq!(paced(Some(&pace), slow()).await, Some(()));
        // 100 ms: the next is due 2 s after it started.
        assert_eq!(paced(Some(&pace), async {}).await, None);
        assert!(pace.due_in(Instant::now()) > Duration::from_millis(1500));

        let pace = Pace::default();
        assert_eq!(paced(Some(&pace), async { 1 }).await, Some(1));
        assert_eq!(paced(Some(&pace), async { 2 }).await, Some(2));
        // Without a pace, always.
        assert_eq!(paced(None, slow()).await, Some(()));
        assert_eq!(paced(None, slow()).await, Some(()));
    }
}
