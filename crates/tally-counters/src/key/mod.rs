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

use crate::window::{format_secs, WindowSpec};

mod parse;

mod error;

pub use error::TemplateError;

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
        let t = || template.to_owned();
        for (i, name) in dimensions.iter().enumerate() {
            if dimensions[..i].contains(name) {
                return Err(TemplateError::DuplicateDimensionName {
                    template: t(),
                    dimension: name.clone(),
                });
            }
        }

        let bytes = template.as_bytes();
        let mut parts = Vec::new();
        let mut seen = vec![false; dimensions.len()];
        // The time placeholder's text and fields, once found.
        let mut time: Option<(&str, Vec<TimeField>)> = None;
        // Text of the previous placeholder, for the separator check.
        let mut previous: Option<&str> = None;
        let mut literal_start = 0;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'}' => {
                    return Err(TemplateError::StrayCloseBrace {
                        template: t(),
                        position: i,
                    })
                }
                b'{' => {}
                _ => {
                    i += 1;
                    continue;
                }
            }
            let open = i;
            let close = match bytes[open + 1..]
                .iter()
                .position(|&b| b == b'{' || b == b'}')
            {
                Some(off) if bytes[open + 1 + off] == b'}' => open + 1 + off,
                Some(off) => {
                    return Err(TemplateError::NestedBrace {
                        template: t(),
                        position: open + 1 + off,
                    })
                }
                None => {
                    return Err(TemplateError::UnclosedBrace {
                        template: t(),
                        position: open,
                    })
                }
            };
            // Both ends are ASCII braces, so these are char boundaries.
            let name = &template[open + 1..close];
            if name.is_empty() {
                return Err(TemplateError::EmptyPlaceholder {
                    template: t(),
                    position: open,
                });
            }

            let part = if let Some(index) = dimensions.iter().position(|d| d == name) {
                if seen[index] {
                    return Err(TemplateError::RepeatedDimension {
                        template: t(),
                        dimension: name.to_owned(),
                    });
                }
                seen[index] = true;
                Part::Dimension(index)
            } else if name.bytes().all(|b| TimeField::from_letter(b).is_some()) {
                let fields = parse_time_pattern(name).map_err(|reason| {
                    TemplateError::InvalidTimePattern {
                        template: t(),
                        placeholder: name.to_owned(),
                        reason,
                    }
                })?;
                if let Some((first, _)) = time {
                    return Err(TemplateError::MultipleTime {
                        template: t(),
                        first: first.to_owned(),
                        second: name.to_owned(),
                    });
                }
                time = Some((name, fields));
                Part::Time
            } else {
                return Err(TemplateError::UnknownPlaceholder {
                    template: t(),
                    placeholder: name.to_owned(),
                    dimensions: if dimensions.is_empty() {
                        "none configured".to_owned()
                    } else {
                        dimensions.join(", ")
                    },
                });
            };

            let literal = &template[literal_start..open];
            if let Some(first) = previous {
                if !literal.contains(':') {
                    return Err(TemplateError::AdjacentPlaceholders {
                        template: t(),
                        first: first.to_owned(),
                        second: name.to_owned(),
                    });
                }
            }
            if !literal.is_empty() {
                parts.push(Part::Literal(literal.as_bytes().into()));
            }
            parts.push(part);
            previous = Some(name);
            literal_start = close + 1;
            i = close + 1;
        }
        if literal_start < bytes.len() {
            parts.push(Part::Literal(bytes[literal_start..].into()));
        }

        if let Some(index) = seen.iter().position(|&s| !s) {
            return Err(TemplateError::MissingDimension {
                template: t(),
                dimension: dimensions[index].clone(),
            });
        }
        let Some((placeholder, fields)) = time else {
            return Err(TemplateError::MissingTime { template: t() });
        };
        let size = window.size_secs();
        let missing: Vec<String> = TimeField::ALL
            .into_iter()
            .filter(|f| f.required_for(size) && !fields.contains(f))
            .map(|f| format!("{} ({})", f.token(), f.meaning()))
            .collect();
        if !missing.is_empty() {
            return Err(TemplateError::TimeTooCoarse {
                template: t(),
                placeholder: placeholder.to_owned(),
                missing: missing.join(", "),
                window: format_secs(u64::from(size)),
            });
        }

        Ok(Self {
            parts: parts.into(),
            time: fields.into(),
            dimensions: dimensions.len(),
        })
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

/// Bytes that would break injectivity (`%`, `:`), form hash tags (`{`, `}`) or make keys hard
/// to read in logs and redis-cli (ASCII control characters).
pub(crate) const fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b':' | b'{' | b'}' | 0x7F) || b < 0x20
}

/// Splits a pattern made only of the letters y M d H m s into fields; the error says why.
fn parse_time_pattern(pattern: &str) -> Result<Vec<TimeField>, String> {
    let bytes = pattern.as_bytes();
    let mut fields = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let letter = bytes[i];
        let run = bytes[i..].iter().take_while(|&&b| b == letter).count();
        let run_text = &pattern[i..i + run];
        let Some(field) = TimeField::from_letter(letter) else {
            return Err(format!("`{run_text}` is not a time token"));
        };
        if run != field.token().len() {
            return Err(format!(
                "`{run_text}` is not a time token; use yyyy (year), MM (month), dd (day), \
                 HH (hour), mm (minute), ss (second)"
            ));
        }
        if fields.contains(&field) {
            return Err(format!(
                "{} ({}) appears more than once",
                field.token(),
                field.meaning()
            ));
        }
        fields.push(field);
        i += run;
    }
    Ok(fields)
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
