#!/usr/bin/env python3
"""Checks that the source tree is a map: imports between folders run one way.

For every folder of a crate's `src/`, each child (a file or a sub-folder) is a node. An import
from a file under child A to a module under sibling child B is an edge A -> B. The check fails if
the edges of any folder form a cycle (A -> B -> ... -> A), and, for the service crate's top level,
if an import runs against the declared order of its stages (LAYERS below). Imports between a
module and its own parent or children (`super::Item`, a `mod.rs` naming its files) are not
edges: a folder and its files are one unit.

It also enforces two size rules: no `.rs` file of a crate's `src/` over 500 lines, and no
struct with more than 12 fields in product code. Configuration sections (structs that derive
`Deserialize`) are exempt from the second: they are inert data with one field per key of the
file, split by section already, and a flattened split would lose `deny_unknown_fields`.

Usage: scripts/check_layers.py [--graph]   (exit 1 with a list of what is wrong)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Crates checked: (src folder, the name other crates use for it).
CRATES = [("src", "tally"), ("crates/tally-counters/src", "tally_counters"),
          ("crates/tally-testkit/src", "tally_testkit"), ("crates/tally-bench/src", "tally_bench")]

# The service's stages, top to bottom: a module may import only modules at its own rank or below.
# main -> cli -> app -> {api, jobs} -> stream -> ops -> config -> (the library crate).
LAYERS = {"main": 0, "cli": 1, "app": 2, "api": 3, "jobs": 3, "stream": 4, "ops": 5, "config": 6,
          "lib": 7}

MAX_LINES = 500
MAX_FIELDS = 12
# Product code: structs counted here (tests, benchmarks and the test kit are tooling).
PRODUCT = ["src", "crates/tally-counters/src"]

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"')
USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"\b(crate|super|self|tally)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def strip(text):
    text = COMMENT.sub(" ", text)
    return STRING.sub('""', text)


def module_of(rel):
    """src-relative file path -> module path (a tuple); lib.rs/main.rs are the root."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (paths only, renames dropped)."""
    tree = re.sub(r"\s+as\s+[A-Za-z_0-9]+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for item in items:
            if not item:
                continue
            if "{" in item:
                head, rest = item.split("{", 1)
                walk(prefix + head, rest[: rest.rfind("}")])
            else:
                out.append(prefix + item)

    walk("", tree)
    return out


def references(text, module, self_name):
    """Module paths (tuples, crate-absolute, possibly too long) a file refers to."""
    text = strip(text)
    paths = []
    for m in USE.finditer(text):
        paths.extend(expand_use(m.group(1)))
    paths.extend(m.group(0) for m in PATH.finditer(text))
    refs = []
    for p in paths:
        segs = [s for s in p.split("::") if s]
        if not segs:
            continue
        head = segs[0]
        if head == "crate" or head == self_name:
            refs.append(tuple(segs[1:]))
        elif head in ("super", "self"):
            base = list(module)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super" and base:
                    base.pop()
                segs = segs[1:]
            refs.append(tuple(base + segs))
    return refs


def resolve(path, modules):
    """The longest prefix of `path` that is a module of the crate."""
    for n in range(len(path), 0, -1):
        if path[:n] in modules:
            return path[:n]
    return ()


def cycles(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def struct_fields(text):
    """(name, number of fields, line) of every braced struct."""
    clean = strip(text)
    for m in re.finditer(r"\bstruct\s+([A-Za-z_][A-Za-z0-9_]*)[^;{(]*\{", clean):
        depth, i = 1, m.end()
        body_start = i
        while depth and i < len(clean):
            depth += {"{": 1, "}": -1}.get(clean[i], 0)
            i += 1
        body = clean[body_start: i - 1]
        # Fields: `name: Type` at the top nesting level of the body.
        depth, fields, start = 0, 0, 0
        for j, ch in enumerate(body + ","):
            if ch in "<([{":
                depth += 1
            elif ch in ">)]}":
                depth -= 1
            elif ch == "," and depth == 0:
                if re.search(r"^\s*(#\[[^\]]*\]\s*)*(pub(\([^)]*\))?\s+)?[a-z_][a-z0-9_]*\s*:",
                             body[start:j]):
                    fields += 1
                start = j + 1
        # Attributes right above the struct (its derives).
        head = clean[max(0, clean.rfind("\n\n", 0, m.start())): m.start()]
        if "Deserialize" in head:
            continue
        yield m.group(1), fields, text.count("\n", 0, m.start()) + 1


def check_crate(src, self_name, problems, graph):
    files = {}
    for base, _, names in os.walk(os.path.join(ROOT, src)):
        for name in names:
            if name.endswith(".rs"):
                full = os.path.join(base, name)
                files[os.path.relpath(full, os.path.join(ROOT, src))] = full
    modules = {module_of(rel) for rel in files}
    # Folders are modules too (a folder without mod.rs still groups its files).
    for rel in files:
        parts = rel.split("/")[:-1]
        for n in range(1, len(parts) + 1):
            modules.add(tuple(parts[:n]))
    edges = {}  # folder (tuple) -> {child: {child}}
    where = {}  # (folder, a, b) -> first file
    for rel, full in sorted(files.items()):
        with open(full, encoding="utf-8") as f:
            text = f.read()
        n_lines = text.count("\n")
        if n_lines > MAX_LINES:
            problems.append(f"{src}/{rel}: {n_lines} lines (at most {MAX_LINES})")
        if any(src.startswith(p) for p in PRODUCT):
            for name, n, line in struct_fields(text):
                if n > MAX_FIELDS:
                    problems.append(f"{src}/{rel}:{line}: struct {name} has {n} fields "
                                    f"(at most {MAX_FIELDS})")
        me = module_of(rel)
        # The binary's modules (main.rs and what it declares) import the library as `tally::`.
        for ref in references(text, me, self_name):
            target = resolve(ref, modules)
            if not target:
                continue
            common = 0
            while common < min(len(me), len(target)) and me[common] == target[common]:
                common += 1
            if common == len(me) or common == len(target):
                continue  # a module and its own ancestor or descendant
            folder, a, b = me[:common], me[common], target[common]
            edges.setdefault(folder, {}).setdefault(a, set()).add(b)
            where.setdefault((folder, a, b), f"{src}/{rel}")
    for folder, fe in sorted(edges.items()):
        nodes = set(fe) | {b for bs in fe.values() for b in bs}
        for comp in cycles(nodes, fe):
            links = [f"{a} -> {b} ({where[(folder, a, b)]})" for a in comp for b in sorted(fe.get(a, ()))
                     if b in comp]
            problems.append(f"{src}/{'/'.join(folder) or '.'}: cycle between {', '.join(comp)}: "
                            + "; ".join(links))
        if graph:
            for a in sorted(fe):
                print(f"{src}/{'/'.join(folder)}: {a} -> {', '.join(sorted(fe[a]))}")
    if src == "src":
        top = edges.get((), {})
        for a, bs in sorted(top.items()):
            for b in sorted(bs):
                ra, rb = LAYERS.get(a), LAYERS.get(b)
                if ra is None or rb is None:
                    problems.append(f"src: top-level module {a if ra is None else b} has no "
                                    f"place in the layers (scripts/check_layers.py LAYERS)")
                elif rb < ra:
                    problems.append(f"src: {a} imports {b}, a stage above it "
                                    f"({where[((), a, b)]})")


def self_test():
    """The check finds what it is for: a sibling cycle, an upward import, a long file, a big
    struct; and passes a tree without them."""
    import tempfile
    global ROOT
    saved = ROOT
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        write("src/lib.rs", "pub mod config;\npub mod ops;\npub mod stream;\n")
        write("src/config/mod.rs", "pub struct Model;\n")
        write("src/ops/mod.rs", "use crate::config::Model;\n")
        write("src/stream/mod.rs", "pub mod a;\npub mod b;\n")
        write("src/stream/a.rs", "use super::b::B;\npub struct A;\n")
        write("src/stream/b.rs", "pub struct B;\n")
        ROOT = root
        try:
            clean = []
            check_crate("src", "tally", clean, False)
            assert clean == [], clean
            write("src/stream/b.rs", "use crate::stream::{a::A};\npub struct B;\n")
            write("src/config/mod.rs", "pub struct Model;\nfn f() { crate::ops::x(); }\n")
            write("src/ops/big.rs", "\n" * (MAX_LINES + 1) + "struct Owner {\n" +
                  "".join(f"    f{i}: u8,\n" for i in range(MAX_FIELDS + 1)) + "}\n")
            found = []
            check_crate("src", "tally", found, False)
            text = "\n".join(found)
            assert "src/stream: cycle between a, b" in text, text
            assert "src: config imports ops, a stage above it" in text, text
            assert "src/ops/big.rs: %d lines" % (MAX_LINES + 1 + MAX_FIELDS + 3) in text, text
            assert "struct Owner has %d fields" % (MAX_FIELDS + 1) in text, text
        finally:
            ROOT = saved
    print("check_layers: self-test passed")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return 0
    graph = "--graph" in sys.argv
    problems = []
    for src, name in CRATES:
        if os.path.isdir(os.path.join(ROOT, src)):
            check_crate(src, name, problems, graph)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: no cycle, no upward import, no file over "
          f"{MAX_LINES} lines, no struct over {MAX_FIELDS} fields")
    return 0


if __name__ == "__main__":
    sys.exit(main())
