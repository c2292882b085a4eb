//! Reading a dead-letter topic back: each message's payload and tally's headers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::Harness;

/// One dead letter.
#[derive(Debug)]
pub struct DeadLetter {
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

impl DeadLetter {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// The first `n` messages of partition 0 of `topic` (fewer if `wait` passes first).
pub fn read(h: &Harness, topic: &str, n: usize, wait: Duration) -> Vec<DeadLetter> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", h.mock.bootstrap_servers())
        .set("group.id", "dlq-reader")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + wait;
    while got.len() < n && Instant::now() < deadline {
        if let Some(Ok(msg)) = c.poll(Duration::from_millis(100)) {
            let headers = msg
                .headers()
                .map(|hs| {
                    hs.iter()
                        .filter_map(|h| {
                            let v = String::from_utf8_lossy(h.value?).into_owned();
                            Some((h.key.to_string(), v))
                        })
                        .collect()
                })
                .unwrap_or_default();
            got.push(DeadLetter {
                payload: msg.payload().unwrap_or_default().to_vec(),
                headers,
            });
        }
    }
    got
}
