//! Number formatting and the table printer the report's parts share.

use crate::redis_stats::RedisWork;

/// `n` per second, with thousands separators (`n/a` for no time).
pub fn rate(n: f64, secs: f64) -> String {
    if secs <= 0.0 {
        return "n/a".into();
    }
    thousands(n / secs)
}

/// Rounded to a whole number, with thousands separators.
pub fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn per_million(x: f64, n: f64) -> f64 {
    x / n * 1e6
}

/// Two decimals.
pub fn f2(x: f64) -> String {
    format!("{x:.2}")
}

pub fn ms(secs: f64) -> String {
    if secs.is_finite() {
        format!("{:.1} ms", secs * 1e3)
    } else {
        "n/a".into()
    }
}

pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Whether the counts in Redis equal the events sent.
pub fn counted(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**NO**"
    }
}

/// Redis commands per million messages: sent, and (in parentheses) run inside scripts.
pub fn commands(work: &RedisWork, messages: f64) -> String {
    format!(
        "{} ({})",
        thousands(per_million(work.top_level(), messages)),
        thousands(per_million(work.script_inner(), messages))
    )
}

/// A Markdown table with one column per item of `columns`: a header row, then one row per
/// figure, each cell computed from its column's item.
pub struct ColumnTable<'a, T> {
    columns: &'a [T],
    text: String,
}

impl<'a, T> ColumnTable<'a, T> {
    /// The header row: an empty corner, then `head` of every column.
    pub fn new(columns: &'a [T], head: impl Fn(&T) -> String) -> Self {
        let names: Vec<String> = columns.iter().map(head).collect();
        let text = format!(
            "| | {} |\n|---|{}\n",
            names.join(" | "),
            "---|".repeat(columns.len())
        );
        ColumnTable { columns, text }
    }

    pub fn columns(&self) -> &'a [T] {
        self.columns
    }

    /// A row named `name`, with `cell` of every column.
    pub fn row(&mut self, name: &str, cell: impl Fn(&T) -> String) {
        let cells: Vec<String> = self.columns.iter().map(cell).collect();
        self.text
            .push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }

    pub fn into_text(self) -> String {
        self.text
    }
}
