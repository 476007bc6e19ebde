use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub accounts: Vec<i64>,
}

#[jobq::job(ordering = accounts)]
pub async fn send(args: Args) -> Result<(), JobError> {
    let _ = args.accounts;
    Ok(())
}

fn main() {}
