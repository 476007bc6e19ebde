use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job(kind = 5, retry = "exp(max=0)", colour = "blue", lease = "1 hour")]
fn send(_ctx: JobContext, _args: Args, _extra: u8) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
