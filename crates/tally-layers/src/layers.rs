//! Imports run one way. For every folder of a crate's `src/`, each child (a file or a
//! sub-folder) is a node; a reference from code under child A to a module under sibling B is an
//! edge A -> B. The edges of a folder must form no cycle, and at the service's top level no edge
//! may run against the order of its stages ([`LAYERS`]). References between a module and its own
//! parent or children (`super::Item`, a `mod.rs` naming its files) are not edges: a folder and
//! its files are one unit.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::refs::{FileRefs, Resolver};
use crate::tree::{CrateSpec, Source};

/// The service's stages, top to bottom: a module may import only modules at its own rank or
/// below. main -> cli -> app -> {api, jobs} -> stream -> ops -> config -> (the library crate).
pub const LAYERS: &[(&str, usize)] = &[
    ("main", 0),
    ("cli", 1),
    ("app", 2),
    ("api", 3),
    ("jobs", 3),
    ("stream", 4),
    ("ops", 5),
    ("config", 6),
    ("lib", 7),
];

/// folder -> child -> the siblings it refers to.
type Edges = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;
/// (folder, child, sibling) -> the first `file:line` that makes the edge.
type FirstAt = HashMap<(Vec<String>, String, String), String>;

/// Strongly connected components with more than one node (Tarjan).
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a str) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        for w in st.edges.get(v).into_iter().flatten() {
            if !st.index.contains_key(w.as_str()) {
                visit(st, w);
                let lw = st.low[w.as_str()];
                st.low.insert(v, st.low[v].min(lw));
            } else if st.stack.contains(&w.as_str()) {
                let iw = st.index[w.as_str()];
                st.low.insert(v, st.low[v].min(iw));
            }
        }
        if st.low[v] == st.index[v] {
            let at = st.stack.iter().rposition(|x| *x == v).unwrap_or(0);
            let mut comp: Vec<String> = st.stack.drain(at..).map(str::to_string).collect();
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    nodes.extend(edges.values().flatten().map(String::as_str));
    let mut st = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !st.index.contains_key(v) {
            visit(&mut st, v);
        }
    }
    st.out
}

/// A crate's edges, each with the first place that makes it.
fn edges(sources: &[&Source], refs: &[&FileRefs], resolver: &Resolver) -> (Edges, FirstAt) {
    let mut edges = Edges::new();
    let mut first = HashMap::new();
    for (s, r) in sources.iter().zip(refs) {
        for raw in &r.refs {
            let Some(path) = resolver.absolute(&raw.segs, &raw.from, raw.bin) else {
                continue;
            };
            let target = resolver.module(&path);
            let me = &raw.from;
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if target.is_empty() || common == me.len() || common == target.len() {
                continue; // a module and its own ancestor or descendant
            }
            let (folder, a, b) = (
                me[..common].to_vec(),
                me[common].clone(),
                target[common].clone(),
            );
            edges
                .entry(folder.clone())
                .or_default()
                .entry(a.clone())
                .or_default()
                .insert(b.clone());
            first
                .entry((folder, a, b))
                .or_insert_with(|| format!("{}:{}", s.path, raw.line));
        }
    }
    (edges, first)
}

/// The layer and cycle checks of one crate; with `graph`, print its edges.
pub fn check_crate(
    spec: &CrateSpec,
    sources: &[&Source],
    refs: &[&FileRefs],
    resolver: &Resolver,
    problems: &mut Vec<String>,
    graph: bool,
) {
    let (edges, first) = edges(sources, refs, resolver);
    for (folder, fe) in &edges {
        let name = if folder.is_empty() {
            ".".to_string()
        } else {
            folder.join("/")
        };
        for comp in cycles(fe) {
            let links: Vec<String> = comp
                .iter()
                .flat_map(|a| {
                    fe.get(a)
                        .into_iter()
                        .flatten()
                        .filter(|b| comp.contains(b))
                        .map(move |b| (a, b))
                })
                .map(|(a, b)| {
                    format!(
                        "{a} -> {b} ({})",
                        first[&(folder.clone(), a.clone(), b.clone())]
                    )
                })
                .collect();
            problems.push(format!(
                "{}/{name}: cycle between {}: {}",
                spec.src,
                comp.join(", "),
                links.join("; ")
            ));
        }
        if graph {
            for (a, bs) in fe {
                let bs: Vec<&str> = bs.iter().map(String::as_str).collect();
                println!(
                    "{}/{}: {a} -> {}",
                    spec.src,
                    folder.join("/"),
                    bs.join(", ")
                );
            }
        }
    }
    if spec.src == "src" {
        upward(edges.get(&Vec::new()), &first, problems);
    }
}

/// The service's top level: every edge runs down [`LAYERS`].
fn upward(
    top: Option<&BTreeMap<String, BTreeSet<String>>>,
    first: &FirstAt,
    problems: &mut Vec<String>,
) {
    let rank = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, r)| *r);
    for (a, bs) in top.into_iter().flatten() {
        for b in bs {
            match (rank(a), rank(b)) {
                (Some(ra), Some(rb)) if rb < ra => {
                    let at = &first[&(Vec::new(), a.clone(), b.clone())];
                    problems.push(format!("src: {a} imports {b}, a stage above it ({at})"));
                }
                (Some(_), Some(_)) => {}
                (ra, _) => {
                    let m = if ra.is_none() { a } else { b };
                    problems.push(format!(
                        "src: top-level module {m} has no place in the layers \
                         (crates/tally-layers/src/layers.rs LAYERS)"
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_the_components_of_more_than_one_node() {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in [
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("d", "a"),
            ("e", "f"),
            ("f", "e"),
            ("g", "g"),
        ] {
            edges.entry(a.into()).or_default().insert(b.into());
        }
        assert_eq!(cycles(&edges), [vec!["a", "b", "c"], vec!["e", "f"]]);
    }
}
