//! A writer schema compiled for the fields the decoder wants: every value's shape (to read or
//! skip it), and at each wanted place the decoder slots it fills. Built once per schema id.
//!
//! Within a budget, whatever the schema: a named type is compiled once for each wanted sub-tree
//! it is used with (almost always once, with nothing wanted inside) and that plan is shared by
//! every use, so a plan is as large as the schema's text, not as its expansion (8 records of 8
//! fields of the previous record would expand to 8^8 nodes). A value that takes no bytes and
//! holds nothing wanted (null, an empty record, a record of such) is planned as a null, so
//! skipping any value costs at most its bytes times the depth. A plan past `max_nodes` nodes is
//! refused.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use apache_avro::schema::{Name, Schema};
use smallvec::SmallVec;

use super::super::paths::{Entry, Node};

/// Deeper nesting (or a recursive schema) is refused.
const MAX_DEPTH: usize = 32;

/// How to read one value, and which slots take it.
#[derive(Debug)]
pub(super) struct AvroPlan {
    pub(super) kind: AvroKind,
    pub(super) slots: SmallVec<[usize; 1]>,
    /// Something in it is wanted (its slots or a descendant's): else it is only skipped.
    pub(super) wanted: bool,
    /// Its values take no bytes (null, fixed(0), records of such): their count in an array is
    /// bounded by the reader's item budget, not by the datum's bytes.
    pub(super) zero_width: bool,
}

#[derive(Debug)]
pub(super) enum AvroKind {
    Null,
    Bool,
    /// int or long; a timestamp in micro- or nanoseconds is divided down to milliseconds.
    Long {
        divide: i64,
    },
    Float,
    Double,
    /// bytes (and decimals on bytes): read past, never a value.
    Bytes,
    Str,
    Fixed(usize),
    Enum(Vec<Box<str>>),
    Record(Vec<Arc<AvroPlan>>),
    /// The element plan, and the plans of wanted indexes.
    Array(Arc<AvroPlan>, Vec<(usize, Arc<AvroPlan>)>),
    /// The value plan, and the plans of wanted keys.
    Map(Arc<AvroPlan>, Vec<(Box<str>, Arc<AvroPlan>)>),
    Union(Vec<Arc<AvroPlan>>),
}

/// Why a schema was not compiled.
#[derive(Debug, PartialEq)]
pub(super) enum Refused {
    /// A schema tally cannot read (recursive, too deep, not a record, an unknown name).
    Unreadable(String),
    /// More than this many nodes.
    TooLarge(usize),
}

/// A compiled plan: the top-level record's, and how many nodes were built for it.
pub(super) struct Compiled {
    pub(super) plan: AvroPlan,
    pub(super) nodes: usize,
}

/// Compiles `schema` for the fields of `root` (the payload's top level is a record), in at most
/// `max_nodes` nodes.
pub(super) fn compile(schema: &Schema, root: &Node, max_nodes: usize) -> Result<Compiled, Refused> {
    let Schema::Record(r) = schema else {
        return Err(Refused::Unreadable(
            "the top-level schema is not a record".into(),
        ));
    };
    let mut names = HashMap::new();
    collect(schema, &mut names, 0);
    let mut c = AvroCompiler {
        names,
        shared: HashMap::new(),
        open: HashSet::new(),
        nodes: 0,
        max_nodes,
        null: Arc::new(AvroPlan {
            kind: AvroKind::Null,
            slots: SmallVec::new(),
            wanted: false,
            zero_width: true,
        }),
    };
    // The root is its own plan (not shared): a reference back to it is a recursive schema.
    c.open.insert((&r.name, key(Some(root))));
    let (kind, _) = c.composite(schema, Some(root), 0)?;
    c.spend(1)?;
    Ok(Compiled {
        plan: AvroPlan {
            wanted: true,
            zero_width: false,
            kind,
            slots: SmallVec::new(),
        },
        nodes: c.nodes,
    })
}

/// Every named type, for `Ref`s.
fn collect<'s>(schema: &'s Schema, names: &mut HashMap<&'s Name, &'s Schema>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match schema {
        Schema::Record(r) => {
            names.insert(&r.name, schema);
            for f in &r.fields {
                collect(&f.schema, names, depth + 1);
            }
        }
        Schema::Enum(e) => {
            names.insert(&e.name, schema);
        }
        Schema::Fixed(f) => {
            names.insert(&f.name, schema);
        }
        Schema::Array(a) => collect(&a.items, names, depth + 1),
        Schema::Map(m) => collect(&m.types, names, depth + 1),
        Schema::Union(u) => u
            .variants()
            .iter()
            .for_each(|v| collect(v, names, depth + 1)),
        _ => {}
    }
}

/// What identifies a wanted sub-tree: its node's address (0: nothing wanted).
fn key(node: Option<&Node>) -> usize {
    node.map_or(0, |n| n as *const Node as usize)
}

/// A plan and its height (1 for a leaf): a shared plan used deeper must not pass `MAX_DEPTH`.
type Planned = (Arc<AvroPlan>, usize);

struct AvroCompiler<'s> {
    names: HashMap<&'s Name, &'s Schema>,
    /// Named types compiled without slots, by name and wanted sub-tree: reused at every use.
    shared: HashMap<(&'s Name, usize), Planned>,
    /// Named types being compiled: meeting one again inside itself is a recursive schema.
    open: HashSet<(&'s Name, usize)>,
    /// Nodes built so far, and the budget.
    nodes: usize,
    max_nodes: usize,
    /// The plan of every skipped value that takes no bytes.
    null: Arc<AvroPlan>,
}

impl<'s> AvroCompiler<'s> {
    /// Counts `n` more nodes against the budget.
    fn spend(&mut self, n: usize) -> Result<(), Refused> {
        self.nodes += n;
        match self.nodes > self.max_nodes {
            true => Err(Refused::TooLarge(self.max_nodes)),
            false => Ok(()),
        }
    }

    /// The plan of a value of `schema` at `depth`; `node` holds what is wanted inside it,
    /// `slots` the fields it is itself. A named type's plan is shared (see the module).
    fn plan(
        &mut self,
        schema: &'s Schema,
        node: Option<&Node>,
        slots: SmallVec<[usize; 1]>,
        depth: usize,
    ) -> Result<Planned, Refused> {
        let too_deep = || {
            Refused::Unreadable(format!(
                "schema nested deeper than {MAX_DEPTH} (or recursive)"
            ))
        };
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        let name = match schema {
            Schema::Ref { name } => name,
            Schema::Record(r) => &r.name,
            Schema::Enum(e) => &e.name,
            Schema::Fixed(f) => &f.name,
            _ => return self.build(schema, node, slots, depth),
        };
        let at = (name, key(node));
        if let Some((plan, height)) = self.shared.get(&at).filter(|_| slots.is_empty()) {
            return match depth + height > MAX_DEPTH + 1 {
                true => Err(too_deep()),
                false => Ok((plan.clone(), *height)),
            };
        }
        let definition = match schema {
            Schema::Ref { name } => *self.names.get(name).ok_or_else(|| {
                Refused::Unreadable(format!("unknown type `{}`", name.fullname(None)))
            })?,
            defined => defined,
        };
        if !self.open.insert(at) {
            return Err(Refused::Unreadable(format!(
                "recursive type `{}`",
                name.fullname(None)
            )));
        }
        let shared = slots.is_empty();
        let built = self.build(definition, node, slots, depth);
        self.open.remove(&at);
        let built = built?;
        if shared {
            self.shared.insert(at, built.clone());
        }
        Ok(built)
    }

    /// A new plan of a value of `schema` (see [`AvroCompiler::plan`]).
    fn build(
        &mut self,
        schema: &'s Schema,
        node: Option<&Node>,
        slots: SmallVec<[usize; 1]>,
        depth: usize,
    ) -> Result<Planned, Refused> {
        self.spend(1)?;
        let (kind, height) = match schema {
            Schema::Decimal(d) => return self.plan(&d.inner, None, slots, depth),
            Schema::Enum(e) => {
                self.spend(e.symbols.len())?;
                (scalar(schema).unwrap_or(AvroKind::Null), 1)
            }
            _ => match scalar(schema) {
                Some(kind) => (kind, 1),
                None => self.composite(schema, node, depth)?,
            },
        };
        let inside = match &kind {
            AvroKind::Record(fields) => fields.iter().any(|f| f.wanted),
            AvroKind::Array(_, w) => !w.is_empty(),
            AvroKind::Map(_, w) => !w.is_empty(),
            AvroKind::Union(v) => v.iter().any(|p| p.wanted),
            _ => false,
        };
        let zero_width = match &kind {
            AvroKind::Null | AvroKind::Fixed(0) => true,
            AvroKind::Record(fields) => fields.iter().all(|f| f.zero_width),
            _ => false,
        };
        let wanted = inside || !slots.is_empty();
        if zero_width && !wanted {
            return Ok((self.null.clone(), 1));
        }
        let plan = AvroPlan {
            kind,
            slots,
            wanted,
            zero_width,
        };
        Ok((Arc::new(plan), height))
    }

    /// The plan of a field, an item or a value of a map (`entry`: what is wanted of it).
    fn child(
        &mut self,
        entry: Option<&Entry>,
        schema: &'s Schema,
        depth: usize,
    ) -> Result<Planned, Refused> {
        let (inner, slots) = entry.map_or((None, SmallVec::new()), |e| {
            (e.inner.as_ref(), e.slots.clone())
        });
        self.plan(schema, inner, slots, depth + 1)
    }

    /// The kind of a record, array, map or union, planning what is wanted inside it (`node`),
    /// and its height.
    fn composite(
        &mut self,
        schema: &'s Schema,
        node: Option<&Node>,
        depth: usize,
    ) -> Result<(AvroKind, usize), Refused> {
        let mut height = 0;
        let mut tally = |(plan, h): Planned| {
            height = height.max(h);
            plan
        };
        let kind = match schema {
            Schema::Record(r) => {
                let mut fields = Vec::with_capacity(r.fields.len());
                for f in &r.fields {
                    let entry = node.and_then(|n| n.by_key(&f.name));
                    fields.push(tally(self.child(entry, &f.schema, depth)?));
                }
                AvroKind::Record(fields)
            }
            Schema::Array(a) => {
                let mut wanted = Vec::new();
                for (i, e) in node.iter().flat_map(|n| n.indexes()) {
                    wanted.push((i, tally(self.child(Some(e), &a.items, depth)?)));
                }
                AvroKind::Array(tally(self.child(None, &a.items, depth)?), wanted)
            }
            Schema::Map(m) => {
                let mut wanted = Vec::new();
                for (k, e) in node.iter().flat_map(|n| n.keys()) {
                    wanted.push((k.into(), tally(self.child(Some(e), &m.types, depth)?)));
                }
                AvroKind::Map(tally(self.child(None, &m.types, depth)?), wanted)
            }
            // The branches are planned for what is wanted inside the union; when the union
            // itself fills slots, the reader reads the branch it finds rather than skipping it.
            Schema::Union(u) => {
                let mut branches = Vec::with_capacity(u.variants().len());
                for v in u.variants() {
                    branches.push(tally(self.plan(v, node, SmallVec::new(), depth + 1)?));
                }
                AvroKind::Union(branches)
            }
            other => return Err(Refused::Unreadable(format!("unsupported type {other:?}"))),
        };
        Ok((kind, height + 1))
    }
}

/// The kind of a value of a primitive (or logical) type; None for the others.
fn scalar(schema: &Schema) -> Option<AvroKind> {
    Some(match schema {
        Schema::Null => AvroKind::Null,
        Schema::Boolean => AvroKind::Bool,
        Schema::Int | Schema::Long | Schema::Date | Schema::TimeMillis | Schema::TimeMicros => {
            AvroKind::Long { divide: 1 }
        }
        Schema::TimestampMillis | Schema::LocalTimestampMillis => AvroKind::Long { divide: 1 },
        Schema::TimestampMicros | Schema::LocalTimestampMicros => AvroKind::Long { divide: 1_000 },
        Schema::TimestampNanos | Schema::LocalTimestampNanos => {
            AvroKind::Long { divide: 1_000_000 }
        }
        Schema::Float => AvroKind::Float,
        Schema::Double => AvroKind::Double,
        Schema::Bytes | Schema::BigDecimal => AvroKind::Bytes,
        Schema::String | Schema::Uuid => AvroKind::Str,
        Schema::Fixed(f) => AvroKind::Fixed(f.size),
        Schema::Duration => AvroKind::Fixed(12),
        Schema::Enum(e) => AvroKind::Enum(e.symbols.iter().map(|s| s.as_str().into()).collect()),
        _ => return None,
    })
}
