//! Tests for `overlap.rs`: clashing and separate template pairs, and that every pair of keys
//! found equal by rendering is reported.

use super::*;
use crate::window::WindowSpec;
use proptest::prelude::*;
use std::time::Duration;

fn template(text: &str, secs: u64) -> KeyTemplate {
    let dims: Vec<String> = ["a", "b"]
        .into_iter()
        .filter(|d| text.contains(&format!("{{{d}}}")))
        .map(String::from)
        .collect();
    let window = WindowSpec::new(Duration::from_secs(secs), chrono_tz::Tz::UTC).unwrap();
    KeyTemplate::parse(text, &dims, &window).expect("test template parses")
}

fn clash_of(a: &str, b: &str) -> Option<String> {
    clash(&template(a, 3600), &template(b, 3600)).map(|k| String::from_utf8(k).unwrap())
}

#[test]
fn one_template_for_two_windows_or_kinds_clashes() {
    let hourly = template("c:{a}:{yyyyMMddHH}", 3600);
    let daily = template("c:{a}:{yyyyMMddHH}", 86_400);
    // The daily window starts at hour 00, which the hourly counter renders too.
    let example = clash(&hourly, &daily).expect("clash");
    assert_eq!(String::from_utf8(example).unwrap(), "c::0000000000");
    assert_eq!(
        clash(&hourly, &hourly).as_deref(),
        Some(&b"c::0000000000"[..])
    );
}

#[test]
fn dimension_names_do_not_separate_keys() {
    assert!(clash_of("c:{a}:{yyyyMMddHH}", "c:{b}:{yyyyMMddHH}").is_some());
}

#[test]
fn templates_that_coincide_after_rendering_clash() {
    // a = "1", b = "x1".
    assert_eq!(
        clash_of("c:x{a}:{yyyyMMddHH}", "c:{b}:{yyyyMMddHH}").as_deref(),
        Some("c:x:0000000000")
    );
    // A value can be all digits: both render c:<digits>:<digits>.
    assert!(clash_of("c:{a}:{yyyyMMddHH}", "c:{yyyyMMddHH}:{a}").is_some());
    // The second counter's value "%25" renders where the first has a literal '%'.
    assert_eq!(
        clash_of("c:%{a}:{yyyyMMddHH}", "c:{a}:{yyyyMMddHH}").as_deref(),
        Some("c:%00:0000000000")
    );
    // With two values and one literal colon between them on one side.
    assert!(clash_of("k:{a}:{b}:{yyyyMMddHH}", "k:{a}:x:{yyyyMMddHH}").is_some());
}

#[test]
fn separate_prefixes_and_shapes_do_not_clash() {
    assert_eq!(clash_of("a:{a}:{yyyyMMddHH}", "b:{a}:{yyyyMMddHH}"), None);
    // Values never contain ':', so the number of colons separates these.
    assert_eq!(
        clash_of("c:{a}:{yyyyMMddHH}", "c:{a}:{b}:{yyyyMMddHH}"),
        None
    );
    // Hourly and daily keys on one prefix differ in the number of digits.
    let hourly = template("flow:{a}:{yyyyMMddHH}", 3600);
    let daily = template("flow:{a}:{yyyyMMdd}", 86_400);
    assert_eq!(clash(&hourly, &daily), None);
    // '%' in a value is always followed by two uppercase hex digits.
    assert_eq!(clash_of("c:%G{a}:{yyyyMMddHH}", "c:{a}:{yyyyMMddHH}"), None);
    // A literal that a value cannot contain.
    assert_eq!(clash_of("c:{a}:{yyyyMMddHH}", "c:{a}:x:{yyyyMMddHH}"), None);
}

#[test]
fn keys_that_can_start_with_the_state_prefix() {
    let starts =
        |t: &str| with_prefix(&template(t, 3600), "tally:").map(|k| String::from_utf8(k).unwrap());
    assert_eq!(starts("flow:count:{a}:{yyyyMMddHH}"), None);
    assert_eq!(starts("tallyx:{a}:{yyyyMMddHH}"), None);
    assert_eq!(
        starts("{a}:x:{yyyyMMddHH}").as_deref(),
        Some("tally:x:0000000000")
    );
    assert_eq!(
        starts("tal{a}:{yyyyMMddHH}").as_deref(),
        Some("tally:0000000000")
    );
    assert!(starts("tally:{a}:{yyyyMMddHH}").is_some());
}

/// A template from a few pieces that make near misses likely: literals around `{a}`, maybe
/// `{b}`, and a time placeholder, first or last.
fn build(
    lits: &[&str; 4],
    two: bool,
    time_first: bool,
    (time, secs): (&str, u64),
) -> (String, u64) {
    let mut pieces = vec!["{a}"];
    if two {
        pieces.push("{b}");
    }
    if time_first {
        pieces.insert(0, time);
    } else {
        pieces.push(time);
    }
    // Placeholders must be separated by a literal with ':'.
    let mut text = lits[0].to_string();
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            text.push(':');
            text.push_str(lits[i]);
        }
        text.push_str(p);
    }
    text.push_str(lits[3]);
    (text, secs)
}

/// Two templates, the second a small edit of the first (one literal, the shape, or the time).
fn arb_pair() -> impl Strategy<Value = ((String, u64), (String, u64))> {
    let literal = || prop::sample::select(vec!["", "c", "c:", ":", "x", "%", "%2", "0", "1"]);
    let time = || {
        prop::sample::select(vec![
            ("{yyyyMMddHH}", 3600u64),
            ("{HHyyyyMMdd}", 3600),
            ("{yyyyMMdd}", 86_400),
        ])
    };
    (
        prop::array::uniform4(literal()),
        (0usize..4, literal()),
        prop::array::uniform2(prop::bool::ANY),
        prop::array::uniform2(prop::bool::ANY),
        prop::array::uniform2(time()),
    )
        .prop_map(|(lits, (edit, lit), two, first, time)| {
            let mut other = lits;
            other[edit] = lit;
            (
                build(&lits, two[0], first[0], time[0]),
                build(&other, two[1], first[1], time[1]),
            )
        })
}

/// Every key `t` renders for values from [`VALUES`] and a few times.
fn renderings(t: &KeyTemplate) -> std::collections::HashSet<Vec<u8>> {
    let digits: usize = t
        .shape()
        .map(|s| match s {
            Shape::Digits(n) => n,
            _ => 0,
        })
        .sum();
    let mut out = std::collections::HashSet::new();
    for time in ["0000000000", "2025010100", "1000000000"] {
        let time = &time[..digits];
        for a in VALUES {
            for b in VALUES {
                let values = [a, b];
                let mut key = Vec::new();
                t.render(&mut key, &values[..t.dimension_count()], time);
                out.insert(key);
            }
        }
    }
    out
}

const VALUES: [&str; 10] = ["", "1", "00", "x", ":", "%", "c", "x:1", "%25", "0:c"];

proptest! {
    /// Whenever two templates render the same key for some values and times, the search finds
    /// a clash (soundness: a missed clash would merge two counters).
    #[test]
    fn equal_renderings_are_always_found(((ta, sa), (tb, sb)) in arb_pair()) {
        let (a, b) = (template(&ta, sa), template(&tb, sb));
        let shared = renderings(&a).intersection(&renderings(&b)).next().cloned();
        if let Some(key) = shared {
            let key = String::from_utf8_lossy(&key).into_owned();
            prop_assert!(clash(&a, &b).is_some(), "{ta} and {tb} both render {key}");
        }
    }
}
