//! A writer schema compiled for the fields the decoder wants: every value's shape (to read or
//! skip it), and at each wanted place the decoder slots it fills. Built once per schema id.

use std::collections::HashMap;

use apache_avro::schema::{Name, Schema};
use smallvec::SmallVec;

use super::super::paths::{Entry, Node};

/// Deeper nesting (or a recursive schema) is refused.
const MAX_DEPTH: usize = 32;

/// How to read one value, and which slots take it.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) kind: Kind,
    pub(super) slots: SmallVec<[usize; 1]>,
    /// Something in it is wanted (its slots or a descendant's): else it is only skipped.
    pub(super) wanted: bool,
}

#[derive(Debug)]
pub(super) enum Kind {
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
    Record(Vec<Plan>),
    /// The element plan, and the plans of wanted indexes.
    Array(Box<Plan>, Vec<(usize, Plan)>),
    /// The value plan, and the plans of wanted keys.
    Map(Box<Plan>, Vec<(Box<str>, Plan)>),
    Union(Vec<Plan>),
}

/// Compiles `schema` for the fields of `root` (the payload's top level is a record).
pub(super) fn compile(schema: &Schema, root: &Node) -> Result<Plan, String> {
    let mut names = HashMap::new();
    collect(schema, &mut names, 0);
    let c = Compiler { names };
    match schema {
        Schema::Record(_) => c.plan(schema, Some(root), SmallVec::new(), 0),
        _ => Err("the top-level schema is not a record".into()),
    }
}

/// Every named type, for `Ref`s.
fn collect<'s>(schema: &'s Schema, names: &mut HashMap<Name, &'s Schema>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.clone(), schema);
            for f in &r.fields {
                collect(&f.schema, names, depth + 1);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.clone(), schema);
        }
        Schema::Fixed(f) => {
            names.insert(f.name.clone(), schema);
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

struct Compiler<'s> {
    names: HashMap<Name, &'s Schema>,
}

impl Compiler<'_> {
    /// The plan of a value of `schema`; `node` holds what is wanted inside it, `slots` the
    /// fields it is itself.
    fn plan(
        &self,
        schema: &Schema,
        node: Option<&Node>,
        slots: SmallVec<[usize; 1]>,
        depth: usize,
    ) -> Result<Plan, String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "schema nested deeper than {MAX_DEPTH} (or recursive)"
            ));
        }
        let kind = match schema {
            Schema::Decimal(d) => return self.plan(&d.inner, None, slots, depth + 1),
            Schema::Ref { name } => match self.names.get(name) {
                Some(s) => return self.plan(s, node, slots, depth + 1),
                None => return Err(format!("unknown type `{}`", name.fullname(None))),
            },
            _ => match scalar(schema) {
                Some(kind) => kind,
                None => self.composite(schema, node, !slots.is_empty(), depth)?,
            },
        };
        let inside = match &kind {
            Kind::Record(fields) => fields.iter().any(|f| f.wanted),
            Kind::Array(_, w) => !w.is_empty(),
            Kind::Map(_, w) => !w.is_empty(),
            Kind::Union(v) => v.iter().any(|p| p.wanted),
            _ => false,
        };
        Ok(Plan {
            wanted: inside || !slots.is_empty(),
            kind,
            slots,
        })
    }

    /// The kind of a record, array, map or union, planning what is wanted inside it (`node`);
    /// `has_slots`: the value itself fills slots.
    fn composite(
        &self,
        schema: &Schema,
        node: Option<&Node>,
        has_slots: bool,
        depth: usize,
    ) -> Result<Kind, String> {
        let child = |entry: Option<&Entry>, schema: &Schema| {
            let (inner, slots) = entry.map_or((None, SmallVec::new()), |e| {
                (e.inner.as_ref(), e.slots.clone())
            });
            self.plan(schema, inner, slots, depth + 1)
        };
        Ok(match schema {
            Schema::Record(r) => Kind::Record(
                r.fields
                    .iter()
                    .map(|f| child(node.and_then(|n| n.by_key(&f.name)), &f.schema))
                    .collect::<Result<_, _>>()?,
            ),
            Schema::Array(a) => {
                let mut wanted = Vec::new();
                if let Some(n) = node {
                    for (i, e) in n.indexes() {
                        wanted.push((i, child(Some(e), &a.items)?));
                    }
                }
                Kind::Array(Box::new(child(None, &a.items)?), wanted)
            }
            Schema::Map(m) => {
                let wanted = node
                    .map(|n| {
                        n.keys()
                            .map(|(k, e)| Ok((k.into(), child(Some(e), &m.types)?)))
                            .collect::<Result<Vec<_>, String>>()
                    })
                    .transpose()?
                    .unwrap_or_default();
                Kind::Map(Box::new(child(None, &m.types)?), wanted)
            }
            // The union's slots take the branch's value: a branch is read, not skipped, then.
            Schema::Union(u) => Kind::Union(
                u.variants()
                    .iter()
                    .map(|v| {
                        let mut p = self.plan(v, node, SmallVec::new(), depth + 1)?;
                        p.wanted |= has_slots;
                        Ok(p)
                    })
                    .collect::<Result<_, String>>()?,
            ),
            other => return Err(format!("unsupported type {other:?}")),
        })
    }
}

/// The kind of a value of a primitive (or logical) type; None for the others.
fn scalar(schema: &Schema) -> Option<Kind> {
    Some(match schema {
        Schema::Null => Kind::Null,
        Schema::Boolean => Kind::Bool,
        Schema::Int | Schema::Long | Schema::Date | Schema::TimeMillis | Schema::TimeMicros => {
            Kind::Long { divide: 1 }
        }
        Schema::TimestampMillis | Schema::LocalTimestampMillis => Kind::Long { divide: 1 },
        Schema::TimestampMicros | Schema::LocalTimestampMicros => Kind::Long { divide: 1_000 },
        Schema::TimestampNanos | Schema::LocalTimestampNanos => Kind::Long { divide: 1_000_000 },
        Schema::Float => Kind::Float,
        Schema::Double => Kind::Double,
        Schema::Bytes | Schema::BigDecimal => Kind::Bytes,
        Schema::String | Schema::Uuid => Kind::Str,
        Schema::Fixed(f) => Kind::Fixed(f.size),
        Schema::Duration => Kind::Fixed(12),
        Schema::Enum(e) => Kind::Enum(e.symbols.iter().map(|s| s.as_str().into()).collect()),
        _ => return None,
    })
}
