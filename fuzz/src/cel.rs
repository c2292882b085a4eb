//! The `cel` target: counter filters and derived fields in CEL.

use std::borrow::Cow;

use tally::config::{Program, Val};

/// `data` is lines of text: the expression, then one value per field it reads (`null`,
/// `true`/`false`, an integer, a float, or else a string; missing: `null`). Compiled as a
/// derived field and as a filter; a program that compiles evaluates the same way twice, and a
/// filter answers a boolean or an error, never a panic.
pub fn cel(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let expr = lines.next().unwrap_or_default();
    // Compiled first: a program outlives the values it is evaluated with.
    let (program, filter) = (Program::compile(expr), Program::filter(expr));
    let values: Vec<&str> = lines.collect();
    let val = |i: usize| -> Val<'_> {
        match values.get(i).copied() {
            None | Some("null") => Val::Null,
            Some("true") => Val::Bool(true),
            Some("false") => Val::Bool(false),
            Some(v) => v
                .parse::<i64>()
                .map(Val::Int)
                .or_else(|_| v.parse::<f64>().map(Val::Double))
                .unwrap_or(Val::Str(Cow::Borrowed(v))),
        }
    };
    if let Ok(program) = &program {
        let first = program.eval_with(&val).map(|v| format!("{v:?}"));
        let again = program.eval_with(&val).map(|v| format!("{v:?}"));
        assert_eq!(first.is_ok(), again.is_ok());
        if let (Ok(a), Ok(b)) = (first, again) {
            // NaN is not equal to itself; anything else must be.
            assert!(a == b || a.contains("NaN"), "{a} then {b}");
        }
    }
    if let Ok(filter) = &filter {
        let _ = filter.test_with(&val);
    }
}
