//! Formatting for pages: times, ages, query strings, and the inline SVG charts.

use std::fmt::Write;

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};

#[derive(Template)]
#[template(path = "message.html")]
struct Message<'a> {
    status: String,
    message: &'a str,
}

/// A small HTML page saying `message` with `status` (big enough that browsers show it
/// rather than their own error page).
pub(super) fn message(status: StatusCode, message: &str) -> Response {
    let page = Message {
        status: status.to_string(),
        message,
    };
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(_) => (status, format!("{message}\n")).into_response(),
    }
}

/// `2026-12-01 21:03:04Z`, or `—`.
pub(super) fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "—".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%SZ").to_string(),
    )
}

/// `3m 02s`, or `—`.
pub(super) fn age(secs: Option<f64>) -> String {
    let Some(s) = secs else {
        return "—".to_owned();
    };
    let s = s.max(0.0);
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m {:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s < 86_400.0 {
        format!(
            "{}h {:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    } else {
        format!(
            "{}d {:02}h",
            (s / 86_400.0) as u64,
            ((s % 86_400.0) / 3600.0) as u64
        )
    }
}

/// `opt` or `—`.
pub(super) fn or_dash(opt: Option<&str>) -> String {
    opt.map_or_else(|| "—".to_owned(), str::to_owned)
}

/// Percent-encodes a query-string component.
pub(super) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `k1=v1&k2=v2` of the pairs whose value is not empty.
pub(super) fn query(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A bar chart of `values` (one bar each, oldest left) as inline SVG: numbers only, so
/// the markup is safe to embed unescaped. `class` picks the colour from the page's CSS.
pub(super) fn bars(values: &[i64], class: &str, label: &str) -> String {
    let (w, h) = (600.0_f64, 80.0_f64);
    let max = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = values.len().max(1) as f64;
    let bw = w / n;
    let mut svg = format!(
        "<svg class=\"chart {class}\" viewBox=\"0 0 {w} {h}\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"{label}\">"
    );
    for (i, v) in values.iter().enumerate() {
        if *v == 0 {
            continue;
        }
        let bh = (*v as f64 / max * (h - 2.0)).max(1.0);
        let _ = write!(
            svg,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\"><title>{v}</title></rect>",
            i as f64 * bw,
            h - bh,
            (bw - 1.0).max(0.5),
            bh
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::{age, bars, query};

    #[test]
    fn formats_read_well() {
        assert_eq!(age(Some(3.25)), "3.2s");
        assert_eq!(age(Some(125.0)), "2m 05s");
        assert_eq!(age(Some(7200.0 + 60.0)), "2h 01m");
        assert_eq!(age(None), "—");
        assert_eq!(
            query(&[("kind", "a b&c"), ("state", ""), ("before", "9")]),
            "kind=a%20b%26c&before=9"
        );
        let svg = bars(&[0, 2, 4], "done", "done per minute");
        assert_eq!(svg.matches("<rect").count(), 2, "{svg}");
    }
}
