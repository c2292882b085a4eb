//! The fuzz targets' bodies: each takes raw fuzzer bytes, drives one stage of tally through its
//! public API and asserts the stage's documented guarantees. A panic here is a finding.
//!
//! The same functions run in two places: the libFuzzer binaries in `fuzz_targets/`, and the
//! main crate's `tests/it/release/fuzz_corpus.rs`, which replays the committed corpus in the normal test
//! suite (it includes this file with `#[path]`). So this file may only use `tally`, `std` and
//! crates that are also `tally`'s own dependencies or dev-dependencies (`chrono`, `chrono-tz`,
//! `serde_json`, `protox`, `envoy-types`, `prost`). One module per target beyond the first three.

mod avro;
mod cel;
mod limits;
mod protobuf;

pub use avro::avro;
pub use cel::cel;
pub use limits::limits;
pub use protobuf::protobuf;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use prost::Message as _;
use tally::api::rlqs::usage;
use tally::api::rlqs::{MAX_BUCKET_BYTES, MAX_BUCKET_KEYS};
use tally::config::{Config, DecodeConfig, TimeFormat};
use tally::key::{escape_into, KeyTemplate};
use tally::stream::decode::{Decoder, FieldRole};
use tally::window::{WindowSpec, MAX_TS_MS, MIN_TS_MS};

/// The reference counter's dimensions, in template order; also the decoder's first fields.
const DIMENSIONS: [&str; 3] = ["app_id", "device_id", "ip"];

/// Decoders covering every time source, built once: the Kafka timestamp (no time field) and a
/// `ts` field in each [`TimeFormat`]. Small limits so `too_large` is reachable.
fn decoders() -> &'static [(Decoder, Option<i64>)] {
    static DECODERS: OnceLock<Vec<(Decoder, Option<i64>)>> = OnceLock::new();
    DECODERS.get_or_init(|| {
        let mut fields: Vec<(String, FieldRole)> = DIMENSIONS
            .iter()
            .map(|d| (d.to_string(), FieldRole::Dimension))
            .collect();
        fields.push(("bytes".to_string(), FieldRole::Value));
        let config = |time_field: Option<&str>, time_format| DecodeConfig {
            time_field: time_field.map(String::from),
            time_format,
            max_message_bytes: 4096,
            max_value_bytes: 64,
            dead_letter_topic: None,
            ..DecodeConfig::default()
        };
        let compiled = |c: &DecodeConfig| c.compile().expect("a valid [decode]");
        let mut out = Vec::new();
        for kafka_ts in [Some(1_722_531_600_123), None, Some(i64::MIN)] {
            out.push((
                Decoder::new(&compiled(&config(None, TimeFormat::EpochMs)), &fields),
                kafka_ts,
            ));
        }
        for format in [TimeFormat::EpochMs, TimeFormat::EpochS, TimeFormat::Rfc3339] {
            out.push((
                Decoder::new(&compiled(&config(Some("ts"), format)), &fields),
                Some(0),
            ));
        }
        // Fields inside objects and arrays (`[decode.fields]`).
        let mut nested = config(Some("ts"), TimeFormat::EpochMs);
        for (name, path) in [("app_id", "a.b"), ("ip", "a.c[1]"), ("ts", "/t/0")] {
            nested.fields.insert(name.to_string(), path.to_string());
        }
        out.push((Decoder::new(&compiled(&nested), &fields), Some(0)));
        out
    })
}

/// The reference key template with 1h windows in a zone with DST, built once.
fn reference_template() -> &'static (KeyTemplate, WindowSpec) {
    static TEMPLATE: OnceLock<(KeyTemplate, WindowSpec)> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let window = WindowSpec::new(Duration::from_secs(3600), chrono_tz::Europe::Berlin)
            .expect("1h divides a day");
        let dims: Vec<String> = DIMENSIONS.iter().map(|d| d.to_string()).collect();
        let template = KeyTemplate::parse(
            "flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}",
            &dims,
            &window,
        )
        .expect("reference template is valid");
        (template, window)
    })
}

/// `data` is a Kafka payload. Decodes it with every decoder; a decoded event must respect the
/// limits and have its dimensions rendered into a key like the pipeline does.
pub fn decode(data: &[u8]) {
    let (template, window) = reference_template();
    let mut key = Vec::new();
    let mut time = String::new();
    for (decoder, kafka_ts) in decoders() {
        let decoded = decoder.decode(Some(data), *kafka_ts);
        // The fast scan must give the full parser's answer, value for value or error for error.
        match (&decoded, decoder.decode_reference(Some(data), *kafka_ts)) {
            (Ok(fast), Ok(full)) => {
                assert_eq!(fast.dims, full.dims);
                assert_eq!(fast.nums, full.nums);
                assert_eq!(fast.ts_ms, full.ts_ms);
            }
            (Err(fast), Err(full)) => assert_eq!(*fast, full),
            (fast, full) => panic!("fast {:?} vs full {:?}", fast.is_ok(), full.is_ok()),
        }
        let Ok(event) = decoded else {
            continue;
        };
        // The dimensions, `bytes`, and `ts` when it is a field.
        assert!((DIMENSIONS.len() + 1..=DIMENSIONS.len() + 2).contains(&event.dims.len()));
        assert_eq!(event.nums.len(), event.dims.len());
        assert!((MIN_TS_MS..=MAX_TS_MS).contains(&event.ts_ms));
        let values: Vec<&str> = event.dims[..DIMENSIONS.len()]
            .iter()
            .map(|d| &**d)
            .collect();
        assert!(values.iter().all(|v| v.len() <= 64), "max_value_bytes");
        template.format_time(window.window_of(event.ts_ms).local_start, &mut time);
        template.render(&mut key, &values, &time);
        assert_no_hash_tag(&key);
        for value in values {
            check_escape(value);
        }
    }
    assert!(decoders()[0].0.decode(None, Some(0)).is_err());
}

/// `data` is lines of text:
///
/// 1. the key template;
/// 2. dimension names, comma-separated (empty: none);
/// 3. `<window seconds> <time zone>`, the zone an IANA name or an index into all zones
///    (an invalid window falls back to 1h, an invalid zone to UTC);
/// 4. an event time in epoch milliseconds (invalid: 0);
/// 5. and on: one dimension value per line (missing: empty).
///
/// A template that parses must render keys without hash tags, with its time placeholder
/// rendered at exactly its own width, in a window that contains the event time.
pub fn key_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let template = lines.next().unwrap_or_default();
    let dimensions: Vec<String> = match lines.next() {
        None | Some("") => Vec::new(),
        Some(list) => list.split(',').map(String::from).collect(),
    };
    let mut spec = lines.next().unwrap_or_default().split(' ');
    let size = spec
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(3600);
    let tz = match spec.next() {
        Some(name) => match name.parse::<usize>() {
            Ok(index) => chrono_tz::TZ_VARIANTS[index % chrono_tz::TZ_VARIANTS.len()],
            Err(_) => name.parse().unwrap_or(chrono_tz::UTC),
        },
        None => chrono_tz::UTC,
    };
    let window = WindowSpec::new(Duration::from_secs(size), tz)
        .or_else(|_| WindowSpec::new(Duration::from_secs(3600), tz))
        .expect("1h divides a day");
    let ts_ms = lines
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_default();
    let values: Vec<&str> = dimensions
        .iter()
        .map(|_| lines.next().unwrap_or_default())
        .collect();

    for value in &values {
        check_escape(value);
    }
    let Ok(parsed) = KeyTemplate::parse(template, &dimensions, &window) else {
        return;
    };
    assert_eq!(parsed.dimension_count(), dimensions.len());

    let w = window.window_of(ts_ms);
    let clamped = ts_ms.clamp(MIN_TS_MS, MAX_TS_MS);
    assert!(
        w.start_ms <= clamped && clamped < w.end_ms,
        "window {w:?} does not contain {clamped}"
    );
    let mut time = String::new();
    parsed.format_time(w.local_start, &mut time);
    let placeholder = time_placeholder(template, &dimensions);
    assert_eq!(
        time.len(),
        placeholder.len(),
        "{{{placeholder}}} rendered as {time:?}"
    );
    assert!(time.bytes().all(|b| b.is_ascii_digit()), "{time:?}");

    let mut key = Vec::new();
    parsed.render(&mut key, &values, &time);
    assert_no_hash_tag(&key);
}

/// The placeholder of a valid template that is not a dimension: its time pattern.
fn time_placeholder<'t>(template: &'t str, dimensions: &[String]) -> &'t str {
    template
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .find(|name| !dimensions.iter().any(|d| d == name))
        .expect("a valid template has a time placeholder")
}

/// `data` is the text of a TOML config file. Loads it like `tally run --config FILE`; a config
/// that loads must print (`tally check`) as TOML that loads again to the same config.
pub fn config(data: &[u8]) {
    let file = TempFile::new();
    std::fs::write(&file.0, data).expect("write temp config");
    let Ok(config) = Config::load(Some(&file.0), &serde_json::json!({})) else {
        return;
    };
    let printed = config.to_toml();
    std::fs::write(&file.0, &printed).expect("write temp config");
    let reloaded = Config::load(Some(&file.0), &serde_json::json!({}))
        .unwrap_or_else(|e| panic!("printed config does not load: {e}\n{printed}"));
    assert_eq!(reloaded.to_toml(), printed);
}

/// `data` is a `RateLimitQuotaUsageReports` message as an Envoy sends it on the quota stream.
/// Each bucket's usage is read as the session reads it (the id within the caps, sorted) and its
/// allowed requests bounded by a grant and a slack taken from the report itself: what counts is
/// never more than was reported nor more than the grant and the slack earned, and nothing is
/// lost between what counts and the excess.
pub fn rlqs_report(data: &[u8]) {
    let Ok(reports) = RateLimitQuotaUsageReports::decode(data) else {
        return;
    };
    let interval = Duration::from_secs(5);
    for raw in reports.bucket_quota_usages {
        let Ok(read) = usage::read(raw) else {
            continue;
        };
        assert!(!read.id.is_empty() && read.id.len() <= MAX_BUCKET_KEYS);
        assert!(read.id.windows(2).all(|w| w[0] <= w[1]), "sorted pairs");
        assert!(read
            .id
            .iter()
            .all(|(k, v)| k.len() <= MAX_BUCKET_BYTES && v.len() <= MAX_BUCKET_BYTES));
        assert_eq!(read.id.len(), read.bucket_id.bucket.len());
        // The grant and the slack from the report's other fields, so the fuzzer reaches every
        // edge (zero, equal, u64::MAX).
        let granted = read.denied;
        let slack = read.said.as_secs();
        let mut last = 0;
        for since in [
            Some(Duration::ZERO),
            Some(interval / 2),
            Some(interval),
            None,
        ] {
            let earned = usage::slack_earned(slack, since, interval);
            assert!(
                earned <= slack && earned >= last,
                "earned {earned} of {slack}"
            );
            last = earned;
            let usage::Counted { counted, excess } = usage::count(read.allowed, granted, earned);
            assert!(counted <= read.allowed);
            assert!(counted <= granted.saturating_add(earned));
            assert_eq!(counted.checked_add(excess), Some(read.allowed));
            if read.allowed <= granted.saturating_add(earned) {
                assert_eq!(excess, 0, "within the grant and slack, all counts");
            }
        }
    }
}

/// A per-process, per-thread file path, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new() -> Self {
        let name = format!(
            "tally-fuzz-config-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], "");
        Self(std::env::temp_dir().join(name))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Keys must not contain braces: in Redis Cluster they would form hash tags steered by users.
fn assert_no_hash_tag(key: &[u8]) {
    assert!(
        !key.iter().any(|&b| b == b'{' || b == b'}'),
        "key has a brace: {:?}",
        String::from_utf8_lossy(key)
    );
}

/// An escaped value contains no separator, brace or control byte, and decodes back exactly.
fn check_escape(value: &str) {
    let mut out = b"prefix:".to_vec();
    escape_into(&mut out, value);
    let escaped = &out[b"prefix:".len()..];
    assert!(
        !escaped
            .iter()
            .any(|&b| matches!(b, b':' | b'{' | b'}' | 0x7f) || b < 0x20),
        "unescaped byte in {escaped:?}"
    );
    assert_eq!(
        unescape(escaped),
        value.as_bytes(),
        "escape is not injective"
    );
}

/// Inverse of [`escape_into`]: `%XX` (uppercase hex) to the byte, everything else verbatim.
fn unescape(escaped: &[u8]) -> Vec<u8> {
    let hex = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'A'..=b'F' => b - b'A' + 10,
        _ => panic!("escape uses uppercase hex digits, got {b:#x}"),
    };
    let mut out = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        if escaped[i] == b'%' {
            assert!(i + 2 < escaped.len(), "truncated escape");
            out.push(hex(escaped[i + 1]) << 4 | hex(escaped[i + 2]));
            i += 3;
        } else {
            out.push(escaped[i]);
            i += 1;
        }
    }
    out
}
