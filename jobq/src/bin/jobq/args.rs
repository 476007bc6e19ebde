//! Arguments shared by several commands, their parsers, and reading input (a payload,
//! a confirmation).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use jobq::admin::Filter;

use super::{Failure, fail};

#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this last error code.
    #[arg(long)]
    code: Option<String>,
    /// Finished at or after: RFC 3339, or an age such as 2h or 7d.
    #[arg(long, value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Finished before: RFC 3339, or an age such as 30m.
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Include cancelled jobs.
    #[arg(long)]
    cancelled: bool,
}

impl FilterArgs {
    pub(crate) fn filter(&self) -> Filter {
        Filter {
            kind: self.kind.clone(),
            queue: self.queue.clone(),
            code: self.code.clone(),
            since: self.since,
            until: self.until,
            include_cancelled: self.cancelled,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.kind.is_none()
            && self.queue.is_none()
            && self.code.is_none()
            && self.since.is_none()
            && self.until.is_none()
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30s, 15m, 2h or 7d"))?;
    let secs = match unit {
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return Err(format!("unknown unit `{unit}` in `{s}`: use s, m, h or d")),
    };
    Duration::try_from_secs_f64(n * secs).map_err(|e| format!("`{s}`: {e}"))
}

/// `KIND=DONE[,FAILED[,CANCELLED]]`: a kind and up to three retention periods.
pub(crate) fn parse_kind_retention(s: &str) -> Result<(String, [Option<Duration>; 3]), String> {
    let (kind, periods) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not KIND=DONE[,FAILED[,CANCELLED]]"))?;
    if kind.trim().is_empty() {
        return Err(format!("`{s}` names no kind"));
    }
    let mut out = [None; 3];
    let parts: Vec<&str> = periods.split(',').collect();
    if parts.len() > 3 {
        return Err(format!(
            "`{s}` has more than three periods (done, failed, cancelled)"
        ));
    }
    for (slot, part) in out.iter_mut().zip(parts) {
        if !part.trim().is_empty() {
            *slot = Some(parse_duration(part)?);
        }
    }
    Ok((kind.trim().to_owned(), out))
}

pub(crate) fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let age = parse_duration(s)
        .map_err(|_| format!("`{s}` is neither an RFC 3339 time nor an age like 2h or 7d"))?;
    let age = chrono::Duration::from_std(age).map_err(|e| e.to_string())?;
    Ok(Utc::now() - age)
}

pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    let (n, per) = match s.split_once('/') {
        Some((n, unit)) => (
            n,
            match unit {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(format!("unknown rate unit `{unit}`: use /s, /m or /h")),
            },
        ),
        None => (s, 1.0),
    };
    let n: f64 = n
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a rate like 50/s"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("rate must be positive, got `{s}`"));
    }
    Ok(n / per)
}

pub(crate) fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(fail(
            "confirmation_required",
            format!("{question} — refusing without --yes (stdin is not a terminal)"),
        ));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if matches!(line.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(fail("aborted", "aborted; nothing was changed"))
    }
}

/// A payload argument: JSON text, `@path` for a file's contents, `-` for stdin.
pub(crate) fn read_payload(arg: &str) -> Result<serde_json::Value, Failure> {
    let text = if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| fail("payload_unreadable", format!("reading stdin: {e}")))?;
        text
    } else if let Some(path) = arg.strip_prefix('@') {
        std::fs::read_to_string(path)
            .map_err(|e| fail("payload_unreadable", format!("reading {path}: {e}")))?
    } else {
        arg.to_owned()
    };
    serde_json::from_str(&text)
        .map_err(|e| fail("invalid_payload", format!("the payload is not JSON: {e}")))
}
