//! Why a key template is refused: each variant is one rule of key injectivity, and its message
//! tells the config author what to change.

/// Why a key template was rejected; every message names the template and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// Two dimensions with one name could not be told apart in the template.
    #[error("dimension `{dimension}` is listed more than once for key template `{template}`; dimension names must be unique")]
    DuplicateDimensionName {
        /// The template being parsed.
        template: String,
        /// The name listed twice.
        dimension: String,
    },
    /// A `{` with no `}` after it: braces only delimit placeholders.
    #[error("key template `{template}`: '{{' at byte {position} is never closed by '}}' (braces may only surround placeholders such as {{ip}})")]
    UnclosedBrace {
        /// The template being parsed.
        template: String,
        /// Byte offset of the unclosed `{`.
        position: usize,
    },
    /// A `}` outside a placeholder: literal braces would form Redis Cluster hash tags.
    #[error("key template `{template}`: '}}' at byte {position} has no matching '{{' (braces may only surround placeholders such as {{ip}})")]
    StrayCloseBrace {
        /// The template being parsed.
        template: String,
        /// Byte offset of the stray `}`.
        position: usize,
    },
    /// A `{` inside a placeholder: placeholders cannot contain other placeholders.
    #[error("key template `{template}`: '{{' at byte {position} is inside another placeholder; placeholders cannot be nested")]
    NestedBrace {
        /// The template being parsed.
        template: String,
        /// Byte offset of the inner `{`.
        position: usize,
    },
    /// `{}` names nothing.
    #[error("key template `{template}`: empty placeholder '{{}}' at byte {position}; write a dimension name or a time pattern such as {{yyyyMMddHH}}")]
    EmptyPlaceholder {
        /// The template being parsed.
        template: String,
        /// Byte offset of the `{`.
        position: usize,
    },
    /// Neither a dimension nor a time pattern, most likely a typo.
    #[error("key template `{template}`: unknown placeholder {{{placeholder}}}: it is not one of the dimensions ({dimensions}) and not a time pattern (a time pattern is only the letters y M d H m s with no separators, e.g. {{yyyyMMddHH}})")]
    UnknownPlaceholder {
        /// The template being parsed.
        template: String,
        /// Text between the braces.
        placeholder: String,
        /// The configured dimension names, comma separated, to help spot the typo.
        dimensions: String,
    },
    /// Made of time letters but not of valid tokens.
    #[error("key template `{template}`: invalid time pattern {{{placeholder}}}: {reason}")]
    InvalidTimePattern {
        /// The template being parsed.
        template: String,
        /// Text between the braces.
        placeholder: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Counters differing only in this dimension would share a key.
    #[error("key template `{template}` does not contain dimension {{{dimension}}}; every dimension must appear exactly once, otherwise counters for different {dimension} values would share a key")]
    MissingDimension {
        /// The template being parsed.
        template: String,
        /// The dimension that does not appear.
        dimension: String,
    },
    /// Repeating a dimension adds nothing and makes keys harder to read back.
    #[error("key template `{template}` contains dimension {{{dimension}}} more than once; every dimension must appear exactly once")]
    RepeatedDimension {
        /// The template being parsed.
        template: String,
        /// The repeated dimension.
        dimension: String,
    },
    /// Without a time part every window would write the same key.
    #[error("key template `{template}` has no time placeholder; add one such as {{yyyyMMddHH}} so each window gets its own key")]
    MissingTime {
        /// The template being parsed.
        template: String,
    },
    /// The window's time is written in one place, so keys stay unambiguous.
    #[error("key template `{template}` has more than one time placeholder ({{{first}}} and {{{second}}}); use a single one such as {{yyyyMMddHH}}")]
    MultipleTime {
        /// The template being parsed.
        template: String,
        /// The first time placeholder.
        first: String,
        /// The second time placeholder.
        second: String,
    },
    /// Two different windows would render the same time text and so share a key.
    #[error("key template `{template}`: time pattern {{{placeholder}}} lacks {missing}, so different {window} windows would share a key")]
    TimeTooCoarse {
        /// The template being parsed.
        template: String,
        /// The time placeholder.
        placeholder: String,
        /// The missing tokens with their meaning, e.g. `HH (hour)`.
        missing: String,
        /// The window size, e.g. `1h`.
        window: String,
    },
    /// Without a `:` between them, `{a}{b}` renders a="x",b="yz" and a="xy",b="z" identically.
    #[error("key template `{template}`: placeholders {{{first}}} and {{{second}}} must be separated by text containing ':' (e.g. {{{first}}}:{{{second}}}), otherwise different values could produce the same key")]
    AdjacentPlaceholders {
        /// The template being parsed.
        template: String,
        /// The earlier placeholder.
        first: String,
        /// The later placeholder.
        second: String,
    },
}
