use jobq::JobError;

#[jobq::job(cron = "0 3 * * *", tz = "Europe/Atlantis")]
pub async fn tick(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
