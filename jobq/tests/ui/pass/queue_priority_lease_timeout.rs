//! `queue`, `priority`, `lease` and `timeout`.
use std::time::Duration;

use jobq::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job(queue = "mail", priority = -5, lease = "5m", timeout = "90s")]
async fn urgent(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(priority = 10, lease = "1500ms", timeout = "1h")]
async fn lazy(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    assert_eq!(Urgent::QUEUE, "mail");
    assert_eq!(Urgent::PRIORITY, -5);
    assert_eq!(Urgent::LEASE, Duration::from_secs(300));
    assert_eq!(Urgent::TIMEOUT, Some(Duration::from_secs(90)));
    assert_eq!(Lazy::QUEUE, "default");
    assert_eq!(Lazy::PRIORITY, 10);
    assert_eq!(Lazy::LEASE, Duration::from_millis(1500));
    assert_eq!(Lazy::TIMEOUT, Some(Duration::from_secs(3600)));
}
