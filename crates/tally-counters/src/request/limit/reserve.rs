//! Reserve → settle: a fixed-window policy whose cost is known only after the response (LLM
//! tokens). The request reserves an upper bound of its cost atomically with the admission
//! decision (admitted only if settled usage + live reservations + this reservation ≤ limit);
//! the response settles the true cost by request id exactly once, which releases the
//! reservation and charges the cost (at most `max_extra` above what was reserved). A reservation
//! never settled is released at its expiry. The script's side is `lua/reserve.lua`.
//!
//! Only the fixed window supports it: its state is one count per window, so a reservation's
//! release and a settle's charge are additions to it. (A sliding log would need the settled
//! units back-dated into the log, GCRA its theoretical arrival time moved back: not exact.)

use std::time::Duration;

use super::{Algorithm, LimitPolicy};
use crate::request::RequestError;

/// What a reserving call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// On the request: decided against settled usage plus live reservations; when admitted and
    /// the call names a request id, its cost is held as a reservation (without an id, charged
    /// at once). A cost of 0 checks that a unit is left.
    Reserve,
    /// At stream done: the request's true cost, settled once per request id.
    Settle,
}

/// A reserving policy's part of an [`super::Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation<'a> {
    /// Reserve or settle.
    pub phase: Phase,
    /// The request's id (Envoy's `x-request-id`): what a settle finds its reservation by; ''
    /// on a reserve: none (a plain charge or check that still counts live reservations).
    pub id: &'a str,
    /// How long a reservation (and a settle's record, which makes a retried settle change
    /// nothing) is kept.
    pub expiry: Duration,
    /// Most units a settle charges above its reservation (a true cost beyond it is cut there).
    pub max_extra: u64,
}

/// Longest request id, in bytes (it is a hash field and a sorted-set member in Redis).
pub const MAX_ID_BYTES: usize = 512;

/// Longest reservation expiry: a day (held budget must come back).
pub const MAX_RESERVATION: Duration = Duration::from_secs(86_400);

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The reservation was released and `charged` units recorded (the true cost, cut at the
    /// reservation + `max_extra`).
    Settled {
        /// Units recorded.
        charged: u64,
        /// Units the reservation held (now released).
        released: u64,
    },
    /// The request was settled before: nothing changed (a retried or duplicated settle).
    AlreadySettled,
    /// No live reservation had this id (it expired, or was never made): the true cost was
    /// recorded as it is.
    Unreserved {
        /// Units recorded.
        charged: u64,
    },
}

impl Settled {
    /// Parse the four reply values of entry `entry` (an index entry: `settle` in
    /// `lua/reserve.lua`) of the limit script's reply.
    pub(super) fn from_reply(reply: &redis::Value, entry: usize) -> Option<Settled> {
        let redis::Value::Array(items) = reply else {
            return None;
        };
        let int = |i: usize| crate::script::int(items.get(2 + 4 * entry + i)?).ok();
        let (result, charged, released) = (int(0)?, int(1)?, int(2)?);
        let charged = u64::try_from(charged).ok()?;
        Some(match result {
            1 => Settled::Settled {
                charged,
                released: u64::try_from(released).ok()?,
            },
            2 => Settled::AlreadySettled,
            3 => Settled::Unreserved { charged },
            _ => return None,
        })
    }
}

/// Why a policy cannot reserve, or `None` when it can.
pub fn unsupported(policy: &LimitPolicy) -> Option<String> {
    let name = match policy.algorithm {
        Algorithm::Fixed => return None,
        Algorithm::SlidingLog => "sliding_log",
        Algorithm::SlidingCounter => "sliding_counter",
        Algorithm::Gcra => "gcra",
    };
    Some(format!(
        "reservations need the fixed algorithm (`{name}` cannot release or settle a reservation \
         exactly)"
    ))
}

impl Reservation<'_> {
    /// The key kinds of a reserving policy's state and its index (apart from a plain fixed
    /// window's: a policy that starts or stops reserving starts from new keys).
    pub(super) const KINDS: (&'static str, &'static str) =
        ("limit.fixed.reserve", "limit.fixed.reserve.index");

    /// Check what the script cannot: the id's size, the expiry's range.
    pub(super) fn validate(&self, policy: &LimitPolicy) -> Result<(), RequestError> {
        let invalid = |why: String| Err(RequestError::Invalid(why));
        if let Some(why) = unsupported(policy) {
            return invalid(format!("limit `{}`: {why}", policy.name));
        }
        if self.id.len() > MAX_ID_BYTES {
            return invalid(format!(
                "request id of {} bytes; at most {MAX_ID_BYTES} are accepted",
                self.id.len()
            ));
        }
        if self.phase == Phase::Settle && self.id.is_empty() {
            return invalid("a settle needs the request's id".into());
        }
        if self.expiry.is_zero() || self.expiry > MAX_RESERVATION {
            return invalid("reservation expiry: must be between 1ms and 1 day".into());
        }
        Ok(())
    }
}
