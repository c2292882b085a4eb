//! `config/tally.toml` is the reference of every key (the README says so): each key the
//! configuration types accept is in it, set or commented out with an example, under its section;
//! it names no key they do not accept; as shipped it is the built-in defaults (a copy changes
//! nothing), and with its commented-out example entries uncommented it loads and validates.
//!
//! The keys come from the types, not from a list kept by hand: the default configuration, with
//! an entry in every list, serialized to JSON. `None` fields serialize as `null` there (none of
//! the types skips them), so optional keys are enumerated too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{json, Map, Value};
use tally::config::Config;

/// Sections (dotted paths of tables; a list's entries are tables of the list's path) and the keys
/// set directly in each.
type Keys = BTreeMap<String, BTreeSet<String>>;

fn reference_path() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tally.toml"))
}

fn reference_text() -> String {
    std::fs::read_to_string(reference_path()).expect("read config/tally.toml")
}

/// A list entry from its required fields; serde fills in the rest, so a new field with a default
/// shows up without this test changing (and a new required one fails here, by name).
fn entry<T: serde::de::DeserializeOwned>(fields: Value) -> T {
    serde_json::from_value(fields.clone()).unwrap_or_else(|e| panic!("entry {fields}: {e}"))
}

/// The default configuration with one entry in every list, so that the entries' fields show.
fn config_with_every_list() -> Config {
    let mut config = Config::default();
    assert!(!config.counters.is_empty(), "the default has a counter");
    let request = &mut config.request;
    request.limits.push(entry(
        json!({"name": "l", "algorithm": "fixed", "limit": 1, "window": "1s"}),
    ));
    request.quotas.push(entry(json!({"name": "q", "size": 1})));
    request
        .once
        .push(entry(json!({"name": "o", "window": "1d"})));
    request
        .unique
        .push(entry(json!({"name": "u", "window": "1h"})));
    request.pools.push(entry(json!({"name": "p"})));
    config.rlqs.buckets.push(entry(
        json!({"domain": "d", "name": "b", "limit": 1, "window": "1s"}),
    ));
    config
}

/// The keys the types accept. A table without keys (a free-form map such as `kafka.properties`)
/// is listed with none.
fn type_keys() -> Keys {
    let value = serde_json::to_value(config_with_every_list()).expect("serialize");
    let mut keys = Keys::new();
    walk("", value.as_object().expect("a table"), &mut keys);
    keys
}

fn walk(path: &str, table: &Map<String, Value>, keys: &mut Keys) {
    keys.entry(path.to_string()).or_default();
    for (key, value) in table {
        let child = match path {
            "" => key.clone(),
            _ => format!("{path}.{key}"),
        };
        match value {
            Value::Object(table) => walk(&child, table, keys),
            Value::Array(items) if items.first().is_some_and(Value::is_object) => {
                for item in items {
                    walk(&child, item.as_object().expect("a table"), keys);
                }
            }
            _ => {
                keys.entry(path.to_string())
                    .or_default()
                    .insert(key.clone());
            }
        }
    }
}

/// The keys of the reference file: `key = …` lines, set or commented out (`# key = …`), under
/// the latest `[section]` or `[[section]]` header, itself set or commented out. Quoted keys (librdkafka properties) and prose
/// are not keys.
fn reference_keys(text: &str) -> Keys {
    let mut keys = Keys::from([(String::new(), BTreeSet::new())]);
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        // A commented-out header starts a commented-out example entry (`# [[request.limits]]`).
        let line = line.strip_prefix('#').map_or(line, str::trim_start);
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).trim().to_string();
            keys.entry(section.clone()).or_default();
            continue;
        }
        let Some((key, _)) = line.split_once(" = ") else {
            continue;
        };
        let bare = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        if !key.is_empty() && key.chars().all(bare) {
            keys.get_mut(&section)
                .expect("section seen")
                .insert(key.to_string());
        }
    }
    keys
}

#[test]
fn every_key_the_types_accept_is_in_the_reference_and_no_other() {
    let accepted = type_keys();
    let documented = reference_keys(&reference_text());
    // The walk itself: sections and keys from every part of the configuration.
    for key in [
        "request.limits",
        "request.pools",
        "jobs.reconcile",
        "kafka.properties",
    ] {
        assert!(accepted.contains_key(key), "{key} in {accepted:?}");
    }
    assert!(
        accepted["redis"].contains("password"),
        "None fields are keys"
    );
    assert!(accepted["request.limits"].contains("burst"));

    let mut missing = Vec::new();
    for (section, keys) in &accepted {
        let Some(there) = documented.get(section) else {
            missing.push(format!("[{section}]"));
            continue;
        };
        missing.extend(keys.difference(there).map(|key| {
            format!("{section}.{key}")
                .trim_start_matches('.')
                .to_string()
        }));
    }
    assert!(
        missing.is_empty(),
        "config/tally.toml lacks (set it to its default, or comment it out with an example): {missing:?}"
    );

    let mut unknown = Vec::new();
    for (section, keys) in &documented {
        match accepted.get(section) {
            None => unknown.push(format!("[{section}]")),
            // A table without keys of its own is a free-form map, or holds only tables.
            Some(known) if known.is_empty() => {}
            Some(known) => {
                unknown.extend(keys.difference(known).map(|key| format!("{section}.{key}")))
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "config/tally.toml shows keys tally does not accept: {unknown:?}"
    );
}

/// The lists of tables that are empty by default: the reference's entries there are examples.
fn example_lists(with_entries: &Value, default: &Value, path: &str, out: &mut Vec<String>) {
    let Some(table) = with_entries.as_object() else {
        return;
    };
    for (key, value) in table {
        let child = format!("{path}/{key}");
        let empty_by_default = default
            .pointer(&child)
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        match value {
            Value::Array(items)
                if empty_by_default && items.first().is_some_and(Value::is_object) =>
            {
                out.push(child)
            }
            Value::Object(_) => example_lists(value, default, &child, out),
            _ => {}
        }
    }
}

/// The reference with its commented-out example entries uncommented: from a `# [[list]]` header
/// to the next blank line, every `# key = …` line (prose comments stay comments).
fn with_examples_uncommented(text: &str) -> String {
    let mut out = String::new();
    let mut in_example = false;
    let is_key = |l: &str| {
        l.split_once(" = ").is_some_and(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
    };
    for line in text.lines() {
        if line.starts_with("# [[") {
            in_example = true;
        } else if line.trim().is_empty() || line.starts_with('[') {
            in_example = false;
        }
        match line.strip_prefix("# ") {
            Some(rest) if in_example && (rest.starts_with("[[") || is_key(rest)) => {
                out.push_str(rest)
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[test]
fn the_reference_is_the_defaults_and_its_examples_load() {
    // As shipped, the file is the built-in defaults, section by section (so a failure names the
    // section; the counters' entry is the default counter).
    let loaded = Config::load(Some(reference_path()), &json!({}))
        .unwrap_or_else(|e| panic!("config/tally.toml: {e}"));
    let loaded = serde_json::to_value(&loaded).expect("serialize");
    let default = serde_json::to_value(Config::default()).expect("serialize");
    let sections = default.as_object().expect("a table");
    assert_eq!(sections.len(), loaded.as_object().map_or(0, Map::len));
    for (section, value) in sections {
        assert_eq!(
            loaded.get(section),
            Some(value),
            "config/tally.toml's [{section}] differs from the built-in default"
        );
    }

    // Uncommented, its examples load and validate, one entry at least in every list that is
    // empty by default.
    let dir = std::env::temp_dir().join(format!("tally-reference-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tally.toml");
    std::fs::write(&path, with_examples_uncommented(&reference_text())).expect("write");
    let examples_loaded = Config::load(Some(&path), &json!({}))
        .unwrap_or_else(|e| panic!("config/tally.toml with its examples uncommented: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let examples_loaded = serde_json::to_value(&examples_loaded).expect("serialize");
    let with_entries = serde_json::to_value(config_with_every_list()).expect("serialize");
    let mut examples = Vec::new();
    example_lists(&with_entries, &default, "", &mut examples);
    assert!(examples.contains(&"/request/limits".into()), "{examples:?}");
    for at in &examples {
        let entries = examples_loaded
            .pointer(at)
            .and_then(|v| v.as_array().map(Vec::len));
        assert!(
            entries.is_some_and(|n| n > 0),
            "config/tally.toml has no commented-out example entry in {at}"
        );
    }
}
