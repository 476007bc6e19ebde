//! Every SQL statement jobq issues, one function each, named `noun_verb`.
//!
//! No other module of jobq issues SQL (`notify` only LISTENs, through sqlx's
//! `PgListener`); `jobq-testing`'s statements are here too, in `testing`. Functions take
//! the narrowest executor they need (`&mut PgConnection` or `&PgPool`), never commit a
//! transaction they did not open, and take "now" as a parameter (`coalesce($n, now())`)
//! where the clock matters, so tests can move time without sleeping. `None` means the
//! database's clock.
//!
//! The statements fenced by an attempt's `(id, lease generation)`, and the updates of
//! the promoter and the reaper that join their chosen rows back by primary key, test
//! the state as `(state = 'running') IS TRUE` (or `'scheduled'`): that form implies no
//! partial index's predicate, so the planner cannot read the rows through the partial
//! index of that state, which statistics taken while the state was empty make look free
//! (an idle queue analyzed, then a burst: each fence check read every running job, and
//! a promotion of 1,000 jobs among 100,000 scheduled took 24 s in a nested loop).

/// SQL naming the database a statement runs in: its name and the start time of its
/// server, so that two servers with a database of the same name are told apart. The time
/// is in epoch seconds, so the session's time zone and date style do not change the text
/// (`date_part`'s float8, cheaper to print than `extract`'s numeric).
macro_rules! database_sql {
    () => {
        "(current_database() || ' ' || date_part('epoch', pg_postmaster_start_time())::text)"
    };
}

/// The NOTIFY channel enqueue wakes producers on; the payload is the queue name.
macro_rules! notify_channel {
    () => {
        "jobq_insert"
    };
}

/// SQL that wakes the producers of the queues in the `text[]` at `$queues`, less those
/// named in the `text[]` at `$recent` (NULL: none) for this statement's database, as
/// `queue || chr(31) || db` with `db` as [`database_sql!`] names it. An expression (the
/// count of notifications sent), so a statement sends them by selecting it. PostgreSQL
/// delivers them when the transaction commits, once per queue however often notified.
macro_rules! wake_sql {
    ($queues:literal, $recent:literal) => {
        concat!(
            "(SELECT count(pg_notify('",
            notify_channel!(),
            "', q)) FROM unnest(",
            $queues,
            "::text[]) q WHERE NOT (q || chr(31) || ",
            database_sql!(),
            ") = ANY(coalesce(",
            $recent,
            "::text[], '{}')))"
        )
    };
}

/// [`wake_sql!`] for a single job's statement: wakes the queue in the `text` at `$queue`
/// (NULL: none) unless `$recent` names it for this database. A scalar `CASE` rather than
/// a subquery: a sub-select in a one-row insert cost about a tenth of its throughput.
macro_rules! wake_one_sql {
    ($queue:literal, $recent:literal) => {
        concat!(
            "(CASE WHEN ",
            $queue,
            "::text IS NOT NULL AND NOT (",
            $queue,
            " || chr(31) || ",
            database_sql!(),
            ") = ANY(coalesce(",
            $recent,
            "::text[], '{}')) THEN num_nonnulls(pg_notify('",
            notify_channel!(),
            "', ",
            $queue,
            ")) ELSE 0 END)"
        )
    };
}

/// The columns `woke` ([`wake_sql!`]) and `db` ([`database_sql!`]) of a batch insert's
/// result, on its first input row only (`i.ord = 1`), so the batch notifies once, and
/// only if its CTE `ins` inserted a row: a batch of duplicates wakes no one, and its
/// `db` is NULL, so the enqueue does not count it as a wake-up for the cooldown.
macro_rules! wake_columns_sql {
    ($queues:literal, $recent:literal) => {
        concat!(
            "CASE WHEN i.ord = 1 AND EXISTS (SELECT 1 FROM ins) THEN ",
            wake_sql!($queues, $recent),
            " END AS woke, CASE WHEN i.ord = 1 AND EXISTS (SELECT 1 FROM ins) THEN ",
            database_sql!(),
            " END AS db"
        )
    };
}

/// SQL for the state a new job starts in, given the expression of its `run_after`:
/// `scheduled` when that is in the future by the database's clock, else `pending`.
macro_rules! state_sql {
    ($($at:tt)+) => {
        concat!(
            "(CASE WHEN ",
            $($at)+,
            " > now() THEN 'scheduled' ELSE 'pending' END)"
        )
    };
}

/// An `INSERT` of one `jobq.outbox` row from seven parameters: id (uuid), event type,
/// aggregate type, aggregate id, aggregate version (int8), payload (JSON text) and
/// headers (JSON text, NULL for none), as [`NewEvent::bind`] binds them. The same row
/// `jobq.publish` writes; `outbox_insert` sends it alone, and an enqueue that carries an
/// event puts it in a CTE of its own statement.
macro_rules! outbox_row_sql {
    ($id:literal, $type:literal, $at:literal, $ai:literal, $av:literal, $payload:literal,
     $headers:literal) => {
        concat!(
            "INSERT INTO jobq.outbox (id, event_type, aggregate_type, aggregate_id, ",
            "aggregate_version, agg_key, payload, headers) VALUES (",
            $id,
            "::uuid, ",
            $type,
            "::text, ",
            $at,
            "::text, ",
            $ai,
            "::text, ",
            $av,
            "::int8, coalesce(",
            $at,
            " || ':' || ",
            $ai,
            ", 'event:' || ",
            $id,
            "::text), ",
            $payload,
            "::text::jsonb, coalesce(",
            $headers,
            "::text::jsonb, '{}'))"
        )
    };
}

/// The `SET` of a claim's `UPDATE jobq.jobs j`: running, one more attempt, a new lease
/// generation, the lease of the kind (`s.lease`, from the `served` CTE), the worker and
/// the clock at the given parameters. Every claim (`job_claim`, `claim_apply`,
/// `claim_kind_wide`) uses it, so a claimed row is the same whichever claimed it.
macro_rules! claim_set_sql {
    ($worker:literal, $now:literal) => {
        concat!(
            "SET state = 'running', attempts = j.attempts + 1, lease_gen = j.lease_gen + 1, ",
            "locked_until = coalesce(",
            $now,
            ", now()) + make_interval(secs => s.lease), locked_by = ",
            $worker,
            ", started_at = coalesce(",
            $now,
            ", now())"
        )
    };
}

/// The `RETURNING` of a claim, as `claimed_from_rows` reads it (`claim_kind_wide` pads the
/// same columns with NULLs in a UNION: keep the two in step).
macro_rules! claim_returning_sql {
    () => {
        r#"
        RETURNING j.id, j.lease_gen, j.attempts, j.max_attempts, j.kind, j.queue,
                  j.payload::text AS payload, j.priority, j.created_at, j.payload_version,
                  j.trace_context::text AS trace_context,
                  greatest(extract(epoch FROM j.started_at - j.run_after), 0)::float8 AS wait_secs,
                  j.run_after
        "#
    };
}

mod admin;
mod browse;
mod effects;
mod jobs;
mod lease;
mod limits;
mod migrations;
mod ordering;
#[cfg(test)]
mod ordering_tests;
mod outbox;
mod promote;
mod prune;
#[cfg(test)]
mod scale_tests;
mod schedules;
mod stats;
pub(crate) mod testing;
#[cfg(test)]
mod tests;
mod unique;
mod workers;

pub use crate::rows::{AuditRow, JobRow, TerminalJob, Transition};
pub(crate) use admin::*;
pub(crate) use browse::*;
pub use browse::{FailedGroup, JobSummary, MinuteCount};
pub(crate) use effects::*;
pub(crate) use jobs::*;
pub use lease::ReapReport;
pub(crate) use lease::*;
pub(crate) use limits::*;
pub use limits::{LimitRow, LimitUsage};
pub(crate) use migrations::*;
pub(crate) use ordering::*;
pub use ordering::{ParkedKey, Unparked};
pub(crate) use outbox::*;
pub use outbox::{
    Aggregate, EventParam, InboxOutcome, OutboxEvent, OutboxLag, PublishFailures, StuckEvent,
};
pub(crate) use promote::*;
pub(crate) use prune::*;
pub use schedules::ScheduleRow;
pub(crate) use schedules::*;
pub(crate) use stats::*;
pub(crate) use unique::*;
pub(crate) use workers::*;

use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::limits::{MAX_IDEMPOTENCY_KEY_LEN, MAX_KIND_LEN, MAX_PAYLOAD_BYTES, MAX_QUEUE_LEN};

/// The NOTIFY channel enqueue wakes producers on; the payload is the queue name.
pub(crate) const NOTIFY_CHANNEL: &str = notify_channel!();

/// How an insert wakes producers: it notifies each of `queues` (those of its due jobs)
/// but the ones in `recent` (see [`wake_sql!`]), inside its own statement. The default
/// wakes no one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wake<'a> {
    pub(crate) queues: &'a [String],
    pub(crate) recent: &'a [String],
}

/// The database an insert ran in, as [`database_sql!`] names it, when it could wake
/// producers (its `db` column; `None` for a batch that inserted nothing).
pub(crate) type Db = Option<String>;

/// How many entries of `jobs.errors` are kept; older ones are dropped.
pub(crate) const ERROR_HISTORY_LEN: i32 = 20;

/// The longest error message stored; longer ones are cut.
pub(crate) const MAX_ERROR_MESSAGE_LEN: usize = 4000;

/// A validated job ready for insertion.
#[derive(Debug, Clone)]
pub(crate) struct NewJob {
    pub(crate) kind: String,
    pub(crate) queue: String,
    /// Serialized JSON.
    pub(crate) payload: String,
    pub(crate) priority: i16,
    pub(crate) max_attempts: i32,
    pub(crate) run_after: Option<DateTime<Utc>>,
    pub(crate) delay_secs: Option<f64>,
    pub(crate) idempotency_key: Option<String>,
    /// Payload version, uniqueness, maximum age (`0005_time`).
    pub(crate) time: TimeOpts,
    /// The enqueuing span's W3C trace context, as a JSON object (`0010_traces`).
    pub(crate) trace_context: Option<String>,
    /// The ordering key (`0008_ordering`), if the job has one.
    pub(crate) ordering: Option<NewOrdering>,
}

impl NewJob {
    /// Whether the plain inserts of `jobs.rs` can write the job: it carries none of the
    /// options only the general insert of `unique.rs` writes.
    pub(crate) fn is_plain(&self) -> bool {
        self.time.is_plain() && self.trace_context.is_none()
    }

    /// Whether the job is due at once (no future `run_after` or delay), so that waking
    /// its queue's producers is worth it. Scheduled jobs are found by polling.
    pub(crate) fn due_now(&self) -> bool {
        match self.run_after {
            Some(at) => at <= Utc::now(),
            None => self.delay_secs.is_none_or(|d| d <= 0.0),
        }
    }

    /// The queues of `jobs` due at once, each once: those an insert of them wakes.
    pub(crate) fn due_queues(jobs: &[NewJob]) -> Vec<String> {
        let mut queues: Vec<String> = Vec::new();
        for job in jobs.iter().filter(|j| j.due_now()) {
            if !queues.contains(&job.queue) {
                queues.push(job.queue.clone());
            }
        }
        queues
    }

    /// Rejects what the database would reject, with a stable code instead of a
    /// constraint name.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        validate_name("kind", &self.kind, MAX_KIND_LEN)?;
        validate_name("queue", &self.queue, MAX_QUEUE_LEN)?;
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::invalid(
                "payload_too_large",
                format!(
                    "payload of kind `{}` is {} bytes; the limit is {} bytes (store large data elsewhere and enqueue a reference)",
                    self.kind,
                    self.payload.len(),
                    MAX_PAYLOAD_BYTES
                ),
            ));
        }
        if has_escaped_nul(&self.payload) {
            return Err(Error::invalid(
                "nul_in_payload",
                format!(
                    "payload of kind `{}` contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store",
                    self.kind
                ),
            ));
        }
        check_decodable(&self.kind, &self.payload)?;
        if self.max_attempts < 1 {
            return Err(Error::invalid(
                "invalid_max_attempts",
                format!("max_attempts must be at least 1, got {}", self.max_attempts),
            ));
        }
        if let Some(key) = &self.idempotency_key
            && key.contains('\0')
        {
            return Err(Error::invalid(
                "invalid_idempotency_key",
                "idempotency key contains a NUL character, which PostgreSQL's text cannot store",
            ));
        }
        if let Some(key) = &self.idempotency_key
            && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN)
        {
            return Err(Error::invalid(
                "invalid_idempotency_key",
                format!(
                    "idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} bytes, got {}",
                    key.len()
                ),
            ));
        }
        if let Some(o) = &self.ordering {
            validate_ordering(o)?;
        }
        if let Some(at) = self.run_after {
            // PostgreSQL's timestamptz spans 4713 BC (chrono's year -4712) to 294276 AD;
            // chrono's range is wider. Whole years inside it, to stay clear of both ends.
            let year = chrono::Datelike::year(&at);
            if !(-4711..=294_275).contains(&year) {
                return Err(Error::invalid(
                    "run_after_out_of_range",
                    format!("run_after {at} is outside the range PostgreSQL can store"),
                ));
            }
        }
        if let Some(d) = self.delay_secs {
            // About 1,000 years: far beyond any sane delay, far inside interval's range.
            if !d.is_finite() || !(0.0..=3.2e10).contains(&d) {
                return Err(Error::invalid(
                    "run_after_out_of_range",
                    format!("delay of {d} seconds is out of range"),
                ));
            }
        }
        Ok(())
    }
}

/// The deepest nesting of arrays and objects serde_json decodes (its recursion limit
/// is 128 levels).
pub(crate) const MAX_PAYLOAD_DEPTH: usize = 127;

/// Refuses a payload the runtime could not decode: nesting deeper than serde_json's
/// recursion limit, or a number outside `f64`'s range (checked by a full parse only when
/// the payload has a number with an exponent or of many digits, which Rust values
/// serialized by serde_json almost never have).
fn check_decodable(kind: &str, json: &str) -> Result<(), Error> {
    let (depth, odd_numbers) = scan_json(json);
    if depth > MAX_PAYLOAD_DEPTH {
        return Err(Error::invalid(
            "payload_too_deep",
            format!(
                "payload of kind `{}` nests {depth} levels deep; the limit is {MAX_PAYLOAD_DEPTH} (serde_json could not decode it)",
                bounded(kind)
            ),
        ));
    }
    if odd_numbers && let Err(e) = serde_json::from_str::<serde_json::Value>(json) {
        return Err(Error::invalid(
            "payload_undecodable",
            format!("payload of kind `{}` would not decode: {e}", bounded(kind)),
        ));
    }
    Ok(())
}

/// The deepest nesting of `json` (outside strings), and whether it has a number with an
/// exponent or of more than 15 digits.
fn scan_json(json: &str) -> (usize, bool) {
    let (mut depth, mut deepest, mut odd) = (0usize, 0usize, false);
    let (mut in_string, mut escaped, mut digits) = (false, false, 0usize);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'e' | b'E' if digits > 0 => odd = true,
            _ => {}
        }
        if b.is_ascii_digit() {
            digits += 1;
            odd |= digits > 15;
        } else if !matches!(b, b'.' | b'-' | b'+' | b'e' | b'E') {
            digits = 0;
        }
    }
    (deepest, odd)
}

/// At most the first 64 characters of `name`, for an error message about it.
pub(crate) fn bounded(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &name[..end]),
        None => name.to_owned(),
    }
}

/// Whether serialized JSON holds a U+0000 character (written `\u0000`, which jsonb
/// refuses), as opposed to an escaped backslash followed by `u0000`.
pub(crate) fn has_escaped_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    json.match_indices("\\u0000").any(|(i, _)| {
        // The escape is real when an even number of backslashes precede this one.
        let before = bytes[..i].iter().rev().take_while(|b| **b == b'\\').count();
        before % 2 == 0
    })
}

/// The longest ordering key accepted, in bytes.
pub(crate) const MAX_ORDERING_KEY_LEN: usize = 500;

/// Rejects an ordering key or scope PostgreSQL could not store or that would not fit the
/// index (`invalid_ordering_key`).
fn validate_ordering(o: &NewOrdering) -> Result<(), Error> {
    let bad = |what: &str, detail: String| {
        Error::invalid("invalid_ordering_key", format!("ordering {what} {detail}"))
    };
    for (what, value, max) in [
        ("scope", &o.scope, MAX_KIND_LEN),
        ("key", &o.key, MAX_ORDERING_KEY_LEN),
    ] {
        if value.is_empty() || value.len() > max {
            return Err(bad(
                what,
                format!("must be 1 to {max} bytes, got {}", value.len()),
            ));
        }
        if value.contains('\0') {
            return Err(bad(
                what,
                "contains a NUL character, which PostgreSQL's text cannot store".to_owned(),
            ));
        }
    }
    Ok(())
}

pub(crate) fn validate_name(what: &str, name: &str, max: usize) -> Result<(), Error> {
    let code = match what {
        "kind" => "invalid_kind",
        _ => "invalid_queue",
    };
    if name.trim().is_empty() {
        return Err(Error::invalid(code, format!("{what} must not be empty")));
    }
    if name.len() > max {
        return Err(Error::invalid(
            code,
            format!(
                "{what} `{}` is {} bytes; the limit is {max}",
                bounded(name),
                name.len()
            ),
        ));
    }
    if name.contains('\0') {
        return Err(Error::invalid(
            code,
            format!(
                "{what} `{}` contains a NUL character, which PostgreSQL's text cannot store",
                bounded(&name.replace('\0', "\\0"))
            ),
        ));
    }
    Ok(())
}

/// Cuts `message` to [`MAX_ERROR_MESSAGE_LEN`] bytes on a character boundary.
pub(crate) fn truncate_message(message: &str) -> &str {
    if message.len() <= MAX_ERROR_MESSAGE_LEN {
        return message;
    }
    let mut end = MAX_ERROR_MESSAGE_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

#[cfg(test)]
mod nul_tests {
    use super::has_escaped_nul;

    #[test]
    fn the_depth_limit_is_serde_jsons() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let ok = nest(super::MAX_PAYLOAD_DEPTH);
        assert_eq!(super::scan_json(&ok).0, super::MAX_PAYLOAD_DEPTH);
        assert!(serde_json::from_str::<serde_json::Value>(&ok).is_ok());
        let deep = nest(super::MAX_PAYLOAD_DEPTH + 1);
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        assert!(super::check_decodable("k", &deep).is_err());
        assert_eq!(super::scan_json(r#"{"a":"[[[[\"[["}"#), (1, false));
        assert!(super::scan_json(r#"{"n":1e400}"#).1);
        assert!(super::check_decodable("k", r#"{"n":1e400}"#).is_err());
        assert!(super::check_decodable("k", r#"{"n":1e300,"m":12345678901234567890}"#).is_ok());
        assert!(!super::scan_json(r#"{"n":-12.5,"key":"e1"}"#).1);
    }

    #[test]
    fn finds_real_nul_escapes_only() {
        let nul = serde_json::to_string("a\u{0}b").unwrap();
        assert!(has_escaped_nul(&nul));
        let backslash_u = serde_json::to_string("a\\u0000b").unwrap();
        assert!(!has_escaped_nul(&backslash_u), "{backslash_u}");
        let both = serde_json::to_string("\\\u{0}").unwrap();
        assert!(has_escaped_nul(&both), "{both}");
    }
}
