//! Counter filters and derived fields in the decoder.

use super::*;
use crate::config::{Config, Model};

/// Counters on one topic: `all` (no filter), `errors` (5xx only, by a derived status class),
/// `slow` (a filter on a nested field, summing one only it reads).
fn model(extra_counter: &str) -> std::sync::Arc<Model> {
    let text = r#"
[kafka]
brokers = "127.0.0.1:9"
topic = "t"
group_id = "g"
[decode.fields]
latency = "timing.ms"
[decode.derive]
class = 'string(status / 100) + "xx"'
[[counters]]
name = "all"
dimensions = ["route"]
key = "a:{route}:{yyyyMMddHH}"
window = "1h"
[[counters]]
name = "errors"
dimensions = ["route", "class"]
key = "e:{route}:{class}:{yyyyMMddHH}"
window = "1h"
filter = 'status >= 500 && method == "POST"'
[[counters]]
name = "slow"
dimensions = ["route"]
value_field = "latency"
key = "s:{route}:{yyyyMMddHH}"
window = "1h"
filter = "latency > 100"
"#
    .to_string()
        + extra_counter;
    let config: Config = toml::from_str(&text).unwrap();
    Model::compile(config).unwrap()
}

fn decode(d: &Decoder, payload: &str) -> Result<Event<'static>, DecodeError> {
    let payload: &'static str = Box::leak(payload.to_string().into_boxed_str());
    d.decode(Some(payload.as_bytes()), Some(1_722_531_600_000))
}

#[test]
fn filters_pick_counters_and_derived_fields_are_dimensions() {
    let m = model("");
    let d = Decoder::for_counters(&m.config.decode, &m.counters);
    let class = d.field_index("class").unwrap();
    let latency = d.field_index("latency").unwrap();

    let e = decode(
        &d,
        r#"{"route":"/a","status":503,"method":"POST","timing":{"ms":250}}"#,
    )
    .unwrap();
    assert_eq!(e.skips, Skips::default(), "every counter takes it");
    assert_eq!(e.dims[class], "5xx");
    assert_eq!(e.nums[latency], 250);

    let e = decode(
        &d,
        r#"{"route":"/a","status":200,"method":"POST","timing":{"ms":5}}"#,
    )
    .unwrap();
    assert_eq!(e.skips.filtered, 0b110, "errors and slow say no");

    // `slow`'s value is missing: its filter reads null > 100, an error; `errors` lacks status.
    let e = decode(&d, r#"{"route":"/a","method":"POST"}"#).unwrap();
    assert_eq!(e.skips.failed, 0b110);
    assert_eq!(e.skips.all(), 0b110, "`all` still counts it");

    // A filtered counter's own field of the wrong type: skipped by that counter only.
    let e = decode(
        &d,
        r#"{"route":"/a","status":500,"method":"POST","timing":{"ms":"x"}}"#,
    )
    .unwrap();
    assert_eq!(e.skips.failed, 0b100, "`latency > 100` on a string fails");
    let e = decode(
        &d,
        r#"{"route":"/a","status":500,"method":"POST","timing":{"ms":1e3}}"#,
    )
    .unwrap();
    assert_eq!(
        (e.skips.invalid, e.skips.all()),
        (0b100, 0b100),
        "a float is no sum"
    );

    // The unfiltered counter's field stays required: the event is bad input for all.
    let e = decode(&d, r#"{"status":503,"method":"POST","timing":{"ms":250}}"#);
    assert_eq!(e.unwrap_err(), DecodeError::MissingField);
}

#[test]
fn a_derived_field_that_fails_skips_only_the_counters_that_need_it() {
    // `by_class` has no filter but groups by the derived class: a status that is no number
    // fails the derivation and skips that counter alone.
    let m = model(
        r#"
[[counters]]
name = "by_class"
dimensions = ["class"]
key = "c:{class}:{yyyyMMddHH}"
window = "1h"
"#,
    );
    let d = Decoder::for_counters(&m.config.decode, &m.counters);
    let e = decode(&d, r#"{"route":"/a","status":"oops","method":"GET"}"#).unwrap();
    assert_eq!(e.skips.failed & 0b1000, 0b1000, "by_class: {:?}", e.skips);
    assert_eq!(e.skips.all() & 1, 0, "all counts it");
    let e = decode(&d, r#"{"route":"/a","status":404,"method":"GET"}"#).unwrap();
    assert_eq!(e.skips.all() & 0b1000, 0);
    assert_eq!(e.dims[d.field_index("class").unwrap()], "4xx");
}

#[test]
fn without_rules_nothing_changes() {
    let m = model("");
    let mut config = m.config.clone();
    config.decode.derive.clear();
    let counters: Vec<_> = m.counters.iter().take(1).cloned().collect();
    let d = Decoder::for_counters(&config.decode, &counters);
    assert_eq!(d.names.len(), 1, "only `route` is read");
    let e = decode(&d, r#"{"route":"/a"}"#).unwrap();
    assert_eq!(e.skips, Skips::default());
    assert_eq!(decode(&d, r#"{}"#).unwrap_err(), DecodeError::MissingField);
}
