//! `jobq migrate` and `jobq status`: the schema, and the queues and kinds at a glance.

use std::time::Duration;

use clap::Args;
use jobq::stats::{Stats, StatsOptions};

use super::output::{human_secs, opt_age};
use super::{Cx, Failure, parse_duration, print_json, table, time};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// How far back finished counts and run times look (e.g. 15m, 1h, 1d).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    window: Duration,
}

/// Create or upgrade jobq's schema.
pub(crate) async fn migrate(cx: &Cx) -> Result<(), Failure> {
    let (pool, json) = (&cx.pool, cx.json);
    jobq::migrate(pool).await?;
    if json {
        print_json(&serde_json::json!({"migrated": true, "version": jobq::MIGRATIONS.len()}))?;
    } else {
        println!("jobq schema is at version {}", jobq::MIGRATIONS.len());
    }

    Ok(())
}

/// Queues and kinds: pending, running against capacity, oldest age, failures, run
/// times against leases, unserved kinds.
pub(crate) async fn status(cx: &Cx, args: StatusArgs) -> Result<(), Failure> {
    let StatusArgs { window } = args;
    let (pool, json) = (&cx.pool, cx.json);
    let opts = StatsOptions {
        window,
        ..StatsOptions::default()
    };
    let s = jobq::stats::stats_with(pool, &opts).await?;
    if json {
        print_json(&s)?;
    } else {
        print_status(&s);
    }

    Ok(())
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
    super::ordering::print_parked(&s.parked_keys);
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
        if !s.outbox.failures.is_empty() {
            let rows: Vec<Vec<String>> = s
                .outbox
                .failures
                .iter()
                .map(|f| vec![f.code.clone(), f.events.to_string()])
                .collect();
            print!("{}", table(&["PUBLISH FAILURE", "EVENTS"], &rows));
        }
    }
}
