//! `[decode.fields]`: nested paths (fast scan and full parser agree), and the record's own
//! sources (key, headers, topic, partition).

use rdkafka::message::{Header, OwnedHeaders};

use super::tests::{assert_same_answer, assert_same_answer_mangled, config, nested_decoder, roles};
use super::*;

#[test]
fn nested_paths_read_objects_and_arrays() {
    let d = Decoder::new(
        &config(
            &[
                ("method", "request.method"),
                ("sku", "items[1].sku"),
                ("tag", "tags.0"),
                ("odd", "/a~1b/c.d"),
                ("count", "stats.n"),
            ],
            Some("time"),
        )
        .compile()
        .unwrap(),
        &roles(&[
            ("method", FieldRole::Dimension),
            ("sku", FieldRole::Dimension),
            ("tag", FieldRole::Dimension),
            ("odd", FieldRole::Dimension),
            ("count", FieldRole::Value),
            ("route", FieldRole::Dimension),
        ]),
    );
    let payload = br#"{"request":{"method":"POST","path":"/x"},"items":[{"sku":"a"},{"sku":"b"}],
        "tags":{"0":"zero"},"a/b":{"c.d":"dotted"},"stats":{"n":5},"route":"/v1","time":1722531600000}"#;
    let e = d.decode(Some(payload), None).unwrap();
    assert_eq!(&e.dims[..4], ["POST", "b", "zero", "dotted"]);
    assert!(
        matches!(e.dims[0], Cow::Borrowed(_)),
        "nested strings borrow too"
    );
    assert_eq!(e.nums[4], 5);
    assert_eq!(e.dims[5], "/v1", "a name not listed is the top-level field");
    assert_eq!(e.ts_ms, 1_722_531_600_000);
    // `tags.0` reads an array's first element as well; `items[1]` only an array's.
    let arrays = br#"{"request":{"method":"GET"},"items":{"1":{"sku":"k"}},"tags":["t"],
        "a/b":{"c.d":"x"},"stats":{"n":1},"route":"r","time":1}"#;
    let e = d.decode(Some(arrays), None);
    assert_eq!(e.unwrap_err(), DecodeError::MissingField);
    let arrays = br#"{"request":{"method":"GET"},"items":[0,{"sku":"k"}],"tags":["t"],
        "a/b":{"c.d":"x"},"stats":{"n":1},"route":"r","time":1}"#;
    let e = d.decode(Some(arrays), None).unwrap();
    assert_eq!(&e.dims[..3], ["GET", "k", "t"]);
    // A path through a scalar, or to an object, is missing or the wrong type.
    for (payload, error) in [
        (&br#"{"request":"POST"}"#[..], DecodeError::MissingField),
        (br#"{"request":{"method":{"v":1}}}"#, DecodeError::WrongType),
        (br#"{"request":{}}"#, DecodeError::MissingField),
    ] {
        assert_eq!(d.decode(Some(payload), None).unwrap_err(), error);
        assert_eq!(d.decode_reference(Some(payload), None).unwrap_err(), error);
    }
}

#[test]
fn nested_paths_take_the_fast_scan() {
    let d = nested_decoder();
    let payload =
        r#"{"n":{"a":[7,{"x":1},"s"],"b":{"c":{"d":true}}},"bytes":3,"ts":1722531600123}"#;
    let mut raw = vec![None; d.names.len()];
    assert!(scan::scan(payload, &d.root, &mut raw).is_some());
    let e = d.decode(Some(payload.as_bytes()), None).unwrap();
    assert_eq!(&e.dims[..2], ["s", "7"]);
    assert_eq!(e.nums[2], 3);
}

#[test]
fn fast_scan_and_full_parser_agree_on_nested_input() {
    let payload = br#" {"n":{"b":{"c":{"d":[1]}},"a":[1,{"q":[2]},"s",true,null]},"bytes":-12,"n":{"a":[3,4,"t"]},"ts":1722531600123} "#;
    assert_same_answer_mangled(payload);
    for depth in [1, 30, 62, 63, 64, 65, 126, 127, 128, 129] {
        for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
            let inside = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            for payload in [
                format!(r#"{{"n":{{"a":[{inside},2,"s"]}},"bytes":1,"ts":1}}"#),
                format!(r#"{{"n":{{"a":[1,2,{inside}]}},"bytes":1,"ts":1}}"#),
                format!(r#"{{"n":{{"b":{{"c":{inside}}},"a":[1,2,"s"]}},"bytes":1,"ts":1}}"#),
            ] {
                assert_same_answer(payload.as_bytes());
            }
        }
    }
}

#[test]
fn fast_scan_and_full_parser_agree_on_numbers_where_an_object_is_wanted() {
    // `n` is the parent of the nested paths: any number there, however odd, gets one answer.
    for n in super::tests::NUMBERS {
        for payload in [
            format!(r#"{{"n":{n},"bytes":1,"ts":1}}"#),
            format!(r#"{{"n":{{"a":{n},"b":{{"c":{n}}}}},"bytes":1,"ts":1}}"#),
            format!(r#"{{"n":{{"a":[1,{n}],"b":{n}}},"bytes":1,"ts":1}}"#),
        ] {
            assert_same_answer(payload.as_bytes());
        }
    }
}

#[test]
fn record_sources_read_key_headers_topic_and_partition() {
    let d = Decoder::new(
        &config(
            &[
                ("tenant", "$key"),
                ("region", "$header.x-region"),
                ("cost", "$header.x-cost"),
                ("topic", "$topic"),
                ("part", "$partition"),
            ],
            None,
        )
        .compile()
        .unwrap(),
        &roles(&[
            ("tenant", FieldRole::Dimension),
            ("region", FieldRole::Dimension),
            ("cost", FieldRole::Value),
            ("topic", FieldRole::Dimension),
            ("part", FieldRole::Dimension),
            ("route", FieldRole::Dimension),
        ]),
    );
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "x-region",
            value: Some("eu"),
        })
        .insert(Header {
            key: "x-cost",
            value: Some("12"),
        })
        .insert(Header {
            key: "x-region",
            value: Some("us"),
        });
    let record = Record {
        key: Some(b"acme"),
        headers: Some(headers.as_borrowed()),
        topic: "orders",
        partition: 3,
    };
    let payload = br#"{"route":"/r"}"#;
    let e = d
        .decode_record(&record, Some(payload), Some(5), 10)
        .unwrap();
    assert_eq!(
        &e.dims[..],
        ["acme", "us", "", "orders", "3", "/r"],
        "the last header wins"
    );
    assert_eq!(e.nums[2], 12);
    // No key, a header missing, a value header that is no number, a key that is no UTF-8.
    let no_key = Record {
        key: None,
        ..record
    };
    assert_eq!(
        d.decode_record(&no_key, Some(payload), Some(5), 10)
            .unwrap_err(),
        DecodeError::MissingField
    );
    let bad = OwnedHeaders::new()
        .insert(Header {
            key: "x-region",
            value: Some("eu"),
        })
        .insert(Header {
            key: "x-cost",
            value: Some("lots"),
        });
    let bad_cost = Record {
        headers: Some(bad.as_borrowed()),
        ..record
    };
    assert_eq!(
        d.decode_record(&bad_cost, Some(payload), Some(5), 10)
            .unwrap_err(),
        DecodeError::WrongType
    );
    let only_region = OwnedHeaders::new().insert(Header {
        key: "x-region",
        value: Some("eu"),
    });
    let no_cost = Record {
        headers: Some(only_region.as_borrowed()),
        ..record
    };
    assert_eq!(
        d.decode_record(&no_cost, Some(payload), Some(5), 10)
            .unwrap_err(),
        DecodeError::MissingField
    );
    let binary = Record {
        key: Some(b"\xff\xfe"),
        ..record
    };
    assert_eq!(
        d.decode_record(&binary, Some(payload), Some(5), 10)
            .unwrap_err(),
        DecodeError::NotUtf8
    );
    let long = Record {
        key: Some(b"a-key-longer-than-sixteen"),
        ..record
    };
    assert_eq!(
        d.decode_record(&long, Some(payload), Some(5), 10)
            .unwrap_err(),
        DecodeError::TooLarge
    );
}

#[test]
fn the_time_can_come_from_a_header() {
    for (format, text, ms) in [
        (TimeFormat::EpochMs, "1722531600123", 1_722_531_600_123),
        (TimeFormat::EpochS, "1722531600", 1_722_531_600_000),
        (
            TimeFormat::Rfc3339,
            "2024-08-01T17:00:00Z",
            1_722_531_600_000,
        ),
    ] {
        let mut c = config(&[("at", "$header.at")], Some("at"));
        c.time_format = format;
        let d = Decoder::new(
            &c.compile().unwrap(),
            &roles(&[("route", FieldRole::Dimension)]),
        );
        let headers = OwnedHeaders::new().insert(Header {
            key: "at",
            value: Some(text),
        });
        let record = Record {
            headers: Some(headers.as_borrowed()),
            ..Record::default()
        };
        let e = d
            .decode_record(&record, Some(br#"{"route":"r"}"#), Some(5), ms)
            .unwrap();
        assert_eq!(e.ts_ms, ms, "{format:?}");
    }
}
