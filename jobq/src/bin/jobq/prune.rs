//! `jobq prune`: delete finished jobs past their retention, per kind if asked, and inbox
//! rows past theirs.

use std::time::Duration;

use clap::Args;
use jobq::maintenance::{Pruner, PrunerConfig, Retention};

use super::args::{confirm, parse_kind_retention};
use super::{Cx, Failure, admin_actor, parse_duration, print_json};

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
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
    /// Keep inbox rows (events consumers applied) this long after they were applied.
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    inbox_after: Duration,
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
}

/// Delete terminal jobs past their retention (with their effect-ledger rows).
pub(crate) async fn prune(cx: &Cx, args: PruneArgs) -> Result<(), Failure> {
    let PruneArgs {
        dry_run,
        done_after,
        failed_after,
        cancelled_after,
        inbox_after,
        batch,
        kind_retention,
        yes,
    } = args;
    let (pool, json) = (&cx.pool, cx.json);
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
        inbox_after,
        actor: admin_actor(cx.actor.as_deref()),
        ..PrunerConfig::default()
    };
    let pruner = Pruner::new(pool.clone(), config);
    let preview = pruner.dry_run(None).await?;
    if dry_run || preview.total() + preview.inbox == 0 {
        if json {
            print_json(&serde_json::json!({"dry_run": dry_run, "report": preview}))?;
        } else {
            println!(
                "would delete {} jobs: {} done, {} failed, {} cancelled; {} inbox rows",
                preview.total(),
                preview.done,
                preview.failed,
                preview.cancelled,
                preview.inbox
            );
        }
        return Ok(());
    }
    let inbox = match preview.inbox {
        0 => String::new(),
        n => format!(" and {n} inbox rows"),
    };
    confirm(&format!("Delete {} jobs{inbox}?", preview.total()), yes)?;
    let r = pruner.run_once().await?;
    if json {
        print_json(&serde_json::json!({"dry_run": false, "report": r}))?;
    } else {
        println!(
            "deleted {} jobs: {} done, {} failed, {} cancelled; {} inbox rows ({} batches)",
            r.total(),
            r.done,
            r.failed,
            r.cancelled,
            r.inbox,
            r.batches
        );
    }

    Ok(())
}
