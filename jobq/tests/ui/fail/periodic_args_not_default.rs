use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub customer_id: i64,
}

#[jobq::job(every = "15m")]
pub async fn digest(args: Args) -> Result<(), JobError> {
    let _ = args.customer_id;
    Ok(())
}

fn main() {}
