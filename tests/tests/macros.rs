//! The issue's `#[jobq::job]` example end to end, against a real PostgreSQL: enqueue in
//! a committed and in a rolled-back transaction, every error variant landing in the right
//! state with the right `last_error_code` (a Retry-After honoured instead of the backoff),
//! and the idempotency field deduplicating.
//!
//! Nothing is registered by hand: `inventory` hands the runtime every `#[jobq::job]` of
//! this test binary (here, `send_invoice` only).
// The snippet's items are `pub` and undocumented, as the issue writes them.
#![allow(missing_docs, missing_debug_implementations)]

use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::JobContext;
use jobq_testing::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

// ---- the snippet, as written ----

#[derive(Serialize, Deserialize)]
pub struct InvoiceArgs {
    pub invoice_id: i64,
    pub email: String,
}

#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum InvoiceError {
    #[error("mail provider unavailable")]
    #[jobq(retryable, code = "provider_unavailable")]
    ProviderDown,
    #[error("rate limited")]
    #[jobq(retryable, code = "rate_limited", retry_after = wait)]
    RateLimited { wait: std::time::Duration },
    #[error("invoice {0} not found")]
    #[jobq(permanent, code = "invoice_missing")]
    Missing(i64),
    #[error(transparent)]
    Db(#[from] sqlx::Error), // unannotated: retryable, code derived from the variant
}

/// The mail "provider" is scripted by the address, so each test picks its outcome.
#[jobq::job(kind = "send_invoice", retry = "exp(max=10,jitter)", idempotency = invoice_id)]
async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
    assert_eq!(ctx.kind(), "send_invoice");
    match args.email.split('@').next().unwrap_or_default() {
        "down" => Err(InvoiceError::ProviderDown),
        "slow" => Err(InvoiceError::RateLimited {
            wait: Duration::from_secs(120),
        }),
        "missing" => Err(InvoiceError::Missing(args.invoice_id)),
        "db" => Err(sqlx::Error::PoolTimedOut)?,
        _ => Ok(()),
    }
}

// ---- helpers ----

/// The business table the snippet updates in the same transaction.
async fn invoices(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("CREATE TABLE invoices (id bigint PRIMARY KEY, status text NOT NULL)")
        .execute(pool)
        .await?;
    sqlx::query("INSERT INTO invoices VALUES (42, 'draft')")
        .execute(pool)
        .await?;
    Ok(())
}

/// The snippet's "elsewhere": mark the invoice and enqueue its job in one transaction.
async fn mark_and_enqueue(
    pool: &PgPool,
    email: &str,
    commit: bool,
) -> anyhow::Result<jobq::Enqueued> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE invoices SET status = 'sending' WHERE id = $1")
        .bind(42_i64)
        .execute(&mut *tx)
        .await?;
    let enqueued = SendInvoice::enqueue(
        &mut tx,
        InvoiceArgs {
            invoice_id: 42,
            email: email.into(),
        },
    )
    .await?;
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(enqueued)
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    kind: String,
    state: String,
    attempts: i32,
    max_attempts: i32,
    idempotency_key: Option<String>,
    last_error_code: Option<String>,
    last_error: Option<String>,
    /// `run_after - now()` in seconds.
    due_in: f64,
}

async fn job(pool: &PgPool, id: jobq::JobId) -> anyhow::Result<Row> {
    Ok(sqlx::query_as(
        "SELECT kind, state, attempts, max_attempts, idempotency_key, last_error_code,
                last_error, extract(epoch FROM run_after - now())::float8 AS due_in
         FROM jobq.jobs WHERE id = $1",
    )
    .bind(id.0)
    .fetch_one(pool)
    .await?)
}

async fn count(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
        .fetch_one(pool)
        .await?)
}

/// Enqueues one job for `email`, commits, runs every due job once, returns the row.
async fn run_once(email: &str) -> anyhow::Result<(TestDatabase, Row)> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    invoices(&pool).await?;
    let enqueued = mark_and_enqueue(&pool, email, true).await?;
    let report = jobq::Runtime::builder(pool.clone())
        .build()?
        .drain(None)
        .await?;
    assert_eq!(report.attempts.len(), 1, "{report:?}");
    let row = job(&pool, enqueued.id).await?;
    Ok((db, row))
}

// ---- tests ----

#[tokio::test]
async fn enqueue_in_a_committed_transaction_creates_the_job() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    invoices(&pool).await?;

    let enqueued = mark_and_enqueue(&pool, "a@b.c", true).await?;
    assert!(!enqueued.duplicate);
    let status: String = sqlx::query_scalar("SELECT status FROM invoices WHERE id = 42")
        .fetch_one(&pool)
        .await?;
    assert_eq!(status, "sending");
    let row = job(&pool, enqueued.id).await?;
    assert_eq!(row.kind, "send_invoice");
    assert_eq!(row.state, "pending");
    assert_eq!(row.max_attempts, 10, "from retry = \"exp(max=10,jitter)\"");
    assert_eq!(row.idempotency_key.as_deref(), Some("42"));

    let runtime = jobq::Runtime::builder(pool.clone()).build()?;
    assert_eq!(runtime.kinds().collect::<Vec<_>>(), ["send_invoice"]);
    let report = runtime.drain(None).await?;
    assert_eq!(report.done(), 1, "{report:?}");
    let row = job(&pool, enqueued.id).await?;
    assert_eq!((row.state.as_str(), row.attempts), ("done", 1));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn enqueue_in_a_rolled_back_transaction_leaves_nothing() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    invoices(&pool).await?;

    mark_and_enqueue(&pool, "a@b.c", false).await?;
    assert_eq!(count(&pool).await?, 0);
    let status: String = sqlx::query_scalar("SELECT status FROM invoices WHERE id = 42")
        .fetch_one(&pool)
        .await?;
    assert_eq!(status, "draft");
    let report = jobq::Runtime::builder(pool.clone())
        .build()?
        .drain(None)
        .await?;
    assert!(report.attempts.is_empty());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn retryable_variant_is_scheduled_with_backoff() -> anyhow::Result<()> {
    let (db, row) = run_once("down@b.c").await?;
    assert_eq!(row.state, "scheduled");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error_code.as_deref(), Some("provider_unavailable"));
    assert_eq!(row.last_error.as_deref(), Some("mail provider unavailable"));
    // exp(max=10,jitter): base 1 s, first delay drawn from [0.5 s, 1 s].
    assert!(
        row.due_in > 0.0 && row.due_in <= 1.0,
        "due in {}s",
        row.due_in
    );

    // Past the backoff it runs again, and fails the same way.
    let pool = db.pool().clone();
    let later: DateTime<Utc> = Utc::now() + chrono::Duration::seconds(5);
    let report = jobq::Runtime::builder(pool.clone())
        .build()?
        .drain(Some(later))
        .await?;
    assert_eq!(report.retried(), 1, "{report:?}");
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM jobq.jobs")
        .fetch_one(&pool)
        .await?;
    assert_eq!(attempts, 2);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn rate_limited_variant_waits_its_retry_after() -> anyhow::Result<()> {
    let (db, row) = run_once("slow@b.c").await?;
    assert_eq!(row.state, "scheduled");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error_code.as_deref(), Some("rate_limited"));
    // The variant's `wait` (120 s), not the exponential backoff (at most 1 s here).
    assert!(
        (110.0..=120.0).contains(&row.due_in),
        "due in {}s, expected about 120s",
        row.due_in
    );
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn permanent_variant_fails_after_one_attempt() -> anyhow::Result<()> {
    let (db, row) = run_once("missing@b.c").await?;
    assert_eq!(row.state, "failed");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error_code.as_deref(), Some("invoice_missing"));
    assert_eq!(row.last_error.as_deref(), Some("invoice 42 not found"));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn unannotated_variant_is_retryable_with_its_snake_case_code() -> anyhow::Result<()> {
    let (db, row) = run_once("db@b.c").await?;
    assert_eq!(row.state, "scheduled");
    assert_eq!(row.last_error_code.as_deref(), Some("db"));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn idempotency_field_dedupes() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    invoices(&pool).await?;

    let first = mark_and_enqueue(&pool, "a@b.c", true).await?;
    let second = mark_and_enqueue(&pool, "other@b.c", true).await?;
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(second.id, first.id);
    assert_eq!(count(&pool).await?, 1);

    // Another invoice id is another job, through the pool this time.
    let third = SendInvoice::enqueue(
        &pool,
        InvoiceArgs {
            invoice_id: 43,
            email: "a@b.c".into(),
        },
    )
    .await?;
    assert!(!third.duplicate);
    assert_ne!(third.id, first.id);
    assert_eq!(count(&pool).await?, 2);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn builder_and_batch_enqueue() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();

    let mut tx = pool.begin().await?;
    let at = Utc::now() + chrono::Duration::hours(1);
    let delayed = SendInvoice::with(InvoiceArgs {
        invoice_id: 1,
        email: "a@b.c".into(),
    })
    .run_after(at)
    .priority(-7)
    .enqueue(&mut *tx)
    .await?;
    let batch = SendInvoice::enqueue_many(
        &mut *tx,
        (2..=4).map(|invoice_id| InvoiceArgs {
            invoice_id,
            email: "a@b.c".into(),
        }),
    )
    .await?;
    tx.commit().await?;
    assert_eq!(batch.len(), 3);
    assert!(batch.iter().all(|e| !e.duplicate));

    let (priority, due_in): (i16, f64) = sqlx::query_as(
        "SELECT priority, extract(epoch FROM run_after - now())::float8 FROM jobq.jobs WHERE id = $1",
    )
    .bind(delayed.id.0)
    .fetch_one(&pool)
    .await?;
    assert_eq!(priority, -7);
    assert!(due_in > 3500.0, "due in {due_in}s");

    // The three due ones run; the delayed one waits.
    let report = jobq::Runtime::builder(pool.clone())
        .build()?
        .drain(None)
        .await?;
    assert_eq!(report.done(), 3, "{report:?}");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn the_running_runtime_serves_the_registered_job() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    invoices(&pool).await?;
    let enqueued = mark_and_enqueue(&pool, "a@b.c", true).await?;

    let handle = jobq::Runtime::builder(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if job(&pool, enqueued.id).await?.state == "done" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "job never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.shutdown().await;
    db.close().await;
    Ok(())
}
