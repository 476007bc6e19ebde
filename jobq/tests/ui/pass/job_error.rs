//! `jobq::JobError` (or `Box<E: Classify>`) as the error type, no derive needed.
use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job]
async fn plain(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Err(JobError::retryable("down", "provider down"))
}

#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum Small {
    #[error("x")]
    X,
}

#[jobq::job]
async fn boxed(_ctx: JobContext, _args: Args) -> Result<(), Box<Small>> {
    Err(Box::new(Small::X))
}

fn main() {
    let _ = (Plain, Boxed);
}
