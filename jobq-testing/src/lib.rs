//! Run jobq jobs synchronously in tests.
//!
//! [`perform`] runs one attempt of a job inline, with no database, through the runtime's
//! own execution path, and tells how it ended ([`Outcome`]). [`TestDatabase`] gives each
//! test its own freshly created and migrated database and drops it afterwards.
//!
//! ```no_run
//! # async fn t() -> Result<(), jobq::Error> {
//! let db = jobq_testing::TestDatabase::new().await?;
//! let pool = db.pool().clone();
//! // ... enqueue, drain, assert ...
//! db.close().await;
//! # Ok(()) }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod database;
mod inline;

pub use database::{DEFAULT_DATABASE_URL, TestDatabase, database_url};
pub use inline::{Outcome, Perform, perform};
