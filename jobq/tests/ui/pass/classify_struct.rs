//! `#[derive(Classify)]` on structs: the attribute sits on the type.
use std::time::Duration;

use jobq::{Classify, Disposition};

#[derive(Debug, thiserror::Error, jobq::Classify)]
#[error("rate limited")]
#[jobq(code = "rate_limited", retry_after = wait)]
pub struct RateLimited {
    pub wait: Duration,
}

#[derive(Debug, thiserror::Error, jobq::Classify)]
#[error("not found")]
#[jobq(permanent)]
pub struct NotFound(pub i64);

#[derive(Debug, thiserror::Error, jobq::Classify)]
#[error("flaky")]
pub struct FlakyUpstream;

#[derive(Debug, thiserror::Error, jobq::Classify)]
#[error("later")]
#[jobq(retry_after = 0)]
pub struct Later(pub Duration);

fn main() {
    let c = RateLimited { wait: Duration::from_secs(9) }.classify();
    assert_eq!(c.disposition, Disposition::Retryable);
    assert_eq!(c.code, "rate_limited");
    assert_eq!(c.retry_after, Some(Duration::from_secs(9)));
    let c = NotFound(1).classify();
    assert_eq!((c.disposition, c.code.as_ref()), (Disposition::Permanent, "not_found"));
    let c = FlakyUpstream.classify();
    assert_eq!((c.disposition, c.code.as_ref()), (Disposition::Retryable, "flaky_upstream"));
    assert_eq!(Later(Duration::from_millis(5)).classify().retry_after, Some(Duration::from_millis(5)));
}
