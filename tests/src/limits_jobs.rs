//! The job kinds of the limit tests, shared by the test and its worker processes
//! (`limits_node`): the test enqueues them, the workers serve them.

use std::time::Duration;

use jobq::JobError;

/// Capped at 3 running across all nodes; 200 ms each; a 1 s lease so the reaper returns
/// a killed worker's slot soon.
#[jobq::job(kind = "capped", concurrency = 3, lease = "1s")]
pub(crate) async fn capped(_args: tests::N) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// At most 20 starts a second across all nodes, bursts of 5.
#[jobq::job(kind = "metered", rate = "20/s", burst = 5)]
pub(crate) async fn metered(_args: tests::N) -> Result<(), JobError> {
    Ok(())
}

/// No limit in code: an operator sets one at run time. 300 ms each.
#[jobq::job(kind = "adjustable")]
pub(crate) async fn adjustable(_args: tests::N) -> Result<(), JobError> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
