//! Where keys live: plain keys on a single server; hash-tagged keys on Redis Cluster.
//!
//! In cluster mode every key of a flush unit must live in one slot (a Lua script may only touch
//! keys of one slot), yet keys must spread evenly over the primaries. A counter key is assigned
//! a *shard* `s = fnv1a64(plain_key) mod cluster_shards` and gets the suffix `:{<tag_s>}`, where
//! `tag_s` is the smallest non-negative integer (in decimal) whose Redis hash slot lies in the
//! `s`-th of `cluster_shards` equal ranges of the 16384 slots. So shards map to evenly spaced
//! slots, and any contiguous slot assignment spreads them evenly over primaries. The applied
//! offset of (partition, shard) carries the same tag, so a unit and its offset share a slot.
//!
//! `tally key` prints the key of given dimension values, so nobody needs to compute this by hand.

/// Redis Cluster hash slot of `key` (CRC16/XMODEM of the first non-empty `{…}` tag, or the key).
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash tag of each of `shards` shards (see the module docs).
pub fn shard_tags(shards: u32) -> Vec<String> {
    let shards = shards.clamp(1, 16_384) as usize;
    let mut tags = vec![String::new(); shards];
    let mut missing = shards;
    let mut n: u64 = 0;
    while missing > 0 {
        let text = n.to_string();
        let slot = key_slot(text.as_bytes()) as usize;
        let shard = slot * shards / 16_384;
        if tags[shard].is_empty() {
            tags[shard] = text;
            missing -= 1;
        }
        n += 1;
    }
    tags
}

/// How keys are laid out for the configured deployment.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `Some(tag per shard)` in cluster mode.
    tags: Option<Vec<String>>,
}

impl Layout {
    /// The layout of the configured deployment.
    pub fn for_config(redis: &crate::config::RedisConfig) -> Layout {
        match redis.mode {
            crate::config::RedisMode::Standalone | crate::config::RedisMode::Sentinel => {
                Layout::standalone()
            }
            crate::config::RedisMode::Cluster => Layout::cluster(redis.cluster_shards),
        }
    }

    /// Plain keys, one shard.
    pub fn standalone() -> Layout {
        Layout { tags: None }
    }

    /// Hash-tagged keys over `shards` shards.
    pub fn cluster(shards: u32) -> Layout {
        Layout {
            tags: Some(shard_tags(shards)),
        }
    }

    /// Number of shards (1 standalone).
    pub fn shards(&self) -> u32 {
        self.tags.as_ref().map_or(1, |t| t.len() as u32)
    }

    /// The hash tag of `shard`, if keys are tagged.
    pub fn tag(&self, shard: u32) -> Option<&str> {
        self.tags.as_ref().map(|t| t[shard as usize].as_str())
    }

    /// Append the tag suffix `:{tag}` of `shard` to `key`, in cluster mode.
    pub fn append_tag(&self, key: &mut Vec<u8>, shard: u32) {
        if let Some(tag) = self.tag(shard) {
            key.extend_from_slice(b":{");
            key.extend_from_slice(tag.as_bytes());
            key.push(b'}');
        }
    }
}

/// The shard of a series: counter `name` and its dimension `values`, not the window, so every
/// window of one series lives in one slot (a range is one slot's reads; PFCOUNT over several
/// windows works on a cluster). FNV-1a over the name and each value, each followed by 0xFF
/// (never in UTF-8, so the framing is unambiguous).
pub fn series_shard(name: &str, values: &[&str], shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes.iter().chain([0xFFu8].iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(name.as_bytes());
    for v in values {
        eat(v.as_bytes());
    }
    (h % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn tags_are_evenly_spaced_and_distinct() {
        for shards in [1u32, 3, 64, 256, 1024] {
            let tags = shard_tags(shards);
            assert_eq!(tags.len(), shards as usize);
            for (s, tag) in tags.iter().enumerate() {
                let slot = key_slot(tag.as_bytes()) as usize;
                assert_eq!(slot * shards as usize / 16_384, s, "tag {tag} of shard {s}");
            }
        }
    }

    #[test]
    fn tagged_keys_keep_the_plain_key_readable() {
        let mut key = b"flow:count:a:b:c:2025080117".to_vec();
        Layout::cluster(64).append_tag(&mut key, 5);
        let text = String::from_utf8(key).unwrap();
        assert!(text.starts_with("flow:count:a:b:c:2025080117:{"), "{text}");
        let mut plain = b"k".to_vec();
        Layout::standalone().append_tag(&mut plain, 5);
        assert_eq!(plain, b"k");
    }
}
