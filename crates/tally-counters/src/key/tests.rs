//! Tests for the key templates (`key/`): every parse error, rendering, and injectivity properties.

use super::*;
use chrono::NaiveDate;
use chrono_tz::Tz;
use proptest::prelude::*;
use std::time::Duration;

const DEFAULT: &str = "flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}";

fn dims(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn window(secs: u64) -> WindowSpec {
    WindowSpec::new(Duration::from_secs(secs), Tz::UTC).expect("valid test window")
}

fn parse(template: &str, names: &[&str], secs: u64) -> Result<KeyTemplate, TemplateError> {
    KeyTemplate::parse(template, &dims(names), &window(secs))
}

fn parse_err(template: &str, names: &[&str], secs: u64) -> TemplateError {
    parse(template, names, secs).expect_err("template must be rejected")
}

fn default_template() -> KeyTemplate {
    parse(DEFAULT, &["app_id", "device_id", "ip"], 3600).expect("default template parses")
}

fn at(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, m, d)
        .and_then(|d| d.and_hms_opt(h, mi, s))
        .expect("valid test date")
}

fn render(t: &KeyTemplate, values: &[&str], time: &str) -> String {
    let mut out = b"stale".to_vec();
    t.render(&mut out, values, time);
    String::from_utf8(out).expect("keys of UTF-8 values are UTF-8")
}

fn escape(value: &str) -> String {
    let mut out = Vec::new();
    escape_into(&mut out, value);
    String::from_utf8(out).expect("escaping keeps UTF-8")
}

fn unescape(escaped: &[u8]) -> Option<String> {
    super::unescape(escaped)
}

/// Reads the dimension values and time text back out of a rendered key. Succeeding on every
/// rendered key proves rendering is injective.
fn decode(t: &KeyTemplate, key: &[u8]) -> Option<(Vec<String>, String)> {
    t.decode(key)
}

#[test]
fn default_template_renders_expected_key() {
    let t = default_template();
    assert_eq!(t.dimension_count(), 3);
    let mut time = String::from("stale");
    t.format_time(at(2025, 8, 1, 17, 0, 0), &mut time);
    assert_eq!(time, "2025080117");
    assert_eq!(
        render(&t, &["app123", "device456", "127.0.0.1"], &time),
        "flow:count:app123:device456:127.0.0.1:2025080117"
    );
    assert_eq!(
        render(&t, &["app123", "device456", "::1"], &time),
        "flow:count:app123:device456:%3A%3A1:2025080117"
    );
}

#[test]
fn escapes_exactly_the_special_bytes() {
    assert_eq!(escape("::1"), "%3A%3A1");
    assert_eq!(escape("%{}"), "%25%7B%7D");
    assert_eq!(escape("a\nb\x7f\x00\x1f"), "a%0Ab%7F%00%1F");
    assert_eq!(escape("héllo 😀 [x]/y=z"), "héllo 😀 [x]/y=z");
    assert_eq!(escape(""), "");
    for b in 0u8..=0x7F {
        let s = char::from(b).to_string();
        let special = b < 0x20 || b == 0x7F || b"%:{}".contains(&b);
        let expected = if special {
            format!("%{b:02X}")
        } else {
            s.clone()
        };
        assert_eq!(escape(&s), expected, "byte {b:#04x}");
    }
    // Appends rather than clearing.
    let mut out = b"k:".to_vec();
    escape_into(&mut out, "a:b");
    assert_eq!(out, b"k:a%3Ab");
}

#[test]
fn formats_time_tokens_in_any_order_and_subset() {
    let t = parse("x:{HHddMMyyyy}", &[], 3600).expect("parses");
    let mut out = String::new();
    t.format_time(at(2025, 8, 1, 7, 0, 0), &mut out);
    assert_eq!(out, "0701082025");
    let t = parse("x:{yyyyMMddHHmmss}", &[], 1).expect("parses");
    t.format_time(at(987, 1, 2, 3, 4, 5), &mut out);
    assert_eq!(out, "09870102030405");
    let t = parse("day:{yyyyMMdd}", &[], 86_400).expect("parses");
    t.format_time(at(2025, 12, 31, 0, 0, 0), &mut out);
    assert_eq!(out, "20251231");
    assert_eq!(render(&t, &[], &out), "day:20251231");
}

#[test]
fn push_padded_handles_wide_and_negative_values() {
    let mut out = String::new();
    push_padded(&mut out, 12_345, 4);
    push_padded(&mut out, -7, 4);
    push_padded(&mut out, 0, 2);
    assert_eq!(out, "12345-000700");
}

#[test]
fn accepts_varied_valid_templates() {
    for (template, names, secs) in [
        ("{yyyyMMddHH}", &[][..], 3600),
        ("{a}:{yyyyMMddHHmm}", &["a"][..], 900),
        ("pre{a}x:y{b}::{yyyyMMdd}suffix", &["a", "b"][..], 86_400),
        ("{yyyyMMddHHmmss}:{a}", &["a"][..], 1),
        ("{yyyyMMddHHmm}:{a}", &["a"][..], 60),
        ("ünï:{a}:{yyyyMMddHH}", &["a"][..], 6 * 3600),
    ] {
        parse(template, names, secs).unwrap_or_else(|e| panic!("{template}: {e}"));
    }
}

#[test]
fn dimension_name_wins_over_time_pattern() {
    let t = parse("{HH}:{yyyyMMddHH}", &["HH"], 3600).expect("parses");
    assert_eq!(render(&t, &["v"], "T"), "v:T");
    let e = parse_err("{HH}", &["HH"], 86_400);
    assert!(matches!(e, TemplateError::MissingTime { .. }), "{e}");
}

#[test]
fn rejects_duplicate_dimension_names() {
    let e = parse_err("{a}:{yyyyMMddHH}", &["a", "a"], 3600);
    assert!(
        matches!(e, TemplateError::DuplicateDimensionName { ref dimension, .. } if dimension == "a")
    );
    assert!(e.to_string().contains("listed more than once"), "{e}");
}

#[test]
fn rejects_brace_errors() {
    let e = parse_err("flow:{app_id:{yyyyMMddHH}", &["app_id"], 3600);
    assert_eq!(
        e,
        TemplateError::NestedBrace {
            template: "flow:{app_id:{yyyyMMddHH}".into(),
            position: 13
        }
    );
    let e = parse_err("flow:{yyyyMMddHH", &[], 3600);
    assert!(
        matches!(e, TemplateError::UnclosedBrace { position: 5, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("never closed"), "{e}");
    // A literal '{' is an unclosed placeholder; a literal '}' is a stray brace.
    let e = parse_err("{yyyyMMddHH}:a{b", &[], 3600);
    assert!(
        matches!(e, TemplateError::UnclosedBrace { position: 14, .. }),
        "{e}"
    );
    let e = parse_err("{yyyyMMddHH}:a}b", &[], 3600);
    assert!(
        matches!(e, TemplateError::StrayCloseBrace { position: 14, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("no matching"), "{e}");
    let e = parse_err("x:{}:{yyyyMMddHH}", &[], 3600);
    assert!(
        matches!(e, TemplateError::EmptyPlaceholder { position: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("empty placeholder"), "{e}");
}

#[test]
fn rejects_unknown_placeholders() {
    let e = parse_err(DEFAULT, &["app_id", "device", "ip"], 3600);
    assert!(
        matches!(e, TemplateError::UnknownPlaceholder { ref placeholder, .. } if placeholder == "device_id"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("{device_id}") && msg.contains("app_id, device, ip"),
        "{msg}"
    );
    let e = parse_err("x:{yyyy-MM-dd}", &[], 86_400);
    assert!(
        e.to_string().contains("dimensions (none configured)"),
        "{e}"
    );
    assert!(matches!(e, TemplateError::UnknownPlaceholder { .. }), "{e}");
    assert!(e.to_string().contains("with no separators"), "{e}");
}

#[test]
fn rejects_invalid_time_patterns() {
    let e = parse_err("x:{yyMMddHH}", &[], 3600);
    assert!(matches!(e, TemplateError::InvalidTimePattern { .. }), "{e}");
    assert!(e.to_string().contains("`yy` is not a time token"), "{e}");
    let e = parse_err("x:{yyyyMMddHHHH}", &[], 3600);
    assert!(e.to_string().contains("`HHHH`"), "{e}");
    let e = parse_err("x:{yyyyMMddyyyy}", &[], 86_400);
    assert!(
        e.to_string().contains("yyyy (year) appears more than once"),
        "{e}"
    );
}

#[test]
fn rejects_missing_and_repeated_dimensions() {
    let e = parse_err("flow:{app_id}:{yyyyMMddHH}", &["app_id", "ip"], 3600);
    assert!(
        matches!(e, TemplateError::MissingDimension { ref dimension, .. } if dimension == "ip")
    );
    assert!(
        e.to_string().contains("does not contain dimension {ip}"),
        "{e}"
    );
    let e = parse_err("{ip}:{ip}:{yyyyMMddHH}", &["ip"], 3600);
    assert!(
        matches!(e, TemplateError::RepeatedDimension { ref dimension, .. } if dimension == "ip")
    );
    assert!(e.to_string().contains("more than once"), "{e}");
}

#[test]
fn rejects_missing_or_multiple_time_placeholders() {
    let e = parse_err("flow:{ip}", &["ip"], 3600);
    assert!(matches!(e, TemplateError::MissingTime { .. }), "{e}");
    assert!(e.to_string().contains("no time placeholder"), "{e}");
    let e = parse_err("x:{yyyyMMdd}:{HH}", &[], 3600);
    assert!(
        matches!(e, TemplateError::MultipleTime { ref first, ref second, .. } if first == "yyyyMMdd" && second == "HH"),
        "{e}"
    );
}

#[test]
fn rejects_time_patterns_too_coarse_for_the_window() {
    let coarse = |template: &str, secs: u64| match parse_err(template, &[], secs) {
        TemplateError::TimeTooCoarse {
            missing, window, ..
        } => (missing, window),
        other => panic!("{template}: unexpected {other}"),
    };
    assert_eq!(
        coarse("x:{yyyyMMdd}", 3600),
        ("HH (hour)".into(), "1h".into())
    );
    assert_eq!(
        coarse("x:{yyyyMMddHH}", 900),
        ("mm (minute)".into(), "15m".into())
    );
    assert_eq!(
        coarse("x:{yyyyMMddHHmm}", 10),
        ("ss (second)".into(), "10s".into())
    );
    assert_eq!(
        coarse("x:{yyyyMM}", 86_400),
        ("dd (day)".into(), "1d".into())
    );
    // Lowercase mm is minutes: a classic mix-up, reported with its meaning.
    assert_eq!(
        coarse("x:{yyyymmdd}", 86_400),
        ("MM (month)".into(), "1d".into())
    );
    let e = parse_err("x:{MMddHH}", &[], 3600);
    assert!(
        e.to_string()
            .ends_with("lacks yyyy (year), so different 1h windows would share a key"),
        "{e}"
    );
}

#[test]
fn rejects_placeholders_without_colon_between() {
    for template in [
        "{a}{b}:{yyyyMMddHH}",
        "{a}-{b}:{yyyyMMddHH}",
        "{a}:{b}{yyyyMMddHH}",
    ] {
        let e = parse_err(template, &["a", "b"], 3600);
        assert!(
            matches!(e, TemplateError::AdjacentPlaceholders { .. }),
            "{template}: {e}"
        );
    }
    let e = parse_err("{a}{b}:{yyyyMMddHH}", &["a", "b"], 3600);
    assert!(
        e.to_string().contains("{a} and {b} must be separated"),
        "{e}"
    );
}

/// Templates with placeholders at the start, end and middle, literal-free edges and suffixes.
const TEMPLATES: [(&str, &[&str]); 4] = [
    (DEFAULT, &["app_id", "device_id", "ip"]),
    (
        "{ip}:{yyyyMMddHH}:{app_id}::{device_id}",
        &["app_id", "device_id", "ip"],
    ),
    (
        "{yyyyMMddHH}-x:{device_id}a:b{app_id}:{ip}%end",
        &["app_id", "device_id", "ip"],
    ),
    (
        "{device_id}:{ip}:{app_id}:{yyyyMMddHH}",
        &["app_id", "device_id", "ip"],
    ),
];

/// Strings rich in the characters escaping must handle, plus arbitrary Unicode.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a:%{}\\x00\\x1f\\x7f3A]{0,5}",
        "[a-z0-9:%{}\\x00-\\x20\\x7fé😀]{0,12}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn escape_round_trips(s in value()) {
        let escaped = escape(&s);
        let clean = !escaped.bytes().any(|b| b < 0x20 || b"\x7f:{}".contains(&b));
        prop_assert!(clean, "unescaped special byte in {:?}", escaped);
        prop_assert_eq!(unescape(escaped.as_bytes()), Some(s));
    }

    #[test]
    fn rendering_is_decodable_hence_injective(
        which in 0..TEMPLATES.len(),
        values in proptest::collection::vec(value(), 3),
    ) {
        let (template, names) = TEMPLATES[which];
        let t = parse(template, names, 3600).expect("test template parses");
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let key = render(&t, &refs, "2025080117");
        prop_assert!(!key.contains('{') && !key.contains('}'), "hash tag in {}", key);
        prop_assert_eq!(decode(&t, key.as_bytes()), Some((values, "2025080117".to_owned())));
    }

    #[test]
    fn different_tuples_give_different_keys(
        which in 0..TEMPLATES.len(),
        a in proptest::collection::vec("[a:%{}3A]{0,3}", 3),
        b in proptest::collection::vec("[a:%{}3A]{0,3}", 3),
    ) {
        let (template, names) = TEMPLATES[which];
        let t = parse(template, names, 3600).expect("test template parses");
        let key = |v: &Vec<String>| {
            let refs: Vec<&str> = v.iter().map(String::as_str).collect();
            render(&t, &refs, "2025080117")
        };
        prop_assert_eq!(a == b, key(&a) == key(&b));
        // Moving a character across a separator must change the key too.
        let mut shifted = a.clone();
        if let Some(c) = shifted[0].pop() {
            shifted[1].insert(0, c);
            prop_assert_ne!(key(&a), key(&shifted));
        }
    }
}

#[test]
fn scan_patterns_escape_glob_characters() {
    assert_eq!(glob_prefix(b"flow:count:"), b"flow:count:*");
    assert_eq!(glob_prefix(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*");
}
