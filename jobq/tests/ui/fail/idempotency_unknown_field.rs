use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job(idempotency = invoice)]
pub async fn send(args: Args) -> Result<(), JobError> {
    let _ = args.invoice_id;
    Ok(())
}

fn main() {}
