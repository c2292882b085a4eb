//! The decoder's fast path: one borrowed pass over a JSON object that keeps only the wanted
//! fields (at any depth: [`Node`]) and validates (without building anything) the rest.
//!
//! It accepts a strict subset of what the full parser (serde_json) accepts and gives the same
//! values on it; on anything else it answers `None` and the caller runs the full parser, so
//! errors and unusual input (escapes, floats or long integers in wanted fields, deep nesting)
//! get exactly the full parser's answer. Strings without escapes borrow from the payload.

use std::borrow::Cow;

use super::paths::{Entry, Node};
use super::FieldValue;

/// Nesting deeper than this goes to the full parser (serde_json's own limit is 128).
const MAX_DEPTH: u32 = 64;

/// Integers with more digits than this may not fit `i64`: the full parser decides.
const MAX_INT_DIGITS: usize = 18;

/// Scans `text` (one JSON object) and stores each wanted field's value in `out[its slot]`,
/// walking into objects and arrays the tree wants; a later duplicate key overwrites an earlier
/// one, as with the full parser.
/// `None`: not in the fast path's subset (or not valid JSON); `out` is then partly filled.
pub(super) fn scan<'a>(
    text: &'a str,
    root: &Node,
    out: &mut [Option<FieldValue<'a>>],
) -> Option<()> {
    let mut s = Scanner {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    s.skip_ws();
    if s.peek()? != b'{' {
        return None;
    }
    s.object(root, out, 0)?;
    s.skip_ws();
    (s.pos == s.bytes.len()).then_some(())
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> bool {
        let hit = self.peek() == Some(want);
        self.pos += usize::from(hit);
        hit
    }

    fn expect(&mut self, want: u8) -> Option<()> {
        self.eat(want).then_some(())
    }

    /// The object at `{` (nested `depth` deep), its wanted keys stored.
    fn object(
        &mut self,
        node: &Node,
        out: &mut [Option<FieldValue<'a>>],
        depth: u32,
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        self.skip_ws();
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            match node.by_key(key) {
                Some(entry) => self.wanted(entry, out, depth + 1)?,
                None => self.skip_value(depth + 1)?,
            }
            self.skip_ws();
            match self.next()? {
                b',' => self.skip_ws(),
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    /// The array at `[`, its wanted indexes stored.
    fn array(&mut self, node: &Node, out: &mut [Option<FieldValue<'a>>], depth: u32) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        self.skip_ws();
        if self.eat(b']') {
            return Some(());
        }
        let mut index = 0;
        loop {
            match node.by_index(index) {
                Some(entry) => self.wanted(entry, out, depth + 1)?,
                None => self.skip_value(depth + 1)?,
            }
            index += 1;
            self.skip_ws();
            match self.next()? {
                b',' => self.skip_ws(),
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// A wanted value: stored in its slots; walked into when fields lie inside it.
    fn wanted(
        &mut self,
        entry: &Entry,
        out: &mut [Option<FieldValue<'a>>],
        depth: u32,
    ) -> Option<()> {
        let value = match (&entry.inner, self.peek()?) {
            (Some(inner), b'{') => self.object(inner, out, depth).map(|()| FieldValue::Other)?,
            (Some(inner), b'[') => self.array(inner, out, depth).map(|()| FieldValue::Other)?,
            // A scalar where fields were wanted inside: read as a wanted value, so a number the
            // full parser refuses (`1e400` overflows f64) goes to it and gets its answer.
            _ if entry.slots.is_empty() => return self.field_value(depth).map(drop),
            _ => self.field_value(depth)?,
        };
        for &slot in &entry.slots {
            out[slot] = Some(value.clone());
        }
        Some(())
    }

    /// JSON whitespace: exactly space, tab, newline, carriage return.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.pos + word.len();
        (self.bytes.get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// A string starting at `"`, without escapes or control characters (those: `None`).
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.pos;
        let end = string_end(self.bytes, start)?;
        if self.bytes[end] != b'"' {
            return None;
        }
        self.pos = end + 1;
        // Both ends are next to an ASCII quote, so they are char boundaries of valid UTF-8.
        self.text.get(start..end)
    }

    /// Digits from here; how many.
    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// A wanted field's value. Integers are taken when plainly within `i64` (no fraction,
    /// exponent, `-0` or leading zero); other numbers go to the full parser.
    fn field_value(&mut self, depth: u32) -> Option<FieldValue<'a>> {
        match self.peek()? {
            b'"' => self.string().map(|s| FieldValue::Str(Cow::Borrowed(s))),
            b'-' | b'0'..=b'9' => {
                let negative = self.eat(b'-');
                let start = self.pos;
                let n = self.digits();
                let digits = &self.bytes[start..self.pos];
                let plain = (1..=MAX_INT_DIGITS).contains(&n)
                    && (digits[0] != b'0' || (n == 1 && !negative))
                    && !matches!(self.peek(), Some(b'.' | b'e' | b'E'));
                if !plain {
                    return None;
                }
                let value = digits
                    .iter()
                    .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
                Some(FieldValue::Int(if negative { -value } else { value }))
            }
            b't' => self.literal(b"true").map(|()| FieldValue::Bool(true)),
            b'f' => self.literal(b"false").map(|()| FieldValue::Bool(false)),
            b'n' => self.literal(b"null").map(|()| FieldValue::Other),
            b'{' | b'[' => self.skip_value(depth).map(|()| FieldValue::Other),
            _ => None,
        }
    }

    /// Validates and skips one value of any type; `depth` is the nesting around it.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'-' | b'0'..=b'9' => self.skip_number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'{' => self.skip_container(depth, b'}', true),
            b'[' => self.skip_container(depth, b']', false),
            _ => None,
        }
    }

    /// An object (`keyed`) or array from its opening bracket to `close`.
    fn skip_container(&mut self, depth: u32, close: u8, keyed: bool) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        self.skip_ws();
        if self.eat(close) {
            return Some(());
        }
        loop {
            if keyed {
                self.string()?;
                self.skip_ws();
                self.expect(b':')?;
                self.skip_ws();
            }
            self.skip_value(depth + 1)?;
            self.skip_ws();
            match self.next()? {
                b',' => self.skip_ws(),
                b if b == close => return Some(()),
                _ => return None,
            }
        }
    }

    /// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn skip_number(&mut self) -> Option<()> {
        self.eat(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat(b'.') && self.digits() == 0 {
            return None;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }
}

/// The first quote, backslash or control character at or after `pos`, eight bytes at a time.
fn string_end(bytes: &[u8], mut pos: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = bytes.get(pos..pos + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        // Each term flags its lowest matching byte exactly (false flags only lie above a true
        // one), so the lowest flag of all is the first special byte.
        let hits = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGH;
        if hits != 0 {
            return Some(pos + (hits.trailing_zeros() / 8) as usize);
        }
        pos += 8;
    }
    let tail = bytes.get(pos..)?;
    let at = tail
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(pos + at)
}
