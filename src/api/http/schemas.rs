//! Schemas for answers whose types live below HTTP (the query's), written out for the OpenAPI
//! description and the handlers that return them.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

/// The schema of `query::RangeAnswer` (whose module does not derive it yet), strict: a field
/// the answer gains and this schema lacks fails the `openapi` integration test.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RangeAnswer)]
pub struct RangeAnswerSchema {
    /// Counter name.
    counter: String,
    /// The dimension values asked for.
    dimensions: BTreeMap<String, String>,
    /// Combined over the windows: the sum for counts; the union's cardinality for distinct
    /// counters and leaderboards (null where it cannot be computed, see `notes`).
    value: Option<i64>,
    /// Leaderboards: the best members over the range, `[member, score]`, best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    top: Option<Vec<(String, i64)>>,
    /// Oldest first.
    windows: Vec<WindowValueSchema>,
    /// What the figure does not cover (expired windows, approximations).
    #[serde(skip_serializing_if = "Option::is_none")]
    notes: Option<Vec<String>>,
}

/// The schema of `query::WindowValue`, strict like [`RangeAnswerSchema`].
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = WindowValue)]
pub struct WindowValueSchema {
    /// Window start, Unix ms.
    start_ms: i64,
    /// Window end, Unix ms.
    end_ms: i64,
    /// The stored key.
    key: String,
    /// Hash storage: the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    /// The value; null: nothing stored.
    value: Option<i64>,
    /// The window's keys have expired: a missing value means nothing is kept, not zero.
    expired: bool,
}
