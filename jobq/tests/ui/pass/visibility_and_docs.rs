//! The generated type has the handler's visibility and documentation; the handler keeps
//! its own attributes and stays callable.
#![deny(missing_docs, unreachable_pub, missing_debug_implementations, dead_code)]
//! Crate docs.

mod jobs {
    use jobq::{JobContext, JobError};

    /// The args.
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    pub struct Args {
        /// An id.
        pub id: i64,
    }

    /// Archives a document.
    ///
    /// Runs on the `archive` queue.
    #[jobq::job(queue = "archive")]
    pub async fn archive(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
        Ok(())
    }

    #[jobq::job]
    pub(crate) async fn reindex(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
        Ok(())
    }

    #[jobq::job]
    async fn private_job(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
        Ok(())
    }
}

pub use jobs::{Archive, Args, archive};

fn main() {
    let _ = (Archive, jobs::Reindex);
}
