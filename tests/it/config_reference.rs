//! `config/tally.toml` is the reference of every key (the README says so): each key the
//! configuration types accept is in it, set or commented out with an example, under its section;
//! it names no key they do not accept; and it loads, setting the built-in defaults everywhere but
//! in its example lists.
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
/// the latest `[section]` or `[[section]]` header. Quoted keys (librdkafka properties) and prose
/// are not keys.
fn reference_keys(text: &str) -> Keys {
    let mut keys = Keys::from([(String::new(), BTreeSet::new())]);
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).trim().to_string();
            keys.entry(section.clone()).or_default();
            continue;
        }
        let line = line.strip_prefix('#').map_or(line, str::trim_start);
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

/// Remove the value at the JSON pointer `at` from `value` and return it.
fn take(value: &mut Value, at: &str) -> Option<Value> {
    let (parent, key) = at.rsplit_once('/')?;
    value.pointer_mut(parent)?.as_object_mut()?.remove(key)
}

#[test]
fn the_reference_loads_and_sets_the_defaults_outside_its_example_lists() {
    let loaded = Config::load(Some(reference_path()), &json!({}))
        .unwrap_or_else(|e| panic!("config/tally.toml: {e}"));
    let mut loaded = serde_json::to_value(&loaded).expect("serialize");
    let mut default = serde_json::to_value(Config::default()).expect("serialize");
    let with_entries = serde_json::to_value(config_with_every_list()).expect("serialize");

    let mut examples = Vec::new();
    example_lists(&with_entries, &default, "", &mut examples);
    assert!(examples.contains(&"/request/limits".into()), "{examples:?}");
    for at in &examples {
        let entries = take(&mut loaded, at).and_then(|v| v.as_array().map(Vec::len));
        assert!(
            entries.is_some_and(|n| n > 0),
            "config/tally.toml has no example entry in {at} (loaded and validated with the rest)"
        );
        take(&mut default, at);
    }

    // Section by section, so a failure names the section (the counters' example is the default).
    let sections = default.as_object().expect("a table");
    assert_eq!(sections.len(), loaded.as_object().map_or(0, Map::len));
    for (section, value) in sections {
        assert_eq!(
            loaded.get(section),
            Some(value),
            "config/tally.toml's [{section}] differs from the built-in default"
        );
    }
}
