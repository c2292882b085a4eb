//! envoyproxy/ratelimit's wildcard values: each `*` matches any run of characters.

/// Whether `value` matches a pattern split on `*` (each `*` any run of characters, empty too).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return value.is_empty(),
    };
    let Some((last, middle)) = rest.split_last() else {
        return value == first;
    };
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut inner = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match inner.find(part.as_str()) {
            Some(i) => inner = &inner[i + part.len()..],
            None => return false,
        }
    }
    true
}
