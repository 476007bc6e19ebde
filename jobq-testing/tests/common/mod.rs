//! Jobs implemented by hand (as `#[jobq::job]` would generate them), shared by the tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Duration;

use jobq::{Job, JobContext, JobError, RetryPolicy};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvoiceArgs {
    pub invoice_id: i64,
}

/// Succeeds.
pub struct SendInvoice;

impl Job for SendInvoice {
    const KIND: &'static str = "test_send_invoice";
    type Args = InvoiceArgs;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
        Ok(())
    }
}

/// Fails permanently.
pub struct Reject;

impl Job for Reject {
    const KIND: &'static str = "test_reject";
    type Args = InvoiceArgs;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: InvoiceArgs) -> Result<(), JobError> {
        Err(JobError::permanent(
            "invoice_missing",
            format!("invoice {} does not exist", args.invoice_id),
        ))
    }
}

/// A retryable failure carrying a Retry-After of 90 s.
pub struct RateLimited;

impl Job for RateLimited {
    const KIND: &'static str = "test_rate_limited";
    const RETRY: RetryPolicy = RetryPolicy::exponential(5);
    type Args = ();
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Err(
            JobError::retryable("rate_limited", "429 from the mail provider")
                .retry_after(Duration::from_secs(90)),
        )
    }
}

/// A retryable failure without Retry-After, under an exponential policy without jitter
/// (base 1 s): the delay after attempt n is 2^(n-1) s.
pub struct Flaky;

impl Job for Flaky {
    const KIND: &'static str = "test_flaky";
    const RETRY: RetryPolicy = RetryPolicy::exponential(4);
    type Args = ();
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Err(JobError::retryable("upstream_down", "503"))
    }
}

/// Panics.
pub struct Explodes;

impl Job for Explodes {
    const KIND: &'static str = "test_explodes";
    const RETRY: RetryPolicy = RetryPolicy::exponential(2);
    type Args = InvoiceArgs;
    type Error = JobError;
    async fn run(_ctx: JobContext, args: InvoiceArgs) -> Result<(), JobError> {
        panic!("invoice {} exploded", args.invoice_id)
    }
}

/// Sleeps past its 50 ms timeout.
pub struct Slow;

impl Job for Slow {
    const KIND: &'static str = "test_slow";
    const TIMEOUT: Option<Duration> = Some(Duration::from_millis(50));
    type Args = ();
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }
}

/// Cancels itself.
pub struct GivesUp;

impl Job for GivesUp {
    const KIND: &'static str = "test_gives_up";
    type Args = ();
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Err(JobError::cancel("customer closed the account"))
    }
}

/// Fails its first two attempts (retryable, with the default jittered backoff), then
/// succeeds.
pub struct FailsTwice;

impl Job for FailsTwice {
    const KIND: &'static str = "test_fails_twice";
    const RETRY: RetryPolicy = RetryPolicy::exponential(5)
        .base(Duration::from_secs(60))
        .jitter(true);
    type Args = InvoiceArgs;
    type Error = JobError;
    async fn run(ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
        if ctx.attempt() <= 2 {
            return Err(JobError::retryable(
                "smtp_down",
                format!("attempt {} failed", ctx.attempt()),
            ));
        }
        Ok(())
    }
}

/// Reports its context in a permanent error's message: `id kind queue attempt/max`.
pub struct EchoContext;

impl Job for EchoContext {
    const KIND: &'static str = "test_echo_context";
    const QUEUE: &'static str = "echo";
    type Args = ();
    type Error = JobError;
    async fn run(ctx: JobContext, _args: ()) -> Result<(), JobError> {
        Err(JobError::permanent(
            "echo",
            format!(
                "{} {} {} {}/{}",
                ctx.id(),
                ctx.kind(),
                ctx.queue(),
                ctx.attempt(),
                ctx.max_attempts()
            ),
        ))
    }
}

/// Args with a float: NaN serializes to `null`, which does not decode as `f64`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RatioArgs {
    pub ratio: f64,
}

pub struct Ratio;

impl Job for Ratio {
    const KIND: &'static str = "test_ratio";
    type Args = RatioArgs;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: RatioArgs) -> Result<(), JobError> {
        Ok(())
    }
}

/// Args keyed by tuples: JSON objects need string keys, so they do not serialize.
pub struct Grid;

impl Job for Grid {
    const KIND: &'static str = "test_grid";
    type Args = BTreeMap<(i32, i32), i32>;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: BTreeMap<(i32, i32), i32>) -> Result<(), JobError> {
        Ok(())
    }
}

/// Text args, for NUL characters (which `jsonb` refuses).
pub struct Note;

impl Job for Note {
    const KIND: &'static str = "test_note";
    type Args = String;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: String) -> Result<(), JobError> {
        Ok(())
    }
}
