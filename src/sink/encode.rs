//! Encoding a flush: its units planned into script calls (merged where they can be), one
//! pipeline per shard (one slot on a cluster), with what is needed to read the replies.

use super::{merge, script, Sink, UnitMeta};
use crate::aggregate::Unit;

impl Sink {
    /// Encode `units` as one pipeline per shard (one slot on a cluster), with what is needed to
    /// read the replies. Units of one (partition, shard) stay in order inside their pipeline.
    pub(super) fn prepare(&mut self, units: Vec<Unit>) -> Vec<(redis::Pipeline, Vec<UnitMeta>)> {
        let check_ttl = self
            .flushes
            .is_multiple_of(u64::from(self.flush.ttl_check_every));
        self.flushes += 1;
        let mut groups: Vec<(redis::Pipeline, Vec<UnitMeta>)> = Vec::new();
        let mut group_of_shard: std::collections::HashMap<u32, usize> =
            std::collections::HashMap::new();
        for call in merge::plan(units, self.flush.max_keys_per_merged_call) {
            let shard = call.shard();
            let g = *group_of_shard.entry(shard).or_insert_with(|| {
                groups.push((redis::pipe(), Vec::new()));
                groups.len() - 1
            });
            let (cmd, meta) = match call {
                merge::Call::Unit(unit) => {
                    let keys = self.scope.keys(unit.partition, unit.shard);
                    let cmd = if unit.other.is_empty() {
                        script::apply_cmd(self.apply.sha(), &keys, &unit, check_ttl)
                    } else {
                        script::apply_kinds_cmd(self.apply_kinds.sha(), &keys, &unit, check_ttl)
                    };
                    let meta = UnitMeta {
                        partitions: smallvec::smallvec![unit.partition],
                        merged: false,
                        shard,
                        keys: (unit.keys.len() + unit.other.len()) as u64,
                    };
                    (cmd, meta)
                }
                merge::Call::Merged(m) => {
                    let fences: Vec<String> = m
                        .ranges
                        .iter()
                        .map(|r| self.scope.key(r.partition, shard))
                        .collect();
                    let cmd = script::apply_merged_cmd(
                        self.apply_merged.sha(),
                        &self.scope.marker(shard),
                        &fences,
                        &m,
                        check_ttl,
                    );
                    let meta = UnitMeta {
                        partitions: m.ranges.iter().map(|r| r.partition).collect(),
                        merged: true,
                        shard,
                        keys: m.keys.len() as u64,
                    };
                    (cmd, meta)
                }
            };
            groups[g].0.add_command(cmd);
            groups[g].1.push(meta);
        }
        groups
    }
}
