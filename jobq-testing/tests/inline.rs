//! Inline mode: one attempt through `jobq::run_attempt`, no database.

mod common;

use std::time::{Duration, Instant};

use common::*;
use jobq::JobId;
use jobq_testing::{Outcome, Perform, perform};

fn invoice(id: i64) -> InvoiceArgs {
    InvoiceArgs { invoice_id: id }
}

#[tokio::test]
async fn a_successful_handler_is_done() {
    let outcome = perform::<SendInvoice>(invoice(42)).await;
    assert_eq!(outcome, Outcome::Done);
    outcome.assert_done();
}

#[tokio::test]
async fn a_permanent_failure_keeps_its_code_and_message() {
    let outcome = perform::<Reject>(invoice(7)).await;
    assert_eq!(
        outcome,
        Outcome::Failed {
            code: "invoice_missing".into(),
            message: "invoice 7 does not exist".into(),
            exhausted: false,
        }
    );
    assert_eq!(
        outcome.assert_permanent("invoice_missing"),
        "invoice 7 does not exist"
    );
    assert_eq!(
        outcome.assert_failed("invoice_missing"),
        "invoice 7 does not exist"
    );
}

#[tokio::test]
async fn a_retry_after_sets_the_delay() {
    let outcome = perform::<RateLimited>(()).await;
    assert_eq!(
        outcome.assert_retry("rate_limited"),
        Duration::from_secs(90)
    );
    // Whatever the attempt, the Retry-After wins over the policy.
    let later = Perform::<RateLimited>::new(()).attempt(4).run().await;
    assert_eq!(later.delay(), Some(Duration::from_secs(90)));
}

#[tokio::test]
async fn without_retry_after_the_policy_gives_the_delay_for_the_attempt() {
    for (attempt, secs) in [(1, 1), (2, 2), (3, 4)] {
        let outcome = Perform::<Flaky>::new(()).attempt(attempt).run().await;
        assert_eq!(
            outcome.assert_retry("upstream_down"),
            Duration::from_secs(secs),
            "attempt {attempt}"
        );
    }
}

#[tokio::test]
async fn a_retryable_failure_on_the_last_attempt_is_terminal() {
    // Flaky allows 4 attempts.
    let outcome = Perform::<Flaky>::new(()).attempt(4).run().await;
    assert!(
        matches!(&outcome, Outcome::Failed { code, exhausted: true, .. } if code == "upstream_down"),
        "{outcome:?}"
    );
    outcome.assert_failed("upstream_down");
    // An enqueue's max_attempts override counts too.
    let outcome = Perform::<Flaky>::new(())
        .attempt(2)
        .max_attempts(2)
        .run()
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Failed {
                exhausted: true,
                ..
            }
        ),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_panicking_handler_is_caught_and_retried_with_code_panic() {
    let outcome = perform::<Explodes>(invoice(9)).await;
    let message = outcome.assert_panicked();
    assert!(message.contains("invoice 9 exploded"), "{message}");
    outcome.assert_retry("panic");
    // Explodes allows two attempts: the second panic is final.
    let last = Perform::<Explodes>::new(invoice(9)).attempt(2).run().await;
    last.assert_failed("panic");
}

#[tokio::test]
async fn an_attempt_past_its_timeout_is_cancelled_and_retried_with_code_timeout() {
    let started = Instant::now();
    let outcome = perform::<Slow>(()).await;
    outcome.assert_timed_out();
    outcome.assert_retry("timeout");
    assert!(
        outcome.message().unwrap_or_default().contains("50ms"),
        "{outcome}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the handler's sleep was not cut short"
    );
}

#[tokio::test]
async fn a_handler_may_cancel_its_job() {
    let outcome = perform::<GivesUp>(()).await;
    outcome.assert_cancelled();
    assert_eq!(outcome.message(), Some("customer closed the account"));
}

#[tokio::test]
async fn context_values_can_be_set() {
    let outcome = perform::<EchoContext>(()).await;
    assert_eq!(
        outcome.assert_permanent("echo"),
        "0 test_echo_context echo 1/25",
        "defaults: id 0, the job's queue, attempt 1 of the policy's max"
    );
    let outcome = Perform::<EchoContext>::new(())
        .id(JobId(77))
        .queue("urgent")
        .attempt(3)
        .max_attempts(5)
        .run()
        .await;
    assert_eq!(
        outcome.assert_permanent("echo"),
        "77 test_echo_context urgent 3/5"
    );
}

#[tokio::test]
async fn args_that_do_not_survive_json_fail_like_the_queue_would() {
    // NaN serializes to null, which the runtime cannot decode: a permanent `decode` failure.
    let outcome = perform::<Ratio>(RatioArgs { ratio: f64::NAN }).await;
    let message = outcome.assert_permanent("decode");
    assert!(message.contains("test_ratio"), "{message}");
    perform::<Ratio>(RatioArgs { ratio: 0.5 })
        .await
        .assert_done();

    // Tuple keys do not serialize at all: enqueue would refuse them.
    let grid = [((1, 2), 3)].into_iter().collect();
    let outcome = perform::<Grid>(grid).await;
    assert!(
        outcome
            .assert_rejected("serialize")
            .contains("key must be a string"),
        "{outcome}"
    );

    // PostgreSQL's jsonb refuses NUL characters.
    perform::<Note>("a\0b".into())
        .await
        .assert_rejected("nul_in_payload");

    // And the size limit applies.
    let big = "x".repeat(jobq::MAX_PAYLOAD_BYTES + 1);
    perform::<Note>(big)
        .await
        .assert_rejected("payload_too_large");
}

#[tokio::test]
#[should_panic(
    expected = "expected the job to be done, but it ended: failed `invoice_missing` (permanent): invoice 1 does not exist"
)]
async fn assertion_helpers_say_what_happened_instead() {
    perform::<Reject>(invoice(1)).await.assert_done();
}

/// Reads its greeting from application state.
struct Greets;

#[derive(Debug)]
struct Greeting(&'static str);

impl jobq::Job for Greets {
    const KIND: &'static str = "greets";
    type Args = String;
    type Error = jobq::JobError;
    async fn run(ctx: jobq::JobContext, name: String) -> Result<(), jobq::JobError> {
        let greeting = ctx
            .state::<Greeting>()
            .ok_or_else(|| jobq::JobError::permanent("no_state", "no greeting configured"))?;
        if greeting.0 == "hello" && name == "world" {
            Ok(())
        } else {
            Err(jobq::JobError::permanent(
                "wrong",
                format!("{} {name}", greeting.0),
            ))
        }
    }
}

#[tokio::test]
async fn application_state_reaches_the_handler() {
    Perform::<Greets>::new("world".into())
        .state(Greeting("hello"))
        .run()
        .await
        .assert_done();
    perform::<Greets>("world".into())
        .await
        .assert_permanent("no_state");
}
