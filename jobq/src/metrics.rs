//! Metrics through the [`metrics`](https://docs.rs/metrics) facade. jobq only records;
//! install any recorder (a Prometheus or OpenTelemetry exporter) to collect them. With no
//! recorder installed, recording costs next to nothing.
//!
//! | name | type | labels | when |
//! | --- | --- | --- | --- |
//! | `jobq_jobs_enqueued_total` | counter | `kind`, `queue` | an enqueue inserted a job (duplicates by idempotency key are not counted; an enqueue whose transaction later rolls back is) |
//! | `jobq_jobs_completed_total` | counter | `kind`, `queue` | an attempt's success was written |
//! | `jobq_jobs_retried_total` | counter | `kind`, `queue`, `code` | a failed attempt was written and the job will be retried |
//! | `jobq_jobs_failed_total` | counter | `kind`, `queue`, `code` | a job reached `failed` |
//! | `jobq_jobs_cancelled_total` | counter | `kind`, `queue` | a job reached `cancelled` |
//! | `jobq_job_duration_seconds` | histogram | `kind`, `queue`, `outcome` | claim to outcome of one attempt |
//! | `jobq_job_wait_seconds` | histogram | `kind`, `queue` | due (`run_after`) to claim |
//! | `jobq_queue_depth` | gauge | `queue` | due pending jobs, refreshed by each runtime's worker heartbeat |
//! | `jobq_queue_oldest_age_seconds` | gauge | `queue` | now − `run_after` of the oldest due job |
//! | `jobq_jobs_parked` | gauge | `queue` | jobs parked behind a `failed` job of their ordering key, refreshed with the depth |
//! | `jobq_schedule_slots_total` | counter | `schedule` | a periodic slot's job was enqueued |
//! | `jobq_schedule_lag_seconds` | gauge | `schedule` | now − the schedule's next slot while it is due and not yet enqueued (0 otherwise), refreshed by each scheduler pass |
//! | `jobq_schedule_paused` | gauge | `schedule` | 1 while an operator paused the schedule |
//! | `jobq_outbox_published_total` | counter | `event_type` | the broker acknowledged an outbox event and the relay marked it published |
//! | `jobq_outbox_publish_failures_total` | counter | `code` | a relay's publish of an event failed (it is retried with backoff) |
//! | `jobq_outbox_lag_seconds` | gauge | `event_type` | now − `created_at` of the oldest unpublished event, refreshed by each relay every 5 s |
//! | `jobq_outbox_unpublished` | gauge | `event_type` | unpublished events, refreshed with the lag |

use std::sync::Arc;

/// Counter: jobs inserted by enqueue.
pub const JOBS_ENQUEUED: &str = "jobq_jobs_enqueued_total";
/// Counter: attempts that completed their job.
pub const JOBS_COMPLETED: &str = "jobq_jobs_completed_total";
/// Counter: failed attempts that will be retried.
pub const JOBS_RETRIED: &str = "jobq_jobs_retried_total";
/// Counter: jobs that reached `failed`.
pub const JOBS_FAILED: &str = "jobq_jobs_failed_total";
/// Counter: jobs that reached `cancelled`.
pub const JOBS_CANCELLED: &str = "jobq_jobs_cancelled_total";
/// Histogram: one attempt's run time, claim to outcome, seconds.
pub const JOB_DURATION: &str = "jobq_job_duration_seconds";
/// Histogram: due to claim, seconds.
pub const JOB_WAIT: &str = "jobq_job_wait_seconds";
/// Gauge: due pending jobs per queue.
pub const QUEUE_DEPTH: &str = "jobq_queue_depth";
/// Gauge: age of the oldest due job per queue, seconds.
pub const QUEUE_OLDEST_AGE: &str = "jobq_queue_oldest_age_seconds";
/// Gauge: jobs parked behind a failed job of their ordering key, per queue.
pub const JOBS_PARKED: &str = "jobq_jobs_parked";

/// Counter: periodic slots enqueued.
pub const SCHEDULE_SLOTS: &str = "jobq_schedule_slots_total";
/// Gauge: how late a due schedule's next slot is.
pub const SCHEDULE_LAG: &str = "jobq_schedule_lag_seconds";
/// Gauge: 1 while a schedule is paused.
pub const SCHEDULE_PAUSED: &str = "jobq_schedule_paused";

pub(crate) fn schedule_slots(schedule: &str, n: u64) {
    metrics::counter!(SCHEDULE_SLOTS, "schedule" => schedule.to_owned()).increment(n);
}

pub(crate) fn schedule_gauges(schedule: &str, lag_secs: f64, paused: bool) {
    metrics::gauge!(SCHEDULE_LAG, "schedule" => schedule.to_owned()).set(lag_secs);
    metrics::gauge!(SCHEDULE_PAUSED, "schedule" => schedule.to_owned()).set(if paused {
        1.0
    } else {
        0.0
    });
}

/// Counter: outbox events published (acknowledged by the broker).
pub const OUTBOX_PUBLISHED: &str = "jobq_outbox_published_total";
/// Counter: failed publishes of outbox events, by code.
pub const OUTBOX_PUBLISH_FAILURES: &str = "jobq_outbox_publish_failures_total";
/// Gauge: age of the oldest unpublished event per event type, seconds.
pub const OUTBOX_LAG: &str = "jobq_outbox_lag_seconds";
/// Gauge: unpublished events per event type.
pub const OUTBOX_UNPUBLISHED: &str = "jobq_outbox_unpublished";

pub(crate) fn outbox_published(event_type: &str, n: u64) {
    metrics::counter!(OUTBOX_PUBLISHED, "event_type" => event_type.to_owned()).increment(n);
}

pub(crate) fn outbox_failed(code: &str) {
    metrics::counter!(OUTBOX_PUBLISH_FAILURES, "code" => code.to_owned()).increment(1);
}

pub(crate) fn outbox_lag(lag: &[crate::store::OutboxLag]) {
    for l in lag {
        metrics::gauge!(OUTBOX_LAG, "event_type" => l.event_type.clone()).set(l.oldest_age_secs);
        metrics::gauge!(OUTBOX_UNPUBLISHED, "event_type" => l.event_type.clone())
            .set(l.unpublished as f64);
    }
}

pub(crate) fn enqueued(kind: &str, queue: &str, n: u64) {
    if n > 0 {
        metrics::counter!(JOBS_ENQUEUED, "kind" => kind.to_owned(), "queue" => queue.to_owned())
            .increment(n);
    }
}

/// Records a claimed job's wait. Labels share the claim's names (an `Arc` clone each).
pub(crate) fn claimed(kind: &Arc<str>, queue: &Arc<str>, wait_secs: f64) {
    metrics::histogram!(JOB_WAIT, "kind" => kind.clone(), "queue" => queue.clone())
        .record(wait_secs);
}

/// Records an attempt whose outcome was written, leaving the job in `state`.
pub(crate) fn finished(
    kind: &Arc<str>,
    queue: &Arc<str>,
    state: &str,
    code: Option<&str>,
    secs: f64,
) {
    let (k, q) = (kind.clone(), queue.clone());
    let code = || code.unwrap_or("none").to_owned();
    let outcome = match state {
        "done" => {
            metrics::counter!(JOBS_COMPLETED, "kind" => k.clone(), "queue" => q.clone())
                .increment(1);
            "done"
        }
        "pending" | "scheduled" => {
            metrics::counter!(JOBS_RETRIED, "kind" => k.clone(), "queue" => q.clone(), "code" => code())
                .increment(1);
            "retried"
        }
        "failed" => {
            metrics::counter!(JOBS_FAILED, "kind" => k.clone(), "queue" => q.clone(), "code" => code())
                .increment(1);
            "failed"
        }
        "cancelled" => {
            metrics::counter!(JOBS_CANCELLED, "kind" => k.clone(), "queue" => q.clone())
                .increment(1);
            "cancelled"
        }
        _ => "other",
    };
    metrics::histogram!(JOB_DURATION, "kind" => k, "queue" => q, "outcome" => outcome).record(secs);
}

pub(crate) fn queue_gauges(queue: &str, depth: i64, oldest_age_secs: f64) {
    metrics::gauge!(QUEUE_DEPTH, "queue" => queue.to_owned()).set(depth as f64);
    metrics::gauge!(QUEUE_OLDEST_AGE, "queue" => queue.to_owned()).set(oldest_age_secs);
}

pub(crate) fn parked_gauge(queue: &str, parked: i64) {
    metrics::gauge!(JOBS_PARKED, "queue" => queue.to_owned()).set(parked as f64);
}
