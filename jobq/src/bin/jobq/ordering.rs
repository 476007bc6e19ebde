//! `jobq unpark KEY --skip-failed [--scope S] --reason R`, the `PARKED KEYS` section of
//! `jobq status`, and the ordering lines of `jobq show`.

use jobq::admin::{Admin, JobRow, ParkedKey};

use super::{Failure, fail, print_json, table, time};

/// `jobq unpark`: the failed jobs of the key stop blocking it (they stay `failed`), so
/// the jobs parked behind them proceed. Audited per failed job.
pub(crate) async fn unpark(
    admin: &Admin,
    key: &str,
    skip_failed: bool,
    scope: Option<&str>,
    reason: Option<&str>,
    json: bool,
) -> Result<(), Failure> {
    if !skip_failed {
        return Err(fail(
            "skip_failed_required",
            "`jobq unpark` needs --skip-failed: the key's failed jobs stay `failed` and stop blocking it (to run them again first, `jobq replay ID` instead)",
        ));
    }
    let done = admin.unpark(key, scope, reason).await?;
    if json {
        return print_json(&done);
    }
    let skipped: Vec<String> = done.skipped.iter().map(ToString::to_string).collect();
    println!(
        "unparked {key}: failed job(s) {} skipped (still failed), {} job(s) released",
        skipped.join(", "),
        done.released
    );
    Ok(())
}

/// The parked keys of `jobq status`, when there are any.
pub(crate) fn print_parked(keys: &[ParkedKey]) {
    if keys.is_empty() {
        return;
    }
    println!();
    let total: i64 = keys.iter().map(|k| k.parked).sum();
    println!("PARKED KEYS ({total} jobs parked behind failed jobs)");
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            vec![
                k.scope.clone(),
                k.key.clone(),
                k.blocker.to_string(),
                k.blocker_kind.clone(),
                k.code.clone().unwrap_or_default(),
                time(k.since),
                k.parked.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["SCOPE", "KEY", "BLOCKER", "KIND", "CODE", "SINCE", "PARKED"],
            &rows
        )
    );
}

/// The ordering lines of `jobq show`: the key, and what the job waits behind.
pub(crate) fn print_show(j: &JobRow) {
    let (Some(scope), Some(key)) = (&j.ordering_scope, &j.ordering_key) else {
        return;
    };
    println!("{:<17} {key} (scope {scope})", "ordering key");
    if let Some(m) = j.parked_behind {
        println!(
            "parked behind job {m} (failed): replay or cancel it, or `jobq unpark {key} --skip-failed --scope {scope}`"
        );
    } else if let Some(m) = j.blocked_by
        && (j.state == "pending" || j.state == "scheduled")
    {
        println!("waiting behind job {m} (the job of its key before it)");
    }
    if j.ordering_skipped {
        println!("unparked: no longer blocks its key (skipped with --skip-failed)");
    }
}
