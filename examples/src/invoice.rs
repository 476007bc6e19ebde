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

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;
use jobq::{Classification, Classify, Job, JobContext, RetryPolicy, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The job's arguments: only what the job needs, never the whole invoice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvoiceArgs {
    /// The invoice to send.
    pub invoice_id: i64,
    /// Where to send it.
    pub email: String,
}

/// Why sending an invoice failed.
#[derive(Debug, thiserror::Error)]
pub enum InvoiceError {
    /// The mail provider is down: try again later.
    #[error("mail provider unavailable")]
    ProviderDown,
    /// The provider asked us to wait.
    #[error("rate limited, retry after {wait:?}")]
    RateLimited {
        /// How long the provider asked us to wait.
        wait: Duration,
    },
    /// The invoice does not exist: retrying cannot help.
    #[error("invoice {0} not found")]
    Missing(i64),
    /// A database error: retryable.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl Classify for InvoiceError {
    fn classify(&self) -> Classification {
        match self {
            InvoiceError::ProviderDown => Classification::retryable("provider_unavailable"),
            InvoiceError::RateLimited { wait } => {
                Classification::retryable("rate_limited").with_retry_after(*wait)
            }
            InvoiceError::Missing(_) => Classification::permanent("invoice_missing"),
            InvoiceError::Db(_) => Classification::retryable("db"),
        }
    }
}

/// A pretend mail provider that fails now and then.
#[derive(Debug, Default)]
pub struct MailProvider {
    calls: AtomicU32,
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

/// Sends one invoice by mail and marks it sent.
#[derive(Debug)]
pub struct SendInvoice;

impl Job for SendInvoice {
    const KIND: &'static str = "send_invoice";
    const RETRY: RetryPolicy = RetryPolicy::exponential(10)
        .base(Duration::from_millis(200))
        .jitter(true);
    type Args = InvoiceArgs;
    type Error = InvoiceError;

    fn idempotency_key(args: &InvoiceArgs) -> Option<String> {
        Some(args.invoice_id.to_string())
    }

    async fn run(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
        send_invoice(ctx, args).await
    }
}

/// The handler.
pub async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
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
    ctx.complete_in_tx(&mut tx)
        .await
        .map_err(|_| InvoiceError::ProviderDown)?;
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

async fn example_database() -> anyhow::Result<PgPool> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .with_context(|| format!("cannot reach PostgreSQL at {url}; set DATABASE_URL"))?;
    sqlx::query("DROP DATABASE IF EXISTS jobq_example WITH (FORCE)")
        .execute(&admin)
        .await?;
    sqlx::query("CREATE DATABASE jobq_example")
        .execute(&admin)
        .await?;
    admin.close().await;
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    Ok(PgPoolOptions::new()
        .max_connections(10)
        .connect_with(options.database("jobq_example"))
        .await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,invoice=info".into()),
        )
        .init();
    let pool = example_database().await?;
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

    let handle = Runtime::builder(pool.clone())
        .register::<SendInvoice>()
        .state(MailProvider::default())
        .poll_interval(Duration::from_millis(100))
        .build()?
        .start()
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobq.jobs WHERE state IN ('pending', 'running')",
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
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state IN ('pending', 'running')")
            .fetch_one(&pool)
            .await?;
    println!("  {pending} job(s)");
    anyhow::ensure!(
        sent == 20 && failed.len() == 1 && pending == 0,
        "the example did not finish as expected"
    );
    Ok(())
}
