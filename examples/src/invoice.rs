//! The invoice example from jobq's design essays.
//!
//! Each invoice row and its `send_invoice` job are committed in one transaction, so a
//! crash can never leave an invoice without its job or a job without its invoice. The mail
//! provider fails now and then (retryably, sometimes with a Retry-After); a job for an
//! invoice that does not exist fails permanently. At the end the example asks the job
//! table the three questions: what is pending, what failed and why, what did we do.
//!
//! Run it with `cargo run -p examples --bin invoice` (uses `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; it creates and uses its own database
//! `jobq_example`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use jobq::{JobContext, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The job's arguments: only what the job needs, never the whole invoice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvoiceArgs {
    /// The invoice to send.
    pub invoice_id: i64,
    /// Where to send it.
    pub email: String,
}

/// Why sending an invoice failed: each variant says whether a retry can help.
#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum InvoiceError {
    /// The mail provider is down: try again later.
    #[error("mail provider unavailable")]
    #[jobq(retryable, code = "provider_unavailable")]
    ProviderDown,
    /// The provider asked us to wait.
    #[error("rate limited, retry after {wait:?}")]
    #[jobq(retryable, code = "rate_limited", retry_after = wait)]
    RateLimited {
        /// How long the provider asked us to wait.
        wait: Duration,
    },
    /// The address cannot receive mail: retrying cannot help.
    #[error("`{0}` is not a mail address")]
    #[jobq(permanent, code = "bad_address")]
    BadAddress(String),
    /// The invoice does not exist: retrying cannot help.
    #[error("invoice {0} not found")]
    #[jobq(permanent, code = "invoice_missing")]
    Missing(i64),
    /// This attempt lost its job to another worker: roll back, nothing to do.
    #[error(transparent)]
    Jobq(#[from] jobq::Error),
    /// A database error: retryable (code `db`).
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A pretend mail provider that fails now and then: every 7 calls, once with a 503 and
/// once with a rate limit. Clones share the call count.
#[derive(Debug, Clone, Default)]
pub struct MailProvider {
    calls: Arc<AtomicU32>,
}

impl MailProvider {
    /// Sends one mail, or fails the way real providers do.
    pub async fn send(&self, to: &str, invoice_id: i64) -> Result<(), InvoiceError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        match call % 7 {
            3 => Err(InvoiceError::ProviderDown),
            5 => Err(InvoiceError::RateLimited {
                wait: Duration::from_millis(300),
            }),
            _ => {
                tracing::info!(invoice_id, to, "invoice mailed");
                Ok(())
            }
        }
    }
}

/// Sends one invoice by mail, then marks it sent and completes the job in one
/// transaction.
#[jobq::job(
    kind = "send_invoice",
    retry = "exp(max=10,base=200ms,jitter)",
    idempotency = invoice_id,
    timeout = "30s"
)]
pub async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
    if !args.email.contains('@') {
        return Err(InvoiceError::BadAddress(args.email));
    }
    let (Some(pool), Some(mail)) = (ctx.pool(), ctx.state::<MailProvider>()) else {
        return Err(InvoiceError::ProviderDown);
    };
    let status: Option<String> = sqlx::query_scalar("SELECT status FROM invoices WHERE id = $1")
        .bind(args.invoice_id)
        .fetch_optional(pool)
        .await?;
    match status.as_deref() {
        None => return Err(InvoiceError::Missing(args.invoice_id)),
        Some("sent") => return Ok(()), // an earlier attempt got this far
        Some(_) => {}
    }
    mail.send(&args.email, args.invoice_id).await?;
    // Mark it sent and complete the job in one transaction: both or neither.
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE invoices SET status = 'sent', sent_at = now() WHERE id = $1")
        .bind(args.invoice_id)
        .execute(&mut *tx)
        .await?;
    ctx.complete_in_tx(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Creates an invoice and its job in one transaction.
pub async fn create_invoice(pool: &PgPool, id: i64, email: &str) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO invoices (id, email, status) VALUES ($1, $2, 'sending')")
        .bind(id)
        .bind(email)
        .execute(&mut *tx)
        .await?;
    SendInvoice::enqueue(
        &mut tx,
        InvoiceArgs {
            invoice_id: id,
            email: email.to_owned(),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,invoice=info".into()),
        )
        .init();
    let pool = examples::fresh_database("jobq_example", 10).await?;
    jobq::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL,
                                status text NOT NULL, sent_at timestamptz)",
    )
    .execute(&pool)
    .await?;

    for id in 1..=20 {
        create_invoice(&pool, id, &format!("customer{id}@example.com")).await?;
    }
    // A job whose invoice was never committed: it fails permanently.
    SendInvoice::enqueue(
        &pool,
        InvoiceArgs {
            invoice_id: 404,
            email: "nobody@example.com".into(),
        },
    )
    .await?;
    // A business change that rolls back takes its job with it.
    let mut tx = pool.begin().await?;
    SendInvoice::enqueue(
        &mut tx,
        InvoiceArgs {
            invoice_id: 999,
            email: "rolled-back@example.com".into(),
        },
    )
    .await?;
    tx.rollback().await?;

    // SendInvoice registered itself: #[jobq::job] did that.
    let handle = Runtime::builder(pool.clone())
        .state(MailProvider::default())
        .poll_interval(Duration::from_millis(100))
        .build()?
        .start()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobq.jobs WHERE state IN ('scheduled', 'pending', 'running')",
        )
        .fetch_one(&pool)
        .await?;
        if open == 0 || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown().await;

    println!("\nWhat did we do?");
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT state, count(*), sum(attempts)::bigint FROM jobq.jobs GROUP BY state ORDER BY state",
    )
    .fetch_all(&pool)
    .await?;
    println!("  {:<10} {:>5} {:>9}", "state", "jobs", "attempts");
    for (state, jobs, attempts) in rows {
        println!("  {state:<10} {jobs:>5} {attempts:>9}");
    }
    let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices WHERE status = 'sent'")
        .fetch_one(&pool)
        .await?;
    println!("  invoices sent: {sent} of 20");

    println!("\nWhat failed, and why?");
    let failed: Vec<(i64, String, i32, String)> = sqlx::query_as(
        "SELECT id, coalesce(last_error_code, ''), attempts, coalesce(last_error, '')
         FROM jobq.jobs WHERE state = 'failed' ORDER BY id",
    )
    .fetch_all(&pool)
    .await?;
    for (id, code, attempts, message) in &failed {
        println!("  job {id}: {code} after {attempts} attempt(s): {message}");
    }

    println!("\nWhich retries happened along the way?");
    let retried: Vec<(String, i64)> = sqlx::query_as(
        "SELECT e->>'code', count(*) FROM jobq.jobs, jsonb_array_elements(errors) e
         WHERE state = 'done' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await?;
    for (code, n) in retried {
        println!("  {code}: {n}");
    }

    println!("\nWhat is pending?");
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE state IN ('scheduled', 'pending', 'running')",
    )
    .fetch_one(&pool)
    .await?;
    println!("  {pending} job(s)");
    anyhow::ensure!(
        sent == 20 && failed.len() == 1 && pending == 0,
        "the example did not finish as expected"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The invoice job tested the way a user tests theirs: inline for the handler's own
    //! logic, against a test database for the transaction and the retries.

    use super::*;
    use jobq_testing::{Perform, TestDatabase, assert_enqueued_with, assert_not_enqueued};

    fn args(invoice_id: i64, email: &str) -> InvoiceArgs {
        InvoiceArgs {
            invoice_id,
            email: email.to_owned(),
        }
    }

    #[tokio::test]
    async fn a_bad_address_fails_permanently_without_touching_anything() {
        let outcome = Perform::<SendInvoice>::new(args(1, "not-an-address"))
            .state(MailProvider::default())
            .run()
            .await;
        assert_eq!(
            outcome.assert_permanent("bad_address"),
            "`not-an-address` is not a mail address"
        );
    }

    async fn invoices(db: &TestDatabase) -> anyhow::Result<()> {
        sqlx::query(
            "CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL,
                                    status text NOT NULL, sent_at timestamptz)",
        )
        .execute(db.pool())
        .await?;
        Ok(())
    }

    #[tokio::test]
    async fn the_invoice_and_its_job_commit_or_roll_back_together() -> anyhow::Result<()> {
        let db = TestDatabase::new().await?;
        invoices(&db).await?;
        let mut tx = db.pool().begin().await?;
        sqlx::query("INSERT INTO invoices (id, email, status) VALUES (7, 'a@b.c', 'sending')")
            .execute(&mut *tx)
            .await?;
        SendInvoice::enqueue(&mut tx, args(7, "a@b.c")).await?;
        // Visible inside the uncommitted transaction ...
        assert_enqueued_with::<SendInvoice>(&mut *tx, &args(7, "a@b.c")).await;
        tx.rollback().await?;
        // ... and gone with it.
        assert_not_enqueued::<SendInvoice>(db.pool()).await;

        create_invoice(db.pool(), 8, "b@c.d").await?;
        assert_enqueued_with::<SendInvoice>(db.pool(), &args(8, "b@c.d")).await;
        db.close().await;
        Ok(())
    }

    #[tokio::test]
    async fn flaky_mail_is_retried_until_sent_and_a_missing_invoice_fails() -> anyhow::Result<()> {
        let db = TestDatabase::new().await?;
        invoices(&db).await?;
        for id in 1..=10 {
            create_invoice(db.pool(), id, &format!("c{id}@example.com")).await?;
        }
        SendInvoice::enqueue(db.pool(), args(404, "nobody@example.com")).await?;
        // Retries are due in the future: the drain moves its clock instead of sleeping.
        let drained = db
            .drain()
            .state(MailProvider::default())
            .advance_clock(true)
            .run()
            .await?;
        assert_eq!((drained.done(), drained.failed()), (10, 1));
        assert!(
            drained.retried() >= 2,
            "the provider fails twice in every 7 calls"
        );
        let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices WHERE status = 'sent'")
            .fetch_one(db.pool())
            .await?;
        assert_eq!(sent, 10);
        let (state, code): (String, String) = sqlx::query_as(
            "SELECT state, last_error_code FROM jobq.jobs WHERE payload->>'invoice_id' = '404'",
        )
        .fetch_one(db.pool())
        .await?;
        assert_eq!(
            (state.as_str(), code.as_str()),
            ("failed", "invoice_missing")
        );
        db.close().await;
        Ok(())
    }
}
