//! `crate = "path"` for a crate that reaches jobq under another path.
mod deps {
    pub use ::jobq as queue;
}

use deps::queue::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[derive(Debug, thiserror::Error, deps::queue::Classify)]
#[jobq(crate = "crate::deps::queue")]
pub enum Failure {
    #[error("down")]
    Down,
}

#[deps::queue::job(crate = "crate::deps::queue", kind = "renamed")]
async fn renamed(_ctx: JobContext, _args: Args) -> Result<(), Failure> {
    Ok(())
}

fn main() {
    assert_eq!(Renamed::KIND, "renamed");
    let _ = JobError::cancel("x");
}
