//! `ordering = field`: the key is the field's `to_string()`; `ordering_scope` names a
//! scope shared by several kinds (default: the kind).
use jobq::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct InvoiceArgs {
    pub account_id: i64,
    pub invoice_id: i64,
}

#[jobq::job(kind = "send_invoice", ordering = account_id, ordering_scope = "billing")]
async fn send_invoice(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(ordering = invoice_id)]
async fn by_invoice(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    let args = InvoiceArgs { account_id: 7, invoice_id: 42 };
    assert_eq!(SendInvoice::ordering_key(&args), Some("7".to_owned()));
    assert_eq!(SendInvoice::ORDERING_SCOPE, Some("billing"));
    assert_eq!(ByInvoice::ordering_key(&args), Some("42".to_owned()));
    assert_eq!(ByInvoice::ORDERING_SCOPE, None);
    let _ = ByInvoice::with(args).ordering_key("override");
}
