//! `Result<T, E>` with any `T`: the value is the handler's own (handy in unit tests) and
//! the runtime discards it.
use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub n: u32,
}

#[jobq::job]
async fn double(_ctx: JobContext, args: Args) -> Result<u32, JobError> {
    Ok(args.n * 2)
}

fn main() {
    let _ = Double;
}
