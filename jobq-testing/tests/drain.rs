//! Database mode: `Drain` over an isolated `TestDatabase`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is how a test reports failure

mod common;

use std::time::Duration;

use common::*;
use jobq::{AttemptOutcome, Job};
use jobq_testing::{Drain, Error, TestDatabase, enqueued};

fn invoice(id: i64) -> InvoiceArgs {
    InvoiceArgs { invoice_id: id }
}

#[tokio::test]
async fn drain_runs_every_due_job_and_counts_what_happened() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    SendInvoice::enqueue_many(pool, [invoice(1), invoice(2)]).await?;
    Reject::enqueue(pool, invoice(3)).await?;
    RateLimited::enqueue(pool, ()).await?;

    let drained = db
        .drain()
        .register::<SendInvoice>()
        .register::<Reject>()
        .register::<RateLimited>()
        .run()
        .await?;
    assert_eq!(drained.done(), 2);
    assert_eq!(drained.failed(), 1);
    assert_eq!(drained.retried(), 1, "the retry waits for its Retry-After");
    assert_eq!(drained.jobs().len(), 4);

    // The retry is scheduled 90 s after the drain's clock.
    let [limited] = enqueued::<RateLimited>(pool).await?.try_into().unwrap();
    assert_eq!(limited.state, "scheduled");
    assert_eq!(limited.attempts, 1);
    assert_eq!(limited.last_error_code.as_deref(), Some("rate_limited"));
    assert_eq!(
        limited.run_after - drained.clock,
        chrono::Duration::seconds(90)
    );

    // Nothing is due any more: a second drain does nothing.
    let again = db.drain().register::<RateLimited>().run().await?;
    assert!(again.is_empty());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_job_that_fails_twice_then_succeeds_finishes_when_the_clock_moves() -> anyhow::Result<()>
{
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let id = FailsTwice::enqueue(pool, invoice(5)).await?.id;

    let started = std::time::Instant::now();
    let drained = db
        .drain()
        .register::<FailsTwice>()
        .advance_clock(true)
        .run()
        .await?;
    assert!(started.elapsed() < Duration::from_secs(5), "drain slept");

    assert_eq!(
        (drained.retried(), drained.done(), drained.failed()),
        (2, 1, 0)
    );
    let attempts = drained.attempts_of(id);
    let numbers: Vec<u32> = attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2, 3]);
    assert!(
        matches!(&attempts[0].outcome, AttemptOutcome::Failed(f) if f.class.code == "smtp_down")
    );
    assert_eq!(attempts[2].outcome, AttemptOutcome::Done);
    assert_eq!(drained.final_states(), [(id, Some("done"))]);
    assert_eq!(drained.rounds, 3);

    // The clock moved past both backoffs (60 s and 120 s, jittered into their upper half).
    let [job] = enqueued::<FailsTwice>(pool).await?.try_into().unwrap();
    assert_eq!((job.state.as_str(), job.attempts), ("done", 3));
    let moved = drained.clock - job.created_at;
    assert!(
        moved >= chrono::Duration::seconds(90),
        "clock moved only {moved}"
    );
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn an_advancing_drain_leaves_every_job_terminal() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    Explodes::enqueue(pool, invoice(1)).await?; // panics twice: exhausted
    Flaky::enqueue(pool, ()).await?; // four attempts, all failing
    SendInvoice::with(invoice(2))
        .run_in(Duration::from_secs(3600))
        .queue("later")
        .enqueue(pool)
        .await?;

    let drained = db
        .drain()
        .register::<Explodes>()
        .register::<Flaky>()
        .register::<SendInvoice>()
        .advance_clock(true)
        .run()
        .await?;
    assert_eq!(drained.failed(), 2);
    assert_eq!(
        drained.done(),
        1,
        "the scheduled job in another queue ran too"
    );
    assert_eq!(drained.retried(), 1 + 3);
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE state NOT IN ('done', 'failed', 'cancelled')",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(pending, 0);
    let [exploded] = enqueued::<Explodes>(pool).await?.try_into().unwrap();
    assert_eq!(exploded.last_error_code.as_deref(), Some("panic"));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_drain_without_clock_movement_leaves_scheduled_jobs_alone() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    SendInvoice::with(invoice(1))
        .run_in(Duration::from_secs(600))
        .enqueue(pool)
        .await?;
    let drained = db.drain().register::<SendInvoice>().run().await?;
    assert!(drained.is_empty());
    // Told to look from a later time, it runs it.
    let later = chrono::Utc::now() + chrono::Duration::seconds(601);
    let drained = db.drain().register::<SendInvoice>().at(later).run().await?;
    assert_eq!(drained.done(), 1);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn drain_serves_only_the_registered_kinds_and_chosen_queues() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    SendInvoice::enqueue(pool, invoice(1)).await?;
    SendInvoice::with(invoice(2))
        .queue("other")
        .enqueue(pool)
        .await?;
    Reject::enqueue(pool, invoice(3)).await?;

    let drained = db
        .drain()
        .register::<SendInvoice>()
        .queue("default")
        .run()
        .await?;
    assert_eq!(drained.done(), 1);
    let states: Vec<(i64, jobq::JobState)> = enqueued::<SendInvoice>(pool)
        .await?
        .into_iter()
        .map(|j| (j.args.invoice_id, j.state))
        .collect();
    assert_eq!(
        states,
        [(1, jobq::JobState::Done), (2, jobq::JobState::Pending)]
    );
    assert_eq!(
        enqueued::<Reject>(pool).await?[0].state,
        "pending",
        "unserved kind untouched"
    );
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_drain_that_cannot_finish_says_so() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let id = FailsTwice::enqueue(db.pool(), invoice(1)).await?.id;
    let err = db
        .drain()
        .register::<FailsTwice>()
        .advance_clock(true)
        .max_rounds(1)
        .run()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DrainLimit { rounds: 1, .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("#{id} test_fails_twice")), "{text}");
    assert!(!text.contains('\n'));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_drain_with_no_job_types_is_a_configuration_error() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let err = Drain::new(db.pool())
        .auto_register(false)
        .run()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Jobq(jobq::Error::Config(_))), "{err}");
    db.close().await;
    Ok(())
}
