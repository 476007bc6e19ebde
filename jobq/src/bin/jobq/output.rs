//! How the CLI prints: tables, JSON, times and ages, and its one-line errors.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// An error for the user: what went wrong, as one line.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl From<jobq::Error> for Failure {
    fn from(e: jobq::Error) -> Self {
        Failure {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

pub(crate) fn fail(code: &str, message: impl Into<String>) -> Failure {
    Failure {
        code: code.to_owned(),
        message: message.into(),
    }
}

pub(crate) fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).map_err(|e| fail("serialize", e.to_string()))?;
    println!("{text}");
    Ok(())
}

/// A plain text table: left-aligned columns separated by two spaces.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// `3s`, `4m12s`, `2h05m`, `3d04h`.
pub(crate) fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 10.0 {
        return format!("{s:.1}s");
    }
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

pub(crate) fn opt_age(a: Option<f64>) -> String {
    a.map_or_else(|| "-".to_owned(), human_secs)
}

pub(crate) fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}
