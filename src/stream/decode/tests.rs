use super::*;
use crate::config::DecodeConfig;

fn decoder(time_field: Option<&str>, format: TimeFormat) -> Decoder {
    let config = DecodeConfig {
        time_field: time_field.map(String::from),
        time_format: format,
        max_message_bytes: 256,
        max_value_bytes: 16,
        dead_letter_topic: None,
        max_future: std::time::Duration::from_secs(3600),
        ..DecodeConfig::default()
    };
    Decoder::new(
        &config.compile().unwrap(),
        &[
            ("app_id".to_string(), FieldRole::Dimension),
            ("ip".to_string(), FieldRole::Dimension),
            ("bytes".to_string(), FieldRole::Value),
        ],
    )
}

#[test]
fn extracts_wanted_fields_and_borrows_strings() {
    let d = decoder(Some("ts"), TimeFormat::EpochMs);
    let payload = br#"{"ignored":{"deep":[1,2,{"x":null}]},"app_id":"a1","ip":"::1","bytes":42,"ts":1722531600123}"#;
    let e = d.decode(Some(payload), None).unwrap();
    assert_eq!(e.dims[0], "a1");
    assert!(matches!(e.dims[0], Cow::Borrowed(_)));
    assert_eq!(e.dims[1], "::1");
    assert_eq!(e.nums[2], 42);
    assert_eq!(e.ts_ms, 1_722_531_600_123);
}

#[test]
fn escaped_strings_and_numbers_as_dimensions() {
    let d = decoder(None, TimeFormat::EpochMs);
    let e = d
        .decode(Some(br#"{"app_id":"a\"b","ip":12345,"bytes":-3}"#), Some(7))
        .unwrap();
    assert_eq!(e.dims[0], "a\"b");
    assert_eq!(e.dims[1], "12345");
    assert_eq!(e.nums[2], -3);
    assert_eq!(e.ts_ms, 7, "kafka timestamp used without a time field");
}

#[test]
fn every_reason_is_reported() {
    let d = decoder(Some("ts"), TimeFormat::EpochMs);
    let cases: &[(Option<&[u8]>, DecodeError)] = &[
        (None, DecodeError::Empty),
        (Some(b""), DecodeError::Empty),
        (Some(&[b'x'; 300]), DecodeError::TooLarge),
        (Some(b"{\"app_id\":\"\xff\"}"), DecodeError::NotUtf8),
        (Some(b"not json"), DecodeError::NotJson),
        (Some(b"[1,2]"), DecodeError::NotJson),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"ts":1} trailing"#),
            DecodeError::NotJson,
        ),
        (
            Some(br#"{"app_id":"a","bytes":1,"ts":1}"#),
            DecodeError::MissingField,
        ),
        (
            Some(br#"{"app_id":"a","ip":null,"bytes":1,"ts":1}"#),
            DecodeError::WrongType,
        ),
        (
            Some(br#"{"app_id":{"x":1},"ip":"b","bytes":1,"ts":1}"#),
            DecodeError::WrongType,
        ),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":1.5,"ts":1}"#),
            DecodeError::WrongType,
        ),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":"1","ts":1}"#),
            DecodeError::WrongType,
        ),
        (
            Some(br#"{"app_id":"aaaaaaaaaaaaaaaaaaaaa","ip":"b","bytes":1,"ts":1}"#),
            DecodeError::TooLarge,
        ),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":1}"#),
            DecodeError::MissingField,
        ),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"ts":"noon"}"#),
            DecodeError::BadTimestamp,
        ),
        (
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"ts":1e300}"#),
            DecodeError::BadTimestamp,
        ),
    ];
    for (payload, want) in cases {
        let got = d.decode(*payload, Some(1)).map(|_| ()).unwrap_err();
        assert_eq!(
            got,
            *want,
            "payload {:?}",
            payload.map(String::from_utf8_lossy)
        );
    }
}

#[test]
fn time_formats() {
    let s = decoder(Some("t"), TimeFormat::EpochS);
    let e = s
        .decode(
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"t":1722531600}"#),
            None,
        )
        .unwrap();
    assert_eq!(e.ts_ms, 1_722_531_600_000);
    let e = s
        .decode(
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"t":1722531600.5}"#),
            None,
        )
        .unwrap();
    assert_eq!(e.ts_ms, 1_722_531_600_500);
    let r = decoder(Some("t"), TimeFormat::Rfc3339);
    let e = r
        .decode(
            Some(br#"{"app_id":"a","ip":"b","bytes":1,"t":"2024-08-01T18:00:00+02:00"}"#),
            None,
        )
        .unwrap();
    assert_eq!(e.ts_ms, 1_722_528_000_000);
    let none = decoder(None, TimeFormat::EpochMs);
    assert_eq!(
        none.decode(Some(br#"{"app_id":"a","ip":"b","bytes":1}"#), None)
            .unwrap_err(),
        DecodeError::BadTimestamp
    );
}

#[test]
fn event_time_past_max_future_is_bad_input() {
    let d = decoder(Some("ts"), TimeFormat::EpochMs);
    let now = 1_700_000_000_000;
    let ok = format!(
        r#"{{"app_id":"a","ip":"i","bytes":1,"ts":{}}}"#,
        now + 3_600_000
    );
    assert!(d.decode_at(Some(ok.as_bytes()), None, now).is_ok());
    let far = format!(
        r#"{{"app_id":"a","ip":"i","bytes":1,"ts":{}}}"#,
        now + 3_600_001
    );
    assert_eq!(
        d.decode_at(Some(far.as_bytes()), None, now).unwrap_err(),
        DecodeError::FutureTime
    );
    // Year 2200: a valid timestamp, but no event happens there.
    let far_future = r#"{"app_id":"a","ip":"i","bytes":1,"ts":7258118400000}"#;
    assert!(d.decode(Some(far_future.as_bytes()), None).is_ok());
    assert_eq!(
        d.decode_at(Some(far_future.as_bytes()), None, now)
            .unwrap_err(),
        DecodeError::FutureTime
    );
}

#[test]
fn every_reason_has_its_index_and_a_distinct_label() {
    for (i, e) in DecodeError::ALL.iter().enumerate() {
        assert_eq!(e.index(), i);
    }
    let labels: std::collections::BTreeSet<_> =
        DecodeError::ALL.iter().map(|e| e.reason()).collect();
    assert_eq!(labels.len(), DecodeError::ALL.len());
}

/// Decoders with every time source, for comparing the fast scan with the full parser.
pub(super) fn reference_decoders() -> Vec<(Decoder, Option<i64>)> {
    let mut out = vec![(decoder(None, TimeFormat::EpochMs), Some(1))];
    out.push((nested_decoder(), Some(1)));
    for format in [TimeFormat::EpochMs, TimeFormat::EpochS, TimeFormat::Rfc3339] {
        out.push((decoder(Some("ts"), format), None));
    }
    out
}

/// `decode` (fast scan, falling back) and `decode_reference` (full parser only) give the same
/// answer for `payload` with every decoder.
pub(super) fn assert_same_answer(payload: &[u8]) {
    for (d, kafka_ts) in reference_decoders() {
        let fast = d.decode(Some(payload), kafka_ts);
        let full = d.decode_reference(Some(payload), kafka_ts);
        let shown = String::from_utf8_lossy(payload);
        match (fast, full) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.dims, b.dims, "dims of {shown}");
                assert_eq!(a.nums, b.nums, "nums of {shown}");
                assert_eq!(a.ts_ms, b.ts_ms, "time of {shown}");
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "error for {shown}"),
            (a, b) => panic!("{shown}: fast {:?} vs full {:?}", a.err(), b.err()),
        }
    }
}

/// Whether the fast scan alone accepts `payload` (no fallback to the full parser).
fn scanned(payload: &str) -> bool {
    let d = decoder(Some("ts"), TimeFormat::EpochMs);
    let mut raw = vec![None; d.names.len()];
    scan::scan(payload, &d.root, &mut raw).is_some()
}

const EDGE_CASES: &[&str] = &[
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1722531600123}"#,
    " \t\r\n{ \"app_id\" : \"a\" ,\n\"ip\"\t:\"b\",\"bytes\" :1 ,\"ts\":1722531600} \n",
    r#"{}"#,
    r#"{ }"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1,}"#,
    r#"{"app_id":"a","ip":"b","bytes":1 "ts":1}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1}}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1"#,
    "\u{feff}{\"app_id\":\"a\",\"ip\":\"b\",\"bytes\":1,\"ts\":1}",
    // Escapes: in a wanted value, in a key, in a skipped value.
    r#"{"app_id":"a\"b","ip":"\u00e9","bytes":1,"ts":1}"#,
    r#"{"app\u005fid":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"x":"\\\/\b\f\n\r\t","app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"x":"\q","app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"x":"\u12g4","app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    "{\"x\":\"tab\there\",\"app_id\":\"a\",\"ip\":\"b\",\"bytes\":1,\"ts\":1}",
    r#"{"app_id":"ü€😀","ip":"b","bytes":1,"ts":1}"#,
    // Nested values skipped, or wanted (then the wrong type).
    r#"{"n":{"a":[1,{"b":[]},"c",true,false,null,-1.5e3]},"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"n":[[],{},[{}]],"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"n":{"a":1,},"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"n":[1,],"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"n":{"a" 1},"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"n":{1:1},"app_id":"a","ip":"b","bytes":1,"ts":1}"#,
    r#"{"app_id":["a"],"ip":"b","bytes":1,"ts":1}"#,
    r#"{"app_id":"a","ip":"b","bytes":{"v":1},"ts":1}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":[1]}"#,
    // Duplicate keys: the last one counts, whatever the first was.
    r#"{"app_id":"a","app_id":"z","ip":"b","bytes":1,"ts":1}"#,
    r#"{"app_id":{},"ip":"b","bytes":1,"ts":1,"app_id":"z"}"#,
    r#"{"app_id":"z","ip":"b","bytes":1,"ts":1,"app_id":null}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"bytes":2.5,"ts":1}"#,
    // Literals.
    r#"{"app_id":true,"ip":false,"bytes":1,"ts":1,"x":null}"#,
    r#"{"app_id":tru,"ip":"b","bytes":1,"ts":1}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1,"x":nul}"#,
    r#"{"app_id":"a","ip":"b","bytes":1,"ts":1,"x":True}"#,
    r#"{"app_id":null,"ip":"b","bytes":1,"ts":1}"#,
];

/// Numbers in every form, each as a dimension, a value, the time and a skipped field.
pub(super) const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "01",
    "-01",
    "7",
    "-7",
    "1.0",
    "1.5",
    "-0.0",
    "1e3",
    "1E+3",
    "1e-3",
    "1.5e2",
    "1.",
    ".5",
    "-",
    "+1",
    "1e",
    "1e+",
    "--1",
    "0x10",
    "1_000",
    "123456789012345678",
    "-123456789012345678",
    "1234567890123456789",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "100000000000000000000000000",
    "1722531600",
    "1722531600.5",
    "1722531600123",
    "1e400",
    "-1e400",
    "172251e40072254",
    "1e-400",
    "0.1e999999999999999999",
    "4.9e-324",
    "Infinity",
    "NaN",
];

#[test]
fn fast_scan_gives_the_full_parsers_answer_on_edge_cases() {
    for case in EDGE_CASES {
        assert_same_answer(case.as_bytes());
    }
    let base = r#"{"app_id":"a","ip":"b","bytes":1,"ts":1722531600123,"x":1}"#;
    for n in NUMBERS {
        for field in [
            "\"app_id\":\"a\"",
            "\"bytes\":1",
            "\"ts\":1722531600123",
            "\"x\":1",
        ] {
            let (name, _) = field.split_once(':').unwrap();
            let payload = base.replacen(field, &format!("{name}:{n}"), 1);
            assert_same_answer(payload.as_bytes());
        }
    }
    for depth in [1, 60, 63, 64, 65, 127, 128, 129, 300] {
        for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
            let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let payload = format!(r#"{{"n":{nested},"app_id":"a","ip":"b","bytes":1,"ts":1}}"#);
            assert_same_answer(payload.as_bytes());
            let wanted = format!(r#"{{"app_id":{nested},"ip":"b","bytes":1,"ts":1}}"#);
            assert_same_answer(wanted.as_bytes());
        }
    }
}

#[test]
fn fast_scan_gives_the_full_parsers_answer_on_mangled_input() {
    let payload = br#" {"n":{"a":[1,-2.5e-3,"s",true,null]},"app_id":"ab","ip":"c\"d","bytes":-12,"ts":1722531600123,"r":"2024-08-01T18:00:00Z"} "#;
    assert_same_answer_mangled(payload);
}

/// [`assert_same_answer`] for every prefix of `payload`, every byte of it replaced by (or
/// preceded by) each of a few structural or odd bytes, and every byte removed.
pub(super) fn assert_same_answer_mangled(payload: &[u8]) {
    for end in 1..=payload.len() {
        assert_same_answer(&payload[..end]);
    }
    let odd = b"{}[]\":,\\ 0-+.eE1tnx\x00\x1f\x7f\xc3\xff";
    for i in 0..payload.len() {
        for &b in odd {
            let mut mangled = payload.to_vec();
            mangled[i] = b;
            assert_same_answer(&mangled);
            mangled.insert(i, b);
            assert_same_answer(&mangled);
        }
        let mut cut = payload.to_vec();
        cut.remove(i);
        assert_same_answer(&cut);
    }
}

#[test]
fn common_payloads_take_the_fast_scan_and_unusual_ones_fall_back() {
    let fast = [
        r#"{"app_id":"a","ip":"b","bytes":1,"ts":1722531600123}"#,
        r#"{"x":"a\"b","app_id":"a","ip":"b","bytes":-1,"ts":0,"y":[1.5,{"z":null}]}"#,
        r#"{"app_id":"a","app_id":true,"ip":7,"bytes":1,"ts":1,"f":-2.5e-3}"#,
    ];
    let fallback = [
        // Escape in a wanted value, a float or a long integer in a wanted field, deep nesting.
        r#"{"app_id":"a\"b","ip":"b","bytes":1,"ts":1}"#,
        r#"{"app_id":"a","ip":"b","bytes":1,"ts":1.5}"#,
        r#"{"app_id":"a","ip":"b","bytes":1234567890123456789,"ts":1}"#,
        r#"{"app_id":"a","ip":"b","bytes":-0,"ts":1}"#,
        &format!(
            r#"{{"n":{}{},"app_id":"a"}}"#,
            "[".repeat(65),
            "]".repeat(65)
        ),
        r#"{"app_id":"a","ip":"b","bytes":1,"ts":1} x"#,
    ];
    let base = r#"{"app_id":"a","ip":"b","bytes":1,"ts":1}"#;
    assert!(scanned(base));
    for p in fast {
        // Escapes in skipped strings go to the full parser too (checked there, not copied).
        assert_eq!(scanned(p), !p.contains('\\'), "{p}");
    }
    for p in fallback {
        assert!(!scanned(p), "{p}");
    }
}

#[test]
fn strings_of_every_length_with_a_special_byte_anywhere() {
    // The scan looks for the end of a string eight bytes at a time: every length and position.
    for len in 0..26 {
        let plain: String = (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        for value in [plain.clone(), format!("{plain}é"), format!("ü{plain}")] {
            assert_same_answer(
                format!(r#"{{"x":"{value}","app_id":"{value}","ip":"b","bytes":1,"ts":1}}"#)
                    .as_bytes(),
            );
        }
        for at in 0..len {
            for special in ["\\\"", "\\n", "\\u0041", "\u{1}", "\u{1f}", "\t", "\u{7f}"] {
                let mut value = plain.clone();
                value.insert_str(at, special);
                for payload in [
                    format!(r#"{{"x":"{value}","app_id":"a","ip":"b","bytes":1,"ts":1}}"#),
                    format!(r#"{{"app_id":"{value}","ip":"b","bytes":1,"ts":1}}"#),
                ] {
                    assert_same_answer(payload.as_bytes());
                }
            }
        }
    }
    let d = decoder(None, TimeFormat::EpochMs);
    let e = d
        .decode(
            Some(br#"{"app_id":"abcdefghijklm","ip":"n","bytes":1}"#),
            Some(1),
        )
        .unwrap();
    assert_eq!(e.dims[0], "abcdefghijklm");
}

pub(super) fn config(fields: &[(&str, &str)], time_field: Option<&str>) -> DecodeConfig {
    DecodeConfig {
        time_field: time_field.map(String::from),
        fields: fields
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect(),
        max_value_bytes: 16,
        ..DecodeConfig::default()
    }
}

pub(super) fn roles(names: &[(&str, FieldRole)]) -> Vec<(String, FieldRole)> {
    names.iter().map(|(n, r)| (n.to_string(), *r)).collect()
}

/// Reads `app_id` and `ip` from inside `n`, `bytes` and `ts` from the top level: one of the
/// decoders every fast-scan comparison runs.
pub(super) fn nested_decoder() -> Decoder {
    Decoder::new(
        &config(
            &[("app_id", "n.a[2]"), ("ip", "/n/a/0"), ("deep", "n.b.c.d")],
            Some("ts"),
        )
        .compile()
        .unwrap(),
        &roles(&[
            ("app_id", FieldRole::Dimension),
            ("ip", FieldRole::Dimension),
            ("bytes", FieldRole::Value),
        ]),
    )
}
