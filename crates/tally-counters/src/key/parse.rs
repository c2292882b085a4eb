//! Reading a key back: the window start a rendered key names (for the TTL auditor, which finds
//! keys without expiry and must give each the expiry its window implies).

use chrono::NaiveDate;

use super::{needs_escape, KeyTemplate, Part, Shape};

impl KeyTemplate {
    /// The literal text every key of this template starts with (possibly empty).
    pub fn literal_prefix(&self) -> &[u8] {
        match self.shape().next() {
            Some(Shape::Literal(lit)) => lit,
            _ => &[],
        }
    }

    /// The local window start of `key` if this template can have rendered it (the literal
    /// parts match, each value is escaped text, the time is digits forming a valid time).
    pub fn local_start_of(&self, key: &[u8]) -> Option<chrono::NaiveDateTime> {
        let shape: Vec<Shape<'_>> = self.shape().collect();
        let digits = matched_time(&shape, key)?;
        let mut fields = [1i64, 1, 1, 0, 0, 0];
        let mut at = 0;
        for field in self.time.iter() {
            let width = field.token().len();
            let text = std::str::from_utf8(digits.get(at..at + width)?).ok()?;
            fields[*field as usize] = text.parse().ok()?;
            at += width;
        }
        let [y, mo, d, h, mi, s] = fields;
        NaiveDate::from_ymd_opt(y as i32, mo as u32, d as u32)?
            .and_hms_opt(h as u32, mi as u32, s as u32)
    }
}

/// The time digits of `key` under `shape`, found by matching part by part (values are runs of
/// bytes an escaped value can hold; the first full match wins).
fn matched_time<'k>(shape: &[Shape<'_>], key: &'k [u8]) -> Option<&'k [u8]> {
    let (first, rest) = shape.split_first()?;
    match first {
        Shape::Literal(lit) => {
            let tail = key.strip_prefix(*lit)?;
            if rest.is_empty() {
                return None;
            }
            matched_time(rest, tail)
        }
        Shape::Digits(n) => {
            let (digits, tail) = (key.get(..*n)?, key.get(*n..)?);
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            if rest.is_empty() {
                return tail.is_empty().then_some(digits);
            }
            fully_matches(rest, tail).then_some(digits)
        }
        Shape::Value => {
            for end in 0..=key.len() {
                if end > 0 && needs_escape(key[end - 1]) && key[end - 1] != b'%' {
                    break;
                }
                if rest.is_empty() {
                    continue;
                }
                if let Some(d) = matched_time(rest, &key[end..]) {
                    return Some(d);
                }
            }
            None
        }
    }
}

/// Whether `key` matches `shape` entirely (no time part left to find).
fn fully_matches(shape: &[Shape<'_>], key: &[u8]) -> bool {
    let Some((first, rest)) = shape.split_first() else {
        return key.is_empty();
    };
    match first {
        Shape::Literal(lit) => key
            .strip_prefix(*lit)
            .is_some_and(|tail| fully_matches(rest, tail)),
        Shape::Digits(n) => key
            .get(..*n)
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit) && fully_matches(rest, &key[*n..])),
        Shape::Value => (0..=key.len())
            .take_while(|&end| end == 0 || !needs_escape(key[end - 1]) || key[end - 1] == b'%')
            .any(|end| fully_matches(rest, &key[end..])),
    }
}

/// Inverse of `escape_into`; `None` for text `escape_into` cannot produce.
pub fn unescape(escaped: &[u8]) -> Option<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < escaped.len() {
        let b = escaped[i];
        if b == b'%' {
            let hex = escaped.get(i + 1..i + 3)?;
            if !hex.iter().all(|h| matches!(h, b'0'..=b'9' | b'A'..=b'F')) {
                return None;
            }
            let byte = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            if !needs_escape(byte) {
                return None;
            }
            out.push(byte);
            i += 3;
        } else if needs_escape(b) {
            return None;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl KeyTemplate {
    /// The dimension values (unescaped) and the time text of a key this template rendered (no
    /// cluster tag); None for a key it cannot have rendered. Rendering is injective, so this is
    /// its inverse (the key tests check it on every rendered key).
    pub fn decode(&self, key: &[u8]) -> Option<(Vec<String>, String)> {
        let mut values = vec![None; self.dimensions];
        let mut time = None;
        let mut rest = key;
        for (i, part) in self.parts.iter().enumerate() {
            let len = match (part, self.parts.get(i + 1)) {
                (Part::Literal(lit), _) => {
                    rest = rest.strip_prefix(&lit[..])?;
                    continue;
                }
                // Last part: the value runs to the end.
                (_, None) => rest.len(),
                // Final literal: the value runs up to it.
                (_, Some(Part::Literal(lit))) if i + 2 == self.parts.len() => {
                    rest.len().checked_sub(lit.len())?
                }
                // A literal with ':' follows; values never contain ':', so its first ':' ends
                // the value.
                (_, Some(Part::Literal(lit))) => {
                    let colon_in_lit = lit.iter().position(|&b| b == b':')?;
                    rest.iter()
                        .position(|&b| b == b':')?
                        .checked_sub(colon_in_lit)?
                }
                (_, Some(_)) => return None,
            };
            let (value, tail) = rest.split_at(len);
            rest = tail;
            match part {
                Part::Dimension(d) => values[*d] = Some(unescape(value)?),
                _ => time = Some(String::from_utf8(value.to_vec()).ok()?),
            }
        }
        if !rest.is_empty() {
            return None;
        }
        Some((values.into_iter().collect::<Option<_>>()?, time?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::WindowSpec;
    use std::time::Duration;

    #[test]
    fn keys_name_their_window_start() {
        let hour = WindowSpec::new(Duration::from_secs(3600), chrono_tz::UTC).unwrap();
        let dims = ["a".to_string(), "b".to_string()];
        let t = KeyTemplate::parse("f:{a}:{b}:{yyyyMMddHH}", &dims, &hour).unwrap();
        let start = |k: &str| t.local_start_of(k.as_bytes()).map(|d| d.to_string());
        assert_eq!(
            start("f:x:y%3Az:2026112401").as_deref(),
            Some("2026-11-24 01:00:00")
        );
        assert_eq!(
            start("f::y:2026112401").as_deref(),
            Some("2026-11-24 01:00:00")
        );
        assert_eq!(start("f:x:y:2026113101"), None, "no 31 November");
        assert_eq!(start("f:x:y:z:2026112401"), None, "a value holds no ':'");
        assert_eq!(start("g:x:y:2026112401"), None);
        assert_eq!(start("f:x:y:20261124"), None);
        let mid = KeyTemplate::parse(
            "m:{yyyyMMdd}:{a}:{b}",
            &dims,
            &WindowSpec::new(Duration::from_secs(86_400), chrono_tz::UTC).unwrap(),
        )
        .unwrap();
        assert_eq!(
            mid.local_start_of(b"m:20261124:x:y")
                .map(|d| d.to_string())
                .as_deref(),
            Some("2026-11-24 00:00:00")
        );
    }
}
