use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job]
async fn send(_ctx: JobContext, _args: Args, _pool: sqlx::PgPool, _retries: u32) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
