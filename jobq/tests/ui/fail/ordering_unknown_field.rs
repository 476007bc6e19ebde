use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub account_id: i64,
}

#[jobq::job(ordering = account)]
pub async fn send(args: Args) -> Result<(), JobError> {
    let _ = args.account_id;
    Ok(())
}

fn main() {}
