//! Watermarks: how far event time has progressed on the topic.
//!
//! Each flush records, in its partition's state marker and in the same fenced script call as
//! the applied offset (`note_watermark` in `src/stream/sink/lua/prelude.lua`), the highest event time
//! applied (`wm:<partition>`, only ever raised) and Redis' time of the call (`seen:<partition>`).
//! [`read`] gathers them per partition with Kafka's end offsets; [`topic_watermark`] is the pure
//! rule that turns them into the topic-wide event time up to which every partition has shown
//! its events.

use super::PublishError;
use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use tally_counters::conn::Conn;

use crate::config::{Model, Topic};

/// A partition of one of the topics read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic's index in [`Model::topics`].
    pub topic: usize,
    /// The partition.
    pub partition: i32,
}

/// What is known of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    /// The offset Redis has applied the partition up to (the least over the shards), if any.
    pub applied: Option<i64>,
    /// The highest event time applied (the greatest over the shards), if any.
    pub max_event_ms: Option<i64>,
    /// Redis' time of the last applied range (the greatest over the shards), if any.
    pub seen_ms: Option<i64>,
    /// Kafka's first and next offsets of the partition.
    pub low: i64,
    pub high: i64,
}

impl Mark {
    /// Everything Kafka holds has been applied (an empty partition is caught up).
    pub fn caught_up(&self) -> bool {
        self.applied.unwrap_or(self.low) >= self.high
    }

    /// Idle: caught up, and nothing applied for `idle_timeout` (or ever). An idle partition does
    /// not hold the watermark back; one with a backlog always does, however long ago it was
    /// last seen (after a restart, every partition was last seen before it).
    pub fn idle(&self, now_ms: i64, idle_timeout: Duration) -> bool {
        let quiet = idle_timeout.as_millis() as i64;
        self.caught_up() && self.seen_ms.is_none_or(|s| now_ms - s >= quiet)
    }
}

/// The topic-wide watermark before lateness: the least highest-event-time over the partitions
/// that are not idle. None while a partition that is not idle has shown no event time yet (it
/// could still hold anything). With every partition idle, everything Kafka holds is applied:
/// the greatest event time seen.
pub fn topic_watermark<'m>(
    marks: impl IntoIterator<Item = &'m Mark> + Clone,
    now_ms: i64,
    idle_timeout: Duration,
) -> Option<i64> {
    let mut least: Option<i64> = None;
    let mut active = false;
    for mark in marks.clone() {
        if mark.idle(now_ms, idle_timeout) {
            continue;
        }
        active = true;
        let t = mark.max_event_ms?;
        least = Some(least.map_or(t, |l| l.min(t)));
    }
    if active {
        return least;
    }
    marks.into_iter().filter_map(|m| m.max_event_ms).max()
}

/// The watermark of counter `ci` (model order): [`topic_watermark`] over the partitions of the
/// topics it reads only, so a topic it does not count never holds its windows back.
pub fn counter_watermark(
    marks: &BTreeMap<TopicPartition, Mark>,
    topics: &[Topic],
    ci: usize,
    now_ms: i64,
    idle_timeout: Duration,
) -> Option<i64> {
    let reads = |tp: &TopicPartition| topics.get(tp.topic).is_some_and(|t| t.reads[ci]);
    let own = marks.iter().filter(|(tp, _)| reads(tp)).map(|(_, m)| m);
    topic_watermark(own, now_ms, idle_timeout)
}

/// Every partition's [`Mark`], of every topic read: Kafka's offsets from `consumer`, the rest
/// from each topic's state markers.
pub async fn read(
    model: &Model,
    conn: &mut Conn,
    consumer: &BaseConsumer,
) -> Result<BTreeMap<TopicPartition, Mark>, PublishError> {
    let mut all = BTreeMap::new();
    for (index, topic) in model.topics.iter().enumerate() {
        let marks = read_topic(model, topic, conn, consumer).await?;
        all.extend(marks.into_iter().map(|(partition, mark)| {
            let tp = TopicPartition {
                topic: index,
                partition,
            };
            (tp, mark)
        }));
    }
    Ok(all)
}

/// [`read`] of one topic.
async fn read_topic(
    model: &Model,
    topic: &Topic,
    conn: &mut Conn,
    consumer: &BaseConsumer,
) -> Result<BTreeMap<i32, Mark>, PublishError> {
    let name = topic.name.clone();
    let offsets = tokio::task::block_in_place(|| -> Result<Vec<(i32, i64, i64)>, PublishError> {
        let timeout = Duration::from_secs(10);
        let meta = consumer.fetch_metadata(Some(&name), timeout)?;
        let mut out = Vec::new();
        for t in meta.topics() {
            for p in t.partitions() {
                let (low, high) = consumer.fetch_watermarks(&name, p.id(), timeout)?;
                out.push((p.id(), low, high));
            }
        }
        Ok(out)
    })?;
    if offsets.is_empty() {
        return Err(PublishError::NoPartitions(name.to_string()));
    }
    let mut marks: BTreeMap<i32, Mark> = offsets
        .into_iter()
        .map(|(p, low, high)| {
            let mark = Mark {
                low,
                high,
                ..Mark::default()
            };
            (p, mark)
        })
        .collect();
    for shard in 0..model.layout.shards() {
        let marker = topic.scope.marker(shard);
        let kind: String = conn.query(redis::cmd("TYPE").arg(&marker)).await?;
        if kind != "hash" {
            // No state for this shard: no partition's applied offset is known everywhere.
            for mark in marks.values_mut() {
                mark.applied = None;
            }
            continue;
        }
        let fields: Vec<(String, String)> = conn.query(redis::cmd("HGETALL").arg(&marker)).await?;
        merge_marker(&mut marks, &fields, shard == 0);
    }
    Ok(marks)
}

/// Fold one shard's marker fields into `marks`: applied offsets by least (`first`: the first
/// shard read), event times and seen times by greatest.
fn merge_marker(marks: &mut BTreeMap<i32, Mark>, fields: &[(String, String)], first: bool) {
    let mut applied: BTreeMap<i32, i64> = BTreeMap::new();
    for (field, value) in fields {
        let Ok(v) = value.parse::<i64>() else {
            continue;
        };
        let (what, partition) = match field.split_once(':') {
            Some((what, p)) => (what, p),
            None => ("applied", field.as_str()),
        };
        let Ok(p) = partition.parse::<i32>() else {
            continue;
        };
        let Some(mark) = marks.get_mut(&p) else {
            continue;
        };
        match what {
            "applied" => {
                applied.insert(p, v);
            }
            "wm" => mark.max_event_ms = mark.max_event_ms.max(Some(v)),
            "seen" => mark.seen_ms = mark.seen_ms.max(Some(v)),
            _ => {}
        }
    }
    for (p, mark) in marks.iter_mut() {
        let here = applied.get(p).copied();
        mark.applied = match (first, mark.applied, here) {
            (true, _, h) => h,
            (false, Some(a), Some(h)) => Some(a.min(h)),
            (false, _, _) => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_waits_only_for_the_topics_it_reads() {
        let topic = |name: &str, reads: Vec<bool>| Topic {
            name: name.into(),
            decode: Default::default(),
            scope: tally_counters::model::state_keys::FenceScope::new(
                &Default::default(),
                "g",
                name,
            ),
            reads,
        };
        // Counter 0 reads both topics, counter 1 only the first.
        let topics = [topic("a", vec![true, true]), topic("b", vec![true, false])];
        let tp = |topic, partition| TopicPartition { topic, partition };
        let marks = BTreeMap::from([
            (tp(0, 0), mark(10, 20, Some(9_000), Some(1_000))),
            // The second topic is behind, with a backlog: it holds back whoever reads it.
            (tp(1, 0), mark(3, 20, Some(2_000), Some(1_000))),
        ]);
        let wm = |ci| counter_watermark(&marks, &topics, ci, 2_000, IDLE);
        assert_eq!(wm(0), Some(2_000));
        assert_eq!(
            wm(1),
            Some(9_000),
            "b does not hold back a counter not reading it"
        );
    }

    fn mark(applied: i64, high: i64, max_event_ms: Option<i64>, seen_ms: Option<i64>) -> Mark {
        Mark {
            applied: Some(applied),
            max_event_ms,
            seen_ms,
            low: 0,
            high,
        }
    }

    const IDLE: Duration = Duration::from_secs(60);

    #[test]
    fn the_least_partition_holds_the_watermark() {
        let marks = BTreeMap::from([
            (0, mark(10, 10, Some(5_000), Some(1_000))),
            (1, mark(10, 12, Some(3_000), Some(1_000))),
        ]);
        assert_eq!(topic_watermark(marks.values(), 2_000, IDLE), Some(3_000));
    }

    #[test]
    fn a_quiet_caught_up_partition_is_idle_and_excluded() {
        let marks = BTreeMap::from([
            (0, mark(10, 10, Some(5_000), Some(100_000))),
            (1, mark(4, 4, Some(1_000), Some(1_000))),
            (2, Mark::default()),
        ]);
        assert_eq!(topic_watermark(marks.values(), 100_000, IDLE), Some(5_000));
        assert!(marks[&2].idle(100_000, IDLE), "empty and never seen");
        // Still within idle_timeout: it holds the watermark back.
        assert_eq!(topic_watermark(marks.values(), 30_000, IDLE), Some(1_000));
    }

    #[test]
    fn a_partition_with_a_backlog_is_never_idle() {
        let marks = BTreeMap::from([
            (0, mark(10, 10, Some(5_000), Some(100_000))),
            (1, mark(4, 9, Some(1_000), Some(1_000))),
        ]);
        assert_eq!(
            topic_watermark(marks.values(), 1_000_000, IDLE),
            Some(1_000)
        );
        let unknown = BTreeMap::from([
            (0, mark(10, 10, Some(5_000), Some(100_000))),
            (
                1,
                Mark {
                    high: 3,
                    ..Mark::default()
                },
            ),
        ]);
        assert_eq!(topic_watermark(unknown.values(), 100_000, IDLE), None);
    }

    #[test]
    fn with_every_partition_idle_everything_is_in() {
        let marks = BTreeMap::from([
            (0, mark(10, 10, Some(5_000), Some(1_000))),
            (1, mark(4, 4, Some(7_000), Some(1_000))),
        ]);
        assert_eq!(
            topic_watermark(marks.values(), 1_000_000, IDLE),
            Some(7_000)
        );
    }

    #[test]
    fn markers_fold_over_shards() {
        let mut marks = BTreeMap::from([(0, Mark::default()), (1, Mark::default())]);
        let f = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let s0 = f(&[
            ("0", "7"),
            ("wm:0", "100"),
            ("seen:0", "5"),
            ("created_ms", "1"),
        ]);
        let s1 = f(&[("0", "9"), ("wm:0", "90"), ("seen:0", "6"), ("1", "3")]);
        merge_marker(&mut marks, &s0, true);
        merge_marker(&mut marks, &s1, false);
        assert_eq!(marks[&0].applied, Some(7));
        assert_eq!(marks[&0].max_event_ms, Some(100));
        assert_eq!(marks[&0].seen_ms, Some(6));
        assert_eq!(marks[&1].applied, None, "shard 0 has no offset for it");
    }
}
