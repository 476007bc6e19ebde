//! jobq-testing under `#[sqlx::test]`: sqlx creates the database, `jobq::migrate` adds
//! jobq's schema, and drain and the assertions work on the pool it passes.
//!
//! `#[sqlx::test]` panics when `DATABASE_URL` is unset, so the test itself is marked
//! `#[ignore]` and run through a plain test that skips, with a note, without it.

mod common;

use common::*;
use jobq::Job;
use jobq_testing::{Drain, assert_enqueued, assert_enqueued_with, assert_not_enqueued};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
#[ignore = "needs DATABASE_URL; run through `sqlx_test_works_with_jobq_testing`"]
async fn under_sqlx_test(pool: PgPool) -> anyhow::Result<()> {
    jobq::migrate(&pool).await?;

    let mut tx = pool.begin().await?;
    SendInvoice::enqueue(&mut *tx, InvoiceArgs { invoice_id: 7 }).await?;
    assert_enqueued::<SendInvoice>(&mut *tx, |a| a.invoice_id == 7).await;
    tx.rollback().await?;
    assert_not_enqueued::<SendInvoice>(&pool).await;

    SendInvoice::enqueue(&pool, InvoiceArgs { invoice_id: 8 }).await?;
    FailsTwice::enqueue(&pool, InvoiceArgs { invoice_id: 9 }).await?;
    assert_enqueued_with::<SendInvoice>(&pool, &InvoiceArgs { invoice_id: 8 }).await;
    let drained = Drain::new(&pool)
        .register::<SendInvoice>()
        .register::<FailsTwice>()
        .advance_clock(true)
        .run()
        .await?;
    assert_eq!(
        (drained.done(), drained.retried(), drained.failed()),
        (2, 2, 0)
    );
    Ok(())
}

#[test]
fn sqlx_test_works_with_jobq_testing() -> anyhow::Result<()> {
    if std::env::var_os("DATABASE_URL").is_none() {
        eprintln!(
            "skipped: #[sqlx::test] needs DATABASE_URL (e.g. DATABASE_URL={})",
            jobq_testing::DEFAULT_DATABASE_URL
        );
        return Ok(());
    }
    under_sqlx_test()
}
