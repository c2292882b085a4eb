//! The record of one key of a window: keyed by the counter key (see [`super::cells::Cell`]),
//! valued with JSON that a consumer can read without tally's configuration.

use serde::Serialize;
use tally_counters::model::CounterSpec;
use tally_counters::window::Window;

use super::cells::Cell;

/// Why a record is produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The window closed: its final value.
    Final,
    /// The value changed after the window was published (a late event).
    Correction,
    /// `when = "updates"`: the changed value of an open window.
    Update,
    /// `late = "drop"`: a late change, to the late topic (its value is the would-be correction).
    Late,
    /// The window's keys expired: the key with a null value.
    Tombstone,
}

impl Emit {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Emit::Final => "final",
            Emit::Correction => "correction",
            Emit::Update => "update",
            Emit::Late => "late",
            Emit::Tombstone => "tombstone",
        }
    }
}

/// The JSON value of a record.
#[derive(Debug, Serialize)]
struct Value<'a> {
    counter: &'a str,
    /// Dimension name → value.
    dimensions: serde_json::Map<String, serde_json::Value>,
    /// Window bounds, Unix ms: `[window_start, window_end)`.
    window_start: i64,
    window_end: i64,
    value: i64,
    /// Leaderboards: the best members, best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    top: Option<Vec<Member<'a>>>,
    /// The watermark (after allowed lateness, Unix ms) the window was first published at.
    watermark: i64,
    /// false for an update of an open window.
    #[serde(rename = "final")]
    is_final: bool,
    correction: bool,
}

/// One member of a leaderboard's record.
#[derive(Debug, Serialize)]
struct Member<'a> {
    member: &'a str,
    score: i64,
}

/// The JSON value of `cell` of `window`.
pub fn value(
    spec: &CounterSpec,
    window: &Window,
    cell: &Cell,
    watermark: i64,
    how: Emit,
) -> String {
    let dimensions = spec
        .dimensions
        .iter()
        .zip(&cell.dims)
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let v = Value {
        counter: &spec.name,
        dimensions,
        window_start: window.start_ms,
        window_end: window.end_ms,
        value: cell.value,
        top: cell.top.as_ref().map(|top| {
            top.iter()
                .map(|(member, score)| Member {
                    member,
                    score: *score,
                })
                .collect()
        }),
        watermark,
        is_final: how != Emit::Update,
        correction: matches!(how, Emit::Correction | Emit::Late),
    };
    serde_json::to_string(&v).expect("plain data serializes")
}
