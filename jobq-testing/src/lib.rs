//! Run jobq jobs synchronously in tests, through the runtime's real execution path.
//!
//! Two modes, as Oban's `perform_job`/`drain_queue` and River's `rivertest` offer:
//!
//! - **Inline, no database**: [`perform`] (or [`Perform`] to set the attempt and other
//!   context values) sends the args through JSON as an enqueue would, runs one attempt
//!   through [`jobq::run_attempt`] — decode, `TIMEOUT`, panic catching, classification —
//!   and returns its [`Outcome`]: done, retry (code and delay), failed (permanent or
//!   exhausted), cancelled, or rejected args.
//! - **Against a database**: [`TestDatabase`] creates an isolated, migrated database per
//!   test; [`Drain`] runs every due job on the current task through
//!   [`jobq::Runtime::drain`], and can move its clock forward until every job is terminal;
//!   [`assert_enqueued`], [`assert_enqueued_with`], [`assert_not_enqueued`] and
//!   [`enqueued`] look at what was enqueued, inside the caller's own transaction too.
//!
//! ```
//! use jobq::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Serialize, Deserialize)]
//! struct InvoiceArgs { invoice_id: i64 }
//!
//! struct SendInvoice;
//!
//! impl Job for SendInvoice {
//!     const KIND: &'static str = "send_invoice";
//!     type Args = InvoiceArgs;
//!     type Error = JobError;
//!     async fn run(ctx: JobContext, args: InvoiceArgs) -> Result<(), JobError> {
//!         match args.invoice_id {
//!             0 => Err(JobError::permanent("invoice_missing", "no invoice 0")),
//!             13 if ctx.attempt() < 3 => Err(JobError::retryable("mail_down", "503")
//!                 .retry_after(Duration::from_secs(30))),
//!             _ => Ok(()),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use jobq_testing::{perform, Perform};
//!
//! perform::<SendInvoice>(InvoiceArgs { invoice_id: 42 }).await.assert_done();
//! perform::<SendInvoice>(InvoiceArgs { invoice_id: 0 }).await.assert_permanent("invoice_missing");
//! let delay = perform::<SendInvoice>(InvoiceArgs { invoice_id: 13 }).await.assert_retry("mail_down");
//! assert_eq!(delay, Duration::from_secs(30));
//! Perform::<SendInvoice>::new(InvoiceArgs { invoice_id: 13 }).attempt(3).run().await.assert_done();
//! # }
//! ```
//!
//! # With `#[tokio::test]`
//!
//! Inline tests need nothing else. Database tests create a [`TestDatabase`], which finds a
//! server through [`resolve_database_url`] (`DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, else a throwaway cluster when PostgreSQL's
//! binaries are installed), and close it at the end:
//!
//! ```no_run
//! # use jobq::{Job, JobContext, JobError};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize)] struct InvoiceArgs { invoice_id: i64 }
//! # struct SendInvoice;
//! # impl Job for SendInvoice {
//! #     const KIND: &'static str = "send_invoice";
//! #     type Args = InvoiceArgs;
//! #     type Error = JobError;
//! #     async fn run(_: JobContext, _: InvoiceArgs) -> Result<(), JobError> { Ok(()) }
//! # }
//! use jobq_testing::{TestDatabase, assert_enqueued, assert_not_enqueued};
//!
//! #[tokio::test]
//! async fn billing_enqueues_the_invoice() -> Result<(), Box<dyn std::error::Error>> {
//!     let db = TestDatabase::new().await?;
//!
//!     // Inside the business transaction, before deciding to commit:
//!     let mut tx = db.pool().begin().await?;
//!     SendInvoice::enqueue(&mut *tx, InvoiceArgs { invoice_id: 42 }).await?;
//!     assert_enqueued::<SendInvoice>(&mut *tx, |a| a.invoice_id == 42).await;
//!     assert_not_enqueued::<SendInvoice>(db.pool()).await; // not committed yet
//!     tx.commit().await?;
//!
//!     // Run it, retries included, without sleeping.
//!     let drained = db.drain().register::<SendInvoice>().advance_clock(true).run().await?;
//!     assert_eq!((drained.done(), drained.failed()), (1, 0));
//!
//!     db.close().await;
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! # With `#[sqlx::test]`
//!
//! sqlx's test macro creates a database per test from `DATABASE_URL` (it must be set) and
//! passes its pool; run `jobq::migrate` first and everything else works the same:
//!
//! ```no_run
//! # use jobq::{Job, JobContext, JobError};
//! # struct SendInvoice;
//! # impl Job for SendInvoice {
//! #     const KIND: &'static str = "send_invoice";
//! #     type Args = i64;
//! #     type Error = JobError;
//! #     async fn run(_: JobContext, _: i64) -> Result<(), JobError> { Ok(()) }
//! # }
//! #[sqlx::test]
//! async fn sends_the_invoice(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//!     jobq::migrate(&pool).await?;
//!     SendInvoice::enqueue(&pool, 42).await?;
//!     jobq_testing::assert_enqueued_with::<SendInvoice>(&pool, &42).await;
//!     let drained = jobq_testing::Drain::new(&pool).register::<SendInvoice>().run().await?;
//!     assert_eq!(drained.done(), 1);
//!     Ok(())
//! }
//! # fn main() {}
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod assert;
mod cluster;
mod database;
mod drain;
mod error;
mod inline;
mod resolve;

pub use assert::{
    EnqueuedJob, assert_enqueued, assert_enqueued_with, assert_not_enqueued,
    assert_not_enqueued_where, enqueued,
};
pub use cluster::TempCluster;
pub use database::{TestDatabase, with_database};
pub use drain::{DEFAULT_MAX_ROUNDS, Drain, Drained};
pub use error::Error;
pub use inline::{Outcome, Perform, perform, perform_payload};
pub use resolve::{DEFAULT_DATABASE_URL, database_url, resolve_database_url};
