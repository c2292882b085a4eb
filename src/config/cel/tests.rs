use std::borrow::Cow;

use super::{CelError, EvalError, Program, Val};

/// Runs `text` with the named values (others null).
fn run(text: &str, fields: &[(&str, Val<'static>)]) -> Result<Val<'static>, EvalError> {
    let p = Program::compile(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let vars: Vec<Val> = p
        .vars()
        .iter()
        .map(|v| {
            fields
                .iter()
                .find(|(n, _)| n == v)
                .map_or(Val::Null, |(_, x)| x.clone())
        })
        .collect();
    p.eval(&vars).map(|v| match v {
        Val::Str(s) => Val::Str(Cow::Owned(s.into_owned())),
        Val::Null => Val::Null,
        Val::Bool(b) => Val::Bool(b),
        Val::Int(n) => Val::Int(n),
        Val::UInt(n) => Val::UInt(n),
        Val::Double(d) => Val::Double(d),
    })
}

fn s(text: &str) -> Val<'static> {
    Val::Str(Cow::Owned(text.into()))
}

#[test]
fn filters_decide_like_cel() {
    let event = [
        ("status", Val::Int(503)),
        ("method", s("POST")),
        ("request.path", s("/v1/orders")),
    ];
    for (text, want) in [
        ("status >= 500 && method == \"POST\"", true),
        ("status >= 500 && method == 'GET'", false),
        ("status < 500 || method in ['POST', 'PUT']", true),
        ("!(status == 503)", false),
        (
            "request.path.startsWith('/v1/') && request.path.endsWith('orders')",
            true,
        ),
        ("request.path.contains('ord') && size(method) == 4", true),
        ("method.lowerAscii() == 'post'", true),
        ("status / 100 == 5 && status % 100 == 3", true),
        ("status == 503.0 && status > 502u", true),
        ("has(request.path) && !has(request.query)", true),
        ("missing == null && missing != 'x'", true),
        // An error on one side of && / || is absorbed by the other side's answer, as in CEL.
        ("missing > 3 && false", false),
        ("missing > 3 || status == 503", true),
        ("status == 503 ? method == 'POST' : false", true),
        (
            "int('42') == 42 && double(status) == 503.0 && string(status) == '503'",
            true,
        ),
    ] {
        assert_eq!(run(text, &event), Ok(Val::Bool(want)), "{text}");
    }
}

#[test]
fn derived_values() {
    let event = [("status", Val::Int(404)), ("route", s("/a"))];
    assert_eq!(run("string(status / 100) + 'xx'", &event), Ok(s("4xx")));
    assert_eq!(run("route + ':' + string(status)", &event), Ok(s("/a:404")));
    assert_eq!(run("status >= 500 ? 'error' : 'ok'", &event), Ok(s("ok")));
    assert_eq!(run("-status", &event), Ok(Val::Int(-404)));
}

#[test]
fn runtime_errors_are_errors_not_answers() {
    let event = [("n", Val::Int(i64::MAX)), ("t", s("x"))];
    for (text, error) in [
        ("n + 1 > 0", EvalError::Arithmetic),
        ("n / 0 > 0", EvalError::Arithmetic),
        ("t > 3", EvalError::Type),
        ("missing > 3", EvalError::Type),
        ("int(t) == 1", EvalError::Conversion),
        ("t && true", EvalError::Type),
        ("missing > 3 && true", EvalError::Type),
    ] {
        assert_eq!(run(text, &event), Err(error), "{text}");
    }
    let p = Program::filter("t").unwrap();
    assert_eq!(p.test_with(&|_| s("x")), Err(EvalError::NotBool));
}

#[test]
fn refusals_say_where_and_why() {
    let e = Program::compile("status >= ").unwrap_err();
    assert!(matches!(e, CelError::Syntax { .. }), "{e:?}");
    assert!(e.to_string().starts_with("1:"), "{e}");
    for (text, says) in [
        (
            "status >= 500 &&\n  matches(method, 'x')",
            "2:10: function `matches` is not supported",
        ),
        ("items[0] == 1", "indexing is not supported"),
        ("[1, 2] == x", "a list is allowed only after `in`"),
        ("x in y", "`in` takes a list of literals"),
        ("x.all(y, y > 1)", "macros"),
        ("{'a': 1} == x", "maps"),
        ("{'a': 1}.a == 1", "from a field name only"),
        ("b'x' == y", "bytes"),
        ("size(a, b) == 1", "`size` takes one value"),
        ("startsWith(a, 'x')", "`startsWith` takes a receiver"),
    ] {
        let e = Program::compile(text).unwrap_err();
        assert!(matches!(e, CelError::Unsupported { .. }), "{text}: {e:?}");
        assert!(e.to_string().contains(says), "{text}: {e}");
    }
    for (text, says) in [("status + 1", "gives a number"), ("'a'", "gives a string")] {
        let e = Program::filter(text).unwrap_err();
        assert!(matches!(e, CelError::NotACondition(_)), "{text}: {e:?}");
        assert!(e.to_string().contains(says), "{text}: {e}");
    }
    assert!(Program::filter("x ? true : false").is_ok());
}

#[test]
fn a_field_read_twice_is_one_var() {
    let p = Program::compile("a > 1 && a < 5 && b.c == 'x' && has(b.d)").unwrap();
    assert_eq!(p.vars(), ["a", "b.c", "b.d"]);
}

/// A syntax error names the line and column of the fault itself (1-based, in characters), and
/// an incomplete conditional says what is missing.
#[test]
fn syntax_errors_point_at_the_fault() {
    for (text, at) in [
        ("a + * b", "1:5: "),
        ("a ==\n  * 2", "2:3: "),
        ("a == 'x", "1:6: "),
        ("a == 1)", "1:7: "),
        ("(a == 1", "1:8: "),
    ] {
        let e = Program::compile(text).unwrap_err();
        assert!(matches!(e, CelError::Syntax { .. }), "{text:?}: {e:?}");
        assert!(e.to_string().starts_with(at), "{text:?}: {e}");
    }
    let e = Program::compile("x ? 1").unwrap_err().to_string();
    assert!(e.contains("condition ? then : else"), "{e}");
    assert!(!e.contains("ExprContext"), "{e}");
}
