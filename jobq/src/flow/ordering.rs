//! Per-key ordering: jobs with the same `(ordering_scope, ordering_key)` run one at a
//! time, in enqueue (id) order, on every node.
//!
//! Each job of a key is a link of a chain: `blocked_by` names the job of the key before
//! it while that one is unfinished, and only jobs with `blocked_by IS NULL` are in the
//! claim index. Enqueue takes the key's advisory lock in a statement of its own and then
//! links the new job behind the key's tail; the end of a job (`done`, `cancelled`, or
//! unparked when `failed`) settles the key under the same lock, in a short transaction
//! after the one that ended it, so an enqueue still open when the job ended is seen once
//! it commits. A crash between the two leaves a job waiting behind a finished one: the
//! [`Sweeper`](crate::maintenance::Sweeper) settles those on its next pass.
//!
//! A retry keeps its place (the job stays the head of its key while it backs off); a job
//! that ends `failed` stays in the chain, so the jobs behind it are *parked* until it is
//! replayed (it runs again first), cancelled, or unparked.

use sqlx::PgPool;

use crate::error::Error;
use crate::store;

/// What one sweeper pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Finished jobs that still had a job of their key waiting behind them.
    pub stale: u64,
    /// Jobs that became claimable.
    pub released: u64,
}

/// Settles up to `limit` keys whose waiting job waits behind a job that is no longer in
/// the chain (finished, cancelled, skipped or pruned).
pub(crate) async fn sweep(pool: &PgPool, limit: i64) -> Result<SweepReport, Error> {
    let mut conn = pool.acquire().await?;
    let stale = store::ordering_stale_blockers(&mut conn, limit).await?;
    if stale.is_empty() {
        return Ok(SweepReport::default());
    }
    let released = store::ordering_settle(&mut conn, &stale).await?;
    Ok(SweepReport {
        stale: stale.len() as u64,
        released,
    })
}
