//! The fields a decoder wants from a payload, as a tree of path segments: one walk of the
//! payload fills every field, however deep (the fast scan and the full parser share it).

use smallvec::SmallVec;

use crate::config::Segment;

/// The wanted keys (or indexes) of one object (or array).
#[derive(Debug, Default, Clone)]
pub(super) struct Node {
    entries: Vec<Entry>,
}

/// One wanted key: the fields it holds (`slots`), and the wanted values inside it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    segment: Segment,
    /// Decoder field indexes whose value this is (several names may read one path).
    pub(super) slots: SmallVec<[usize; 1]>,
    /// Fields further down, when the value is an object or array.
    pub(super) inner: Option<Node>,
}

impl Node {
    /// Adds the field `slot` read at `path` (not empty).
    pub(super) fn insert(&mut self, path: &[Segment], slot: usize) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let at = match self.entries.iter().position(|e| e.segment == *first) {
            Some(at) => at,
            None => {
                self.entries.push(Entry {
                    segment: first.clone(),
                    slots: SmallVec::new(),
                    inner: None,
                });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[at];
        match rest.is_empty() {
            true => entry.slots.push(slot),
            false => entry
                .inner
                .get_or_insert_with(Node::default)
                .insert(rest, slot),
        }
    }

    /// The entry an object key selects (the first that matches).
    #[inline]
    pub(super) fn by_key(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| match &e.segment {
            Segment::Key(k) | Segment::KeyOrIndex(k, _) => k.as_bytes() == key.as_bytes(),
            Segment::Index(_) => false,
        })
    }

    /// The entry an array index selects (the first that matches).
    pub(super) fn by_index(&self, index: usize) -> Option<&Entry> {
        self.entries.iter().find(|e| match e.segment {
            Segment::Index(i) | Segment::KeyOrIndex(_, i) => i == index,
            Segment::Key(_) => false,
        })
    }

    /// The wanted indexes (of an array) and their entries.
    pub(super) fn indexes(&self) -> impl Iterator<Item = (usize, &Entry)> {
        self.entries.iter().filter_map(|e| match e.segment {
            Segment::Index(i) | Segment::KeyOrIndex(_, i) => Some((i, e)),
            Segment::Key(_) => None,
        })
    }

    /// The wanted keys (of an object or a map) and their entries.
    pub(super) fn keys(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().filter_map(|e| match &e.segment {
            Segment::Key(k) | Segment::KeyOrIndex(k, _) => Some((&**k, e)),
            Segment::Index(_) => None,
        })
    }
}
