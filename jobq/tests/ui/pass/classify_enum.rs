//! `#[derive(Classify)]` on an enum: every key, every variant shape, generics, and the
//! defaults (retryable, code = snake_case of the variant).
use std::time::Duration;

use jobq::{Classify, Disposition};

#[derive(Debug, thiserror::Error, jobq::Classify)]
pub enum MailError<E: std::error::Error + 'static> {
    #[error("mail provider unavailable")]
    #[jobq(retryable, code = "provider_unavailable")]
    ProviderDown,
    #[error("rate limited")]
    #[jobq(retryable, code = "rate_limited", retry_after = wait)]
    RateLimited { wait: Duration, attempts: u32 },
    #[error("throttled")]
    #[jobq(retry_after = 1)]
    Throttled(u32, Option<Duration>),
    #[error("invoice {0} not found")]
    #[jobq(permanent, code = "invoice_missing")]
    Missing(i64),
    #[error("unsubscribed")]
    #[jobq(cancel)]
    Unsubscribed,
    #[error("bad address")]
    #[jobq(permanent)]
    BadAddress { address: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("HTTP error")]
    HTTPError,
    #[error(transparent)]
    Other(E),
}

/// An enum without variants is fine too.
#[derive(Debug, jobq::Classify)]
pub enum Never {}

fn check<E: std::error::Error>(e: &MailError<E>, d: Disposition, code: &str, after: Option<u64>) {
    let c = e.classify();
    assert_eq!(c.disposition, d, "{e}");
    assert_eq!(c.code, code, "{e}");
    assert_eq!(c.retry_after, after.map(Duration::from_secs), "{e}");
}

fn main() {
    type E = MailError<std::fmt::Error>;
    use Disposition::*;
    check(&E::ProviderDown, Retryable, "provider_unavailable", None);
    check(
        &E::RateLimited { wait: Duration::from_secs(7), attempts: 1 },
        Retryable,
        "rate_limited",
        Some(7),
    );
    check(&E::Throttled(1, Some(Duration::from_secs(3))), Retryable, "throttled", Some(3));
    check(&E::Throttled(1, None), Retryable, "throttled", None);
    check(&E::Missing(42), Permanent, "invoice_missing", None);
    check(&E::Unsubscribed, Cancel, "unsubscribed", None);
    check(&E::BadAddress { address: "x".into() }, Permanent, "bad_address", None);
    check(&E::Io(std::io::Error::other("x")), Retryable, "io", None);
    check(&E::HTTPError, Retryable, "http_error", None);
    check(&E::Other(std::fmt::Error), Retryable, "other", None);
    let _: Option<Never> = None;
}
