//! Retry policies: how many attempts a job gets and how long it waits between them.
//!
//! Pure functions, no I/O. [`next_state`] decides what a failed attempt leads to, for the
//! runtime's executor and for `jobq-testing` alike; the runtime stores a retry's
//! `run_after = now() + delay` using the database's clock. A Retry-After carried by the
//! error replaces the policy's delay.

use std::time::Duration;

use crate::error::{Classification, Disposition};

/// Attempts a job gets when its policy does not say (Sidekiq's and River's default).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// How a job is retried after a retryable failure.
///
/// `max_attempts` counts every attempt, the first included: `exp(max=3)` runs a job at
/// most three times.
///
/// ```
/// use jobq::RetryPolicy;
/// use std::time::Duration;
///
/// const POLICY: RetryPolicy = RetryPolicy::exponential(10)
///     .base(Duration::from_secs(2))
///     .cap(Duration::from_secs(600))
///     .jitter(true);
/// assert_eq!(POLICY.max_attempts(), 10);
/// // After the third failed attempt: 2s * 2^2 = 8s, jittered into [4s, 8s].
/// let (lo, hi) = POLICY.delay_bounds(3);
/// assert_eq!((lo, hi), (Duration::from_secs(4), Duration::from_secs(8)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryPolicy {
    /// `base * 2^(attempt-1)`, never above `cap`; with `jitter`, a uniform draw from the
    /// upper half of that delay ("equal jitter"), so retries of many jobs spread out.
    Exponential {
        /// Attempts in all, the first included.
        max_attempts: u32,
        /// The delay after the first failure.
        base: Duration,
        /// No delay exceeds this.
        cap: Duration,
        /// Spread delays over `[delay/2, delay]`.
        jitter: bool,
    },
    /// The same delay after every failure.
    Fixed {
        /// The delay.
        delay: Duration,
        /// Attempts in all, the first included.
        max_attempts: u32,
    },
    /// One attempt; any failure is final.
    None,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::exponential(DEFAULT_MAX_ATTEMPTS).jitter(true)
    }
}

impl RetryPolicy {
    /// Exponential backoff with `max_attempts` attempts, base 1 s, cap 1 h, no jitter.
    pub const fn exponential(max_attempts: u32) -> Self {
        RetryPolicy::Exponential {
            max_attempts,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
            jitter: false,
        }
    }

    /// A fixed `delay` between attempts, with [`DEFAULT_MAX_ATTEMPTS`] attempts.
    pub const fn fixed(delay: Duration) -> Self {
        RetryPolicy::Fixed {
            delay,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// No retries.
    pub const fn none() -> Self {
        RetryPolicy::None
    }

    /// Sets the first delay of an exponential policy (no effect on others).
    #[must_use]
    pub const fn base(self, base: Duration) -> Self {
        match self {
            RetryPolicy::Exponential {
                max_attempts,
                cap,
                jitter,
                ..
            } => RetryPolicy::Exponential {
                max_attempts,
                base,
                cap,
                jitter,
            },
            other => other,
        }
    }

    /// Sets the largest delay of an exponential policy (no effect on others).
    #[must_use]
    pub const fn cap(self, cap: Duration) -> Self {
        match self {
            RetryPolicy::Exponential {
                max_attempts,
                base,
                jitter,
                ..
            } => RetryPolicy::Exponential {
                max_attempts,
                base,
                cap,
                jitter,
            },
            other => other,
        }
    }

    /// Turns jitter on or off for an exponential policy (no effect on others).
    #[must_use]
    pub const fn jitter(self, jitter: bool) -> Self {
        match self {
            RetryPolicy::Exponential {
                max_attempts,
                base,
                cap,
                ..
            } => RetryPolicy::Exponential {
                max_attempts,
                base,
                cap,
                jitter,
            },
            other => other,
        }
    }

    /// Sets the number of attempts (no effect on [`RetryPolicy::None`], which has one).
    #[must_use]
    pub const fn max(self, max_attempts: u32) -> Self {
        match self {
            RetryPolicy::Exponential {
                base, cap, jitter, ..
            } => RetryPolicy::Exponential {
                max_attempts,
                base,
                cap,
                jitter,
            },
            RetryPolicy::Fixed { delay, .. } => RetryPolicy::Fixed {
                delay,
                max_attempts,
            },
            RetryPolicy::None => RetryPolicy::None,
        }
    }

    /// Attempts in all, the first included (at least 1).
    pub const fn max_attempts(&self) -> u32 {
        let n = match self {
            RetryPolicy::Exponential { max_attempts, .. } => *max_attempts,
            RetryPolicy::Fixed { max_attempts, .. } => *max_attempts,
            RetryPolicy::None => 1,
        };
        if n == 0 { 1 } else { n }
    }

    /// The smallest and largest delay after failed attempt number `attempt` (1-based).
    pub fn delay_bounds(&self, attempt: u32) -> (Duration, Duration) {
        match *self {
            RetryPolicy::Exponential {
                base, cap, jitter, ..
            } => {
                let exp = attempt.saturating_sub(1).min(63);
                let factor = 1u64.checked_shl(exp).unwrap_or(u64::MAX);
                let full = u32::try_from(factor)
                    .ok()
                    .and_then(|f| base.checked_mul(f))
                    .unwrap_or(cap)
                    .min(cap);
                if jitter {
                    (full / 2, full)
                } else {
                    (full, full)
                }
            }
            RetryPolicy::Fixed { delay, .. } => (delay, delay),
            RetryPolicy::None => (Duration::ZERO, Duration::ZERO),
        }
    }

    /// The delay after failed attempt `attempt`, given a uniform draw `unit` in `[0, 1)`.
    /// Deterministic: the runtime passes a random draw, tests pass their own.
    pub fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let (lo, hi) = self.delay_bounds(attempt);
        if lo == hi {
            return lo;
        }
        let unit = unit.clamp(0.0, 1.0);
        lo + (hi - lo).mul_f64(unit)
    }

    /// The delay after failed attempt `attempt`, with a fresh random draw for jitter.
    pub fn next_delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }
}

/// What a failed attempt leads to, as [`next_state`] decides it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextState {
    /// Retryable with attempts left: the job runs again after `delay`.
    Retry {
        /// The error's Retry-After if it carries one, else the policy's backoff.
        delay: Duration,
    },
    /// A terminal failure: `exhausted` when it was retryable but this was the last
    /// allowed attempt, `false` for a permanent one.
    Failed {
        /// Retryable, but out of attempts.
        exhausted: bool,
    },
    /// The job cancelled itself.
    Cancelled,
}

/// The next state of a job whose attempt `attempt` (1-based) of `max_attempts` failed
/// with `class`, under `policy`; `unit` is the jitter's uniform draw in `[0, 1)`.
///
/// The store still applies what only the database knows at write time: an operator's
/// cancel request and the job's maximum age.
#[doc(hidden)]
pub fn next_state(
    attempt: u32,
    max_attempts: u32,
    class: &Classification,
    policy: &RetryPolicy,
    unit: f64,
) -> NextState {
    match class.disposition {
        Disposition::Cancel => NextState::Cancelled,
        Disposition::Permanent => NextState::Failed { exhausted: false },
        Disposition::Retryable if attempt >= max_attempts.max(1) => {
            NextState::Failed { exhausted: true }
        }
        Disposition::Retryable => NextState::Retry {
            delay: class
                .retry_after
                .unwrap_or_else(|| policy.delay_with(attempt, unit)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_grows_and_caps() {
        let p = RetryPolicy::exponential(10)
            .base(Duration::from_secs(1))
            .cap(Duration::from_secs(10));
        let delays: Vec<u64> = (1..=6).map(|a| p.next_delay(a).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(p.next_delay(1000), Duration::from_secs(10));
        assert_eq!(p.max_attempts(), 10);
    }

    #[test]
    fn jitter_stays_within_upper_half() {
        let p = RetryPolicy::exponential(5).jitter(true);
        for attempt in 1..=5 {
            let full = Duration::from_secs(1 << (attempt - 1));
            for _ in 0..200 {
                let d = p.next_delay(attempt);
                assert!(d >= full / 2 && d <= full, "{d:?} for attempt {attempt}");
            }
        }
        assert_eq!(p.delay_with(3, 0.0), Duration::from_secs(2));
        assert_eq!(p.delay_with(3, 1.0), Duration::from_secs(4));
    }

    #[test]
    fn fixed_and_none() {
        let p = RetryPolicy::fixed(Duration::from_secs(30)).max(3);
        assert_eq!(p.next_delay(1), Duration::from_secs(30));
        assert_eq!(p.next_delay(7), Duration::from_secs(30));
        assert_eq!(p.max_attempts(), 3);
        assert_eq!(RetryPolicy::none().max_attempts(), 1);
        assert_eq!(RetryPolicy::exponential(0).max_attempts(), 1);
    }

    #[test]
    fn next_state_follows_the_disposition_and_the_attempts_left() {
        let p = RetryPolicy::exponential(3);
        let retry = Classification::retryable("flaky");
        assert_eq!(
            next_state(1, 3, &retry, &p, 0.0),
            NextState::Retry {
                delay: Duration::from_secs(1)
            }
        );
        assert_eq!(
            next_state(2, 3, &retry, &p, 0.0),
            NextState::Retry {
                delay: Duration::from_secs(2)
            }
        );
        assert_eq!(
            next_state(3, 3, &retry, &p, 0.0),
            NextState::Failed { exhausted: true }
        );
        // An attempt past the budget (a lowered max_attempts) is exhausted too.
        assert_eq!(
            next_state(5, 3, &retry, &p, 0.0),
            NextState::Failed { exhausted: true }
        );
        let mut after = Classification::retryable("rate_limited");
        after.retry_after = Some(Duration::from_secs(42));
        assert_eq!(
            next_state(1, 3, &after, &p, 0.0),
            NextState::Retry {
                delay: Duration::from_secs(42)
            }
        );
        assert_eq!(
            next_state(1, 3, &Classification::permanent("bad"), &p, 0.0),
            NextState::Failed { exhausted: false }
        );
        assert_eq!(
            next_state(3, 3, &Classification::cancel("gone"), &p, 0.0),
            NextState::Cancelled
        );
        // One attempt in all: the first failure is final.
        assert_eq!(
            next_state(1, 1, &retry, &RetryPolicy::none(), 0.0),
            NextState::Failed { exhausted: true }
        );
    }
}
