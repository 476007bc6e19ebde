use jobq::JobError;

#[jobq::job(version = 0)]
pub async fn send(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
