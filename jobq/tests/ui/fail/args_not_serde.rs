use jobq::{JobContext, JobError};

pub struct NotSerde {
    pub id: i64,
}

#[jobq::job]
pub async fn plain(_ctx: JobContext, args: NotSerde) -> Result<(), JobError> {
    let _ = args.id;
    Ok(())
}

fn main() {}
