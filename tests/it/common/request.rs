//! Configuration tables the request-path tests share, to be placed in their `format!` text as
//! `{PLAYS}` and `{PRIMITIVES}`.

/// An hourly counter of plays per video: the stream-path counter a request-path server also has.
pub const PLAYS: &str = r#"[[counters]]
name = "plays"
dimensions = ["video"]
key = "plays:{video}:{yyyyMMddHH}"
window = "1h""#;

/// One of each primitive beside the limits: a quota `flash` of 100, a `once` `welcome`, a
/// `unique` `visitors` and a pool `coupons`.
pub const PRIMITIVES: &str = r#"[[request.quotas]]
name = "flash"
size = 100
ttl = "1h"

[[request.once]]
name = "welcome"
window = "1d"

[[request.unique]]
name = "visitors"
window = "1h"

[[request.pools]]
name = "coupons"
ttl = "1h""#;
