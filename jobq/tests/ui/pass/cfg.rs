//! A `#[cfg]` on the handler applies to the generated type, impls and registration.
use jobq::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job]
#[cfg(any())]
async fn compiled_out(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job]
#[cfg(all())]
async fn compiled_in(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

// Before the attribute, `cfg` removes the item before the macro runs.
#[cfg(any())]
#[jobq::job]
async fn stripped_first(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    assert_eq!(CompiledIn::KIND, "compiled_in");
    let kinds: Vec<&str> = jobq::registered_jobs().iter().map(|h| h.kind()).collect();
    assert_eq!(kinds, ["compiled_in"]);
}
