//! Commands on jobs: `failed`, `show`, `replay` (one or by filter), `cancel`,
//! `edit-payload`, `retry-now`.

use clap::Args;
use jobq::JobId;
use jobq::admin::BulkReplay;

use super::args::{confirm, parse_rate, read_payload};
use super::{Cx, Failure, FilterArgs, fail, print_json, table, time};

#[derive(Debug, Args)]
pub(crate) struct FailedArgs {
    #[command(flatten)]
    filter: FilterArgs,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The job id.
    id: i64,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
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
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// Job ids.
    #[arg(required = true)]
    ids: Vec<i64>,
    /// Do not ask for confirmation (needed for more than one id).
    #[arg(long, short)]
    yes: bool,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct EditPayloadArgs {
    /// The job id.
    id: i64,
    /// The new payload: JSON text, `@path` to read it from a file, or `-` for stdin.
    payload: String,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct RetryNowArgs {
    /// The job id.
    id: i64,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

/// List failed (and with --cancelled, cancelled) jobs, newest first.
pub(crate) async fn failed(cx: &Cx, args: FailedArgs) -> Result<(), Failure> {
    let FailedArgs { filter, limit } = args;
    let (admin, json) = (&cx.admin, cx.json);
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

    Ok(())
}

/// One job: every column, its error history and its audit trail.
pub(crate) async fn show(cx: &Cx, args: ShowArgs) -> Result<(), Failure> {
    let ShowArgs { id } = args;
    let (admin, json) = (&cx.admin, cx.json);
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
            ("trace id", j.trace_id().unwrap_or_else(|| "-".into())),
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

    Ok(())
}

/// Replay one failed or cancelled job, or (with filters) many at a bounded rate.
pub(crate) async fn replay(cx: &Cx, args: ReplayArgs) -> Result<(), Failure> {
    let ReplayArgs {
        id,
        filter,
        rate,
        limit,
        dry_run,
        yes,
        reason,
    } = args;
    let (admin, json) = (&cx.admin, cx.json);
    match id {
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
    };
    Ok(())
}

/// Cancel jobs: pending or failed at once; running ones after their attempt.
pub(crate) async fn cancel(cx: &Cx, args: CancelArgs) -> Result<(), Failure> {
    let CancelArgs { ids, yes, reason } = args;
    let (admin, json) = (&cx.admin, cx.json);
    if ids.len() > 1 {
        confirm(&format!("Cancel {} jobs?", ids.len()), yes)?;
    }
    // On an error, what was cancelled before it is still reported.
    let mut done = Vec::new();
    let mut stopped = None;
    for id in ids {
        match admin.cancel(JobId(id), reason.as_deref()).await {
            Ok(t) => done.push(t),
            Err(e) => {
                stopped = Some((id, e));
                break;
            }
        }
    }
    if json {
        print_json(&done)?;
    } else {
        for t in &done {
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
    if let Some((id, e)) = stopped {
        let mut f = Failure::from(e);
        f.message = format!(
            "stopped at job {id} after cancelling {} job(s): {}",
            done.len(),
            f.message
        );
        return Err(f);
    }
    Ok(())
}

/// Replace the payload of a failed or cancelled job (to fix it before a replay); the
/// audit row keeps the payload before and after.
pub(crate) async fn edit_payload(cx: &Cx, args: EditPayloadArgs) -> Result<(), Failure> {
    let EditPayloadArgs {
        id,
        payload,
        reason,
    } = args;
    let (admin, json) = (&cx.admin, cx.json);
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

    Ok(())
}

/// Make a pending job that waits for its backoff due now.
pub(crate) async fn retry_now(cx: &Cx, args: RetryNowArgs) -> Result<(), Failure> {
    let RetryNowArgs { id, reason } = args;
    let (admin, json) = (&cx.admin, cx.json);
    let t = admin.retry_now(JobId(id), reason.as_deref()).await?;
    if json {
        print_json(&t)?;
    } else {
        println!("job {} is due now", t.id);
    }

    Ok(())
}
