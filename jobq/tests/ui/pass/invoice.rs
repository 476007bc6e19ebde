//! The example, as written (plus `use` lines).
use jobq::JobContext;
use serde::{Deserialize, Serialize};

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

#[jobq::job(kind = "send_invoice", retry = "exp(max=10,jitter)", idempotency = invoice_id)]
async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
    let _ = (ctx.attempt(), args.email);
    Ok(())
}

async fn elsewhere(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE invoices SET status = 'sending' WHERE id = $1")
        .bind(42)
        .execute(&mut *tx)
        .await?;
    SendInvoice::enqueue(&mut tx, InvoiceArgs { invoice_id: 42, email: "a@b.c".into() }).await?;
    tx.commit().await?;
    jobq::Runtime::builder(pool).build()?.run_until(tokio::signal::ctrl_c()).await?;
    Ok(())
}

fn main() {
    let _ = elsewhere;
}
