//! The macros' expansion under `#![deny(clippy::all, clippy::pedantic)]` (like tokio's
//! `macros_clippy.rs`): `cargo clippy --all-targets -- -D warnings` lints this file, so
//! any lint the generated code triggers in a strict user crate fails CI.
#![deny(clippy::all, clippy::pedantic)]
#![deny(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    unused,
    rust_2018_idioms
)]

use std::time::Duration;

use jobq::{Classify, Disposition, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// The invoice job's args.
#[derive(Debug, Serialize, Deserialize)]
pub struct InvoiceArgs {
    /// The invoice.
    pub invoice_id: i64,
    /// Where it goes.
    pub email: String,
}

/// Why sending an invoice failed.
#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum InvoiceError {
    /// The mail provider is down.
    #[error("mail provider unavailable")]
    #[jobq(retryable, code = "provider_unavailable")]
    ProviderDown,
    /// Slow down.
    #[error("rate limited")]
    #[jobq(retryable, code = "rate_limited", retry_after = wait)]
    RateLimited {
        /// How long.
        wait: Duration,
    },
    /// Throttled, maybe with a hint.
    #[error("throttled")]
    #[jobq(retry_after = 0)]
    Throttled(Option<Duration>),
    /// No such invoice.
    #[error("invoice {0} not found")]
    #[jobq(permanent, code = "invoice_missing")]
    Missing(i64),
    /// The customer left.
    #[error("unsubscribed")]
    #[jobq(cancel)]
    Unsubscribed,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A struct error.
#[derive(Debug, thiserror::Error, jobq::Classify)]
#[error("upstream said later")]
#[jobq(code = "later", retry_after = after)]
pub struct Later {
    /// When.
    pub after: Duration,
}

/// A generic error.
#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum Wrapped<E: std::error::Error + 'static> {
    /// Something inside.
    #[error(transparent)]
    #[jobq(permanent)]
    Inner(E),
}

/// An empty error.
#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum Never {}

/// Sends one invoice.
///
/// # Errors
///
/// As [`InvoiceError`] says.
#[jobq::job(
    kind = "send_invoice",
    retry = "exp(max=10,base=500ms,cap=1h,jitter)",
    idempotency = invoice_id,
    queue = "mail",
    priority = -3,
    lease = "2m",
    timeout = "90s"
)]
pub async fn send_invoice(ctx: JobContext, args: InvoiceArgs) -> Result<(), InvoiceError> {
    if args.invoice_id < 0 {
        return Err(InvoiceError::Missing(args.invoice_id));
    }
    let _ = (ctx.attempt(), args.email);
    Ok(())
}

/// Without a context, returning a value, with a fixed retry.
///
/// # Errors
///
/// Never.
#[jobq::job(retry = "fixed(30s,max=3)", name = CountJob)]
pub async fn count(args: InvoiceArgs) -> Result<usize, JobError> {
    Ok(args.email.len())
}

#[jobq::job(retry = "none")]
async fn private_once(_args: InvoiceArgs) -> Result<(), Later> {
    Ok(())
}

#[jobq::job]
pub(crate) async fn crate_visible(_args: InvoiceArgs) -> Result<(), Wrapped<std::io::Error>> {
    Ok(())
}

#[jobq::job]
async fn never_fails(_ctx: JobContext, _args: InvoiceArgs) -> Result<(), Never> {
    Ok(())
}

/// Version 1 of the report args.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReportV1 {
    /// The customer.
    pub customer: String,
}

/// The report args.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ReportArgs {
    /// The customer.
    pub customer_id: i64,
    /// The customer's name.
    pub name: String,
}

/// Upgrades a version 1 report.
#[jobq::upgrade(from = 1)]
#[must_use]
pub fn report_v1(old: ReportV1) -> ReportArgs {
    ReportArgs {
        customer_id: 0,
        name: old.customer,
    }
}

/// Every key about time and uniqueness at once.
///
/// # Errors
///
/// Never.
#[jobq::job(
    kind = "timed_report",
    version = 2,
    cron = "0 3 * * *",
    tz = "Europe/Berlin",
    missed = "all(max = 2)",
    unique(by = [customer_id], period = "1h", states = [pending]),
    debounce = "30s",
    max_age = "24h"
)]
pub async fn timed_report(args: ReportArgs) -> Result<(), JobError> {
    let _ = (args.customer_id, args.name);
    Ok(())
}

#[test]
fn expansion_is_usable() {
    assert_eq!(SendInvoice::KIND, "send_invoice");
    assert_eq!(SendInvoice::QUEUE, "mail");
    assert_eq!(SendInvoice::PRIORITY, -3);
    assert_eq!(SendInvoice::LEASE, Duration::from_mins(2));
    assert_eq!(SendInvoice::TIMEOUT, Some(Duration::from_secs(90)));
    assert_eq!(CountJob::RETRY.max_attempts(), 3);
    assert_eq!(PrivateOnce::RETRY.max_attempts(), 1);
    assert_eq!(CrateVisible::KIND, "crate_visible");
    assert_eq!(NeverFails::KIND, "never_fails");
    let args = InvoiceArgs {
        invoice_id: 7,
        email: String::new(),
    };
    assert_eq!(SendInvoice::idempotency_key(&args), Some("7".to_owned()));
    let c = InvoiceError::RateLimited {
        wait: Duration::from_secs(2),
    }
    .classify();
    assert_eq!(c.disposition, Disposition::Retryable);
    assert_eq!(c.retry_after, Some(Duration::from_secs(2)));
    assert_eq!(
        InvoiceError::Unsubscribed.classify().disposition,
        Disposition::Cancel
    );
    assert_eq!(InvoiceError::Throttled(None).classify().code, "throttled");
    assert_eq!(
        Later {
            after: Duration::from_secs(1)
        }
        .classify()
        .code,
        "later"
    );
    let kinds: Vec<&str> = jobq::registered_jobs()
        .iter()
        .map(jobq::JobHandler::kind)
        .collect();
    for kind in [
        "send_invoice",
        "count",
        "private_once",
        "crate_visible",
        "never_fails",
        "timed_report",
    ] {
        assert!(kinds.contains(&kind), "{kind} not registered: {kinds:?}");
    }
}
