//! `jobq`: operate a jobq database from a shell — what is pending, what failed, what did
//! we already do — and act on it: replay, cancel, edit a payload, retry now, pause,
//! resume, prune, change a limit.
//!
//! Reads `DATABASE_URL` (or `--database-url`). Prints readable tables by default and JSON
//! with `--json`. Bulk actions ask for confirmation on a terminal and need `--yes`
//! otherwise. Every action is written to `jobq.job_audit` with `--actor` (default
//! `$USER`) and `--reason`.

#[path = "jobq/dashboard.rs"]
mod dashboard;
#[path = "jobq/limits.rs"]
mod limits;
#[path = "jobq/schedules.rs"]
mod schedules;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use jobq::JobId;
use jobq::admin::{Admin, BulkReplay, Filter};
use jobq::maintenance::{Pruner, PrunerConfig, Retention};
use jobq::stats::{Stats, StatsOptions};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// Operate jobq: status, failures, replay, cancel, pause, prune.
#[derive(Debug, Parser)]
#[command(name = "jobq", version, about, long_about = None)]
struct Cli {
    /// The database (default: $DATABASE_URL).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    database_url: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Who acts, as written to the audit log (default: $USER).
    #[arg(long, global = true)]
    actor: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade jobq's schema.
    Migrate,
    /// Queues and kinds: pending, running against capacity, oldest age, failures, run
    /// times against leases, unserved kinds.
    Status {
        /// How far back finished counts and run times look (e.g. 15m, 1h, 1d).
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        window: Duration,
    },
    /// List failed (and with --cancelled, cancelled) jobs, newest first.
    Failed {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One job: every column, its error history and its audit trail.
    Show {
        /// The job id.
        id: i64,
    },
    /// Replay one failed or cancelled job, or (with filters) many at a bounded rate.
    Replay {
        /// The job id; omit it to replay by filter.
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
        /// Jobs per second at most, as `50/s`, `300/m` or `50`.
        #[arg(long, default_value = "10/s", value_parser = parse_rate)]
        rate: f64,
        /// Replay at most this many.
        #[arg(long)]
        limit: Option<u64>,
        /// Count what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel jobs: pending or failed at once; running ones after their attempt.
    Cancel {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<i64>,
        /// Do not ask for confirmation (needed for more than one id).
        #[arg(long, short)]
        yes: bool,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Replace the payload of a failed or cancelled job (to fix it before a replay); the
    /// audit row keeps the payload before and after.
    EditPayload {
        /// The job id.
        id: i64,
        /// The new payload: JSON text, `@path` to read it from a file, or `-` for stdin.
        payload: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Make a pending job that waits for its backoff due now.
    RetryNow {
        /// The job id.
        id: i64,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Pause a queue: workers on every node stop claiming from it; nothing is lost.
    Pause {
        /// The queue.
        queue: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused queue.
    Resume {
        /// The queue.
        queue: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete terminal jobs past their retention (with their effect-ledger rows).
    Prune {
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep done jobs this long (e.g. 7d).
        #[arg(long, default_value = "7d", value_parser = parse_duration)]
        done_after: Duration,
        /// Keep failed jobs this long.
        #[arg(long, default_value = "30d", value_parser = parse_duration)]
        failed_after: Duration,
        /// Keep cancelled jobs this long.
        #[arg(long, default_value = "30d", value_parser = parse_duration)]
        cancelled_after: Duration,
        /// Rows per delete statement.
        #[arg(long, default_value_t = 1000)]
        batch: i64,
        /// A kind's own retention, as the runtime's `PrunerConfig::per_kind` gives it:
        /// `KIND=DONE[,FAILED[,CANCELLED]]` (e.g. `send_invoice=1d,90d`); what is left
        /// out keeps the general value. Repeat for more kinds.
        #[arg(long = "kind-retention", value_name = "KIND=DONE[,FAILED[,CANCELLED]]",
              value_parser = parse_kind_retention)]
        kind_retention: Vec<(String, [Option<Duration>; 3])>,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
    },
    /// Periodic schedules: expression, zone, next and last slot, the last slot's job and
    /// its state, paused.
    Schedules,
    /// Pause, resume or run a periodic schedule now (audited).
    Schedule {
        #[command(subcommand)]
        action: schedules::ScheduleAction,
    },
    /// Concurrency and rate limits in force, with usage: running jobs, tokens and the
    /// next token, key buckets and throttles.
    Limits,
    /// Change a limit at run time (audited): `jobq limit set KIND --concurrency 3`.
    Limit {
        #[command(subcommand)]
        action: limits::LimitAction,
    },
    /// Serve the web dashboard (loopback only unless credentials are given).
    Dashboard(dashboard::DashboardArgs),
    /// Stuck outbox events (unpublished and old, or whose publish failed); with
    /// `--replay ID`, send one event again (audited).
    Outbox {
        /// Unpublished events older than this count as stuck (e.g. 1m, 1h).
        #[arg(long, default_value = "1m", value_parser = parse_duration)]
        older_than: Duration,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Replay this event id: unpublished again, sent under the same id.
        #[arg(long)]
        replay: Option<jobq::outbox::Uuid>,
        /// Why, for the audit log (with --replay).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The most recent operator actions.
    Audit {
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

#[derive(Debug, Args)]
struct FilterArgs {
    /// Only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this last error code.
    #[arg(long)]
    code: Option<String>,
    /// Finished at or after: RFC 3339, or an age such as 2h or 7d.
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Finished before: RFC 3339, or an age such as 30m.
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Include cancelled jobs.
    #[arg(long)]
    cancelled: bool,
}

impl FilterArgs {
    fn filter(&self) -> Filter {
        Filter {
            kind: self.kind.clone(),
            queue: self.queue.clone(),
            code: self.code.clone(),
            since: self.since,
            until: self.until,
            include_cancelled: self.cancelled,
        }
    }

    fn is_empty(&self) -> bool {
        self.kind.is_none()
            && self.queue.is_none()
            && self.code.is_none()
            && self.since.is_none()
            && self.until.is_none()
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30s, 15m, 2h or 7d"))?;
    let secs = match unit {
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return Err(format!("unknown unit `{unit}` in `{s}`: use s, m, h or d")),
    };
    Duration::try_from_secs_f64(n * secs).map_err(|e| format!("`{s}`: {e}"))
}

/// `KIND=DONE[,FAILED[,CANCELLED]]`: a kind and up to three retention periods.
fn parse_kind_retention(s: &str) -> Result<(String, [Option<Duration>; 3]), String> {
    let (kind, periods) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not KIND=DONE[,FAILED[,CANCELLED]]"))?;
    if kind.trim().is_empty() {
        return Err(format!("`{s}` names no kind"));
    }
    let mut out = [None; 3];
    let parts: Vec<&str> = periods.split(',').collect();
    if parts.len() > 3 {
        return Err(format!(
            "`{s}` has more than three periods (done, failed, cancelled)"
        ));
    }
    for (slot, part) in out.iter_mut().zip(parts) {
        if !part.trim().is_empty() {
            *slot = Some(parse_duration(part)?);
        }
    }
    Ok((kind.trim().to_owned(), out))
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let age = parse_duration(s)
        .map_err(|_| format!("`{s}` is neither an RFC 3339 time nor an age like 2h or 7d"))?;
    let age = chrono::Duration::from_std(age).map_err(|e| e.to_string())?;
    Ok(Utc::now() - age)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let (n, per) = match s.split_once('/') {
        Some((n, unit)) => (
            n,
            match unit {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(format!("unknown rate unit `{unit}`: use /s, /m or /h")),
            },
        ),
        None => (s, 1.0),
    };
    let n: f64 = n
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a rate like 50/s"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("rate must be positive, got `{s}`"));
    }
    Ok(n / per)
}

/// An error for the user: what went wrong, as one line.
#[derive(Debug)]
struct Failure {
    code: String,
    message: String,
}

impl From<jobq::Error> for Failure {
    fn from(e: jobq::Error) -> Self {
        Failure {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

fn fail(code: &str, message: impl Into<String>) -> Failure {
    Failure {
        code: code.to_owned(),
        message: message.into(),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

async fn connect(url: Option<&str>) -> Result<PgPool, Failure> {
    let Some(url) = url else {
        return Err(fail(
            "config",
            "no database: set DATABASE_URL or pass --database-url",
        ));
    };
    let unreachable = |e: String| {
        fail(
            "database",
            format!("cannot reach the database at {}: {e}", redact(url)),
        )
    };
    // One direct connection first: its error says why (refused, unknown host, bad
    // password), where a pool would only say it timed out.
    let probe = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(url))
        .await
        .map_err(|_| unreachable("no answer within 10 s".to_owned()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| unreachable(e.to_string()))
}

fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(fail(
            "confirmation_required",
            format!("{question} — refusing without --yes (stdin is not a terminal)"),
        ));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if matches!(line.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(fail("aborted", "aborted; nothing was changed"))
    }
}

/// A payload argument: JSON text, `@path` for a file's contents, `-` for stdin.
fn read_payload(arg: &str) -> Result<serde_json::Value, Failure> {
    let text = if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| fail("payload_unreadable", format!("reading stdin: {e}")))?;
        text
    } else if let Some(path) = arg.strip_prefix('@') {
        std::fs::read_to_string(path)
            .map_err(|e| fail("payload_unreadable", format!("reading {path}: {e}")))?
    } else {
        arg.to_owned()
    };
    serde_json::from_str(&text)
        .map_err(|e| fail("invalid_payload", format!("the payload is not JSON: {e}")))
}

fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).map_err(|e| fail("serialize", e.to_string()))?;
    println!("{text}");
    Ok(())
}

/// A plain text table: left-aligned columns separated by two spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// `3s`, `4m12s`, `2h05m`, `3d04h`.
fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 10.0 {
        return format!("{s:.1}s");
    }
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn opt_age(a: Option<f64>) -> String {
    a.map_or_else(|| "-".to_owned(), human_secs)
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

fn print_status(s: &Stats) {
    let window = human_secs(s.window_secs);
    println!("QUEUES (finished counts: last {window})");
    let rows: Vec<Vec<String>> = s
        .queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                if q.paused { "paused" } else { "active" }.to_owned(),
                q.due.to_string(),
                q.scheduled.to_string(),
                q.retrying.to_string(),
                match q.concurrency {
                    Some(c) => format!("{}/{c}", q.running),
                    None => format!("{}/-", q.running),
                },
                opt_age(q.oldest_due_age_secs),
                opt_age(q.oldest_due_created_age_secs),
                q.done.to_string(),
                q.failed.to_string(),
                q.cancelled.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "QUEUE",
                "STATE",
                "DUE",
                "SCHEDULED",
                "RETRYING",
                "RUNNING",
                "OLDEST DUE",
                "OLDEST AGE",
                "DONE",
                "FAILED",
                "CANCELLED",
            ],
            &rows
        )
    );
    println!();
    println!("KINDS");
    let rows: Vec<Vec<String>> = s
        .kinds
        .iter()
        .map(|k| {
            vec![
                k.queue.clone(),
                k.kind.clone(),
                k.due.to_string(),
                k.scheduled.to_string(),
                k.retrying.to_string(),
                k.running.to_string(),
                opt_age(k.oldest_due_age_secs),
                k.done.to_string(),
                k.failed.to_string(),
                k.cancelled.to_string(),
                if k.unserved { "UNSERVED" } else { "" }.to_owned(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "QUEUE",
                "KIND",
                "DUE",
                "SCHEDULED",
                "RETRYING",
                "RUNNING",
                "OLDEST DUE",
                "DONE",
                "FAILED",
                "CANCELLED",
                "FLAGS",
            ],
            &rows
        )
    );
    if !s.runtimes.is_empty() {
        println!();
        println!("RUN TIMES (last {window})");
        let rows: Vec<Vec<String>> = s
            .runtimes
            .iter()
            .map(|r| {
                vec![
                    r.kind.clone(),
                    r.samples.to_string(),
                    human_secs(r.p50_secs),
                    human_secs(r.p99_secs),
                    human_secs(r.max_secs),
                    opt_age(r.lease_secs),
                    if r.lease_too_short { "P99>LEASE/2" } else { "" }.to_owned(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["KIND", "SAMPLES", "P50", "P99", "MAX", "LEASE", "FLAGS"],
                &rows
            )
        );
    }
    if !s.failures.is_empty() {
        println!();
        println!("FAILURES BY CODE (last {window})");
        let rows: Vec<Vec<String>> = s
            .failures
            .iter()
            .map(|f| {
                vec![
                    f.queue.clone(),
                    f.kind.clone(),
                    f.code.clone(),
                    f.failed.to_string(),
                    f.retrying.to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(&["QUEUE", "KIND", "CODE", "FAILED", "RETRYING"], &rows)
        );
    }
    println!();
    println!("WORKERS ({} live)", s.workers.len());
    let rows: Vec<Vec<String>> = s
        .workers
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.queues
                    .iter()
                    .map(|(q, c)| format!("{q}:{c}"))
                    .collect::<Vec<_>>()
                    .join(","),
                w.kinds.keys().cloned().collect::<Vec<_>>().join(","),
                time(Some(w.last_seen)),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["WORKER", "QUEUES", "KINDS", "LAST SEEN"], &rows)
    );
    if !s.outbox.lag.is_empty() || !s.outbox.failures.is_empty() {
        println!();
        println!("OUTBOX (unpublished events)");
        let rows: Vec<Vec<String>> = s
            .outbox
            .lag
            .iter()
            .map(|l| {
                vec![
                    l.event_type.clone(),
                    l.unpublished.to_string(),
                    human_secs(l.oldest_age_secs),
                ]
            })
            .collect();
        print!("{}", table(&["EVENT TYPE", "UNPUBLISHED", "OLDEST"], &rows));
        for (code, n) in &s.outbox.failures {
            println!("publish failures: {code} {n}");
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let pool = connect(cli.database_url.as_deref()).await?;
    let mut admin = Admin::new(pool.clone());
    if let Some(actor) = &cli.actor {
        admin = admin.actor(actor.clone());
    }
    let json = cli.json;
    match cli.command {
        Command::Migrate => {
            jobq::migrate(&pool).await?;
            if json {
                print_json(
                    &serde_json::json!({"migrated": true, "version": jobq::MIGRATIONS.len()}),
                )?;
            } else {
                println!("jobq schema is at version {}", jobq::MIGRATIONS.len());
            }
        }
        Command::Status { window } => {
            let opts = StatsOptions {
                window,
                ..StatsOptions::default()
            };
            let s = jobq::stats::stats_with(&pool, &opts).await?;
            if json {
                print_json(&s)?;
            } else {
                print_status(&s);
            }
        }
        Command::Failed { filter, limit } => {
            let jobs = admin.failed(&filter.filter(), limit).await?;
            if json {
                print_json(&jobs)?;
            } else {
                let rows: Vec<Vec<String>> = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.id.to_string(),
                            j.queue.clone(),
                            j.kind.clone(),
                            j.state.clone(),
                            j.attempts.to_string(),
                            j.last_error_code.clone().unwrap_or_default(),
                            time(j.finished_at),
                            j.last_error
                                .clone()
                                .unwrap_or_default()
                                .chars()
                                .take(60)
                                .collect(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(
                        &[
                            "ID", "QUEUE", "KIND", "STATE", "ATTEMPTS", "CODE", "FINISHED", "ERROR"
                        ],
                        &rows
                    )
                );
                println!("({} jobs)", jobs.len());
            }
        }
        Command::Show { id } => {
            let d = admin.job(JobId(id)).await?;
            if json {
                print_json(&d)?;
            } else {
                let j = &d.job;
                let fields = [
                    ("id", j.id.to_string()),
                    ("kind", j.kind.clone()),
                    ("queue", j.queue.clone()),
                    ("state", j.state.clone()),
                    ("attempts", format!("{}/{}", j.attempts, j.max_attempts)),
                    ("priority", j.priority.to_string()),
                    (
                        "idempotency key",
                        j.idempotency_key.clone().unwrap_or_else(|| "-".into()),
                    ),
                    ("run after", time(Some(j.run_after))),
                    ("created", time(Some(j.created_at))),
                    ("started", time(j.started_at)),
                    ("finished", time(j.finished_at)),
                    (
                        "locked by",
                        j.locked_by.clone().unwrap_or_else(|| "-".into()),
                    ),
                    ("locked until", time(j.locked_until)),
                    ("cancel requested", j.cancel_requested.to_string()),
                    (
                        "last error code",
                        j.last_error_code.clone().unwrap_or_else(|| "-".into()),
                    ),
                    (
                        "last error",
                        j.last_error.clone().unwrap_or_else(|| "-".into()),
                    ),
                    ("first failed", time(j.first_failed_at)),
                    ("last failed", time(j.last_failed_at)),
                    ("payload", j.payload_text.clone()),
                    (
                        "output",
                        j.output
                            .as_ref()
                            .map_or_else(|| "-".into(), ToString::to_string),
                    ),
                ];
                for (k, v) in fields {
                    println!("{k:<17} {v}");
                }
                println!();
                println!("ERRORS");
                let rows: Vec<Vec<String>> = j
                    .errors
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|e| {
                        let s = |k: &str| match &e[k] {
                            serde_json::Value::String(s) => s.clone(),
                            serde_json::Value::Null => String::new(),
                            v => v.to_string(),
                        };
                        vec![
                            s("attempt"),
                            s("at"),
                            s("code"),
                            s("disposition"),
                            s("message"),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["ATTEMPT", "AT", "CODE", "DISPOSITION", "MESSAGE"], &rows)
                );
                println!();
                println!("AUDIT");
                let rows: Vec<Vec<String>> = d
                    .audit
                    .iter()
                    .map(|a| {
                        vec![
                            time(Some(a.created_at)),
                            a.actor.clone(),
                            a.action.clone(),
                            format!(
                                "{} -> {}",
                                a.before_state.as_deref().unwrap_or("-"),
                                a.after_state.as_deref().unwrap_or("-")
                            ),
                            a.reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["AT", "ACTOR", "ACTION", "STATE", "REASON"], &rows)
                );
            }
        }
        Command::Replay {
            id,
            filter,
            rate,
            limit,
            dry_run,
            yes,
            reason,
        } => match id {
            Some(id) => {
                if !filter.is_empty() {
                    return Err(fail(
                        "usage",
                        "give either a job id or filters (--kind, --code, …), not both",
                    ));
                }
                if dry_run {
                    let d = admin.job(JobId(id)).await?;
                    let ok = matches!(d.job.state.as_str(), "failed" | "cancelled");
                    if json {
                        print_json(
                            &serde_json::json!({"id": id, "state": d.job.state, "would_replay": ok}),
                        )?;
                    } else {
                        println!(
                            "job {id} is {}; replay would {}",
                            d.job.state,
                            if ok { "apply" } else { "be refused" }
                        );
                    }
                    return Ok(());
                }
                let t = admin.replay(JobId(id), reason.as_deref()).await?;
                if json {
                    print_json(&t)?;
                } else {
                    println!("job {} replayed: {} -> {}", t.id, t.before, t.after);
                }
            }
            None => {
                if filter.is_empty() {
                    return Err(fail(
                        "usage",
                        "give a job id, or at least one filter (--kind, --queue, --code, --since, --until)",
                    ));
                }
                let f = filter.filter();
                let opts = BulkReplay {
                    rate_per_sec: rate,
                    limit,
                    dry_run: true,
                };
                let preview = admin.replay_many(&f, opts, None).await?;
                let n = limit.map_or(preview.matched, |l| l.min(preview.matched));
                if dry_run || n == 0 {
                    if json {
                        print_json(&preview)?;
                    } else {
                        println!(
                            "{} jobs match; {n} would be replayed at {rate}/s",
                            preview.matched
                        );
                    }
                    return Ok(());
                }
                confirm(&format!("Replay {n} jobs at {rate}/s?"), yes)?;
                let opts = BulkReplay {
                    dry_run: false,
                    ..opts
                };
                let r = admin.replay_many(&f, opts, reason.as_deref()).await?;
                if json {
                    print_json(&r)?;
                } else {
                    println!(
                        "replayed {} of {} matching jobs in {:.1}s ({} skipped: changed meanwhile)",
                        r.replayed, r.matched, r.elapsed_secs, r.skipped
                    );
                }
            }
        },
        Command::Cancel { ids, yes, reason } => {
            if ids.len() > 1 {
                confirm(&format!("Cancel {} jobs?", ids.len()), yes)?;
            }
            let mut done = Vec::new();
            for id in ids {
                done.push(admin.cancel(JobId(id), reason.as_deref()).await?);
            }
            if json {
                print_json(&done)?;
            } else {
                for t in done {
                    if t.after == "running" {
                        println!(
                            "job {} is running: it will be cancelled when its attempt ends",
                            t.id
                        );
                    } else {
                        println!("job {} cancelled: {} -> {}", t.id, t.before, t.after);
                    }
                }
            }
        }
        Command::EditPayload {
            id,
            payload,
            reason,
        } => {
            let payload = read_payload(&payload)?;
            let t = admin
                .edit_payload(JobId(id), payload, reason.as_deref())
                .await?;
            if json {
                print_json(&t)?;
            } else {
                println!(
                    "job {} payload replaced (still {}); `jobq replay {}` runs it again",
                    t.id, t.after, t.id
                );
            }
        }
        Command::RetryNow { id, reason } => {
            let t = admin.retry_now(JobId(id), reason.as_deref()).await?;
            if json {
                print_json(&t)?;
            } else {
                println!("job {} is due now", t.id);
            }
        }
        Command::Pause { queue, reason } => {
            let c = admin.pause(&queue, reason.as_deref()).await?;
            if json {
                print_json(&c)?;
            } else if c.was_paused {
                println!("queue {queue} was already paused");
            } else {
                println!(
                    "queue {queue} paused: workers stop claiming from it within a poll interval"
                );
            }
        }
        Command::Resume { queue, reason } => {
            let c = admin.resume(&queue, reason.as_deref()).await?;
            if json {
                print_json(&c)?;
            } else if c.was_paused {
                println!("queue {queue} resumed");
            } else {
                println!("queue {queue} was not paused");
            }
        }
        Command::Prune {
            dry_run,
            done_after,
            failed_after,
            cancelled_after,
            batch,
            kind_retention,
            yes,
        } => {
            let per_kind = kind_retention
                .into_iter()
                .map(|(kind, [done, failed, cancelled])| {
                    let r = Retention {
                        done_after: done.unwrap_or(done_after),
                        failed_after: failed.unwrap_or(failed_after),
                        cancelled_after: cancelled.unwrap_or(cancelled_after),
                    };
                    (kind, r)
                })
                .collect();
            let config = PrunerConfig {
                done_after,
                failed_after,
                cancelled_after,
                per_kind,
                batch,
                actor: admin_actor(cli.actor.as_deref()),
                ..PrunerConfig::default()
            };
            let pruner = Pruner::new(pool.clone(), config);
            let preview = pruner.dry_run(None).await?;
            if dry_run || preview.total() == 0 {
                if json {
                    print_json(&serde_json::json!({"dry_run": dry_run, "report": preview}))?;
                } else {
                    println!(
                        "would delete {} jobs: {} done, {} failed, {} cancelled",
                        preview.total(),
                        preview.done,
                        preview.failed,
                        preview.cancelled
                    );
                }
                return Ok(());
            }
            confirm(&format!("Delete {} jobs?", preview.total()), yes)?;
            let r = pruner.run_once().await?;
            if json {
                print_json(&serde_json::json!({"dry_run": false, "report": r}))?;
            } else {
                println!(
                    "deleted {} jobs: {} done, {} failed, {} cancelled ({} batches)",
                    r.total(),
                    r.done,
                    r.failed,
                    r.cancelled,
                    r.batches
                );
            }
        }
        Command::Schedules => schedules::list(&admin, json).await?,
        Command::Limits => limits::list(&admin, json).await?,
        Command::Limit { action } => limits::act(&admin, action, json).await?,
        Command::Schedule { action } => schedules::act(&admin, action, json).await?,
        Command::Dashboard(args) => dashboard::run(pool, args).await?,
        Command::Outbox {
            older_than,
            limit,
            replay,
            reason,
        } => {
            if let Some(id) = replay {
                let actor = cli.actor.clone().unwrap_or_else(jobq::admin::default_actor);
                jobq::outbox::replay(&pool, id, &actor, reason.as_deref()).await?;
                if json {
                    print_json(&serde_json::json!({"replayed": id}))?;
                } else {
                    println!("event {id} will be sent again");
                }
                return Ok(());
            }
            let stuck = jobq::outbox::stuck(&pool, older_than, i64::from(limit)).await?;
            if json {
                print_json(&stuck)?;
            } else {
                let rows: Vec<Vec<String>> = stuck
                    .iter()
                    .map(|e| {
                        vec![
                            e.event.id.to_string(),
                            e.event.event_type.clone(),
                            e.event
                                .aggregate
                                .as_ref()
                                .map(|a| format!("{}:{}", a.kind, a.id))
                                .unwrap_or_default(),
                            e.event.attempts.to_string(),
                            e.last_error_code.clone().unwrap_or_default(),
                            time(Some(e.event.created_at)),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(
                        &["ID", "TYPE", "AGGREGATE", "ATTEMPTS", "CODE", "CREATED"],
                        &rows
                    )
                );
                println!("({} stuck events)", stuck.len());
            }
        }
        Command::Audit { limit } => {
            let rows = admin.audit(limit).await?;
            if json {
                print_json(&rows)?;
            } else {
                let rows: Vec<Vec<String>> = rows
                    .iter()
                    .map(|a| {
                        vec![
                            time(Some(a.created_at)),
                            a.actor.clone(),
                            a.action.clone(),
                            a.job_id.map_or_else(
                                || {
                                    a.detail
                                        .as_ref()
                                        .and_then(|d| {
                                            d["queue"]
                                                .as_str()
                                                .map(|q| format!("queue {q}"))
                                                .or_else(|| {
                                                    d["schedule"]
                                                        .as_str()
                                                        .map(|s| format!("schedule {s}"))
                                                })
                                        })
                                        .unwrap_or_else(|| "-".to_owned())
                                },
                                |id| format!("job {id}"),
                            ),
                            format!(
                                "{} -> {}",
                                a.before_state.as_deref().unwrap_or("-"),
                                a.after_state.as_deref().unwrap_or("-")
                            ),
                            a.reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["AT", "ACTOR", "ACTION", "ON", "STATE", "REASON"], &rows)
                );
            }
        }
    }
    Ok(())
}

fn admin_actor(actor: Option<&str>) -> String {
    actor.map_or_else(jobq::admin::default_actor, str::to_owned)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if json {
                let e = serde_json::json!({"error": {"code": f.code, "message": f.message}});
                eprintln!("{e}");
            } else {
                eprintln!("error: {}", f.message);
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_rates_and_times_parse() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("7w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_rate("50/s"), Ok(50.0));
        assert_eq!(parse_rate("120/m"), Ok(2.0));
        assert_eq!(parse_rate("5"), Ok(5.0));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("fast").is_err());
        let t = parse_time("2026-01-02T03:04:05Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-01-02T03:04:05+00:00");
        let ago = Utc::now() - parse_time("2h").unwrap();
        assert!((ago.num_seconds() - 7200).abs() < 5);
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/prod"),
            "postgres://app:***@db:5432/prod"
        );
        assert_eq!(redact("postgres://app@db/prod"), "postgres://app@db/prod");
    }

    #[test]
    fn tables_align_and_ages_read_well() {
        let t = table(
            &["A", "LONGER"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
        assert_eq!(human_secs(3.25), "3.2s");
        assert_eq!(human_secs(252.0), "4m12s");
        assert_eq!(human_secs(7500.0), "2h05m");
        assert_eq!(human_secs(3.0 * 86400.0 + 4.0 * 3600.0), "3d04h");
    }
}
