//! The registry: which job types this binary serves, by kind.
//!
//! `#[jobq::job]` submits a [`Registration`] to `inventory`; the runtime collects them at
//! build time, adds the types registered explicitly with
//! [`RuntimeBuilder::register`](crate::RuntimeBuilder::register), and refuses to build when
//! two different types claim one kind.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;

use crate::context::JobContext;
use crate::error::{Classification, Classify, Error};
use crate::job::Job;
use crate::retry::RetryPolicy;

/// A job type's handler with its policies, its type erased so the runtime can hold many.
#[derive(Clone)]
pub struct JobHandler {
    inner: Arc<dyn ErasedJob>,
}

impl fmt::Debug for JobHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandler")
            .field("kind", &self.kind())
            .field("type", &self.type_name())
            .field("queue", &self.queue())
            .finish_non_exhaustive()
    }
}

/// A failed attempt as the handler reported it, before the runtime decides what happens
/// next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Retryable, permanent or cancel, with a stable code and an optional Retry-After.
    pub class: Classification,
    /// The error's `Display`, for people.
    pub message: String,
}

trait ErasedJob: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn type_name(&self) -> &'static str;
    fn queue(&self) -> &'static str;
    fn lease(&self) -> Duration;
    fn timeout(&self) -> Option<Duration>;
    fn retry(&self) -> RetryPolicy;
    fn check(&self, payload: &str) -> Result<(), String>;
    fn run(&self, ctx: JobContext, payload: String) -> BoxFuture<'static, Result<(), Failure>>;
}

struct Typed<J>(std::marker::PhantomData<fn() -> J>);

impl<J: Job> ErasedJob for Typed<J> {
    fn kind(&self) -> &'static str {
        J::KIND
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<J>()
    }
    fn queue(&self) -> &'static str {
        J::QUEUE
    }
    fn lease(&self) -> Duration {
        J::LEASE
    }
    fn timeout(&self) -> Option<Duration> {
        J::TIMEOUT
    }
    fn retry(&self) -> RetryPolicy {
        J::RETRY
    }
    fn check(&self, payload: &str) -> Result<(), String> {
        decode_args::<J::Args>(J::KIND, payload).map(drop)
    }
    fn run(&self, ctx: JobContext, payload: String) -> BoxFuture<'static, Result<(), Failure>> {
        Box::pin(async move {
            let args: J::Args = decode_args(J::KIND, &payload).map_err(|message| Failure {
                class: Classification::permanent("decode"),
                message,
            })?;
            drop(payload);
            J::run(ctx, args).await.map_err(|e| Failure {
                class: e.classify(),
                message: e.to_string(),
            })
        })
    }
}

impl JobHandler {
    /// The handler of job type `J`.
    pub fn of<J: Job>() -> Self {
        JobHandler {
            inner: Arc::new(Typed::<J>(std::marker::PhantomData)),
        }
    }

    /// The kind it serves.
    pub fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// The Rust type behind it.
    pub fn type_name(&self) -> &'static str {
        self.inner.type_name()
    }

    /// Its default queue.
    pub fn queue(&self) -> &'static str {
        self.inner.queue()
    }

    /// Its lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// Its per-attempt timeout.
    pub fn timeout(&self) -> Option<Duration> {
        self.inner.timeout()
    }

    /// Its retry policy.
    pub fn retry(&self) -> RetryPolicy {
        self.inner.retry()
    }

    /// Whether `payload` decodes as this kind's args; the error says why not.
    ///
    /// # Errors
    ///
    /// The decoding error, for people.
    pub fn check_payload(&self, payload: &serde_json::Value) -> Result<(), String> {
        self.inner.check(&payload.to_string())
    }

    /// Decodes `payload` and runs the handler; no timeout, no panic catching (the
    /// executor adds those).
    pub(crate) fn call(
        &self,
        ctx: JobContext,
        payload: String,
    ) -> BoxFuture<'static, Result<(), Failure>> {
        self.inner.run(ctx, payload)
    }
}

/// Decodes a stored payload as `T`. The error names where decoding stopped (the path into
/// the payload) and what was expected there, never a value: every double-quoted part of
/// serde's message (a string from the payload) is cut, and so is every back-quoted part
/// that is a number or whose text occurs in the payload (a character, an unknown field
/// or variant); an unknown field's name is left out of the path too.
fn decode_args<T: DeserializeOwned>(kind: &str, payload: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(payload);
    let decoded = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut segments: Vec<_> = e.path().iter().collect();
        let inner = e.inner().to_string();
        if inner.starts_with("unknown field") {
            // The last segment is the unknown key itself: the payload's, not the schema's.
            segments.pop();
        }
        let mut path = String::new();
        for segment in &segments {
            let text = segment.to_string();
            if !path.is_empty() && !text.starts_with('[') {
                path.push('.');
            }
            path.push_str(&text);
        }
        if path.is_empty() {
            path.push('.');
        }
        let message = redact(&inner, payload);
        if path == "." {
            format!("payload does not decode as the args of `{kind}`: {message}")
        } else {
            format!("payload does not decode as the args of `{kind}`: at `{path}`: {message}")
        }
    })?;
    // Trailing characters; serde_json's message for them quotes nothing.
    de.end()
        .map_err(|e| format!("payload does not decode as the args of `{kind}`: {e}"))?;
    Ok(decoded)
}

/// `message` with the quoted parts that may come from `payload` replaced by `…`.
fn redact(message: &str, payload: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('"');
        let body = &rest[start + 1..];
        let end = if quote == '"' {
            // Debug-quoted: skip escaped characters.
            let mut escaped = false;
            body.char_indices()
                .find(|&(_, c)| {
                    let close = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    close
                })
                .map(|(i, _)| i)
        } else {
            body.find('`')
        };
        let Some(end) = end else { break };
        let inner = &body[..end];
        out.push_str(&rest[..=start]);
        if quote == '"' || payload.contains(inner) || inner.parse::<f64>().is_ok() {
            out.push('…');
        } else {
            out.push_str(inner);
        }
        out.push(quote);
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    out
}

/// A job type's entry in the binary-wide `inventory`, submitted by `#[jobq::job]`.
#[derive(Debug)]
pub struct Registration {
    make: fn() -> JobHandler,
}

impl Registration {
    /// The registration of job type `J`.
    pub const fn new<J: Job>() -> Self {
        Registration {
            make: JobHandler::of::<J>,
        }
    }

    /// The handler it registers.
    pub fn handler(&self) -> JobHandler {
        (self.make)()
    }
}

inventory::collect!(Registration);

/// Every job type registered through `inventory` in this binary.
pub fn registered_jobs() -> Vec<JobHandler> {
    inventory::iter::<Registration>
        .into_iter()
        .map(Registration::handler)
        .collect()
}

/// Handlers by kind.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    by_kind: BTreeMap<&'static str, JobHandler>,
}

impl Registry {
    /// Adds `handler`; the same type twice is fine, two types for one kind are not.
    pub(crate) fn add(&mut self, handler: JobHandler) -> Result<(), Error> {
        crate::store::validate_name("kind", handler.kind(), crate::job::MAX_KIND_LEN)?;
        crate::store::validate_name("queue", handler.queue(), crate::job::MAX_QUEUE_LEN)?;
        if let Some(existing) = self.by_kind.get(handler.kind()) {
            if existing.type_name() == handler.type_name() {
                return Ok(());
            }
            return Err(Error::DuplicateKind {
                kind: handler.kind().to_owned(),
                first: existing.type_name(),
                second: handler.type_name(),
            });
        }
        self.by_kind.insert(handler.kind(), handler);
        Ok(())
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&JobHandler> {
        self.by_kind.get(kind)
    }

    pub(crate) fn handlers(&self) -> impl Iterator<Item = &JobHandler> {
        self.by_kind.values()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

#[cfg(test)]
mod decode_tests {
    use super::decode_args;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Args {
        n: i64,
        customer: Customer,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Customer {
        email: String,
        tier: Tier,
    }

    #[derive(Debug, serde::Deserialize)]
    enum Tier {
        Gold,
    }

    #[test]
    fn a_decode_error_names_the_path_and_the_type_never_the_value() {
        let bad = [
            r#"{"n": "S3CR3T-1", "customer": {"email": "a@b", "tier": "Gold"}}"#,
            r#"{"n": 1, "customer": {"email": 98765432, "tier": "Gold"}}"#,
            r#"{"n": 1, "customer": {"email": "a@b", "tier": "S3CR3T-2"}}"#,
            r#"{"n": 1, "customer": {"email": "a@b", "tier": "Gold", "S3CR3T-3": 1}}"#,
            r#"{"n": 1.5e3, "customer": {"email": "a@b", "tier": "Gold"}}"#,
        ];
        for payload in bad {
            let e = decode_args::<Args>("k", payload).unwrap_err();
            assert!(!e.contains("S3CR3T"), "{e}");
            assert!(!e.contains("98765432"), "{e}");
            assert!(!e.contains("1500"), "{e}");
            assert!(e.contains("at `"), "{e}");
        }
        let e = decode_args::<Args>("k", bad[0]).unwrap_err();
        assert!(e.contains("at `n`") && e.contains("expected i64"), "{e}");
        let missing = decode_args::<Args>("k", r#"{"n": 1}"#).unwrap_err();
        assert!(missing.contains("missing field `customer`"), "{missing}");
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_decode_errors() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(decode_args::<serde_json::Value>("k", &deep).is_err());
        let e = decode_args::<serde_json::Value>("k", r#"{"n":1e400}"#).unwrap_err();
        assert!(e.contains("number out of range"), "{e}");
    }
}
