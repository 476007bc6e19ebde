//! Run jobq jobs synchronously in tests.
//!
//! [`perform`] runs one attempt of a job inline, with no database, through the runtime's
//! own execution path, and tells how it ended ([`Outcome`]). [`TestDatabase`] gives each
//! test its own freshly created and migrated database and drops it afterwards, on the
//! server [`resolve_database_url`] finds (`DATABASE_URL`, the default URL, or a throwaway
//! cluster when PostgreSQL is installed but not running). [`Drain`] runs every due job
//! on the current task through `jobq::Runtime::drain`, moving its clock forward on
//! request until every job is terminal. [`assert_enqueued`],
//! [`assert_enqueued_with`], [`assert_not_enqueued`] and [`enqueued`] look at what was
//! enqueued, inside the caller's own uncommitted transaction too.
//!
//! ```no_run
//! # async fn t() -> Result<(), jobq_testing::Error> {
//! let db = jobq_testing::TestDatabase::new().await?;
//! let pool = db.pool().clone();
//! // ... enqueue through `pool`, then:
//! let drained = db.drain().advance_clock(true).run().await?;
//! db.close().await;
//! # Ok(()) }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod assert;
mod cluster;
mod database;
mod drain;
mod error;
mod inline;
mod resolve;
mod sql;

pub use assert::{
    EnqueuedJob, assert_enqueued, assert_enqueued_with, assert_not_enqueued,
    assert_not_enqueued_where, enqueued,
};
pub use database::TestDatabase;
pub use drain::{DEFAULT_MAX_ROUNDS, Drain, Drained};
pub use error::Error;
pub use inline::{Outcome, Perform, perform};
pub use resolve::{DEFAULT_DATABASE_URL, database_url, resolve_database_url};
