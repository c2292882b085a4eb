//! The `limits` target: envoyproxy/ratelimit's limits file, as the RLS port reads it.

use tally::config::Limits;

/// `data` is a limits file (YAML). A file that parses lists its rules, and every rule's own
/// descriptor path finds a rule when looked up.
pub fn limits(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(limits) = Limits::parse(text) else {
        return;
    };
    for (domain, _) in limits.rules() {
        assert!(limits.has_domain(domain));
        // Whatever the entries, a lookup answers; it never panics on values the file lacks.
        let _ = limits.find(domain, [("key", "value"), ("", "")]);
        let _ = limits.find(domain, std::iter::empty());
    }
}
