//! The results table: every figure with its median, min–max, its ratio to the matching
//! ceiling row, and whether the target is met (and by how much it is missed).

use std::collections::HashMap;
use std::time::Duration;

use crate::Settings;
use crate::util::Samples;

/// A target a figure is held to.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// At least this fraction of the matching ceiling row.
    RatioAtLeast(f64),
    AtLeast(f64, &'static str),
    AtMost(f64, &'static str),
}

impl Target {
    pub(crate) fn ratio_at_least(r: f64) -> Target {
        Target::RatioAtLeast(r)
    }
    pub(crate) fn at_least(v: f64, unit: &'static str) -> Target {
        Target::AtLeast(v, unit)
    }
    pub(crate) fn at_most(v: f64, unit: &'static str) -> Target {
        Target::AtMost(v, unit)
    }

    fn describe(&self) -> String {
        match self {
            Target::RatioAtLeast(r) => format!("≥ {:.0} % of ceiling", r * 100.0),
            Target::AtLeast(v, u) => format!("≥ {} {u}", fmt_num(*v)),
            Target::AtMost(v, u) => format!("≤ {} {u}", fmt_num(*v)),
        }
    }

    /// `None` when the target cannot be judged (no ceiling measured in this run).
    fn verdict(&self, value: f64, ratio: Option<f64>) -> Option<String> {
        let (ok, gap) = match self {
            Target::RatioAtLeast(r) => {
                let ratio = ratio?;
                let gap = (r - ratio) * 100.0;
                // Under a point, say how much: "0 points" read as met.
                let digits = if gap < 1.0 { 1 } else { 0 };
                (ratio >= *r, format!("{gap:.digits$} points"))
            }
            Target::AtLeast(v, _) => (value >= *v, format!("{:.0} %", (1.0 - value / v) * 100.0)),
            Target::AtMost(v, _) => (value <= *v, format!("{:.0} %", (value / v - 1.0) * 100.0)),
        };
        Some(if ok {
            "met".to_owned()
        } else {
            format!("**missed** by {gap}")
        })
    }
}

#[derive(Debug)]
struct Row {
    name: String,
    samples: Samples,
    unit: &'static str,
    ratio_to: Option<String>,
    targets: Vec<Target>,
}

/// All rows of one run, in the order they were measured.
#[derive(Debug, Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
    ceilings: HashMap<String, f64>,
    notes: Vec<String>,
}

impl Report {
    /// A line printed under the table's title (how the server was configured).
    pub(crate) fn note(&mut self, line: String) {
        self.notes.push(line);
    }

    /// A reference row others are compared with.
    pub(crate) fn ceiling(&mut self, key: &str, name: &str, samples: Samples) {
        self.ceilings.insert(key.to_owned(), samples.median());
        self.rows.push(Row {
            name: name.to_owned(),
            samples,
            unit: "jobs/s",
            ratio_to: None,
            targets: vec![],
        });
    }

    /// A jobq throughput row, with its ratio to ceiling row `ratio_to`.
    pub(crate) fn jobq(
        &mut self,
        name: &str,
        samples: Samples,
        ratio_to: Option<&str>,
        targets: Vec<Target>,
    ) {
        self.rows.push(Row {
            name: name.to_owned(),
            samples,
            unit: "jobs/s",
            ratio_to: ratio_to.map(str::to_owned),
            targets,
        });
    }

    /// Any other figure (cost, latency, memory).
    pub(crate) fn cost(
        &mut self,
        name: &str,
        samples: Samples,
        unit: &'static str,
        targets: Vec<Target>,
    ) {
        self.rows.push(Row {
            name: name.to_owned(),
            samples,
            unit,
            ratio_to: None,
            targets,
        });
    }

    pub(crate) fn print(&self, s: &Settings, took: Duration) {
        println!();
        println!(
            "jobq bench — {} job(s) per drain, median of {} repetition(s) (min–max){}; took {:.0} s",
            fmt_num(s.jobs as f64),
            s.reps,
            if s.quick {
                ", QUICK (smoke run: figures are not meaningful)"
            } else {
                ""
            },
            took.as_secs_f64()
        );
        println!(
            "ratios are between medians of this run; WAL is server-wide (other clients of the server add to it)"
        );
        for n in &self.notes {
            println!("{n}");
        }
        println!();
        println!("| figure | median | min–max | ratio | target | verdict |");
        println!("| --- | ---: | ---: | ---: | --- | --- |");
        for row in &self.rows {
            let m = row.samples.median();
            let ratio = row
                .ratio_to
                .as_ref()
                .and_then(|k| self.ceilings.get(k))
                .map(|c| m / c);
            let ratio_s = ratio.map_or_else(String::new, |r| format!("{:.0} %", r * 100.0));
            let target = row
                .targets
                .iter()
                .map(Target::describe)
                .collect::<Vec<_>>()
                .join("; ");
            let verdict = row
                .targets
                .iter()
                .map(|t| t.verdict(m, ratio).unwrap_or_else(|| "n/a".to_owned()))
                .collect::<Vec<_>>()
                .join("; ");
            println!(
                "| {} | {} {} | {}–{} | {} | {} | {} |",
                row.name,
                fmt_num(m),
                row.unit,
                fmt_num(row.samples.min()),
                fmt_num(row.samples.max()),
                ratio_s,
                target,
                verdict
            );
        }
    }
}

/// Three significant digits, thousands separated.
fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".to_owned();
    }
    if v.abs() >= 1000.0 {
        let r = v.round() as i64;
        let s = r.abs().to_string();
        let mut out = String::new();
        for (i, ch) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        if r < 0 {
            out.insert(0, '-');
        }
        out
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
