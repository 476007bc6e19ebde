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

use std::time::Duration;

use tokio_util::sync::CancellationToken;

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
