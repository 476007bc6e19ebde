//! Durable background jobs whose only state is a PostgreSQL table.
//!
//! Declare a job by annotating an async function, enqueue it **inside the same
//! transaction** as the business change it belongs to, and run [`Runtime`] in `main`.
//! The runtime claims jobs with `FOR UPDATE SKIP LOCKED`, holds a lease while a handler
//! runs, fences every write by the attempt that claimed the job, retries retryable
//! failures with backoff and jitter, and moves permanent failures and exhausted jobs to
//! the terminal `failed` state with a stable error code.
//!
//! ```no_run
//! use jobq::{Job, JobContext, JobError};
//! use serde::{Deserialize, Serialize};
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
//!     fn idempotency_key(args: &InvoiceArgs) -> Option<String> {
//!         Some(args.invoice_id.to_string())
//!     }
//!     async fn run(_ctx: JobContext, args: InvoiceArgs) -> Result<(), JobError> {
//!         println!("sending invoice {}", args.invoice_id);
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
//! jobq::migrate(&pool).await?;
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE invoices SET status = 'sending' WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! SendInvoice::enqueue(&mut tx, InvoiceArgs { invoice_id: 42 }).await?;
//! tx.commit().await?; // the job exists exactly when this commits
//!
//! jobq::Runtime::builder(pool)
//!     .register::<SendInvoice>()
//!     .build()?
//!     .run_until(tokio::signal::ctrl_c())
//!     .await?;
//! # Ok(()) }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod context;
mod error;
mod job;
pub mod maintenance;
mod migrate;
mod notify;
mod registry;
mod retry;
mod runtime;
mod store;

pub use context::JobContext;
pub use error::{Classification, Classify, Disposition, Error, JobError};
pub use job::{
    EnqueueBuilder, Enqueued, Job, JobId, MAX_IDEMPOTENCY_KEY_LEN, MAX_KIND_LEN, MAX_PAYLOAD_BYTES,
    MAX_QUEUE_LEN,
};
pub use jobq_macros::{Classify, job};
pub use migrate::{MIGRATIONS, Migration, migrate};
pub use registry::{Failure, JobHandler, Registration, registered_jobs};
pub use retry::{DEFAULT_MAX_ATTEMPTS, RetryPolicy};
pub use runtime::{
    AttemptOutcome, DEFAULT_CONCURRENCY, DrainReport, DrainedAttempt, Runtime, RuntimeBuilder,
    RuntimeHandle, ShutdownReport, run_attempt,
};

/// What generated code needs; not part of the public API.
///
/// The macros name only paths under `::jobq::__private` (or the `crate = "..."`
/// override), so users need none of these crates in their own `Cargo.toml`.
#[doc(hidden)]
pub mod __private {
    use std::borrow::Cow;
    use std::time::Duration;

    pub use crate::context::JobContext;
    pub use crate::error::{Classification, Classify, Disposition, Error};
    pub use crate::job::{EnqueueBuilder, Enqueued, Job};
    pub use crate::registry::Registration;
    pub use crate::retry::RetryPolicy;
    pub use async_trait;
    pub use inventory;
    pub use serde;
    pub use serde_json;
    pub use sqlx;
    pub use sqlx::{Acquire, Postgres};

    /// A field usable as `#[jobq(retry_after = field)]`.
    #[diagnostic::on_unimplemented(
        message = "`retry_after` must name a field of type `std::time::Duration` or `Option<Duration>`, not `{Self}`",
        label = "this field is a `{Self}`, not a `Duration`",
        note = "convert where the error is built, e.g. `Duration::from_secs(secs)`"
    )]
    pub trait RetryAfter {
        /// The Retry-After this field carries.
        fn retry_after(&self) -> Option<Duration>;
    }

    impl RetryAfter for Duration {
        fn retry_after(&self) -> Option<Duration> {
            Some(*self)
        }
    }

    impl RetryAfter for Option<Duration> {
        fn retry_after(&self) -> Option<Duration> {
            *self
        }
    }

    /// A classification from the parts `#[derive(Classify)]` knows.
    pub fn classification(
        disposition: Disposition,
        code: &'static str,
        retry_after: Option<Duration>,
    ) -> Classification {
        Classification {
            disposition,
            code: Cow::Borrowed(code),
            retry_after,
        }
    }
}
