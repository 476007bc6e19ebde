//! Leaf data types every room may use: what jobq hands back about jobs (an enqueue's
//! result, a job's columns, its audit trail, the jobs an action changed). `store/` fills
//! them; `admin`, `stats`, the CLI and the dashboard read them.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ids::{JobId, JobState};

/// The result of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id: the new row's, or for a duplicate the existing row's.
    pub id: JobId,
    /// `true` when the idempotency key or the uniqueness rule matched an existing job and
    /// nothing was inserted.
    pub duplicate: bool,
    /// `true` when a duplicate replaced the existing pending job's args or `run_after`
    /// ([`Replace`](crate::Replace), debounce); `false` otherwise, as for a duplicate of a running job.
    pub replaced: bool,
}

/// One job an action changed: its id and its state before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// The job's id.
    pub id: JobId,
    /// Its state before the action.
    pub before: JobState,
    /// Its state after the action (`running` for a cancel requested of a running job).
    pub after: JobState,
}

/// Every column of one job.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct JobRow {
    /// The id.
    pub id: JobId,
    /// The kind.
    pub kind: String,
    /// The queue.
    pub queue: String,
    /// The arguments, parsed; `null` when the stored text does not parse (nesting deeper
    /// than serde_json's limit, a number out of `f64`'s range): read `payload_text` then.
    #[sqlx(skip)]
    pub payload: serde_json::Value,
    /// The arguments exactly as the database prints them, whether or not they parse.
    pub payload_text: String,
    /// The payload's schema version.
    pub payload_version: i32,
    /// Its state.
    pub state: JobState,
    /// Smaller runs first.
    pub priority: i16,
    /// Attempts started so far.
    pub attempts: i32,
    /// The attempt budget.
    pub max_attempts: i32,
    /// Not before this time.
    pub run_after: DateTime<Utc>,
    /// The running attempt's lease.
    pub locked_until: Option<DateTime<Utc>>,
    /// The worker holding the lease.
    pub locked_by: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The last failure's stable code.
    pub last_error_code: Option<String>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// The bounded error history: `[{attempt, at, code, message, disposition}, …]`.
    pub errors: serde_json::Value,
    /// An operator asked to cancel it while it ran.
    pub cancel_requested: bool,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// The last attempt started at.
    pub started_at: Option<DateTime<Utc>>,
    /// The first failure.
    pub first_failed_at: Option<DateTime<Utc>>,
    /// The last failure.
    pub last_failed_at: Option<DateTime<Utc>>,
    /// Reached a terminal state at.
    pub finished_at: Option<DateTime<Utc>>,
    /// What the handler's `Ok(value)` returned (recorded output), if anything.
    pub output: Option<serde_json::Value>,
    /// The ordering key's scope (the kind, or `ordering_scope`), for an ordered job.
    pub ordering_scope: Option<String>,
    /// The ordering key, for an ordered job.
    pub ordering_key: Option<String>,
    /// The job of the same key this one waits behind, while it waits.
    pub blocked_by: Option<JobId>,
    /// A failed job that `unpark --skip-failed` made stop blocking its key.
    pub ordering_skipped: bool,
    /// The failed job of the same key this one is parked behind, while it is.
    pub parked_behind: Option<JobId>,
    /// The W3C trace context the job was enqueued in (`{"traceparent": …}`), captured with
    /// the `otel` feature.
    pub trace_context: Option<serde_json::Value>,
}

impl JobRow {
    /// The trace id (32 lowercase hex digits) of the trace the job was enqueued in, if
    /// its trace context was captured.
    pub fn trace_id(&self) -> Option<String> {
        self.trace_context.as_ref().and_then(traceparent_id)
    }
}

/// The trace id (32 hex digits) of a stored context's `traceparent`
/// (`00-<trace id>-<span id>-<flags>`), if it has a well-formed one.
fn traceparent_id(stored: &serde_json::Value) -> Option<String> {
    let parent = stored.get("traceparent")?.as_str()?;
    let mut parts = parent.split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    let valid = id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && id.bytes().any(|b| b != b'0');
    valid.then(|| id.to_ascii_lowercase())
}

/// One row of `jobq.job_audit`.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct AuditRow {
    /// The audit row's id.
    pub id: i64,
    /// The job acted on (`None` for queue actions and prune passes).
    pub job_id: Option<JobId>,
    /// `replay`, `cancel`, `cancel_requested`, `retry_now`, `edit_payload`, `pause`,
    /// `resume` or `prune`.
    pub action: String,
    /// Who acted.
    pub actor: String,
    /// Why, as given.
    pub reason: Option<String>,
    /// The state before.
    pub before_state: Option<String>,
    /// The state after.
    pub after_state: Option<String>,
    /// Action-specific detail (the queue, the payload before and after, counts, …).
    pub detail: Option<serde_json::Value>,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// A failed or cancelled job, as `jobq failed` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct TerminalJob {
    /// The id.
    pub id: JobId,
    /// The kind.
    pub kind: String,
    /// The queue.
    pub queue: String,
    /// `failed` or `cancelled`.
    pub state: JobState,
    /// Attempts made.
    pub attempts: i32,
    /// The last failure's stable code.
    pub last_error_code: Option<String>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// Reached its terminal state at.
    pub finished_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::traceparent_id;

    #[test]
    fn reads_the_trace_id_of_a_traceparent() {
        let stored = serde_json::json!({
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        });
        assert_eq!(
            traceparent_id(&stored).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"traceparent": "garbage"}),
            serde_json::json!({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}),
            serde_json::json!({"traceparent": 7}),
        ] {
            assert_eq!(traceparent_id(&bad), None, "{bad}");
        }
    }
}
