//! Whether two counters can write the same Redis key, decided on the shapes of their keys.
//!
//! A key template renders a regular language over bytes: literal text, escaped dimension values
//! (any run of bytes that need no escaping and `%XX` escapes, possibly empty) and the window
//! time (a fixed number of digits). Two counters clash when their languages intersect; a
//! breadth-first search of the product automaton decides it and yields the shortest key both can
//! render, which the error message shows. Time digits are any digits (not only valid dates) and
//! an escape is `%` and any two uppercase hex digits, so the check can only err on the side of
//! refusing. Cluster hash tags are appended alike to every key, so plain keys decide.

use std::collections::{HashMap, VecDeque};

use crate::key::{needs_escape, KeyTemplate, Shape};

/// A key both templates can render, if there is one.
pub fn clash(a: &KeyTemplate, b: &KeyTemplate) -> Option<Vec<u8>> {
    intersect(&atoms(a), &atoms(b))
}

/// A key of `template` that starts with `prefix`, if there is one.
pub fn with_prefix(template: &KeyTemplate, prefix: &str) -> Option<Vec<u8>> {
    let mut pattern: Vec<Atom> = prefix.bytes().map(Atom::Byte).collect();
    pattern.push(Atom::Any);
    intersect(&atoms(template), &pattern)
}

/// One step of a key pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atom {
    /// Exactly this byte.
    Byte(u8),
    /// An escaped dimension value (zero or more bytes).
    Value,
    /// One ASCII digit.
    Digit,
    /// Any bytes (zero or more): the rest of a key after a prefix.
    Any,
}

fn atoms(template: &KeyTemplate) -> Vec<Atom> {
    let mut out = Vec::new();
    for shape in template.shape() {
        match shape {
            Shape::Literal(bytes) => out.extend(bytes.iter().copied().map(Atom::Byte)),
            Shape::Value => out.push(Atom::Value),
            Shape::Digits(n) => out.extend(std::iter::repeat_n(Atom::Digit, n)),
        }
    }
    out
}

/// A position in a pattern: the next atom, and inside a [`Atom::Value`] how much of a `%XX`
/// escape has been read (0: none, 1: `%`, 2: `%X`).
type Pos = (usize, u8);

/// A position in each pattern: a state of the product automaton.
type Pair = (Pos, Pos);

/// For each reached pair, the pair it was reached from and the byte read (None: a skip);
/// None for the start.
type Trail = HashMap<Pair, Option<(Pair, Option<u8>)>>;

/// Where reading `c` at `pos` leads, if anywhere.
fn step(pattern: &[Atom], (i, esc): Pos, c: u8) -> Option<Pos> {
    match (pattern.get(i)?, esc) {
        (Atom::Byte(b), _) => (c == *b).then_some((i + 1, 0)),
        (Atom::Digit, _) => c.is_ascii_digit().then_some((i + 1, 0)),
        (Atom::Any, _) => Some((i, 0)),
        (Atom::Value, 0) if c == b'%' => Some((i, 1)),
        (Atom::Value, 0) => (!needs_escape(c)).then_some((i, 0)),
        (Atom::Value, e) => is_upper_hex(c).then_some((i, (e + 1) % 3)),
    }
}

/// The position after an empty match of a value or rest at `pos`, if the pattern allows one.
fn skip(pattern: &[Atom], (i, esc): Pos) -> Option<Pos> {
    match pattern.get(i)? {
        Atom::Value | Atom::Any if esc == 0 => Some((i + 1, 0)),
        _ => None,
    }
}

fn is_upper_hex(c: u8) -> bool {
    matches!(c, b'0'..=b'9' | b'A'..=b'F')
}

/// One representative of every class of bytes that [`step`] treats alike in both patterns,
/// printable ASCII letters and digits first so examples read well.
fn representatives(a: &[Atom], b: &[Atom]) -> Vec<u8> {
    let literal = |c: u8| a.iter().chain(b).any(|atom| *atom == Atom::Byte(c));
    let preferred = (b'a'..=b'z').chain(b'0'..=b'9').chain(b'A'..=b'Z');
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for c in preferred.chain(0..=255) {
        // A literal byte is its own class; the others differ only in what a value or a digit
        // makes of them.
        let class = if literal(c) {
            (Some(c), false, false, false, false)
        } else {
            (
                None,
                needs_escape(c),
                c == b'%',
                is_upper_hex(c),
                c.is_ascii_digit(),
            )
        };
        if !seen.contains(&class) {
            seen.push(class);
            out.push(c);
        }
    }
    out
}

/// The shortest byte string both patterns match, by breadth-first search over pairs of positions.
fn intersect(a: &[Atom], b: &[Atom]) -> Option<Vec<u8>> {
    let classes = representatives(a, b);
    let start: Pair = ((0, 0), (0, 0));
    let mut from: Trail = HashMap::new();
    from.insert(start, None);
    let mut queue = VecDeque::from([start]);
    while let Some(pair @ (pa, pb)) = queue.pop_front() {
        if pa == (a.len(), 0) && pb == (b.len(), 0) {
            return Some(path(&from, pair));
        }
        let mut next = Vec::new();
        if let Some(sa) = skip(a, pa) {
            next.push(((sa, pb), None));
        }
        if let Some(sb) = skip(b, pb) {
            next.push(((pa, sb), None));
        }
        for &c in &classes {
            if let (Some(sa), Some(sb)) = (step(a, pa, c), step(b, pb, c)) {
                next.push(((sa, sb), Some(c)));
            }
        }
        for (to, byte) in next {
            from.entry(to).or_insert_with(|| {
                queue.push_back(to);
                Some((pair, byte))
            });
        }
    }
    None
}

/// The bytes read on the way from the start to `end`.
fn path(from: &Trail, end: Pair) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut at = end;
    while let Some(Some((prev, byte))) = from.get(&at) {
        bytes.extend(*byte);
        at = *prev;
    }
    bytes.reverse();
    bytes
}

#[cfg(test)]
#[path = "overlap_tests.rs"]
mod tests;
