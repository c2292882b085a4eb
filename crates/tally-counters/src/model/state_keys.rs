//! The names of tally's own keys in Redis: per (partition, shard) the applied offset (*fence*),
//! per shard the *state marker*. Tagged like the shard's counter keys, so a flush unit, its fence
//! and its marker share one cluster slot.

use super::layout::Layout;

/// Where the applied offsets of one consumer live: prefix, group and topic.
#[derive(Debug, Clone)]
pub struct FenceScope {
    /// `redis.state_prefix`.
    pub prefix: String,
    /// Consumer group id.
    pub group: String,
    /// Topic name.
    pub topic: String,
    /// Key layout: shards per partition and their hash tags.
    pub layout: Layout,
}

impl FenceScope {
    /// The scope of a consumer `group` reading `topic`, on the configured deployment.
    pub fn new(redis: &crate::config::RedisConfig, group: &str, topic: &str) -> FenceScope {
        FenceScope {
            prefix: redis.state_prefix.clone(),
            group: group.to_string(),
            topic: topic.to_string(),
            layout: Layout::for_config(redis),
        }
    }

    /// The applied-offset key of (partition, shard), tagged like the shard's counter keys.
    pub fn key(&self, partition: i32, shard: u32) -> String {
        fence_key(
            &self.prefix,
            &self.group,
            &self.topic,
            partition,
            shard,
            self.layout.tag(shard),
        )
    }

    /// The state marker of `shard` (same slot as its fences).
    pub fn marker(&self, shard: u32) -> String {
        marker_key(
            &self.prefix,
            &self.group,
            &self.topic,
            shard,
            self.layout.tag(shard),
        )
    }

    /// The window publisher's progress for `counter`: the window end (Unix ms) up to which its
    /// closed windows have been published and acknowledged by Kafka.
    pub fn publish_progress(&self, counter: &str) -> String {
        let suffix = format!(":{}", escaped(counter));
        state_key(
            &self.prefix,
            "published:",
            &self.group,
            &self.topic,
            &suffix,
            None,
        )
    }

    /// What was published for `counter`'s window starting at `start_ms` (a hash: record key →
    /// value), to find the keys a late event changed (corrections).
    pub fn published_values(&self, counter: &str, start_ms: i64) -> String {
        let suffix = format!(":{}:{start_ms}", escaped(counter));
        state_key(
            &self.prefix,
            "values:",
            &self.group,
            &self.topic,
            &suffix,
            None,
        )
    }

    /// Fence and marker of (partition, shard).
    pub fn keys(&self, partition: i32, shard: u32) -> StateKeys {
        StateKeys {
            fence: self.key(partition, shard),
            marker: self.marker(shard),
        }
    }
}

/// The names of tally's own keys for one (partition, shard).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateKeys {
    /// The applied offset of the (partition, shard).
    pub fence: String,
    /// The shard's state marker.
    pub marker: String,
}

/// Where the applied offset of (partition, shard) lives (`tag`: the shard's cluster hash tag).
/// Group and topic are escaped like dimension values so that no two (group, topic, partition,
/// shard) share a key.
pub fn fence_key(
    prefix: &str,
    group: &str,
    topic: &str,
    partition: i32,
    shard: u32,
    tag: Option<&str>,
) -> String {
    state_key(
        prefix,
        "applied:",
        group,
        topic,
        &format!(":{partition}:{shard}"),
        tag,
    )
}

/// The state marker of a shard: `<prefix>state:<group>:<topic>:<shard>` (plus the shard's tag).
pub fn marker_key(prefix: &str, group: &str, topic: &str, shard: u32, tag: Option<&str>) -> String {
    state_key(prefix, "state:", group, topic, &format!(":{shard}"), tag)
}

fn escaped(text: &str) -> String {
    let mut buf = Vec::new();
    crate::key::escape_into(&mut buf, text);
    String::from_utf8(buf).expect("escaped text stays UTF-8")
}

fn state_key(
    prefix: &str,
    kind: &str,
    group: &str,
    topic: &str,
    suffix: &str,
    tag: Option<&str>,
) -> String {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(kind.as_bytes());
    crate::key::escape_into(&mut buf, group);
    buf.push(b':');
    crate::key::escape_into(&mut buf, topic);
    buf.extend_from_slice(suffix.as_bytes());
    if let Some(tag) = tag {
        // Same slot as the shard's counter keys, so one script can update both.
        buf.extend_from_slice(format!(":{{{tag}}}").as_bytes());
    }
    String::from_utf8(buf).expect("escaped text stays UTF-8")
}
