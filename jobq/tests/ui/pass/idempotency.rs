//! `idempotency = field`: the key is the field's `to_string()`.
use jobq::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct InvoiceArgs {
    pub invoice_id: i64,
    pub email: String,
}

#[jobq::job(idempotency = invoice_id)]
async fn send_invoice(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(idempotency = email)]
async fn by_email(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    let args = InvoiceArgs { invoice_id: 42, email: "a@b.c".into() };
    assert_eq!(SendInvoice::idempotency_key(&args), Some("42".to_owned()));
    assert_eq!(ByEmail::idempotency_key(&args), Some("a@b.c".to_owned()));
}
