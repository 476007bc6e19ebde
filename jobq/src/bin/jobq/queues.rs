//! `jobq pause` and `jobq resume`.

use clap::Args;

use super::{Cx, Failure, print_json};

#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The queue.
    queue: String,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The queue.
    queue: String,
    /// Why, for the audit log.
    #[arg(long)]
    reason: Option<String>,
}

/// Pause a queue: workers on every node stop claiming from it; nothing is lost.
pub(crate) async fn pause(cx: &Cx, args: PauseArgs) -> Result<(), Failure> {
    let PauseArgs { queue, reason } = args;
    let (admin, json) = (&cx.admin, cx.json);
    let c = admin.pause(&queue, reason.as_deref()).await?;
    if json {
        print_json(&c)?;
    } else if c.was_paused {
        println!("queue {queue} was already paused");
    } else {
        println!("queue {queue} paused: workers stop claiming from it within a poll interval");
    }

    Ok(())
}

/// Resume a paused queue.
pub(crate) async fn resume(cx: &Cx, args: ResumeArgs) -> Result<(), Failure> {
    let ResumeArgs { queue, reason } = args;
    let (admin, json) = (&cx.admin, cx.json);
    let c = admin.resume(&queue, reason.as_deref()).await?;
    if json {
        print_json(&c)?;
    } else if c.was_paused {
        println!("queue {queue} resumed");
    } else {
        println!("queue {queue} was not paused");
    }

    Ok(())
}
