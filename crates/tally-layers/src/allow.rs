//! The allow list of the budgets (`crates/tally-layers/allow.toml`): a small TOML subset, one
//! entry per line, `"key" = value` under a `[section]`, where a value is a number, a string or
//! an array of strings on that line. `#` starts a comment.

use std::collections::BTreeMap;

/// The sections, what their keys are and what their values say.
pub const SECTIONS: &[&str] = &[
    "long_fns",
    "long_test_fns",
    "duplicate_names",
    "split_impls",
];

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(usize),
    Str(String),
    List(Vec<String>),
}

/// One entry and the line it is on.
#[derive(Debug, Clone)]
pub struct Entry {
    pub value: Value,
    pub line: usize,
}

/// section -> key -> entry.
#[derive(Debug, Default)]
pub struct Allow {
    pub sections: BTreeMap<String, BTreeMap<String, Entry>>,
}

impl Allow {
    pub fn section(&self, name: &str) -> impl Iterator<Item = (&String, &Entry)> {
        self.sections.get(name).into_iter().flatten()
    }
}

/// A basic string at the start of `s`: its text and the rest after the closing quote.
fn string(s: &str) -> Result<(String, &str), String> {
    let mut chars = s
        .strip_prefix('"')
        .ok_or("expected a \"string\"")?
        .char_indices();
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 2..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, c @ ('"' | '\\'))) => out.push(c),
                _ => return Err("unknown escape in a string".into()),
            },
            c => out.push(c),
        }
    }
    Err("unterminated string".into())
}

/// What follows a value: nothing, or a comment.
fn end_of_line(rest: &str) -> Result<(), String> {
    let rest = rest.trim_start();
    if rest.is_empty() || rest.starts_with('#') {
        Ok(())
    } else {
        Err(format!("unexpected `{rest}` after the value"))
    }
}

fn value(s: &str) -> Result<Value, String> {
    let s = s.trim_start();
    if s.starts_with('"') {
        let (text, rest) = string(s)?;
        end_of_line(rest)?;
        return Ok(Value::Str(text));
    }
    if let Some(mut rest) = s.strip_prefix('[') {
        let mut items = Vec::new();
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(']') {
                end_of_line(after)?;
                return Ok(Value::List(items));
            }
            let (text, after) = string(rest)?;
            items.push(text);
            rest = after.trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    let n = digits
        .parse()
        .map_err(|_| format!("expected a number, a string or a list, found `{s}`"))?;
    end_of_line(&s[digits.len()..])?;
    Ok(Value::Int(n))
}

/// Parse the list; errors name their line.
pub fn parse(text: &str) -> Result<Allow, String> {
    let mut allow = Allow::default();
    let mut section: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let s = raw.trim();
        if s.is_empty() || s.starts_with('#') {
            continue;
        }
        if let Some(name) = s.strip_prefix('[') {
            let name = name.split(']').next().unwrap_or_default().trim();
            if !SECTIONS.contains(&name) {
                return Err(format!(
                    "line {line}: unknown section [{name}] (known: {})",
                    SECTIONS.join(", ")
                ));
            }
            allow.sections.entry(name.to_string()).or_default();
            section = Some(name.to_string());
            continue;
        }
        let Some(sec) = &section else {
            return Err(format!("line {line}: an entry before any [section]"));
        };
        let (key, rest) = string(s).map_err(|e| format!("line {line}: {e}"))?;
        let rest = rest
            .trim_start()
            .strip_prefix('=')
            .ok_or(format!("line {line}: expected `=` after the key"))?;
        let value = value(rest).map_err(|e| format!("line {line}: {e}"))?;
        let entries = allow.sections.entry(sec.clone()).or_default();
        if entries.insert(key.clone(), Entry { value, line }).is_some() {
            return Err(format!("line {line}: \"{key}\" is listed twice in [{sec}]"));
        }
    }
    Ok(allow)
}

/// `text` with each listed line (1-based) replaced by its new text, or deleted.
pub fn shrink(text: &str, edits: &[(usize, Option<String>)]) -> String {
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        match edits.iter().find(|(n, _)| *n == i + 1) {
            Some((_, Some(new))) => {
                out.push_str(new);
                out.push('\n');
            }
            Some((_, None)) => {}
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_kind_of_value() {
        let text = "# header\n[long_fns]\n\"src/a.rs::f\" = 95  # why\n\n[split_impls]\n\
                    \"A: src/b.rs\" = \"the \\\"why\\\"\"\n[duplicate_names]\n\"tally::A\" = [\"src/a.rs\", \"src/b.rs\",]\n";
        let allow = parse(text).unwrap();
        let fns: Vec<_> = allow.section("long_fns").collect();
        assert_eq!(fns[0].0, "src/a.rs::f");
        assert_eq!(fns[0].1.value, Value::Int(95));
        assert_eq!(fns[0].1.line, 3);
        let split: Vec<_> = allow.section("split_impls").collect();
        assert_eq!(split[0].1.value, Value::Str("the \"why\"".into()));
        let dup: Vec<_> = allow.section("duplicate_names").collect();
        assert_eq!(
            dup[0].1.value,
            Value::List(vec!["src/a.rs".into(), "src/b.rs".into()])
        );
    }

    #[test]
    fn shrinking_rewrites_or_deletes_only_the_lines_named() {
        let text = "[long_fns]\n\"a\" = 90\n\"b\" = 95\n\"c\" = 99\n";
        let edits = [(2, None), (4, Some("\"c\" = 85".to_string()))];
        assert_eq!(shrink(text, &edits), "[long_fns]\n\"b\" = 95\n\"c\" = 85\n");
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        for (text, error) in [
            ("\"a\" = 1\n", "before any [section]"),
            ("[other]\n", "unknown section"),
            ("[long_fns]\n\"a\" = 1\n\"a\" = 2\n", "listed twice"),
            ("[long_fns]\n\"a\" = 1 2\n", "unexpected `2`"),
            ("[long_fns]\n\"a = 1\n", "unterminated"),
            ("[long_fns]\n\"a\" = x\n", "expected a number"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(error), "{text:?}: {e}");
        }
    }
}
