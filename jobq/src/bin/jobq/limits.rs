//! `jobq limits` and `jobq limit set`: the cluster-wide concurrency and rate limits with
//! their usage, and an operator's changes to them, each audited.

use clap::{Args, Subcommand};
use jobq::Rate;
use jobq::admin::{Admin, LimitSet, LimitTarget};

use super::{Failure, fail, print_json, table, time};

/// `jobq limit …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LimitAction {
    /// Set (or with --clear remove) an operator's limit on a kind or a queue; every node
    /// claims by it within a poll interval. The operator's values win over the code's.
    Set(SetArgs),
}

/// `jobq limit set KIND --concurrency 3 | --rate 50/s [--burst N] | --clear`, or
/// `--queue NAME` instead of a kind.
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// The kind (or give --queue).
    #[arg(required_unless_present = "queue", conflicts_with = "queue")]
    kind: Option<String>,
    /// A queue instead of a kind (concurrency only).
    #[arg(long)]
    queue: Option<String>,
    /// The most running jobs across all nodes (per key for a kind limited per key).
    #[arg(long)]
    concurrency: Option<u32>,
    /// The rate: N/s, N/min or N/h.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<Rate>,
    /// The bucket's size with --rate (default: the rate's count).
    #[arg(long, requires = "rate")]
    burst: Option<u32>,
    /// Remove the operator's limit: the code's, if any, applies again.
    #[arg(long, conflicts_with_all = ["concurrency", "rate", "burst"])]
    clear: bool,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    Rate::parse(s).map_err(|e| e.to_string())
}

/// `jobq limits`: every limit in force with its usage.
pub(crate) async fn list(admin: &Admin, json: bool) -> Result<(), Failure> {
    let rows = admin.limits().await?;
    if json {
        return print_json(&rows);
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|u| {
            let l = &u.limit;
            let concurrency = match l.concurrency {
                None => "-".to_owned(),
                Some(c) if l.per_key => format!(
                    "{} of {c} per key (busiest key)",
                    u.busiest_key_running.unwrap_or(0)
                ),
                Some(c) => format!("{} of {c}", u.running),
            };
            let rate = match (l.rate_count, l.rate_secs) {
                (Some(n), Some(secs)) => {
                    let unit = match secs as u64 {
                        1 => "s".to_owned(),
                        60 => "min".to_owned(),
                        3600 => "h".to_owned(),
                        s => format!("{s}s"),
                    };
                    let per_key = if l.rate_per_key { " per key" } else { "" };
                    format!("{n}/{unit}{per_key} burst {}", l.burst.unwrap_or(n))
                }
                _ => "-".to_owned(),
            };
            let tokens = match (u.tokens, u.next_token_at) {
                (Some(t), None) => format!("{t:.1}"),
                (Some(t), Some(at)) => format!("{t:.1} (next {})", time(Some(at))),
                (None, _) => "-".to_owned(),
            };
            vec![
                l.scope.clone(),
                l.name.clone(),
                u.running.to_string(),
                concurrency,
                rate,
                tokens,
                format!("{} keys, {} throttled", u.key_buckets, u.throttled),
                match &l.updated_by {
                    Some(by) => format!("{} ({by})", l.source),
                    None => l.source.clone(),
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "SCOPE",
                "NAME",
                "RUNNING",
                "CONCURRENCY",
                "RATE",
                "TOKENS",
                "BUCKETS",
                "SOURCE"
            ],
            &rows
        )
    );
    Ok(())
}

/// `jobq limit set …`.
pub(crate) async fn act(admin: &Admin, action: LimitAction, json: bool) -> Result<(), Failure> {
    let LimitAction::Set(a) = action;
    let target = match (a.kind, a.queue) {
        (Some(kind), None) => LimitTarget::Kind(kind),
        (None, Some(queue)) => LimitTarget::Queue(queue),
        _ => return Err(fail("usage", "give a kind or --queue NAME")),
    };
    let name = match &target {
        LimitTarget::Kind(k) => format!("kind {k}"),
        LimitTarget::Queue(q) => format!("queue {q}"),
    };
    let reason = a.reason.as_deref();
    let changed = if a.clear {
        admin.limit_clear(&target, reason).await?
    } else {
        let change = LimitSet {
            concurrency: a.concurrency,
            rate: a.rate,
            burst: a.burst,
        };
        admin.limit_set(&target, &change, reason).await?
    };
    if json {
        return print_json(
            &serde_json::json!({"target": name, "cleared": a.clear, "changed": changed}),
        );
    }
    match (a.clear, changed) {
        (true, true) => println!(
            "{name}: operator limit removed; the code's limit (if any) applies within a poll interval"
        ),
        (true, false) => println!("{name}: had no operator limit"),
        (false, _) => println!("{name}: limit set; every node claims by it within a poll interval"),
    }
    Ok(())
}
