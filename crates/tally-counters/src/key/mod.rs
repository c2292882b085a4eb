//! Redis key templates such as `flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}`.
//!
//! A template is literal text plus placeholders in braces. A placeholder is either one of the
//! counter's dimension names or a time pattern made only of the tokens `yyyy`, `MM`, `dd`,
//! `HH`, `mm`, `ss` (any order or subset, no separators). If a placeholder is both a listed
//! dimension name and a valid time pattern, it is the dimension: the dimension list is the
//! more specific configuration.
//!
//! Parsing rejects every template for which two different counters could end up on the same
//! key: each dimension exactly once, exactly one time placeholder fine enough for the window
//! size, and a `:` between any two placeholders. Dimension values are percent-escaped so they
//! can contain neither `:` nor braces; together this makes rendering injective and keeps user
//! values out of Redis Cluster hash tags (`{...}`), so they cannot steer keys onto one slot.

use chrono::{Datelike, NaiveDateTime, Timelike};

use crate::window::WindowSpec;

use scan::{check_distinct_names, next_placeholder, TemplateParser};

mod parse;
pub use parse::unescape;

mod scan;

mod error;

pub use error::TemplateError;
pub use scan::TimePatternError;

/// One field of a time pattern, rendered zero padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeField {
    /// `yyyy`: four-digit year.
    Year,
    /// `MM`: month 01-12.
    Month,
    /// `dd`: day of month 01-31.
    Day,
    /// `HH`: hour 00-23.
    Hour,
    /// `mm`: minute 00-59.
    Minute,
    /// `ss`: second 00-59.
    Second,
}

impl TimeField {
    /// All fields, coarsest first, for checks and messages.
    const ALL: [TimeField; 6] = [
        Self::Year,
        Self::Month,
        Self::Day,
        Self::Hour,
        Self::Minute,
        Self::Second,
    ];

    /// The field a pattern letter stands for.
    fn from_letter(letter: u8) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.token().as_bytes()[0] == letter)
    }

    /// The token as written in templates, and its plain-language meaning (because `MM` and
    /// `mm` are easy to mix up), indexed like [`TimeField::ALL`].
    const NAMES: [(&'static str, &'static str); 6] = [
        ("yyyy", "year"),
        ("MM", "month"),
        ("dd", "day"),
        ("HH", "hour"),
        ("mm", "minute"),
        ("ss", "second"),
    ];

    /// The token as written in templates, e.g. `MM`.
    fn token(self) -> &'static str {
        Self::NAMES[self as usize].0
    }

    /// What the token means, e.g. `month`.
    fn meaning(self) -> &'static str {
        Self::NAMES[self as usize].1
    }

    /// Whether windows of `size_secs` need this field to get distinct keys. Sizes divide a
    /// day, so a window of at least a minute starts at most once per minute (and so on).
    fn required_for(self, size_secs: u32) -> bool {
        match self {
            Self::Year | Self::Month | Self::Day => true,
            Self::Hour => size_secs < 86_400,
            Self::Minute => size_secs < 3_600,
            Self::Second => size_secs < 60,
        }
    }

    /// This field of `t`.
    fn value(self, t: &NaiveDateTime) -> i64 {
        match self {
            Self::Year => i64::from(t.year()),
            Self::Month => i64::from(t.month()),
            Self::Day => i64::from(t.day()),
            Self::Hour => i64::from(t.hour()),
            Self::Minute => i64::from(t.minute()),
            Self::Second => i64::from(t.second()),
        }
    }
}

/// A piece of a parsed template, in template order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Literal text, copied verbatim.
    Literal(Box<[u8]>),
    /// The value of the dimension at this index, escaped.
    Dimension(usize),
    /// The pre-formatted window time.
    Time,
}

/// A validated key template, ready to render keys without further checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    /// Literal, dimension and time parts in template order.
    parts: Box<[Part]>,
    /// Fields of the time placeholder in template order.
    time: Box<[TimeField]>,
    /// Number of dimensions, i.e. the length `render` expects for `values`.
    dimensions: usize,
}

impl KeyTemplate {
    /// `dimensions` are the counter's dimension names in order; each must appear exactly once in the template.
    ///
    /// `window` decides how fine the time placeholder must be (e.g. `HH` for windows under a day).
    pub fn parse(
        template: &str,
        dimensions: &[String],
        window: &WindowSpec,
    ) -> Result<Self, TemplateError> {
        check_distinct_names(template, dimensions)?;
        let mut parser = TemplateParser::new(template, dimensions);
        let mut from = 0;
        while let Some((open, close)) = next_placeholder(template, from)? {
            parser.placeholder(open, close)?;
            from = close + 1;
        }
        parser.finish(window)
    }

    /// Number of dimension values [`KeyTemplate::render`] expects.
    pub fn dimension_count(&self) -> usize {
        self.dimensions
    }

    /// Format the time part for a window's local start into `out` (cleared first). Called once per window, cached by the caller.
    pub fn format_time(&self, local_start: NaiveDateTime, out: &mut String) {
        out.clear();
        for field in self.time.iter() {
            push_padded(out, field.value(&local_start), field.token().len());
        }
    }

    /// Render the whole key into `out` (cleared first): literals verbatim, each dimension value escaped, the pre-formatted time string verbatim.
    /// `values[i]` is the value of `dimensions[i]`. Hot path: no allocation beyond `out` growth.
    ///
    /// # Panics
    /// If `values` has fewer entries than [`KeyTemplate::dimension_count`]: that is a bug in
    /// the caller, not bad input.
    pub fn render(&self, out: &mut Vec<u8>, values: &[&str], time: &str) {
        debug_assert_eq!(values.len(), self.dimensions, "one value per dimension");
        out.clear();
        for part in self.parts.iter() {
            match part {
                Part::Literal(bytes) => out.extend_from_slice(bytes),
                Part::Dimension(index) => escape_into(out, values[*index]),
                Part::Time => out.extend_from_slice(time.as_bytes()),
            }
        }
    }
}

/// One piece of the keys a template renders, as [`crate::model::overlap`] sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape<'a> {
    /// These bytes, verbatim.
    Literal(&'a [u8]),
    /// An escaped dimension value: any run of bytes [`escape_into`] can produce, possibly empty.
    Value,
    /// The window time: exactly this many ASCII digits (event times are clamped to years
    /// 1..=9999, so every field has its full width).
    Digits(usize),
}

impl KeyTemplate {
    /// The pieces of every key this template renders, in template order.
    pub fn shape(&self) -> impl Iterator<Item = Shape<'_>> {
        let digits = self.time.iter().map(|f| f.token().len()).sum();
        self.parts.iter().map(move |part| match part {
            Part::Literal(bytes) => Shape::Literal(bytes),
            Part::Dimension(_) => Shape::Value,
            Part::Time => Shape::Digits(digits),
        })
    }
}

/// Escape a dimension value so keys are injective: percent-encode (uppercase hex, %XX per byte) the bytes '%', ':', '{', '}', every byte < 0x20 and 0x7f. Everything else (including UTF-8 multibyte) verbatim. Fast path: if no byte needs escaping, extend_from_slice.
///
/// Appends to `out` without clearing it, so it can be used while building a key.
pub fn escape_into(out: &mut Vec<u8>, value: &str) {
    let bytes = value.as_bytes();
    if !bytes.iter().any(|&b| needs_escape(b)) {
        out.extend_from_slice(bytes);
        return;
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if needs_escape(b) {
            out.extend_from_slice(&bytes[run_start..i]);
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xF)]]);
            run_start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
}

/// A SCAN pattern matching keys that start with `prefix` (glob characters escaped).
pub fn glob_prefix(prefix: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 2);
    for &b in prefix {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'*');
    out
}

/// Bytes that would break injectivity (`%`, `:`), form hash tags (`{`, `}`) or make keys hard
/// to read in logs and redis-cli (ASCII control characters).
pub(crate) const fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b':' | b'{' | b'}' | 0x7F) || b < 0x20
}

/// Appends `value` in decimal, zero padded to `width` digits (a sign does not count).
fn push_padded(out: &mut String, value: i64, width: usize) {
    if value < 0 {
        out.push('-');
    }
    let mut digits = [0u8; 20];
    let mut len = 0;
    let mut n = value.unsigned_abs();
    loop {
        // `n % 10` < 10, so the cast is exact.
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for _ in len..width {
        out.push('0');
    }
    for &d in digits[..len].iter().rev() {
        out.push(char::from(d));
    }
}

#[cfg(test)]
mod tests;
