//! What is pending, what is running against capacity, what failed and why, and how long
//! each kind really runs — per queue and kind, from a few cheap indexed queries.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
//! let stats = jobq::stats::stats(&pool).await?;
//! for q in &stats.queues {
//!     println!("{}: {} due, oldest {:?}s", q.queue, q.due, q.oldest_due_age_secs);
//! }
//! for k in stats.runtimes.iter().filter(|k| k.lease_too_short) {
//!     println!("{}: p99 {:.1}s is over half its lease", k.kind, k.p99_secs);
//! }
//! # Ok(()) }
//! ```
//!
//! Counts of finished jobs, failures by code and run-time percentiles cover a recent
//! window ([`StatsOptions::window`], default one hour), read by index-only range scans per
//! kind, so the cost does not grow with the finished rows retention keeps.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Error;
use crate::registry::registered_jobs;
use crate::store;

pub use crate::store::MinuteCount;

/// What [`stats_with`] reads.
#[derive(Debug, Clone)]
pub struct StatsOptions {
    /// How far back finished counts, failures and run times look (default 1 h).
    pub window: Duration,
    /// The most recent finished jobs per kind the percentiles use (default 1,000).
    pub samples: u32,
    /// A worker whose heartbeat is older than this is not live (default 30 s).
    pub worker_ttl: Duration,
    /// Leases of kinds, in addition to those live workers report and those of the
    /// `#[jobq::job]` types linked into this binary.
    pub leases: BTreeMap<String, Duration>,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions {
            window: Duration::from_secs(3600),
            samples: 1000,
            worker_ttl: Duration::from_secs(30),
            leases: BTreeMap::new(),
        }
    }
}

/// A snapshot of the job table.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// The database's time of the snapshot.
    pub at: DateTime<Utc>,
    /// The window finished counts cover, in seconds.
    pub window_secs: f64,
    /// Per queue.
    pub queues: Vec<QueueStats>,
    /// Per queue and kind.
    pub kinds: Vec<KindStats>,
    /// Failures per queue, kind and code in the window.
    pub failures: Vec<FailureCount>,
    /// Run-time percentiles per kind, against the kind's lease.
    pub runtimes: Vec<RunTimeStats>,
    /// Live workers.
    pub workers: Vec<WorkerStats>,
    /// Periodic schedules: next and last slot, the last slot's job state, paused.
    pub schedules: Vec<crate::store::ScheduleRow>,
    /// The outbox: unpublished events per type, and publish failures by code.
    pub outbox: crate::outbox::OutboxStats,
    /// Ordering keys parked behind a failed job, oldest blocker first (at most
    /// [`PARKED_KEYS`]).
    pub parked_keys: Vec<crate::store::ParkedKey>,
}

/// The most parked keys [`Stats::parked_keys`] lists.
pub const PARKED_KEYS: u32 = 100;

/// One queue.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// An operator paused it.
    pub paused: bool,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// When.
    pub paused_at: Option<DateTime<Utc>>,
    /// Pending jobs that are due now (and not waiting behind their ordering key).
    pub due: i64,
    /// Due jobs waiting behind an earlier job of their ordering key (parked ones too).
    pub blocked: i64,
    /// Jobs parked behind a `failed` job of their ordering key: they run only after an
    /// operator replays or cancels it, or runs `jobq unpark`.
    pub parked: i64,
    /// Pending jobs scheduled for later (never attempted).
    pub scheduled: i64,
    /// Pending jobs waiting for a retry's backoff.
    pub retrying: i64,
    /// Running jobs.
    pub running: i64,
    /// The summed concurrency of live workers serving it (`None`: no live worker).
    pub concurrency: Option<i64>,
    /// Now − `run_after` of the oldest due job: how long the oldest due job has waited.
    pub oldest_due_age_secs: Option<f64>,
    /// Now − `created_at` of the oldest due job: the business age.
    pub oldest_due_created_age_secs: Option<f64>,
    /// Jobs that finished `done` in the window.
    pub done: i64,
    /// Jobs that finished `failed` in the window.
    pub failed: i64,
    /// Jobs that finished `cancelled` in the window.
    pub cancelled: i64,
}

/// One kind in one queue.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct KindStats {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// Pending and due (and not waiting behind their ordering key).
    pub due: i64,
    /// Due, waiting behind an earlier job of their ordering key (parked ones too).
    pub blocked: i64,
    /// Parked behind a `failed` job of their ordering key.
    pub parked: i64,
    /// Pending, scheduled for later.
    pub scheduled: i64,
    /// Pending, waiting for a retry.
    pub retrying: i64,
    /// Running.
    pub running: i64,
    /// Done in the window.
    pub done: i64,
    /// Failed in the window.
    pub failed: i64,
    /// Cancelled in the window.
    pub cancelled: i64,
    /// Now − `run_after` of its oldest due job.
    pub oldest_due_age_secs: Option<f64>,
    /// Now − `created_at` of its oldest due job.
    pub oldest_due_created_age_secs: Option<f64>,
    /// It has pending jobs, but no live worker serves this kind on this queue.
    pub unserved: bool,
}

/// Failures of one code.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FailureCount {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The last error's stable code.
    pub code: String,
    /// Jobs that ended `failed` with it in the window.
    pub failed: i64,
    /// Jobs waiting for a retry after failing with it in the window.
    pub retrying: i64,
}

/// Run times of one kind.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunTimeStats {
    /// The kind.
    pub kind: String,
    /// Finished jobs measured.
    pub samples: i64,
    /// Median run time of the last attempt, seconds.
    pub p50_secs: f64,
    /// 99th percentile, seconds.
    pub p99_secs: f64,
    /// Longest, seconds.
    pub max_secs: f64,
    /// The kind's lease, if known (from live workers or this binary's job types).
    pub lease_secs: Option<f64>,
    /// p99 exceeds half the lease: one slow heartbeat away from a lost lease. Raise the
    /// lease above the measured p99, not the median.
    pub lease_too_short: bool,
}

/// A live worker.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Its id (`jobs.locked_by`).
    pub id: String,
    /// Queues it serves, with concurrency.
    pub queues: BTreeMap<String, i64>,
    /// Kinds it serves, with their lease in seconds.
    pub kinds: BTreeMap<String, f64>,
    /// Started at.
    pub started_at: DateTime<Utc>,
    /// Last heartbeat.
    pub last_seen: DateTime<Utc>,
}

/// [`stats_with`] with default options.
///
/// # Errors
///
/// [`Error::Database`] when the database cannot be reached.
pub async fn stats(pool: &PgPool) -> Result<Stats, Error> {
    stats_with(pool, &StatsOptions::default()).await
}

fn age(now: DateTime<Utc>, t: Option<DateTime<Utc>>) -> Option<f64> {
    t.map(|t| ((now - t).num_milliseconds() as f64 / 1000.0).max(0.0))
}

/// A snapshot: five short statements on one connection.
///
/// # Errors
///
/// [`Error::Database`] when the database cannot be reached.
pub async fn stats_with(pool: &PgPool, opts: &StatsOptions) -> Result<Stats, Error> {
    let mut conn = pool.acquire().await?;
    let now = store::db_now(&mut conn).await?;
    let window = chrono::Duration::from_std(opts.window).unwrap_or(chrono::Duration::hours(1));
    let since = now - window;
    let live = store::stats_live(&mut conn, now).await?;
    let finished = store::stats_finished(&mut conn, since).await?;
    let retrying = store::stats_retrying_codes(&mut conn, since).await?;
    let runs = store::stats_run_times(&mut conn, since, i64::from(opts.samples)).await?;
    let queue_rows = store::queue_list(&mut conn).await?;
    let workers = store::worker_list_live(&mut conn, opts.worker_ttl.as_secs_f64()).await?;
    let schedules = store::schedules_list(&mut conn).await?;
    let parked = store::ordering_parked_counts(&mut conn).await?;
    let parked_keys = store::ordering_parked_keys(&mut conn, i64::from(PARKED_KEYS)).await?;
    drop(conn);

    let workers: Vec<WorkerStats> = workers
        .into_iter()
        .map(|w| WorkerStats {
            queues: serde_json::from_value(w.queues).unwrap_or_default(),
            kinds: serde_json::from_value(w.kinds).unwrap_or_default(),
            id: w.id,
            started_at: w.started_at,
            last_seen: w.last_seen,
        })
        .collect();

    // Leases: this binary's job types, then live workers', then the caller's.
    let mut leases: BTreeMap<String, f64> = registered_jobs()
        .iter()
        .map(|h| (h.kind().to_owned(), h.lease().as_secs_f64()))
        .collect();
    for w in &workers {
        for (k, l) in &w.kinds {
            leases.insert(k.clone(), *l);
        }
    }
    for (k, l) in &opts.leases {
        leases.insert(k.clone(), l.as_secs_f64());
    }
    let served: BTreeSet<(&str, &str)> = workers
        .iter()
        .flat_map(|w| {
            w.queues
                .keys()
                .flat_map(move |q| w.kinds.keys().map(move |k| (q.as_str(), k.as_str())))
        })
        .collect();

    let mut kinds: BTreeMap<(String, String), KindStats> = BTreeMap::new();
    for l in &live {
        let k = kinds
            .entry((l.queue.clone(), l.kind.clone()))
            .or_insert_with(|| KindStats {
                queue: l.queue.clone(),
                kind: l.kind.clone(),
                ..KindStats::default()
            });
        k.due = l.due;
        k.blocked = l.blocked;
        k.scheduled = l.scheduled;
        k.retrying = l.retrying;
        k.running = l.running;
        k.oldest_due_age_secs = age(now, l.oldest_due_run_after);
        k.oldest_due_created_age_secs = age(now, l.oldest_due_created_at);
        k.unserved = l.due + l.blocked + l.scheduled + l.retrying > 0
            && !served.contains(&(l.queue.as_str(), l.kind.as_str()));
    }
    for p in &parked {
        let k = kinds
            .entry((p.queue.clone(), p.kind.clone()))
            .or_insert_with(|| KindStats {
                queue: p.queue.clone(),
                kind: p.kind.clone(),
                ..KindStats::default()
            });
        k.parked = p.parked;
    }
    let mut failures: BTreeMap<(String, String, String), FailureCount> = BTreeMap::new();
    for f in &finished {
        let k = kinds
            .entry((f.queue.clone(), f.kind.clone()))
            .or_insert_with(|| KindStats {
                queue: f.queue.clone(),
                kind: f.kind.clone(),
                ..KindStats::default()
            });
        match f.state.as_str() {
            "done" => k.done += f.count,
            "failed" => k.failed += f.count,
            _ => k.cancelled += f.count,
        }
        if f.state == "failed" {
            let code = f.code.clone().unwrap_or_else(|| "unknown".to_owned());
            failures
                .entry((f.queue.clone(), f.kind.clone(), code.clone()))
                .or_insert_with(|| FailureCount {
                    queue: f.queue.clone(),
                    kind: f.kind.clone(),
                    code,
                    failed: 0,
                    retrying: 0,
                })
                .failed += f.count;
        }
    }
    for r in &retrying {
        let code = r.code.clone().unwrap_or_else(|| "unknown".to_owned());
        failures
            .entry((r.queue.clone(), r.kind.clone(), code.clone()))
            .or_insert_with(|| FailureCount {
                queue: r.queue.clone(),
                kind: r.kind.clone(),
                code,
                failed: 0,
                retrying: 0,
            })
            .retrying += r.count;
    }

    let mut queues: BTreeMap<String, QueueStats> = BTreeMap::new();
    let queue_entry = |queues: &mut BTreeMap<String, QueueStats>, name: &str| {
        queues
            .entry(name.to_owned())
            .or_insert_with(|| QueueStats {
                queue: name.to_owned(),
                ..QueueStats::default()
            })
            .queue
            .clone()
    };
    for q in &queue_rows {
        queue_entry(&mut queues, &q.name);
        if let Some(s) = queues.get_mut(&q.name) {
            s.paused = q.paused;
            s.paused_by.clone_from(&q.paused_by);
            s.paused_at = q.paused_at;
        }
    }
    for w in &workers {
        for (q, c) in &w.queues {
            queue_entry(&mut queues, q);
            if let Some(s) = queues.get_mut(q) {
                *s.concurrency.get_or_insert(0) += c;
            }
        }
    }
    for k in kinds.values() {
        queue_entry(&mut queues, &k.queue);
        if let Some(s) = queues.get_mut(&k.queue) {
            s.due += k.due;
            s.blocked += k.blocked;
            s.parked += k.parked;
            s.scheduled += k.scheduled;
            s.retrying += k.retrying;
            s.running += k.running;
            s.done += k.done;
            s.failed += k.failed;
            s.cancelled += k.cancelled;
            s.oldest_due_age_secs = max_opt(s.oldest_due_age_secs, k.oldest_due_age_secs);
            s.oldest_due_created_age_secs =
                max_opt(s.oldest_due_created_age_secs, k.oldest_due_created_age_secs);
        }
    }

    let runtimes = runs
        .into_iter()
        .map(|r| {
            let lease = leases.get(&r.kind).copied();
            RunTimeStats {
                lease_too_short: lease.is_some_and(|l| r.p99 > l / 2.0),
                kind: r.kind,
                samples: r.samples,
                p50_secs: r.p50,
                p99_secs: r.p99,
                max_secs: r.max,
                lease_secs: lease,
            }
        })
        .collect();

    Ok(Stats {
        at: now,
        window_secs: opts.window.as_secs_f64(),
        queues: queues.into_values().collect(),
        kinds: kinds.into_values().collect(),
        failures: failures.into_values().collect(),
        runtimes,
        workers,
        schedules,
        outbox: crate::outbox::stats(pool).await?,
        parked_keys,
    })
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Done and failed jobs per minute over the last `window`, oldest first, one entry per
/// minute (zeros included), ending with the current minute: the dashboard's throughput
/// and failure charts.
///
/// # Errors
///
/// [`Error::Database`] when the database cannot be reached.
pub async fn per_minute(pool: &PgPool, window: Duration) -> Result<Vec<MinuteCount>, Error> {
    let mut conn = pool.acquire().await?;
    let now = store::db_now(&mut conn).await?;
    let minutes = (window.as_secs() / 60).max(1) as i64;
    let end =
        chrono::DurationRound::duration_trunc(now, chrono::Duration::minutes(1)).unwrap_or(now);
    let since = end - chrono::Duration::minutes(minutes - 1);
    let rows = store::stats_per_minute(&mut conn, since).await?;
    let mut out: Vec<MinuteCount> = (0..minutes)
        .map(|i| MinuteCount {
            minute: since + chrono::Duration::minutes(i),
            done: 0,
            failed: 0,
        })
        .collect();
    for r in rows {
        let i = (r.minute - since).num_minutes();
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| out.get_mut(i)) {
            slot.done = r.done;
            slot.failed = r.failed;
        }
    }
    Ok(out)
}
