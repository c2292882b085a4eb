//! Parsing a key template, placeholder by placeholder: [`KeyTemplate::parse`] finds each
//! placeholder with [`next_placeholder`] and hands it to a [`TemplateParser`], which classifies
//! it, checks the separator before it and, at the end, the checks that need the whole template.

use super::{KeyTemplate, Part, TemplateError, TimeField};
use crate::window::{format_secs, WindowSpec};

/// Refuses a dimension list that names one dimension twice (its placeholder could not tell
/// the two values apart).
pub(super) fn check_distinct_names(
    template: &str,
    dimensions: &[String],
) -> Result<(), TemplateError> {
    for (i, name) in dimensions.iter().enumerate() {
        if dimensions[..i].contains(name) {
            return Err(TemplateError::DuplicateDimensionName {
                template: template.to_owned(),
                dimension: name.clone(),
            });
        }
    }
    Ok(())
}

/// The braces `(open, close)` of the first placeholder at or after byte `from`, or None when
/// the rest is literal text; refuses braces that do not pair up.
pub(super) fn next_placeholder(
    template: &str,
    from: usize,
) -> Result<Option<(usize, usize)>, TemplateError> {
    let bytes = template.as_bytes();
    let t = || template.to_owned();
    let Some(open) = bytes[from..]
        .iter()
        .position(|&b| b == b'{' || b == b'}')
        .map(|off| from + off)
    else {
        return Ok(None);
    };
    if bytes[open] == b'}' {
        return Err(TemplateError::StrayCloseBrace {
            template: t(),
            position: open,
        });
    }
    match bytes[open + 1..]
        .iter()
        .position(|&b| b == b'{' || b == b'}')
    {
        Some(off) if bytes[open + 1 + off] == b'}' => Ok(Some((open, open + 1 + off))),
        Some(off) => Err(TemplateError::NestedBrace {
            template: t(),
            position: open + 1 + off,
        }),
        None => Err(TemplateError::UnclosedBrace {
            template: t(),
            position: open,
        }),
    }
}

/// What [`KeyTemplate::parse`] has gathered so far, placeholder by placeholder.
pub(super) struct TemplateParser<'t> {
    /// The whole template, for slicing and for error messages.
    template: &'t str,
    /// The counter's dimension names.
    dimensions: &'t [String],
    /// Parts found so far, in template order.
    parts: Vec<Part>,
    /// Which dimensions have had their placeholder.
    seen: Vec<bool>,
    /// The time placeholder's text and fields, once found.
    time: Option<(&'t str, Vec<TimeField>)>,
    /// Text of the previous placeholder, for the separator check.
    previous: Option<&'t str>,
    /// Where the literal text before the next placeholder starts.
    literal_start: usize,
}

impl<'t> TemplateParser<'t> {
    pub(super) fn new(template: &'t str, dimensions: &'t [String]) -> Self {
        TemplateParser {
            template,
            dimensions,
            parts: Vec::new(),
            seen: vec![false; dimensions.len()],
            time: None,
            previous: None,
            literal_start: 0,
        }
    }

    /// The template, owned, for an error.
    fn t(&self) -> String {
        self.template.to_owned()
    }

    /// Take the placeholder between the braces at `open` and `close`, and the literal text
    /// before it (which must hold a `:` if another placeholder precedes it).
    pub(super) fn placeholder(&mut self, open: usize, close: usize) -> Result<(), TemplateError> {
        // Both ends are ASCII braces, so these are char boundaries.
        let name = &self.template[open + 1..close];
        if name.is_empty() {
            return Err(TemplateError::EmptyPlaceholder {
                template: self.t(),
                position: open,
            });
        }
        let part = self.classify(name)?;
        let literal = &self.template[self.literal_start..open];
        if let Some(first) = self.previous {
            if !literal.contains(':') {
                return Err(TemplateError::AdjacentPlaceholders {
                    template: self.t(),
                    first: first.to_owned(),
                    second: name.to_owned(),
                });
            }
        }
        if !literal.is_empty() {
            self.parts.push(Part::Literal(literal.as_bytes().into()));
        }
        self.parts.push(part);
        self.previous = Some(name);
        self.literal_start = close + 1;
        Ok(())
    }

    /// The part placeholder `name` stands for: a dimension (the more specific reading), else
    /// the time pattern, else an error naming the dimensions there are.
    fn classify(&mut self, name: &'t str) -> Result<Part, TemplateError> {
        if let Some(index) = self.dimensions.iter().position(|d| d == name) {
            if self.seen[index] {
                return Err(TemplateError::RepeatedDimension {
                    template: self.t(),
                    dimension: name.to_owned(),
                });
            }
            self.seen[index] = true;
            Ok(Part::Dimension(index))
        } else if name.bytes().all(|b| TimeField::from_letter(b).is_some()) {
            self.time_part(name)
        } else {
            Err(TemplateError::UnknownPlaceholder {
                template: self.t(),
                placeholder: name.to_owned(),
                dimensions: if self.dimensions.is_empty() {
                    "none configured".to_owned()
                } else {
                    self.dimensions.join(", ")
                },
            })
        }
    }

    /// The time placeholder `name`: a valid pattern, and the only one of the template.
    fn time_part(&mut self, name: &'t str) -> Result<Part, TemplateError> {
        let fields =
            parse_time_pattern(name).map_err(|reason| TemplateError::InvalidTimePattern {
                template: self.t(),
                placeholder: name.to_owned(),
                reason: reason.to_string(),
            })?;
        if let Some((first, _)) = self.time {
            return Err(TemplateError::MultipleTime {
                template: self.t(),
                first: first.to_owned(),
                second: name.to_owned(),
            });
        }
        self.time = Some((name, fields));
        Ok(Part::Time)
    }

    /// The template, once every placeholder is read: the trailing literal, then the checks
    /// that need the whole template (every dimension, a time placeholder fine enough).
    pub(super) fn finish(mut self, window: &WindowSpec) -> Result<KeyTemplate, TemplateError> {
        let bytes = self.template.as_bytes();
        if self.literal_start < bytes.len() {
            self.parts
                .push(Part::Literal(bytes[self.literal_start..].into()));
        }
        if let Some(index) = self.seen.iter().position(|&s| !s) {
            return Err(TemplateError::MissingDimension {
                template: self.t(),
                dimension: self.dimensions[index].clone(),
            });
        }
        let Some((placeholder, fields)) = self.time.take() else {
            return Err(TemplateError::MissingTime { template: self.t() });
        };
        let size = window.size_secs();
        let missing: Vec<String> = TimeField::ALL
            .into_iter()
            .filter(|f| f.required_for(size) && !fields.contains(f))
            .map(|f| format!("{} ({})", f.token(), f.meaning()))
            .collect();
        if !missing.is_empty() {
            return Err(TemplateError::TimeTooCoarse {
                template: self.t(),
                placeholder: placeholder.to_owned(),
                missing: missing.join(", "),
                window: format_secs(u64::from(size)),
            });
        }
        Ok(KeyTemplate {
            parts: self.parts.into(),
            time: fields.into(),
            dimensions: self.dimensions.len(),
        })
    }
}

/// What is wrong with a time pattern (the reason of [`TemplateError::InvalidTimePattern`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimePatternError {
    /// A run of letters that no time field uses.
    #[error("`{0}` is not a time token")]
    UnknownLetter(String),
    /// A field's letter repeated to another length than its token's.
    #[error(
        "`{0}` is not a time token; use yyyy (year), MM (month), dd (day), HH (hour), \
         mm (minute), ss (second)"
    )]
    WrongLength(String),
    /// A field given twice (its token, its meaning).
    #[error("{0} ({1}) appears more than once")]
    Repeated(&'static str, &'static str),
}

/// Splits a pattern made only of the letters y M d H m s into fields; the error says why.
fn parse_time_pattern(pattern: &str) -> Result<Vec<TimeField>, TimePatternError> {
    let bytes = pattern.as_bytes();
    let mut fields = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let letter = bytes[i];
        let run = bytes[i..].iter().take_while(|&&b| b == letter).count();
        let run_text = &pattern[i..i + run];
        let Some(field) = TimeField::from_letter(letter) else {
            return Err(TimePatternError::UnknownLetter(run_text.to_string()));
        };
        if run != field.token().len() {
            return Err(TimePatternError::WrongLength(run_text.to_string()));
        }
        if fields.contains(&field) {
            return Err(TimePatternError::Repeated(field.token(), field.meaning()));
        }
        fields.push(field);
        i += run;
    }
    Ok(fields)
}
