use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job(retry = "fixd(30s)")]
async fn send(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
