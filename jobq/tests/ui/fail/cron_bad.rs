use jobq::JobError;

#[jobq::job(cron = "61 * * * *")]
pub async fn tick(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
