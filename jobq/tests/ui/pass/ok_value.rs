//! `Result<T, E>` with any `T`: a `Serialize` value is recorded as the job's output; any
//! other is the handler's own (handy in unit tests) and the runtime discards it.
use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub n: u32,
}

#[jobq::job]
async fn double(_ctx: JobContext, args: Args) -> Result<u32, JobError> {
    Ok(args.n * 2)
}

/// Not `Serialize`.
pub struct Opaque(pub u32);

#[jobq::job]
async fn wrap(_ctx: JobContext, args: Args) -> Result<Opaque, JobError> {
    Ok(Opaque(args.n))
}

fn main() {
    let _ = (Double, Wrap);
}
