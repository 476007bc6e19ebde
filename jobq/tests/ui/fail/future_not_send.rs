use std::rc::Rc;

use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

async fn yield_now() {}

#[jobq::job]
pub async fn not_send(args: Args) -> Result<(), JobError> {
    let shared = Rc::new(args.id);
    yield_now().await;
    let _ = shared;
    Ok(())
}

fn main() {}
