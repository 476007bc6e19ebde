//! `jobq audit`: the most recent operator actions.

use clap::Args;

use super::{Cx, Failure, print_json, table, time};

#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// At most this many.
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

/// The most recent operator actions.
pub(crate) async fn audit(cx: &Cx, args: AuditArgs) -> Result<(), Failure> {
    let AuditArgs { limit } = args;
    let (admin, json) = (&cx.admin, cx.json);
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
                                    d["queue"].as_str().map(|q| format!("queue {q}")).or_else(
                                        || d["schedule"].as_str().map(|s| format!("schedule {s}")),
                                    )
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

    Ok(())
}
