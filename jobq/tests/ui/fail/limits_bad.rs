use jobq::JobError;

#[jobq::job(kind = "a", rate = "100/day", concurrency = 0)]
pub async fn a(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "b", concurrency_key = destination, rate_key = destination, burst = 5)]
pub async fn b(_args: ()) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "c", concurrency = "5", rate = 100, rate_key = "destination")]
pub async fn c(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
