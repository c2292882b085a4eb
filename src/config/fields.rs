//! `[decode.fields]`: where a named event field is read from.
//!
//! A counter names its fields (`dimensions`, `member`, `value_field`, `decode.time_field`); a
//! name listed in `[decode.fields]` is read from the source written there, any other name is the
//! payload's top-level field of that name. Sources:
//!
//! * a path into the payload: dotted (`request.method`, `items[0].sku`, `tags.0`) or a JSON
//!   Pointer (`/request/method`, `/a~1b` for a key `a/b`); a numeric segment matches an array
//!   index or an object key, `[n]` only an array index;
//! * `$key`: the record key; `$header.<name>`: the record header of that name (its last value);
//! * `$topic`, `$partition`: where the record was read.

use std::fmt;

/// One step of a payload path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// An object key.
    Key(Box<str>),
    /// An array index (`[n]`).
    Index(usize),
    /// A numeric segment: the key in an object, the index in an array.
    KeyOrIndex(Box<str>, usize),
}

/// Where a field's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldSource {
    /// A value inside the payload (one segment: a top-level field).
    Payload(Vec<Segment>),
    /// The record key, as text.
    Key,
    /// The last header of this name, as text.
    Header(Box<str>),
    /// The topic the record was read from.
    Topic,
    /// The partition the record was read from.
    Partition,
}

impl FieldSource {
    /// The source of a field that `[decode.fields]` does not list: the top-level field `name`.
    pub fn top_level(name: &str) -> FieldSource {
        FieldSource::Payload(vec![Segment::Key(name.into())])
    }

    /// Parses one `[decode.fields]` value; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<FieldSource, SourceError> {
        match text {
            "" => Err(SourceError::Empty),
            "$key" => Ok(FieldSource::Key),
            "$topic" => Ok(FieldSource::Topic),
            "$partition" => Ok(FieldSource::Partition),
            _ if text.starts_with("$header.") => match &text["$header.".len()..] {
                "" => Err(SourceError::NoHeaderName),
                name => Ok(FieldSource::Header(name.into())),
            },
            _ if text.starts_with('$') => Err(SourceError::UnknownSource(text.to_string())),
            _ if text.starts_with('/') => pointer(text).map(FieldSource::Payload),
            _ => dotted(text).map(FieldSource::Payload),
        }
    }
}

impl fmt::Display for FieldSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldSource::Key => f.write_str("$key"),
            FieldSource::Header(h) => write!(f, "$header.{h}"),
            FieldSource::Topic => f.write_str("$topic"),
            FieldSource::Partition => f.write_str("$partition"),
            FieldSource::Payload(path) => {
                for s in path {
                    match s {
                        Segment::Key(k) | Segment::KeyOrIndex(k, _) => write!(f, "/{k}")?,
                        Segment::Index(i) => write!(f, "/{i}")?,
                    }
                }
                Ok(())
            }
        }
    }
}

/// Why a `[decode.fields]` value names no source (the value quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// An empty value.
    #[error("empty source; write a field path such as `request.method`")]
    Empty,
    /// `$header.` without a name.
    #[error("`$header.` needs a header name, e.g. `$header.x-region`")]
    NoHeaderName,
    /// A `$` source that the record does not have.
    #[error("unknown source `{0}`: the record's own sources are $key, $header.<name>, $topic and $partition")]
    UnknownSource(String),
    /// A JSON Pointer with a `~` not followed by 0 or 1.
    #[error("`{0}`: `~` must be followed by 0 or 1 in a JSON Pointer")]
    BadEscape(String),
    /// A dotted path with an empty segment.
    #[error("`{0}`: empty segment; write keys separated by single dots (a JSON Pointer such as `/a.b` reads a key with a dot)")]
    EmptySegment(String),
    /// A `[` that holds no array index.
    #[error("`{0}`: `[` must hold an array index, e.g. `items[0].sku`")]
    BadIndex(String),
}

/// A numeric segment without leading zeros is an index too.
fn segment(key: &str) -> Segment {
    let numeric = !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_digit())
        && (key == "0" || !key.starts_with('0'));
    match key.parse::<usize>() {
        Ok(i) if numeric => Segment::KeyOrIndex(key.into(), i),
        _ => Segment::Key(key.into()),
    }
}

/// RFC 6901: `/a/b`, with `~1` for `/` and `~0` for `~`.
fn pointer(text: &str) -> Result<Vec<Segment>, SourceError> {
    text[1..]
        .split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                match (c, c == '~') {
                    (_, false) => out.push(c),
                    (_, true) => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(SourceError::BadEscape(text.to_string())),
                    },
                }
            }
            Ok(segment(&out))
        })
        .collect()
}

/// `a.b[0].c`: keys separated by dots, each followed by any number of `[n]` indexes.
fn dotted(text: &str) -> Result<Vec<Segment>, SourceError> {
    let mut path = Vec::new();
    for part in text.split('.') {
        let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        // `a..b`, `.a`, `a.` and a leading `[0]` (the payload is an object) name no key.
        if key.is_empty() && (rest.is_empty() || path.is_empty()) {
            return Err(SourceError::EmptySegment(text.to_string()));
        }
        if !key.is_empty() {
            path.push(segment(key));
        }
        while !rest.is_empty() {
            let close = rest.find(']').filter(|_| rest.starts_with('['));
            let index = close.and_then(|c| rest[1..c].parse::<usize>().ok());
            match (close, index) {
                (Some(c), Some(i)) => {
                    path.push(Segment::Index(i));
                    rest = &rest[c + 1..];
                }
                _ => return Err(SourceError::BadIndex(text.to_string())),
            }
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::{FieldSource, Segment};

    fn key(k: &str) -> Segment {
        Segment::Key(k.into())
    }

    #[test]
    fn sources_parse() {
        use FieldSource::*;
        assert_eq!(FieldSource::parse("$key"), Ok(Key));
        assert_eq!(FieldSource::parse("$topic"), Ok(Topic));
        assert_eq!(FieldSource::parse("$partition"), Ok(Partition));
        assert_eq!(
            FieldSource::parse("$header.x-region"),
            Ok(Header("x-region".into()))
        );
        assert_eq!(FieldSource::parse("route"), Ok(Payload(vec![key("route")])));
        assert_eq!(
            FieldSource::parse("request.method"),
            Ok(Payload(vec![key("request"), key("method")]))
        );
        assert_eq!(
            FieldSource::parse("items[0][2].sku"),
            Ok(Payload(vec![
                key("items"),
                Segment::Index(0),
                Segment::Index(2),
                key("sku")
            ]))
        );
        assert_eq!(
            FieldSource::parse("tags.1"),
            Ok(Payload(vec![
                key("tags"),
                Segment::KeyOrIndex("1".into(), 1)
            ]))
        );
        assert_eq!(
            FieldSource::parse("/a~1b/c.d/~0x/01"),
            Ok(Payload(vec![key("a/b"), key("c.d"), key("~x"), key("01")]))
        );
        assert_eq!(FieldSource::parse("/"), Ok(Payload(vec![key("")])));
    }

    #[test]
    fn bad_sources_say_why() {
        for (text, says) in [
            ("", "empty source"),
            ("a..b", "empty segment"),
            (".a", "empty segment"),
            ("a.", "empty segment"),
            ("[0].a", "empty segment"),
            ("a[x]", "array index"),
            ("a[0", "array index"),
            ("a]0[", "array index"),
            ("/a~2", "followed by 0 or 1"),
            ("$header.", "needs a header name"),
            ("$offset", "unknown source"),
        ] {
            let e = FieldSource::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_source_prints_as_a_pointer() {
        let s = FieldSource::parse("items[3].sku").unwrap();
        assert_eq!(s.to_string(), "/items/3/sku");
        assert_eq!(
            FieldSource::parse("$header.h").unwrap().to_string(),
            "$header.h"
        );
    }
}
