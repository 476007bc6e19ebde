//! Run jobq jobs synchronously in tests.
//!
//! [`TestDatabase`] gives each test its own freshly created and migrated database and
//! drops it afterwards.
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

pub use database::{DEFAULT_DATABASE_URL, TestDatabase, database_url};
