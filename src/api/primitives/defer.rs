//! Deferred hits: when Redis cannot be reached, a hit whose caller asked for it is written as an
//! event to the topic the stream path consumes (with several topics, the first of
//! `kafka.topics`, encoded for its decoding; a counter that does not read it cannot defer). Only when the error proves that Redis did not run
//! the hit ([`RequestError::did_not_run`]): after a response timeout it may have, and deferring it
//! would count it twice (the caller gets "outcome unknown" and retries with its idempotency key).
//! The event is acknowledged by every in-sync replica (idempotent producer) and counted exactly
//! once by the stream path when Redis is back.
//!
//! The event carries the counter's dimensions, its value (`value_field`) and its time
//! (`decode.time_field`, or the message timestamp), all from the hit itself. The caller's
//! `event` map may add only fields that no counter on the topic reads (a trace id, say): a field
//! a counter reads is refused (400), or a caller could write other counters' dimensions, members
//! and sums through a hit on one counter. It is decoded with the stream path's own decoder before
//! it is sent: an event the stream path would skip (another counter on the topic reads a field
//! this counter has not) is refused instead of sent. An event that decodes counts in every
//! counter of the topic whose fields it has and whose filter takes it, exactly as a produced
//! event would. Guarantee: a 202 means the event is in Kafka and will be counted once;
//! a caller that retries a deferred hit sends a second event (idempotency keys are for hits
//! that reach Redis).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde::Serialize;
use tally_counters::request::{HitReply, RequestError};

use crate::config::{CompiledDecode, FieldSource, Model, Segment, TimeFormat};
use crate::stream::decode::Decoder;

/// Where deferred hits go.
pub struct Deferral {
    /// Made on the first deferred hit (Redis outages are rare; an idle producer would keep
    /// connections to the brokers).
    producer: std::sync::OnceLock<Result<FutureProducer, KafkaError>>,
    settings: ClientConfig,
    topic: String,
    decoder: Decoder,
    /// Where each field goes in the event (`[decode.fields]`), and the time's field and format.
    decode: Arc<CompiledDecode>,
    /// The topic's counters by name, in the decoder's order (for its skip masks).
    counters: Vec<String>,
}

/// Why a deferred event cannot hold a field where the stream path reads it.
#[derive(Debug, thiserror::Error)]
enum Unplaceable {
    /// The field is read from the record's metadata (its key, a header).
    #[error("{field}; a deferred hit writes only the payload")]
    NotPayload { field: String },
    /// The field's path has an array index.
    #[error("{field}, an array index a deferred hit cannot set")]
    Index { field: String },
    /// The field's path goes through a field that is not an object.
    #[error("{field}, inside a field that is not an object")]
    NotObject { field: String },
}

/// Stores `value` where the stream path reads it: at its path in the payload (objects made on
/// the way).
fn put_at(
    event: &mut serde_json::Map<String, serde_json::Value>,
    source: &FieldSource,
    value: serde_json::Value,
) -> Result<(), Unplaceable> {
    let FieldSource::Payload(path) = source else {
        return Err(Unplaceable::NotPayload {
            field: source.to_string(),
        });
    };
    let key = |s: &Segment| match s {
        Segment::Key(k) | Segment::KeyOrIndex(k, _) => Ok(k.to_string()),
        Segment::Index(_) => Err(Unplaceable::Index {
            field: source.to_string(),
        }),
    };
    let (last, inner) = path.split_last().expect("a payload path has a segment");
    let mut at = event;
    for s in inner {
        let slot = at
            .entry(key(s)?)
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        at = slot.as_object_mut().ok_or_else(|| Unplaceable::NotObject {
            field: source.to_string(),
        })?;
    }
    at.insert(key(last)?, value);
    Ok(())
}

/// What became of a hit.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum HitOutcome {
    /// Counted in Redis.
    Counted(HitReply),
    /// Redis was unreachable: the hit is an event in Kafka, counted when Redis is back.
    Deferred {
        /// Always true.
        deferred: bool,
        /// Partition of the event.
        partition: i32,
        /// Offset of the event.
        offset: i64,
    },
}

impl Deferral {
    /// A producer to the stream's first topic (`kafka.topic`, or the first of `kafka.topics`)
    /// with the configured brokers and security properties; None if that entry is a pattern.
    pub fn new(model: &Model) -> Option<Deferral> {
        let topic = model.defer_topic()?;
        let config = &model.config;
        let mut c = ClientConfig::new();
        for (k, v) in &config.kafka.properties {
            // Consumer settings mean nothing to a producer.
            if !k.starts_with("session.")
                && !k.starts_with("heartbeat.")
                && !k.starts_with("fetch.")
            {
                c.set(k, v);
            }
        }
        c.set("bootstrap.servers", &config.kafka.brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "10000");
        Some(Deferral {
            producer: std::sync::OnceLock::new(),
            settings: c,
            // With several topics, deferred hits go to the first: its decoding writes them.
            topic: topic.name.clone(),
            decoder: Decoder::for_topic(model, topic),
            decode: topic.decode.clone(),
            counters: model.counters.iter().map(|c| c.name.clone()).collect(),
        })
    }

    fn producer(&self) -> Result<&FutureProducer, RequestError> {
        self.producer
            .get_or_init(|| self.settings.create())
            .as_ref()
            .map_err(|e| RequestError::Invalid(format!("cannot defer: kafka producer: {e}")))
    }

    fn event(
        &self,
        spec: &crate::model::CounterSpec,
        values: &BTreeMap<String, String>,
        extra: &serde_json::Map<String, serde_json::Value>,
        delta: i64,
        at_ms: i64,
    ) -> Result<Vec<u8>, RequestError> {
        // Only fields no counter reads may come from the caller's map.
        if let Some(field) = extra.keys().find(|k| self.decoder.reads_top_level(k)) {
            return Err(RequestError::Invalid(format!(
                "cannot defer: `event` field `{field}` is read by the topic's counters; a deferred hit sets only counter `{}`'s fields, from `dimensions`, the value and `at`",
                spec.name
            )));
        }
        let mut event = extra.clone();
        let mut put = |name: &str, value: serde_json::Value| {
            put_at(&mut event, &self.decode.source(name), value).map_err(|e| {
                RequestError::Invalid(format!(
                    "cannot defer: counter `{}` reads `{name}` from {e}",
                    spec.name
                ))
            })
        };
        for (k, v) in values {
            put(k, serde_json::Value::String(v.clone()))?;
        }
        match &spec.value_field {
            Some(f) => put(f, delta.into())?,
            None if delta != 1 => {
                return Err(RequestError::Invalid(
                    "a deferred hit of a count counter adds 1 (one event)".into(),
                ))
            }
            None => {}
        }
        if let Some(f) = &self.decode.config.time_field {
            let t = match self.decode.config.time_format {
                TimeFormat::EpochMs => at_ms.into(),
                TimeFormat::EpochS => serde_json::json!(at_ms as f64 / 1000.0),
                TimeFormat::Rfc3339 => chrono::DateTime::from_timestamp_millis(at_ms)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
                    .into(),
            };
            put(f, t)?;
        }
        let payload =
            serde_json::to_vec(&event).map_err(|e| RequestError::Invalid(e.to_string()))?;
        let skips = self
            .decoder
            .decode(Some(&payload), Some(at_ms))
            .map(|decoded| decoded.skips.all())
            .map_err(|e| {
                RequestError::Invalid(format!(
                    "cannot defer: the stream path would skip this event ({}): another counter on the topic reads a field counter `{}` does not have",
                    e.reason(),
                    spec.name
                ))
            })?;
        // The counter's own filter (or a derived field it needs) must take the event, or the
        // 202 would promise a count the stream path never makes.
        let index = self.counters.iter().position(|n| *n == spec.name);
        if index.is_some_and(|i| !self.decoder.reads(i)) {
            return Err(RequestError::Invalid(format!(
                "cannot defer: counter `{}` does not read topic `{}`, where deferred hits go (the first of kafka.topics)",
                spec.name, self.topic
            )));
        }
        let skipped = index.is_some_and(|i| skips.checked_shr(i as u32).unwrap_or(0) & 1 == 1);
        if skipped {
            return Err(RequestError::Invalid(format!(
                "cannot defer: counter `{}` would skip this event (its filter, or a derived field it needs, reads fields a deferred hit does not set)",
                spec.name
            )));
        }
        Ok(payload)
    }
}

impl Deferral {
    /// Write the hit (`delta` on counter `spec` at `at`) to the topic as an event; its
    /// partition and offset once Kafka acknowledged it. `None`: Kafka did not take it (logged).
    pub(super) async fn write(
        &self,
        spec: &crate::model::CounterSpec,
        values: &BTreeMap<String, String>,
        extra: &serde_json::Map<String, serde_json::Value>,
        delta: i64,
        at: i64,
    ) -> Result<Option<(i32, i64)>, RequestError> {
        let payload = self.event(spec, values, extra, delta, at)?;
        let record = FutureRecord::<(), [u8]>::to(&self.topic)
            .payload(&payload)
            .timestamp(at);
        match self.producer()?.send(record, Duration::from_secs(10)).await {
            Ok(delivery) => Ok(Some((delivery.partition, delivery.offset))),
            Err((e, _)) => {
                tracing::warn!(error = %e, "deferred hit could not be written to kafka");
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Model};

    /// `flow` (per app and device), `daily` (per app, summing `bytes`) and `traffic` (per app
    /// and device, summing `bytes`) on one topic.
    fn model() -> std::sync::Arc<Model> {
        model_with("")
    }

    /// The model above, with `[decode.fields]` lines.
    fn model_with(fields: &str) -> std::sync::Arc<Model> {
        let config: Config = toml::from_str(
            &r#"
[kafka]
brokers = "127.0.0.1:9"
topic = "t"
group_id = "g"
[decode]
time_field = "ts"
[decode.fields]
{fields}
[[counters]]
name = "flow"
dimensions = ["app_id", "device_id"]
key = "f:{app_id}:{device_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"
[[counters]]
name = "daily"
dimensions = ["app_id"]
value_field = "bytes"
key = "d:{app_id}:{yyyyMMdd}"
window = "1d"
retention = "2d"
[[counters]]
name = "traffic"
dimensions = ["app_id", "device_id"]
value_field = "bytes"
key = "t:{app_id}:{device_id}:{yyyyMMddHH}"
window = "1h"
retention = "1d"
"#
            .replace("{fields}", fields),
        )
        .unwrap();
        Model::compile(config).unwrap()
    }

    fn event(
        name: &str,
        values: &[(&str, &str)],
        extra: serde_json::Value,
        delta: i64,
    ) -> Result<serde_json::Value, RequestError> {
        event_of(&model(), name, values, extra, delta)
    }

    fn event_of(
        model: &Model,
        name: &str,
        values: &[(&str, &str)],
        extra: serde_json::Value,
        delta: i64,
    ) -> Result<serde_json::Value, RequestError> {
        let deferral = Deferral::new(model).unwrap();
        let spec = model.counters.iter().find(|c| c.name == name).unwrap();
        let values = values
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let extra = extra.as_object().unwrap().clone();
        let at = chrono::Utc::now().timestamp_millis();
        deferral
            .event(spec, &values, &extra, delta, at)
            .map(|p| serde_json::from_slice(&p).unwrap())
    }

    #[test]
    fn a_deferred_hit_writes_only_its_counters_fields() {
        // Another counter's sum, a dimension, the time: all refused.
        for field in ["bytes", "app_id", "ts"] {
            let e = event(
                "flow",
                &[("app_id", "a"), ("device_id", "d")],
                serde_json::json!({field: 9_000_000_000_000_000_000u64}),
                1,
            );
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.to_string().contains(&format!("`{field}`"))),
                "{field}: {e:?}"
            );
        }
        // daily has no device_id, which flow reads: the stream path would skip it, refused.
        let e = event("daily", &[("app_id", "a")], serde_json::json!({}), 5);
        assert!(
            e.as_ref().is_err_and(|e| e.to_string().contains("missing")),
            "{e:?}"
        );
        // traffic has every field the topic reads; a field no counter reads travels along.
        let e = event(
            "traffic",
            &[("app_id", "a"), ("device_id", "d")],
            serde_json::json!({"trace": "t1"}),
            7,
        )
        .unwrap();
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["app_id", "bytes", "device_id", "trace", "ts"], "{e}");
        assert_eq!(e["bytes"], 7);
    }

    #[test]
    fn a_deferred_hit_writes_its_fields_where_the_stream_reads_them() {
        let model = model_with(
            r#"app_id = "client.app"
device_id = "/client/device"
bytes = "sizes.out"
ts = "meta.at""#,
        );
        let e = event_of(
            &model,
            "traffic",
            &[("app_id", "a"), ("device_id", "d")],
            serde_json::json!({"trace": "t1"}),
            7,
        )
        .unwrap();
        assert_eq!(
            e["client"],
            serde_json::json!({"app": "a", "device": "d"}),
            "{e}"
        );
        assert_eq!(e["sizes"]["out"], 7);
        assert!(e["meta"]["at"].is_i64(), "{e}");
        // `client` holds fields counters read: the caller's map may not set it.
        let e = event_of(
            &model,
            "traffic",
            &[("app_id", "a"), ("device_id", "d")],
            serde_json::json!({"client": {}}),
            7,
        );
        assert!(e.is_err_and(|e| e.to_string().contains("`client`")));
        // A field read from the record's key or an array cannot be written by a deferred hit.
        for source in ["$key", "$header.dev", "list[0]"] {
            let model = model_with(&format!("device_id = \"{source}\""));
            let e = event_of(
                &model,
                "traffic",
                &[("app_id", "a"), ("device_id", "d")],
                serde_json::json!({}),
                7,
            );
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.to_string().contains("reads `device_id` from")),
                "{source}: {e:?}"
            );
        }
    }

    #[test]
    fn a_hit_its_own_filter_would_skip_is_refused() {
        let config: Config = toml::from_str(
            r#"
[kafka]
brokers = "127.0.0.1:9"
topic = "t"
group_id = "g"
[[counters]]
name = "errors"
dimensions = ["route"]
key = "e:{route}:{yyyyMMddHH}"
window = "1h"
filter = "status >= 500"
"#,
        )
        .unwrap();
        let model = Model::compile(config).unwrap();
        let e = event_of(
            &model,
            "errors",
            &[("route", "/a")],
            serde_json::json!({}),
            1,
        );
        assert!(e.is_err_and(|e| e.to_string().contains("would skip this event")));
    }
}
