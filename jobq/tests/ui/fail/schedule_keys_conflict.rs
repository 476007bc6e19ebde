use jobq::JobError;

#[jobq::job(cron = "0 3 * * *", every = "1h", missed = "sometimes")]
pub async fn tick(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(tz = "UTC", unique(by = [x], states = [waiting]), debounce = "0s")]
pub async fn other(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
