//! `jobq schedules` and `jobq schedule pause|resume|run-now NAME`: the periodic
//! schedules as rows an operator can see and change, each change audited.

use clap::Subcommand;
use jobq::admin::Admin;

use super::{Failure, print_json, table, time};

/// `jobq schedule …`.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleAction {
    /// Stop enqueuing its slots; the slots that pass meanwhile are handled by its
    /// missed-slot policy on resume.
    Pause {
        /// The schedule's name.
        name: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Enqueue its slots again.
    Resume {
        /// The schedule's name.
        name: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Enqueue one job of it now, outside its slots.
    RunNow {
        /// The schedule's name.
        name: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `jobq schedules`: name, kind, expression, zone, next slot, last slot and its job's
/// state, paused.
pub(crate) async fn list(admin: &Admin, json: bool) -> Result<(), Failure> {
    let rows = admin.schedules().await?;
    if json {
        return print_json(&rows);
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.kind.clone(),
                s.expression.clone(),
                s.tz.clone(),
                time(Some(s.next_slot)),
                time(s.last_slot),
                match (s.last_job_id, &s.last_job_state) {
                    (Some(id), Some(state)) => format!("{id} {state}"),
                    (Some(id), None) => format!("{id} pruned"),
                    _ => "-".to_owned(),
                },
                s.missed.clone(),
                if s.paused {
                    format!("paused by {}", s.paused_by.as_deref().unwrap_or("?"))
                } else {
                    "no".to_owned()
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "NAME", "KIND", "SCHEDULE", "TZ", "NEXT", "LAST", "LAST JOB", "MISSED", "PAUSED"
            ],
            &rows
        )
    );
    Ok(())
}

/// `jobq schedule pause|resume|run-now NAME`.
pub(crate) async fn act(admin: &Admin, action: ScheduleAction, json: bool) -> Result<(), Failure> {
    match action {
        ScheduleAction::Pause { name, reason } => {
            let was = admin.schedule_pause(&name, reason.as_deref()).await?;
            if json {
                print_json(
                    &serde_json::json!({"schedule": name, "was_paused": was, "paused": true}),
                )?;
            } else if was {
                println!("schedule {name} was already paused");
            } else {
                println!("schedule {name} paused");
            }
        }
        ScheduleAction::Resume { name, reason } => {
            let was = admin.schedule_resume(&name, reason.as_deref()).await?;
            if json {
                print_json(
                    &serde_json::json!({"schedule": name, "was_paused": was, "paused": false}),
                )?;
            } else if was {
                println!("schedule {name} resumed");
            } else {
                println!("schedule {name} was not paused");
            }
        }
        ScheduleAction::RunNow { name, reason } => {
            let id = admin.schedule_run_now(&name, reason.as_deref()).await?;
            if json {
                print_json(&serde_json::json!({"schedule": name, "job": id}))?;
            } else {
                println!("schedule {name}: enqueued job {id}");
            }
        }
    }
    Ok(())
}
