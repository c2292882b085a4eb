//! When the state of a quota or a pool is dropped, and how the scripts are told (`lua/expiry.lua`).

use std::time::Duration;

use redis::Cmd;

/// When a primitive's state is dropped; every call that writes moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// At this Unix time, ms (e.g. the end of a sale), as the caller's clock says.
    At(i64),
    /// This long after each call that writes, by Redis' clock: what a configured ttl means, and
    /// safe from a host clock that is off (with `At(now + ttl)`, a clock an hour behind made a
    /// 30-minute quota expire on every take, resetting its count).
    In(Duration),
}

impl Expiry {
    /// The script argument: `<ms>` or `+<ms>` (at least 1 ms).
    pub(crate) fn push(self, cmd: &mut Cmd) {
        match self {
            Expiry::At(ms) => cmd.arg(ms),
            Expiry::In(ttl) => cmd.arg(format!("+{}", ttl.as_millis().max(1))),
        };
    }
}
