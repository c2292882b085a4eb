//! Deferred hits: when Redis cannot be reached, a hit whose caller asked for it is written as an
//! event to the topic the stream path consumes. Only when the error proves that Redis did not run
//! the hit ([`RequestError::did_not_run`]): after a response timeout it may have, and deferring it
//! would count it twice (the caller gets "outcome unknown" and retries with its idempotency key).
//! The event is acknowledged by every in-sync replica (idempotent producer) and counted exactly
//! once by the stream path when Redis is back.
//!
//! The event carries the counter's dimensions, its value (`value_field`) and its time
//! (`decode.time_field`, or the message timestamp), plus any fields the caller adds for the
//! topic's other counters. It is decoded with the stream path's own decoder before it is sent:
//! an event the stream path would skip (a field another counter needs is missing) is refused
//! instead of sent. Guarantee: a 202 means the event is in Kafka and will be counted once;
//! a caller that retries a deferred hit sends a second event (idempotency keys are for hits
//! that reach Redis).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde::Serialize;
use tally_counters::request::{Hit, HitReply, RequestError};

use super::{Action, Requests};
use crate::config::{Model, TimeFormat};
use crate::decode::Decoder;

/// Where deferred hits go.
pub struct Deferral {
    /// Made on the first deferred hit (Redis outages are rare; an idle producer would keep
    /// connections to the brokers).
    producer: std::sync::OnceLock<Result<FutureProducer, String>>,
    settings: ClientConfig,
    topic: String,
    decoder: Decoder,
    time_field: Option<String>,
    time_format: TimeFormat,
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
    /// A producer to `kafka.topic` with the configured brokers and security properties.
    pub fn new(model: &Model) -> Deferral {
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
        Deferral {
            producer: std::sync::OnceLock::new(),
            settings: c,
            topic: config.kafka.topic.clone(),
            decoder: Decoder::for_counters(&config.decode, &model.counters),
            time_field: config.decode.time_field.clone(),
            time_format: config.decode.time_format,
        }
    }

    fn producer(&self) -> Result<&FutureProducer, RequestError> {
        self.producer
            .get_or_init(|| self.settings.create().map_err(|e| e.to_string()))
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
        let mut event = extra.clone();
        for (k, v) in values {
            event.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
        match &spec.value_field {
            Some(f) => {
                event.insert(f.clone(), delta.into());
            }
            None if delta != 1 => {
                return Err(RequestError::Invalid(
                    "a deferred hit of a count counter adds 1 (one event)".into(),
                ))
            }
            None => {}
        }
        if let Some(f) = &self.time_field {
            let t = match self.time_format {
                TimeFormat::EpochMs => at_ms.into(),
                TimeFormat::EpochS => serde_json::json!(at_ms as f64 / 1000.0),
                TimeFormat::Rfc3339 => chrono::DateTime::from_timestamp_millis(at_ms)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
                    .into(),
            };
            event.insert(f.clone(), t);
        }
        let payload =
            serde_json::to_vec(&event).map_err(|e| RequestError::Invalid(e.to_string()))?;
        self.decoder
            .decode(Some(&payload), Some(at_ms))
            .map_err(|e| {
                RequestError::Invalid(format!(
                    "cannot defer: the stream path would skip this event ({}); add the fields the topic's counters need in `event`",
                    e.reason()
                ))
            })?;
        Ok(payload)
    }
}

impl Requests {
    /// Hit counter `name`; when Redis is unreachable and deferral is set up, write the hit to
    /// the topic instead (see the module's guarantee).
    pub async fn hit_or_defer(
        &self,
        name: &str,
        values: &BTreeMap<String, String>,
        hit: &Hit,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<HitOutcome, RequestError> {
        let err = match self.hit(name, values, hit, Action::Apply).await {
            Ok(reply) => return Ok(HitOutcome::Counted(reply)),
            // Only when Redis surely did not run the hit: after a timeout it may have counted it.
            Err(e) if e.did_not_run() => e,
            Err(e) => return Err(e),
        };
        let Some(deferral) = &self.deferral else {
            return Err(err);
        };
        let spec = self.counters.spec(name)?;
        let at = hit
            .at_ms
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        let payload = deferral.event(spec, values, extra, hit.delta, at)?;
        let record = FutureRecord::<(), [u8]>::to(&deferral.topic)
            .payload(&payload)
            .timestamp(at);
        match deferral
            .producer()?
            .send(record, Duration::from_secs(10))
            .await
        {
            Ok(delivery) => {
                self.metrics.request.deferred.inc();
                Ok(HitOutcome::Deferred {
                    deferred: true,
                    partition: delivery.partition,
                    offset: delivery.offset,
                })
            }
            Err((e, _)) => {
                tracing::warn!(error = %e, "deferred hit could not be written to kafka");
                Err(err)
            }
        }
    }
}
