use jobq::JobContext;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("mail provider unavailable")]
pub struct MailError;

#[jobq::job]
async fn send(_ctx: JobContext, _args: Args) -> Result<(), MailError> {
    Ok(())
}

fn main() {}
