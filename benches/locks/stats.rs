//! Percentiles, medians and the report: one table for people, one `BENCH {...}` line
//! per figure for machines.

use std::fmt::Write as _;
use std::time::Duration;

/// The `q`-quantile (0..=1) of `samples`, nearest-rank; zero when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of plain numbers (mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// Whether a figure meets its target; `Info` for figures without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Info,
}

impl Verdict {
    pub fn of(pass: bool) -> Self {
        if pass { Verdict::Pass } else { Verdict::Fail }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Info => "-",
        }
    }
}

/// One row of the table and one machine-readable line.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Stable identifier, e.g. `handoff_p50.waiters_16`.
    pub id: String,
    /// What people read in the first column.
    pub scenario: String,
    pub redlock: Option<f64>,
    pub rslock: Option<f64>,
    pub unit: &'static str,
    /// The limit measured in this run, already formatted (with its unit).
    pub limit: String,
    /// redlock's figure against the limit or rslock, already formatted (e.g. `2.1 RTT`).
    pub ratio: String,
    pub target: String,
    pub verdict: Verdict,
}

#[derive(Debug, Default)]
pub struct Report {
    pub figures: Vec<Figure>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn add(&mut self, figure: Figure) {
        println!("{}", json_line(&figure));
        self.figures.push(figure);
    }

    /// A figure for scripts only: its `BENCH` line, no row in the table (the parts of a
    /// breakdown).
    pub fn detail(&mut self, figure: Figure) {
        println!("{}", json_line(&figure));
    }

    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        println!("note: {note}");
        self.notes.push(note);
    }

    /// The table in Markdown, so that it can be pasted into BENCHMARKS.md as is.
    pub fn table(&self) -> String {
        let header = [
            "scenario",
            "redlock",
            "rslock",
            "limit",
            "redlock vs",
            "target",
            "",
        ];
        let rows: Vec<[String; 7]> = self
            .figures
            .iter()
            .map(|f| {
                [
                    f.scenario.clone(),
                    value(f.redlock, f.unit),
                    value(f.rslock, f.unit),
                    f.limit.clone(),
                    f.ratio.clone(),
                    f.target.clone(),
                    f.verdict.label().to_owned(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            out.push('|');
            for (cell, width) in cells.iter().zip(widths) {
                let _ = write!(out, " {cell:<width$} |");
            }
            out.push('\n');
        };
        line(&header.map(str::to_owned), &mut out);
        line(&widths.map(|w| "-".repeat(w)), &mut out);
        for row in &rows {
            line(row, &mut out);
        }
        out
    }
}

fn value(value: Option<f64>, unit: &str) -> String {
    match value {
        None => "n/a".to_owned(),
        Some(v) if v.is_nan() => "n/a".to_owned(),
        Some(v) => format!("{} {unit}", number(v)).trim_end().to_owned(),
    }
}

/// Three significant digits, without scientific notation.
pub fn number(v: f64) -> String {
    let magnitude = v.abs();
    if magnitude >= 100.0 || v == v.trunc() && magnitude < 1e15 {
        format!("{v:.0}")
    } else if magnitude >= 10.0 {
        format!("{v:.1}")
    } else if magnitude >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_number(value: Option<f64>) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v}"),
        _ => "null".to_owned(),
    }
}

fn json_line(f: &Figure) -> String {
    format!(
        "BENCH {{\"id\":{},\"scenario\":{},\"unit\":{},\"redlock\":{},\"rslock\":{},\"limit\":{},\"ratio\":{},\"target\":{},\"verdict\":{}}}",
        json_string(&f.id),
        json_string(&f.scenario),
        json_string(f.unit),
        json_number(f.redlock),
        json_number(f.rslock),
        json_string(&f.limit),
        json_string(&f.ratio),
        json_string(&f.target),
        json_string(f.verdict.label()),
    )
}
