//! Assertions on what was enqueued, inside and outside the caller's transaction.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is how a test reports failure

mod common;

use std::any::Any;
use std::time::Duration;

use common::*;
use jobq::Job;
use jobq_testing::{
    TestDatabase, assert_enqueued, assert_enqueued_with, assert_not_enqueued,
    assert_not_enqueued_where, enqueued,
};

fn invoice(id: i64) -> InvoiceArgs {
    InvoiceArgs { invoice_id: id }
}

fn panic_text(p: Box<dyn Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test]
async fn assertions_see_the_callers_uncommitted_transaction_and_nothing_after_rollback()
-> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();

    let mut tx = pool.begin().await?;
    SendInvoice::enqueue(&mut *tx, invoice(42)).await?;
    let job = assert_enqueued::<SendInvoice>(&mut *tx, |a| a.invoice_id == 42).await;
    assert_eq!(
        (job.queue.as_str(), job.state.as_str()),
        ("default", "pending")
    );
    assert_enqueued_with::<SendInvoice>(&mut *tx, &invoice(42)).await;
    assert_not_enqueued::<Reject>(&mut *tx).await;
    assert_not_enqueued_where::<SendInvoice>(&mut *tx, |a| a.invoice_id == 43).await;
    // `&mut tx` works as well as `&mut *tx`.
    assert_eq!(enqueued::<SendInvoice>(&mut tx).await?.len(), 1);

    // Other connections do not see it before commit.
    assert_not_enqueued::<SendInvoice>(pool).await;

    tx.rollback().await?;
    assert_not_enqueued::<SendInvoice>(pool).await;
    assert!(enqueued::<SendInvoice>(pool).await?.is_empty());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn after_commit_everyone_sees_the_job() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut tx = pool.begin().await?;
    SendInvoice::enqueue(&mut *tx, invoice(1)).await?;
    tx.commit().await?;
    assert_enqueued_with::<SendInvoice>(pool, &invoice(1)).await;
    let mut conn = pool.acquire().await?;
    assert_enqueued::<SendInvoice>(&mut *conn, |_| true).await;
    drop(conn);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn enqueued_lists_every_job_of_the_kind_with_its_options() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    SendInvoice::enqueue(pool, invoice(1)).await?;
    SendInvoice::with(invoice(2))
        .queue("bulk")
        .priority(5)
        .max_attempts(3)
        .run_in(Duration::from_secs(3600))
        .idempotency_key("invoice-2")
        .enqueue(pool)
        .await?;
    Reject::enqueue(pool, invoice(3)).await?;

    let jobs = enqueued::<SendInvoice>(pool).await?;
    assert_eq!(jobs.len(), 2, "only jobs of the kind");
    let (first, second) = (&jobs[0], &jobs[1]);
    assert_eq!(first.args, invoice(1));
    assert_eq!(first.payload, serde_json::json!({ "invoice_id": 1 }));
    assert_eq!(
        (first.queue.as_str(), first.priority, first.max_attempts),
        ("default", 0, 25)
    );
    assert_eq!(second.args, invoice(2));
    assert_eq!(
        (second.queue.as_str(), second.priority, second.max_attempts),
        ("bulk", 5, 3)
    );
    assert_eq!(second.idempotency_key.as_deref(), Some("invoice-2"));
    assert!(second.run_after - second.created_at >= chrono::Duration::seconds(3599));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn a_failing_assertion_lists_what_was_enqueued_instead() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    SendInvoice::enqueue_many(&pool, (1..=12).map(invoice)).await?;

    let p = pool.clone();
    let err = tokio::spawn(async move {
        assert_enqueued::<SendInvoice>(&p, |a| a.invoice_id == 99).await;
    })
    .await
    .unwrap_err();
    let text = panic_text(err.into_panic());
    assert!(text.contains("assertions.rs:"), "names the caller: {text}");
    assert!(
        text.contains("expected a `test_send_invoice` job matching the predicate to be enqueued, but none of the 12 visible matches"),
        "{text}"
    );
    assert!(
        text.contains(r#"queue=default priority=0 state=pending attempts=0/25"#),
        "{text}"
    );
    assert!(text.contains(r#"args={"invoice_id":1}"#), "{text}");
    assert!(
        text.contains("… and 2 more"),
        "at most ten are listed: {text}"
    );

    let p = pool.clone();
    let err = tokio::spawn(async move {
        assert_enqueued_with::<Reject>(&p, &invoice(1)).await;
    })
    .await
    .unwrap_err();
    let text = panic_text(err.into_panic());
    assert!(
        text.contains(r#"expected a `test_reject` job with args {"invoice_id":1} to be enqueued, but no `test_reject` job is visible to this connection"#),
        "{text}"
    );

    let p = pool.clone();
    let err = tokio::spawn(async move {
        assert_not_enqueued_where::<SendInvoice>(&p, |a| a.invoice_id == 3).await;
    })
    .await
    .unwrap_err();
    let text = panic_text(err.into_panic());
    assert!(
        text.contains(
            "expected no matching `test_send_invoice` job to be enqueued, but 1 is visible"
        ),
        "{text}"
    );
    assert!(text.contains(r#"args={"invoice_id":3}"#), "{text}");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn long_payloads_are_shortened_in_failure_messages() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    Note::enqueue(&pool, "y".repeat(10_000)).await?;
    let p = pool.clone();
    let err = tokio::spawn(async move { assert_not_enqueued::<Note>(&p).await })
        .await
        .unwrap_err();
    let text = panic_text(err.into_panic());
    assert!(text.len() < 1000, "{} bytes", text.len());
    assert!(text.contains("(10002 bytes)"), "{text}");
    db.close().await;
    Ok(())
}
