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
    };
    Decoder::new(
        &config,
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
