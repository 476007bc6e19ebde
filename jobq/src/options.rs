//! Enqueue options about time and uniqueness: [`Unique`] (a uniqueness window over chosen
//! states), [`Replace`] (debounce: what a duplicate of a pending job replaces), and payload
//! versions ([`Upgrade`], [`DecodeError`]).

use std::time::Duration;

use serde::de::DeserializeOwned;

/// A job state a uniqueness rule may list (`#[job(unique(states = [pending, running]))]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UniqueState {
    /// Waiting to run (including retries in backoff).
    Pending,
    /// Claimed by a worker.
    Running,
    /// Finished successfully.
    Done,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl UniqueState {
    /// The bit `jobq.job_state_in` reads for this state.
    const fn bit(self) -> i16 {
        match self {
            UniqueState::Pending => 1,
            UniqueState::Running => 2,
            UniqueState::Done => 4,
            UniqueState::Failed => 8,
            UniqueState::Cancelled => 16,
        }
    }
}

/// A uniqueness rule: while a job of the same kind and key is in one of `states` (and, with
/// a `period`, was enqueued in the same period bucket), a second enqueue inserts nothing
/// and returns the existing job's id with `duplicate: true`.
///
/// The database decides, through a unique index over (kind, key) restricted to the listed
/// states: it holds under concurrent enqueues on any number of nodes, and the key is free
/// again the moment the holder leaves those states or its transaction rolls back.
///
/// ```
/// use std::time::Duration;
/// use jobq::{Unique, UniqueState};
/// let rule = Unique::new()
///     .period(Duration::from_secs(3600))
///     .states(&[UniqueState::Pending, UniqueState::Running])
///     .key("customer-7");
/// # let _ = rule;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unique {
    states: i16,
    period: Option<Duration>,
    key: Option<String>,
}

impl Default for Unique {
    fn default() -> Self {
        Unique::new()
    }
}

impl Unique {
    /// Unique among pending and running jobs (terminal ones do not block the next), with
    /// no period, keyed by the kind's `unique(by = …)` fields or else by the whole args.
    pub const fn new() -> Self {
        Unique {
            states: UniqueState::Pending.bit() | UniqueState::Running.bit(),
            period: None,
            key: None,
        }
    }

    /// Only jobs enqueued in the same bucket of this length (by the database's clock,
    /// counted from the Unix epoch) are duplicates of each other.
    pub const fn period(mut self, period: Duration) -> Self {
        self.period = Some(period);
        self
    }

    /// The states in which a job holds its key (an empty list means the default).
    pub const fn states(mut self, states: &[UniqueState]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < states.len() {
            bits |= states[i].bit();
            i += 1;
        }
        if bits != 0 {
            self.states = bits;
        }
        self
    }

    /// The key itself, instead of the one derived from the args.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub(crate) fn state_bits(&self) -> i16 {
        self.states
    }

    pub(crate) fn period_secs(&self) -> Option<f64> {
        self.period.map(|p| p.as_secs_f64())
    }

    pub(crate) fn explicit_key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

/// What an enqueue that duplicates a *pending* job replaces in it (debounce), in the same
/// statement: `.on_conflict(Replace::args())`. A duplicate of a running job replaces
/// nothing, and says so: [`Enqueued::replaced`](crate::Enqueued::replaced) is `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replace {
    pub(crate) args: bool,
    pub(crate) run_after: bool,
}

impl Replace {
    /// Replace the pending job's args with the new ones.
    pub const fn args() -> Self {
        Replace {
            args: true,
            run_after: false,
        }
    }

    /// Replace the pending job's `run_after` with the new one.
    pub const fn run_after() -> Self {
        Replace {
            args: false,
            run_after: true,
        }
    }

    /// Replace both the args and the `run_after`.
    pub const fn both() -> Self {
        Replace {
            args: true,
            run_after: true,
        }
    }

    /// This and `other` together: `Replace::args().and(Replace::run_after())`.
    pub const fn and(self, other: Replace) -> Self {
        Replace {
            args: self.args || other.args,
            run_after: self.run_after || other.run_after,
        }
    }
}

/// An upgrade of a payload from version `FROM` to `FROM + 1`, implemented on the newer
/// args type by `#[jobq::upgrade(from = FROM)] fn up(old: Old) -> New`.
///
/// A job of `#[job(version = N)]` decodes a row of version `v < N` by chaining the
/// upgrades `v → v+1 → … → N`; a missing link is a compile error at `version`.
#[diagnostic::on_unimplemented(
    message = "no upgrade of payload version {FROM} to `{Self}`",
    label = "the upgrade chain has a gap here",
    note = "write `#[jobq::upgrade(from = {FROM})] fn up(old: OldArgs) -> {Self} {{ … }}`"
)]
pub trait Upgrade<const FROM: u32>: Sized {
    /// The args type of version `FROM`.
    type From: DeserializeOwned;
    /// Converts an old payload into this version.
    fn upgrade(old: Self::From) -> Self;
}

/// Why a stored payload could not be decoded; the attempt fails permanently with
/// [`code`](Self::code) and the row is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// `decode` (the JSON does not fit the type of its version) or `unknown_version`
    /// (no upgrade path from the row's version).
    pub code: &'static str,
    /// For people.
    pub message: String,
}

impl DecodeError {
    /// A row of `version`, which kind `kind` (at version `current`) cannot upgrade.
    pub fn unknown_version(kind: &str, version: u32, current: u32) -> Self {
        DecodeError {
            code: "unknown_version",
            message: format!(
                "payload version {version} of `{kind}` has no upgrade path to version {current}"
            ),
        }
    }

    /// The payload of `version` does not decode as its type; `detail` says where and
    /// why, without the payload's values.
    pub fn decode(kind: &str, version: u32, detail: &str) -> Self {
        DecodeError {
            code: "decode",
            message: format!(
                "payload (version {version}) does not decode as the args of `{kind}`: {detail}"
            ),
        }
    }
}

/// Decodes `payload` of `version` as `T`, for generated `decode` functions.
///
/// # Errors
///
/// A `decode` [`DecodeError`] when the JSON does not fit `T`.
pub fn decode_as<T: DeserializeOwned>(
    kind: &str,
    version: u32,
    payload: &str,
) -> Result<T, DecodeError> {
    decode_json(payload).map_err(|detail| DecodeError::decode(kind, version, &detail))
}

/// Decodes a stored payload as `T`; the error names where decoding stopped (the path into
/// the payload) and what was expected there, never a value: every double-quoted part of
/// serde's message (a string from the payload) is cut, and so is every back-quoted part
/// that is a number or whose text occurs in the payload (a character, an unknown field
/// or variant); an unknown field's name is left out of the path too.
fn decode_json<T: DeserializeOwned>(payload: &str) -> Result<T, String> {
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
            message
        } else {
            format!("at `{path}`: {message}")
        }
    })?;
    // Trailing characters; serde_json's message for them quotes nothing.
    de.end().map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod decode_tests {
    use super::decode_json;

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
            let e = decode_json::<Args>(payload).unwrap_err();
            assert!(!e.contains("S3CR3T"), "{e}");
            assert!(!e.contains("98765432"), "{e}");
            assert!(!e.contains("1500"), "{e}");
            assert!(e.contains("at `"), "{e}");
        }
        let e = decode_json::<Args>(bad[0]).unwrap_err();
        assert!(e.contains("at `n`") && e.contains("expected i64"), "{e}");
        let missing = decode_json::<Args>(r#"{"n": 1}"#).unwrap_err();
        assert!(missing.contains("missing field `customer`"), "{missing}");
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_decode_errors() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(decode_json::<serde_json::Value>(&deep).is_err());
        let e = decode_json::<serde_json::Value>(r#"{"n":1e400}"#).unwrap_err();
        assert!(e.contains("number out of range"), "{e}");
    }
}
