//! `jobq`: operate a jobq database from a shell — what is pending, what failed, what did
//! we already do — and act on it: replay, cancel, edit a payload, retry now, pause,
//! resume, prune, change a limit.
//!
//! Reads `DATABASE_URL` (or `--database-url`). Prints readable tables by default and JSON
//! with `--json`. Bulk actions ask for confirmation on a terminal and need `--yes`
//! otherwise. Every action is written to `jobq.job_audit` with `--actor` (default
//! `$USER`) and `--reason`.

mod args;
mod audit;
mod dashboard;
mod jobs;
mod limits;
mod ordering;
mod outbox;
mod output;
mod prune;
mod queues;
mod schedules;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use jobq::admin::Admin;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

use args::{FilterArgs, parse_duration};
use output::{Failure, fail, print_json, table, time};

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
    Status(status::StatusArgs),
    /// List failed (and with --cancelled, cancelled) jobs, newest first.
    Failed(jobs::FailedArgs),
    /// One job: every column, its error history and its audit trail.
    Show(jobs::ShowArgs),
    /// Replay one failed or cancelled job, or (with filters) many at a bounded rate.
    Replay(jobs::ReplayArgs),
    /// Cancel jobs: pending or failed at once; running ones after their attempt.
    Cancel(jobs::CancelArgs),
    /// Replace the payload of a failed or cancelled job (to fix it before a replay); the
    /// audit row keeps the payload before and after.
    EditPayload(jobs::EditPayloadArgs),
    /// Make a pending job that waits for its backoff due now.
    RetryNow(jobs::RetryNowArgs),
    /// Pause a queue: workers on every node stop claiming from it; nothing is lost.
    Pause(queues::PauseArgs),
    /// Resume a paused queue.
    Resume(queues::ResumeArgs),
    /// Delete terminal jobs past their retention (with their effect-ledger rows).
    Prune(prune::PruneArgs),
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
    Outbox(outbox::OutboxArgs),
    /// Let the jobs parked behind the failed jobs of an ordering key proceed: with
    /// --skip-failed those failed jobs stay `failed` but stop blocking the key (audited).
    Unpark {
        /// The ordering key.
        key: String,
        /// Skip the key's failed jobs (required: the only way to unpark without a replay
        /// or a cancel).
        #[arg(long)]
        skip_failed: bool,
        /// The key's scope (its kind, or the `ordering_scope` name); default: every scope.
        #[arg(long)]
        scope: Option<String>,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// The most recent operator actions.
    Audit(audit::AuditArgs),
}

/// What every command gets: the pool, an [`Admin`] acting as `--actor`, the output mode.
pub(crate) struct Cx {
    pool: PgPool,
    admin: Admin,
    json: bool,
    actor: Option<String>,
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

async fn run(cli: Cli) -> Result<(), Failure> {
    let pool = connect(cli.database_url.as_deref()).await?;
    let mut admin = Admin::new(pool.clone());
    if let Some(actor) = &cli.actor {
        admin = admin.actor(actor.clone());
    }
    let cx = Cx {
        pool,
        admin,
        json: cli.json,
        actor: cli.actor,
    };
    match cli.command {
        Command::Migrate => status::migrate(&cx).await?,
        Command::Status(args) => status::status(&cx, args).await?,
        Command::Failed(args) => jobs::failed(&cx, args).await?,
        Command::Show(args) => jobs::show(&cx, args).await?,
        Command::Replay(args) => jobs::replay(&cx, args).await?,
        Command::Cancel(args) => jobs::cancel(&cx, args).await?,
        Command::EditPayload(args) => jobs::edit_payload(&cx, args).await?,
        Command::RetryNow(args) => jobs::retry_now(&cx, args).await?,
        Command::Pause(args) => queues::pause(&cx, args).await?,
        Command::Resume(args) => queues::resume(&cx, args).await?,
        Command::Prune(args) => prune::prune(&cx, args).await?,
        Command::Outbox(args) => outbox::outbox(&cx, args).await?,
        Command::Audit(args) => audit::audit(&cx, args).await?,
        Command::Unpark {
            key,
            skip_failed,
            scope,
            reason,
        } => {
            ordering::unpark(
                &cx.admin,
                &key,
                skip_failed,
                scope.as_deref(),
                reason.as_deref(),
                cx.json,
            )
            .await?
        }
        Command::Schedules => schedules::list(&cx.admin, cx.json).await?,
        Command::Schedule { action } => schedules::act(&cx.admin, action, cx.json).await?,
        Command::Limits => limits::list(&cx.admin, cx.json).await?,
        Command::Limit { action } => limits::act(&cx.admin, action, cx.json).await?,
        Command::Dashboard(args) => dashboard::run(cx.pool.clone(), args).await?,
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
    use chrono::Utc;

    use super::args::{parse_rate, parse_time};
    use super::output::human_secs;
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
