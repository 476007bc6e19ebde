//! Every form of the `retry` grammar, and every duration unit.
use std::time::Duration;

use jobq::{Job, JobContext, JobError, RetryPolicy};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job(retry = "exp(max=10,jitter)")]
async fn exp_jitter(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(retry = "exp( max = 5, base = 500ms, cap = 1h )")]
async fn exp_full(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(retry = "exp(max=3,cap=5m,base=2s,jitter)")]
async fn exp_any_order(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(retry = "fixed(30s)")]
async fn fixed(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(retry = "fixed(5m,max=4)")]
async fn fixed_max(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(retry = "none")]
async fn once(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

// The policy is a constant expression.
const _: RetryPolicy = ExpJitter::RETRY;

fn main() {
    assert_eq!(ExpJitter::RETRY, RetryPolicy::exponential(10).jitter(true));
    assert_eq!(
        ExpFull::RETRY,
        RetryPolicy::exponential(5)
            .base(Duration::from_millis(500))
            .cap(Duration::from_secs(3600))
    );
    assert_eq!(
        ExpAnyOrder::RETRY,
        RetryPolicy::exponential(3)
            .base(Duration::from_secs(2))
            .cap(Duration::from_secs(300))
            .jitter(true)
    );
    assert_eq!(Fixed::RETRY, RetryPolicy::fixed(Duration::from_secs(30)));
    assert_eq!(
        FixedMax::RETRY,
        RetryPolicy::fixed(Duration::from_secs(300)).max(4)
    );
    assert_eq!(Once::RETRY, RetryPolicy::none());
    assert_eq!(Once::RETRY.max_attempts(), 1);
}
