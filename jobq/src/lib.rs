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
//! use jobq::JobContext;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct InvoiceArgs { invoice_id: i64 }
//!
//! #[derive(Debug, thiserror::Error, jobq::Classify)]
//! enum InvoiceError {
//!     #[error("mail provider unavailable")]
//!     ProviderDown, // retryable, code "provider_down"
//!     #[error("invoice {0} not found")]
//!     #[jobq(permanent, code = "invoice_missing")]
//!     Missing(i64),
//! }
//!
//! #[jobq::job(kind = "send_invoice", retry = "exp(max=10,jitter)", idempotency = invoice_id)]
//! async fn send_invoice(_ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
//!     println!("sending invoice {}", args.invoice_id);
//!     Ok(())
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
//! // Serves every `#[jobq::job]` in the binary.
//! jobq::Runtime::builder(pool)
//!     .build()?
//!     .run_until(tokio::signal::ctrl_c())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! [`Job`] can also be implemented by hand and registered with
//! [`RuntimeBuilder::register`].
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
mod context;
mod error;
mod flow;
mod ids;
mod job;
mod limits;
pub mod maintenance;
pub mod metrics;
mod migrate;
mod notify;
mod options;
pub mod outbox;
mod output;
mod registry;
mod retry;
mod rows;
mod runtime;
pub mod stats;
mod store;
mod trace;
#[cfg(feature = "web")]
pub mod web;

pub use context::{InTransaction, JobContext};
pub use error::{Classification, Classify, Disposition, Error, JobError};
pub use flow::limits::{KindLimits, Rate};
pub use ids::{JobState, UnknownState};
pub use job::{
    Conn, DecodeError, EnqueueBuilder, Enqueued, Job, JobId, MAX_IDEMPOTENCY_KEY_LEN, MAX_KIND_LEN,
    MAX_PAYLOAD_BYTES, MAX_QUEUE_LEN, MIN_LEASE, Replace, Unique, UniqueState, Upgrade,
};
/// Declares a job from an async handler.
///
/// ```no_run
/// use jobq::JobContext;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// pub struct InvoiceArgs { pub invoice_id: i64, pub email: String }
///
/// #[derive(Debug, thiserror::Error, jobq::Classify)]
/// pub enum InvoiceError {
///     #[error("rate limited")]
///     #[jobq(code = "rate_limited", retry_after = wait)]
///     RateLimited { wait: std::time::Duration },
///     #[error("invoice {0} not found")]
///     #[jobq(permanent, code = "invoice_missing")]
///     Missing(i64),
/// }
///
/// /// Sends an invoice by mail.
/// #[jobq::job(
///     kind = "send_invoice",          // default: the function's name
///     retry = "exp(max=10,jitter)",   // or "fixed(30s,max=5)", "none"
///     idempotency = invoice_id,       // a field of the args type
///     queue = "mail",                 // default: "default"
///     priority = -1,                  // smaller runs first; default 0
///     lease = "2m",                   // default 60s
///     timeout = "5m",                 // default: no limit
/// )]
/// pub async fn send_invoice(ctx: jobq::JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
///     let _ = (ctx.attempt(), args.email);
///     Ok(())
/// }
///
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// let mut tx = pool.begin().await?;
/// SendInvoice::enqueue(&mut tx, InvoiceArgs { invoice_id: 42, email: "a@b.c".into() }).await?;
/// SendInvoice::with(InvoiceArgs { invoice_id: 43, email: "a@b.c".into() })
///     .run_in(std::time::Duration::from_secs(60))
///     .priority(-5)
///     .enqueue(&mut *tx)
///     .await?;
/// SendInvoice::enqueue_many(&mut *tx, (44..50).map(|invoice_id| InvoiceArgs {
///     invoice_id,
///     email: "a@b.c".into(),
/// }))
/// .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # The handler
///
/// An `async fn` taking `(ctx: JobContext, args: Args)`, or just `(args: Args)`, and
/// returning `Result<T, E>` where `E` implements [`Classify`](trait@Classify) (derive it,
/// or use [`JobError`]) and `T` is discarded. `Args` must be `Serialize +
/// DeserializeOwned + Send + 'static`, and the returned future `Send`. Not allowed:
/// `self`, generics, more than two parameters. The function stays as written, so unit
/// tests can call it directly.
///
/// # Keys
///
/// | key | value | default |
/// | --- | --- | --- |
/// | `kind` | the stable name stored in `jobs.kind`, `"send_invoice"` | the function's name |
/// | `name` | the generated type, `SendInvoiceJob` | the PascalCase of the function's name |
/// | `retry` | `"exp(max=N[,base=D][,cap=D][,jitter])"`, `"fixed(D[,max=N])"` or `"none"` | `exp(max=25,jitter)`, base 1 s, cap 1 h |
/// | `idempotency` | a field of the args type; its `to_string()` is the key | no key |
/// | `queue` | `"mail"` | `"default"` |
/// | `priority` | an `i16`, smaller runs first | `0` |
/// | `lease` | a duration, at least `"300ms"` | `"60s"` |
/// | `timeout` | a duration | no limit |
/// | `cron` | a cron expression (5 fields, or 6 with seconds first); the kind is periodic, its args `()` or `Default` | not periodic |
/// | `tz` | an IANA zone for `cron`, `"Europe/Berlin"` | `"UTC"` |
/// | `every` | a duration; periodic at multiples of it since the epoch | not periodic |
/// | `missed` | `"skip"`, `"once"` or `"all(max = N)"`: slots that passed while no node ran | `"once"` |
/// | `unique` | `unique(by = [fields], period = D, states = [pending, running, …])`, each part optional | not unique |
/// | `debounce` | a duration: each enqueue replaces the pending job's args and pushes it to now + D | none |
/// | `max_age` | a duration: not done by then, the job fails with code `expired` | no limit |
/// | `version` | the payload version stored, at least 1; older rows decode through [`macro@upgrade`]s | `1` |
/// | `crate` | the path jobq is reachable at, `"::my_deps::jobq"` | `"::jobq"` |
///
/// `N` counts every attempt, the first included (at least 1). A duration `D` is a whole
/// number and a unit: `500ms`, `30s`, `5m`, `1h`. `idempotency` keys by `to_string()`
/// of the field, so the field must implement `Display` (an `Option` does not: key by a
/// field that is always present, or set `EnqueueBuilder::idempotency_key` per enqueue).
///
/// # What it generates
///
/// A unit struct (`SendInvoice`) with the function's visibility and doc comments,
/// implementing [`Job`]; inherent `enqueue(conn, args)`, `with(args)` (an
/// [`EnqueueBuilder`]) and `enqueue_many(conn, iter)`, usable without `use jobq::Job`;
/// and an `inventory` registration, so [`Runtime::builder`] serves the job with nothing
/// registered by hand. Two jobs with one kind make [`RuntimeBuilder::build`] fail with
/// [`Error::DuplicateKind`]. A `#[cfg]` on the function applies to all of it.
///
/// Every mistake in the keys or the signature is a compile error at the offending
/// token, saying what is allowed.
#[doc(inline)]
pub use jobq_macros::job;
pub use maintenance::{Missed, Schedule};

/// Declares an upgrade of a job's payload from version `from` to the next:
/// `#[jobq::upgrade(from = 1)] fn v1_to_v2(old: InvoiceArgsV1) -> InvoiceArgs`. It
/// implements [`Upgrade<1>`](Upgrade) for the returned type; a `#[job(version = N)]`
/// chains the upgrades `1 → 2 → … → N` to decode old rows, and a gap in the chain is a
/// compile error at `version`.
///
/// ```
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct InvoiceArgsV1 { id: i64 }
/// #[derive(Serialize, Deserialize)]
/// struct InvoiceArgs { id: i64, currency: String }
///
/// #[jobq::upgrade(from = 1)]
/// fn v1_to_v2(old: InvoiceArgsV1) -> InvoiceArgs {
///     InvoiceArgs { id: old.id, currency: "EUR".into() }
/// }
///
/// #[jobq::job(kind = "send_invoice_v", version = 2)]
/// async fn send_invoice(args: InvoiceArgs) -> Result<(), jobq::JobError> {
///     let _ = (args.id, args.currency);
///     Ok(())
/// }
/// ```
#[doc(inline)]
pub use jobq_macros::upgrade;

/// Derives [`Classify`](trait@Classify) for an error enum or struct.
///
/// ```
/// use std::time::Duration;
/// use jobq::{Classify, Disposition};
///
/// #[derive(Debug, thiserror::Error, jobq::Classify)]
/// pub enum InvoiceError {
///     #[error("mail provider unavailable")]
///     #[jobq(retryable, code = "provider_unavailable")]
///     ProviderDown,
///     #[error("rate limited")]
///     #[jobq(retryable, code = "rate_limited", retry_after = wait)]
///     RateLimited { wait: Duration },
///     #[error("invoice {0} not found")]
///     #[jobq(permanent, code = "invoice_missing")]
///     Missing(i64),
///     #[error("customer unsubscribed")]
///     #[jobq(cancel)]
///     Unsubscribed,
///     #[error(transparent)]
///     Io(#[from] std::io::Error), // unannotated: retryable, code "io"
/// }
///
/// let c = InvoiceError::RateLimited { wait: Duration::from_secs(30) }.classify();
/// assert_eq!(c.disposition, Disposition::Retryable);
/// assert_eq!(c.code, "rate_limited");
/// assert_eq!(c.retry_after, Some(Duration::from_secs(30)));
/// assert_eq!(InvoiceError::Missing(1).classify().disposition, Disposition::Permanent);
/// assert_eq!(InvoiceError::Io(std::io::Error::other("x")).classify().code, "io");
///
/// // On a struct, the attribute goes on the type.
/// #[derive(Debug, thiserror::Error, jobq::Classify)]
/// #[error("upstream busy")]
/// #[jobq(code = "busy", retry_after = 0)]
/// pub struct Busy(pub Option<Duration>);
/// assert_eq!(Busy(None).classify().code, "busy");
/// ```
///
/// Keys of `#[jobq(...)]`, on each variant of an enum or on a struct:
///
/// - `retryable` (the default), `permanent` (straight to `failed`) or `cancel` (to
///   `cancelled`); at most one.
/// - `code = "..."`: the stable code stored in `jobs.last_error_code`; the default is the
///   snake_case of the variant's (or struct's) name.
/// - `retry_after = field`: a field (a name, or a tuple index like `0`) of type
///   `Duration` or `Option<Duration>`; the next attempt waits exactly that long instead
///   of the job's backoff. Retryable failures only.
/// - `crate = "path"`, on the enum or struct itself, when jobq is reachable under
///   another path.
#[doc(inline)]
pub use jobq_macros::Classify;
/// Derives [`outbox::EventData`] for a struct with named fields: a typed outbox event
/// whose type is declared once.
///
/// ```no_run
/// use serde::Serialize;
///
/// #[derive(Serialize, jobq::Event)]
/// #[event(type = "order_paid", aggregate = order_id, version = version)]
/// struct OrderPaid { order_id: i64, version: i64, amount_cents: i64 }
///
/// # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// let mut tx = pool.begin().await?;
/// let paid = OrderPaid { order_id: 123, version: 7, amount_cents: 990 };
/// jobq::outbox::publish(&mut tx, &paid).await?; // type "order_paid", aggregate ("order", "123", 7)
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// Keys of `#[event(...)]`: `type = "..."` (required), `aggregate = field` (its
/// `to_string()` is the aggregate id) with `version = field` (an integer convertible to
/// `i64`), `aggregate_type = "..."` (default: the aggregate field's name without `_id`),
/// and `crate = "path"`.
#[doc(inline)]
pub use jobq_macros::Event;
pub use migrate::{MIGRATIONS, Migration, migrate};
pub use outbox::inbox;
pub use output::MAX_OUTPUT_BYTES;
pub use registry::Failure;
// Hooks for `jobq-testing` and the macros' output, not part of the interface users hold.
#[doc(hidden)]
pub use registry::{JobHandler, Registration, registered_jobs};
pub use retry::{DEFAULT_MAX_ATTEMPTS, RetryPolicy};
// The failed attempt's decision, shared by the runtime and `jobq-testing`'s inline runner.
#[doc(hidden)]
pub use retry::{NextState, next_state};
pub use runtime::{
    AttemptOutcome, DEFAULT_CONCURRENCY, DEFAULT_PREFETCH, Runtime, RuntimeBuilder, RuntimeHandle,
    ShutdownReport,
};
// Test hooks `jobq-testing` builds on (`Runtime::drain`, one attempt outside the runtime).
#[doc(hidden)]
pub use runtime::{DrainReport, DrainedAttempt, run_attempt, run_attempt_versioned};

/// The statements `jobq-testing` issues, kept with every other statement in `store`;
/// not part of the public API.
#[doc(hidden)]
pub mod __testing {
    pub use crate::store::testing::*;
}

/// What generated code needs; not part of the public API.
///
/// The macros name only paths under `::jobq::__private` (or the `crate = "..."`
/// override), so users need none of these crates in their own `Cargo.toml`.
#[doc(hidden)]
pub mod __private {
    use std::borrow::Cow;
    use std::time::Duration;

    pub use crate::context::JobContext;
    pub use crate::context::{OutputOf, RecordOther, RecordSerialize};
    pub use crate::error::{Classification, Classify, Disposition, Error};
    pub use crate::flow::limits::{KindLimits, Rate};
    pub use crate::job::{
        Conn, DecodeError, EnqueueBuilder, Enqueued, Job, MAX_KIND_LEN, MAX_QUEUE_LEN, MIN_LEASE,
        Replace, Unique, UniqueState, Upgrade, decode_as,
    };
    pub use crate::maintenance::{Missed, Schedule};
    pub use crate::outbox::EventData;
    pub use crate::registry::Registration;
    pub use crate::retry::RetryPolicy;
    pub use async_trait;
    pub use inventory;
    pub use serde;
    pub use serde_json;
    pub use sqlx;
    pub use std::string::String;

    /// The runtime's claim statement, for the bench to time alone (not API).
    pub const JOB_CLAIM_SQL: &str = crate::store::JOB_CLAIM_SQL;

    /// What a handler's first parameter may be: the attempt's [`JobContext`], by value.
    #[diagnostic::on_unimplemented(
        message = "the first parameter of a `#[job]` handler must be `JobContext`, not `{Self}`",
        label = "expected `JobContext` here",
        note = "take the context by value, `ctx: JobContext` (clones are cheap), or leave the parameter out and take only the args"
    )]
    pub trait HandlerContext {
        /// The parameter, from the attempt's context.
        fn from_context(ctx: JobContext) -> Self;
    }

    impl HandlerContext for JobContext {
        fn from_context(ctx: JobContext) -> Self {
            ctx
        }
    }

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

    /// The aggregate id of a `#[derive(Event)]`: the field's `to_string()`.
    #[diagnostic::on_unimplemented(
        message = "the `aggregate` field must implement `Display`, which gives the aggregate id"
    )]
    pub trait AggregateId {
        /// The id as text.
        fn aggregate_id(&self) -> String;
    }

    impl<T: std::fmt::Display + ?Sized> AggregateId for T {
        fn aggregate_id(&self) -> String {
            self.to_string()
        }
    }

    /// The `aggregate` field's id.
    pub fn event_aggregate_id<T: AggregateId + ?Sized>(field: &T) -> String {
        field.aggregate_id()
    }

    /// The `version` field as an `i64`.
    pub fn event_version<T: Copy + Into<i64>>(field: &T) -> i64 {
        (*field).into()
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
