//! `jobq outbox`: stuck events, and replaying one.

use std::time::Duration;

use clap::Args;

use super::{Cx, Failure, parse_duration, print_json, table, time};

#[derive(Debug, Args)]
pub(crate) struct OutboxArgs {
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
}

/// Stuck outbox events (unpublished and old, or whose publish failed); with
/// `--replay ID`, send one event again (audited).
pub(crate) async fn outbox(cx: &Cx, args: OutboxArgs) -> Result<(), Failure> {
    let OutboxArgs {
        older_than,
        limit,
        replay,
        reason,
    } = args;
    let (pool, json) = (&cx.pool, cx.json);
    if let Some(id) = replay {
        let actor = cx.actor.clone().unwrap_or_else(jobq::admin::default_actor);
        jobq::outbox::replay(pool, id, &actor, reason.as_deref()).await?;
        if json {
            print_json(&serde_json::json!({"replayed": id}))?;
        } else {
            println!("event {id} will be sent again");
        }
        return Ok(());
    }
    let stuck = jobq::outbox::stuck(pool, older_than, i64::from(limit)).await?;
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

    Ok(())
}
