//! Looking up a counter's value by name: dimension values given as name → value (a query
//! string, a JSON object, CLI flags) in the counter's dimension order, and the time a caller may
//! name. Every front end (HTTP queries, hits, the CLI, an embedder) checks input here, with one
//! error type.

use std::collections::BTreeMap;

use super::CounterSpec;
use crate::window::MIN_TS_MS;

/// Why given dimension values or a time cannot address a counter's key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No counter of that name.
    #[error("unknown counter `{0}`")]
    UnknownCounter(String),
    /// A dimension of the counter was not given.
    #[error("missing dimension `{0}`")]
    MissingDimension(String),
    /// A given name is not a dimension of the counter.
    #[error("`{given}` is not a dimension of this counter (dimensions: {dimensions:?})")]
    UnknownDimension {
        /// The name given.
        given: String,
        /// The counter's dimensions.
        dimensions: Vec<String>,
    },
    /// The time lies before year 1 or further ahead than allowed.
    #[error("`at` {at_ms} is before year 1 or more than decode.max_future ahead")]
    TimeOutOfRange {
        /// The time given, Unix ms.
        at_ms: i64,
    },
}

impl CounterSpec {
    /// `values` in dimension order: every dimension given, nothing else.
    pub fn values_in_order<'a>(
        &self,
        values: &'a BTreeMap<String, String>,
    ) -> Result<Vec<&'a str>, LookupError> {
        if let Some(given) = values.keys().find(|k| !self.dimensions.contains(k)) {
            return Err(LookupError::UnknownDimension {
                given: given.clone(),
                dimensions: self.dimensions.clone(),
            });
        }
        self.dimensions
            .iter()
            .map(|d| {
                values
                    .get(d)
                    .map(String::as_str)
                    .ok_or_else(|| LookupError::MissingDimension(d.clone()))
            })
            .collect()
    }
}

/// Check a time a caller names for a write: not before year 1, not more than `max_future_ms`
/// after `now_ms` (as for events: a far-future time would make a key live for millennia).
pub fn check_at(at_ms: i64, now_ms: i64, max_future_ms: i64) -> Result<i64, LookupError> {
    if (MIN_TS_MS..=now_ms.saturating_add(max_future_ms)).contains(&at_ms) {
        Ok(at_ms)
    } else {
        Err(LookupError::TimeOutOfRange { at_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CounterConfig;

    fn spec() -> CounterSpec {
        let mut c = CounterConfig::reference();
        c.name = "flow".into();
        c.dimensions = vec!["app".into(), "ip".into()];
        c.key = "flow:{app}:{ip}:{yyyyMMddHH}".into();
        CounterSpec::compile(&c).unwrap()
    }

    fn given(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn values_follow_the_dimension_order_not_the_given_order() {
        let v = given(&[("ip", "1.2.3.4"), ("app", "a")]);
        assert_eq!(spec().values_in_order(&v).unwrap(), ["a", "1.2.3.4"]);
    }

    #[test]
    fn a_missing_or_unknown_dimension_is_named() {
        assert_eq!(
            spec().values_in_order(&given(&[("app", "a")])),
            Err(LookupError::MissingDimension("ip".into()))
        );
        let err = spec()
            .values_in_order(&given(&[("app", "a"), ("ip", "x"), ("user", "u")]))
            .unwrap_err();
        assert!(matches!(err, LookupError::UnknownDimension { ref given, .. } if given == "user"));
    }

    #[test]
    fn times_before_year_one_or_too_far_ahead_are_refused() {
        let now = 1_700_000_000_000;
        assert_eq!(check_at(now + 1000, now, 1000), Ok(now + 1000));
        assert!(check_at(now + 1001, now, 1000).is_err());
        assert!(check_at(MIN_TS_MS - 1, now, 1000).is_err());
        assert!(check_at(i64::MAX, i64::MAX - 1, i64::MAX).is_ok());
    }
}
