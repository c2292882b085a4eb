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
    let d = Decoder::for_counters(&m.first_topic().decode, &m.filters, &m.counters);
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
    let d = Decoder::for_counters(&m.first_topic().decode, &m.filters, &m.counters);
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
    let compiled = config.decode.compile().unwrap();
    let d = Decoder::for_counters(&compiled, &m.filters[..1], &counters);
    assert_eq!(d.names.len(), 1, "only `route` is read");
    let e = decode(&d, r#"{"route":"/a"}"#).unwrap();
    assert_eq!(e.skips, Skips::default());
    assert_eq!(decode(&d, r#"{}"#).unwrap_err(), DecodeError::MissingField);
}

/// Two topics with different layouts: `both` reads either, `pages` only `views` (flat),
/// `users` only `clicks` (nested, its own `[decode.fields]`).
#[test]
fn a_counter_that_does_not_read_a_topic_skips_its_events_without_a_skip_reason() {
    let text = r#"
[kafka]
brokers = "127.0.0.1:9"
group_id = "g"
[[kafka.topics]]
name = "views"
[[kafka.topics]]
name = "clicks"
decode = { fields = { user = "client.user", app = "req.app" } }
[[counters]]
name = "both"
dimensions = ["app"]
key = "b:{app}:{yyyyMMddHH}"
window = "1h"
[[counters]]
name = "pages"
dimensions = ["page"]
topics = ["views"]
key = "p:{page}:{yyyyMMddHH}"
window = "1h"
[[counters]]
name = "users"
dimensions = ["user"]
topics = ["clicks"]
key = "u:{user}:{yyyyMMddHH}"
window = "1h"
"#;
    let m = Model::compile(toml::from_str(text).unwrap()).unwrap();
    let views = Decoder::for_topic(&m, m.topic("views").unwrap());
    let clicks = Decoder::for_topic(&m, m.topic("clicks").unwrap());
    assert!(views.field_index("user").is_none(), "not read on views");
    assert!(!views.reads(2) && views.reads(1) && clicks.reads(2));

    let e = decode(&views, r#"{"app":"a","page":"/x"}"#).unwrap();
    assert_eq!(e.skips.unread, 0b100);
    assert_eq!(e.skips.all(), 0b100, "users does not take it");
    assert_eq!(
        e.skips.masks(),
        [0; 4],
        "by design: no skip metric counts it"
    );
    let e = decode(&clicks, r#"{"req":{"app":"a"},"client":{"user":"u1"}}"#).unwrap();
    assert_eq!(e.skips.all(), 0b010, "pages does not take it");
    assert_eq!(e.skips.masks(), [0; 4]);
    assert_eq!(&*e.dims[clicks.field_index("user").unwrap()], "u1");
    // A field of a counter that reads the topic stays required.
    assert!(matches!(
        decode(&clicks, r#"{"req":{"app":"a"}}"#),
        Err(DecodeError::MissingField)
    ));
    // The single-topic form reads every counter.
    let one = model("");
    let d = Decoder::for_topic(&one, one.first_topic());
    assert!((0..3).all(|ci| d.reads(ci)));
}
