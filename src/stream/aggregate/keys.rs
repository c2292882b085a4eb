//! Compact key storage: a unit's keys in one contiguous byte buffer plus one fixed-size entry per
//! key, instead of one heap allocation per key.
//!
//! With a million keys pending, one `Box<[u8]>` per key cost about 97 bytes per key (a 32-byte
//! map entry, then a ~45-byte key rounded up to a 64-byte malloc chunk). Here a key costs its
//! bytes plus a 24-byte entry, and adding a new key allocates nothing once the buffers have grown
//! (sealing sizes the next unit's buffers like the last one). The open unit finds keys through a
//! hash index of entry numbers ([`KeyTable`]); a sealed unit keeps only the buffers ([`Keys`]).

use std::fmt;

use ahash::RandomState;
use hashbrown::HashTable;

use super::Delta;

/// Key bytes a unit may hold before it is cut (like reaching `max_keys_per_call`), so that
/// offsets fit in the entries' `u32`.
pub(crate) const MAX_KEY_BYTES: usize = 1 << 30;

/// One key: where its bytes are in `Keys::bytes`, and its delta.
#[derive(Clone, Copy)]
struct KeyEntry {
    start: u32,
    len: u32,
    delta: Delta,
}

/// Keys and their deltas, in insertion order.
#[derive(Default, Clone)]
pub struct Keys {
    bytes: Vec<u8>,
    entries: Vec<KeyEntry>,
}

impl Keys {
    /// Empty, with room for `keys` keys of `bytes` bytes in all.
    pub fn with_capacity(keys: usize, bytes: usize) -> Keys {
        Keys {
            bytes: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(keys),
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of all keys together.
    pub fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    /// Append `key` with `delta` (the caller makes sure keys are distinct where it matters).
    pub fn push(&mut self, key: &[u8], delta: Delta) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.entries.push(KeyEntry {
            start: u32::try_from(start).expect("a unit is cut before MAX_KEY_BYTES"),
            len: u32::try_from(key.len()).expect("a key is shorter than 4 GiB"),
            delta,
        });
    }

    /// Keys and deltas, in insertion order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &Delta)> + Clone + '_ {
        self.entries.iter().map(|e| (self.text(e), &e.delta))
    }

    /// The deltas, in insertion order.
    pub fn deltas(&self) -> impl ExactSizeIterator<Item = &Delta> + '_ {
        self.entries.iter().map(|e| &e.delta)
    }

    fn key(&self, i: u32) -> &[u8] {
        self.text(&self.entries[i as usize])
    }

    fn text(&self, e: &KeyEntry) -> &[u8] {
        &self.bytes[e.start as usize..(e.start + e.len) as usize]
    }
}

impl<'a> IntoIterator for &'a Keys {
    type Item = (&'a [u8], &'a Delta);
    type IntoIter = Box<dyn ExactSizeIterator<Item = (&'a [u8], &'a Delta)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<K: AsRef<[u8]>> FromIterator<(K, Delta)> for Keys {
    fn from_iter<I: IntoIterator<Item = (K, Delta)>>(iter: I) -> Keys {
        let mut keys = Keys::default();
        for (k, d) in iter {
            keys.push(k.as_ref(), d);
        }
        keys
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(k, d)| (String::from_utf8_lossy(k), d)))
            .finish()
    }
}

/// [`Keys`] with a hash index, to find a key while deltas are added up.
pub(crate) struct KeyTable {
    keys: Keys,
    /// Entry numbers in `keys`, hashed by their key's bytes.
    index: HashTable<u32>,
    hasher: RandomState,
}

impl KeyTable {
    pub(crate) fn new(hasher: &RandomState) -> KeyTable {
        KeyTable {
            keys: Keys::default(),
            index: HashTable::new(),
            hasher: hasher.clone(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn bytes_len(&self) -> usize {
        self.keys.bytes_len()
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Delta> {
        let hash = self.hasher.hash_one(key);
        let keys = &self.keys;
        let i = *self.index.find(hash, |&i| keys.key(i) == key)?;
        Some(&keys.entries[i as usize].delta)
    }

    pub(crate) fn get_mut(&mut self, key: &[u8]) -> Option<&mut Delta> {
        let hash = self.hasher.hash_one(key);
        let keys = &self.keys;
        let i = *self.index.find(hash, |&i| keys.key(i) == key)?;
        Some(&mut self.keys.entries[i as usize].delta)
    }

    /// The delta of `key`, added with `new()` when the table does not hold it yet (then
    /// `true`). One hash of the key and one probe either way: the hot path's lookup.
    #[inline]
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &[u8],
        new: impl FnOnce() -> Delta,
    ) -> (&mut Delta, bool) {
        let hash = self.hasher.hash_one(key);
        let (keys, hasher) = (&self.keys, &self.hasher);
        let entry = self.index.entry(
            hash,
            |&i| keys.key(i) == key,
            |&j| hasher.hash_one(keys.key(j)),
        );
        let (i, created) = match entry {
            hashbrown::hash_table::Entry::Occupied(e) => (*e.get(), false),
            hashbrown::hash_table::Entry::Vacant(e) => {
                let i = self.keys.len() as u32;
                e.insert(i);
                self.keys.push(key, new());
                (i, true)
            }
        };
        (&mut self.keys.entries[i as usize].delta, created)
    }

    /// Add `key`, which must not be in the table yet.
    pub(crate) fn insert_new(&mut self, key: &[u8], delta: Delta) {
        debug_assert!(self.get(key).is_none());
        let i = self.keys.len() as u32;
        self.keys.push(key, delta);
        let hash = self.hasher.hash_one(key);
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index
            .insert_unique(hash, i, |&j| hasher.hash_one(keys.key(j)));
    }

    /// The keys, without the index.
    pub(crate) fn into_keys(self) -> Keys {
        self.keys
    }

    /// Take the keys out, leaving the table empty with room for as many as it held.
    pub(crate) fn take(&mut self) -> Keys {
        let room = Keys::with_capacity(self.keys.len(), self.keys.bytes_len());
        self.index.clear();
        std::mem::replace(&mut self.keys, room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(delta: i64) -> Delta {
        Delta {
            delta,
            expire_at_ms: 0,
        }
    }

    #[test]
    fn a_table_finds_adds_and_hands_over_its_keys_in_order() {
        let mut t = KeyTable::new(&RandomState::new());
        for (i, k) in ["a", "bb", "ccc", "dddd"].iter().enumerate() {
            t.insert_new(k.as_bytes(), d(i as i64));
        }
        t.get_mut(b"bb").unwrap().delta += 10;
        assert_eq!(t.get(b"zz"), None);
        assert_eq!(t.get(b"dddd"), Some(&d(3)));
        assert_eq!(t.get(b"bb"), Some(&d(11)));
        let keys = t.take();
        let got: Vec<(&[u8], i64)> = keys.iter().map(|(k, d)| (k, d.delta)).collect();
        let want: Vec<(&[u8], i64)> = vec![(b"a", 0), (b"bb", 11), (b"ccc", 2), (b"dddd", 3)];
        assert_eq!(got, want);
        assert_eq!(t.len(), 0);
        assert_eq!(t.get(b"bb"), None);
    }
}
