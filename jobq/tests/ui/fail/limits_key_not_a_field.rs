use jobq::JobError;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Delivery {
    pub destination: String,
}

#[jobq::job(kind = "d", concurrency = 2, concurrency_key = dest)]
pub async fn d(_args: Delivery) -> Result<(), JobError> {
    Ok(())
}

fn main() {}
