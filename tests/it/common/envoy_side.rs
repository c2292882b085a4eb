//! What the tests of tally behind a real Envoy share: guide 09's snippets, run as written, and
//! the request reader of their stand-in upstreams.

/// The first ```yaml block of guide 09 after `after` whose text starts with `starts`, without its
/// fences: the tests run the guide's snippets as written.
pub fn guide_yaml(after: &str, starts: &str) -> String {
    let page = include_str!("../../../docs/guide/09-envoy-istio-and-gateways.md");
    let from = page
        .find(after)
        .unwrap_or_else(|| panic!("guide 09: {after}"));
    let fence = format!("```yaml\n{starts}");
    let start = from
        + page[from..]
            .find(&fence)
            .unwrap_or_else(|| panic!("guide 09: a block `{starts}` after {after}"))
        + "```yaml\n".len();
    let len = page[start..].find("```").unwrap();
    page[start..start + len].to_string()
}

/// The headers of the next HTTP/1.1 request head on `lines` (names lowercased, values trimmed);
/// `None` once the connection ends. The stand-in upstreams behind Envoy read their requests so.
pub fn read_head(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Option<std::collections::HashMap<String, String>> {
    let mut headers = std::collections::HashMap::new();
    loop {
        let line = lines.next()?.ok()?;
        if line.is_empty() {
            return Some(headers);
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
}
