use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

pub struct Mailer;

impl Mailer {
    #[jobq::job]
    async fn send(&self, _ctx: JobContext, _args: Args) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {}
