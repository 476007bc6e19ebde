//! Maintenance services. Each has one shape: a config with defaults, a `run_once()` that
//! does one pass and returns what it did (testable without timers), and a loop around it
//! with an interval, jitter and cancellation.

mod reaper;

pub use crate::store::ReapReport;
pub use reaper::{Reaper, ReaperConfig};

use std::time::Duration;

/// `interval` spread by ±10 %, so services on many nodes do not beat in step.
pub(crate) fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + rand::random::<f64>() * 0.2)
}
