//! Checking a real answer against the one the README shows: the status, the headers shown, and
//! every field of the JSON shown (`…` stands for any value, `,…` for more fields or elements).

use std::collections::BTreeMap;

use serde_json::Value;

/// Fields and headers whose value in the README is one example among many, because it depends
/// on the time or on the calls before: a number must be a number, a string or header value must
/// match with every run of digits masked. Any other field shown must match exactly.
pub const VARYING: &[(&str, &str)] = &[
    ("value", "the README shows a counter after earlier hits"),
    ("taken", "the README shows the 17th taker"),
    ("fence", "the README shows the 42nd holder"),
    ("key", "a key names the current window"),
    ("retry_after_ms", "the time left until the next unit"),
    ("ratelimit", "units remaining and seconds to each reset"),
    ("retry-after", "seconds to wait"),
];

/// What a command answered: an HTTP exchange (curl) or a process' stdout (tally).
pub struct Answer {
    /// HTTP status, or None for a command's output.
    pub status: Option<u16>,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// Parse what `curl -i` printed: status line, headers, a blank line, the body.
    pub fn from_curl(stdout: &str) -> Result<Answer, String> {
        let (head, body) = stdout
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no HTTP head in curl's output: {stdout:?}"))?;
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line in {head:?}"))?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Answer {
            status: Some(status),
            headers,
            body: body.to_string(),
        })
    }

    /// The HTTP status the README shows (`# HTTP/1.1 429 …`), if it shows one.
    pub fn shown_status(shown: &[String]) -> Option<u16> {
        shown
            .iter()
            .find_map(|l| l.strip_prefix("HTTP/"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
    }

    /// Check this answer against the lines shown. A placeholder string the README shows
    /// (`"7f3c…"`) is bound to the real value in `bindings`, so that later examples using it
    /// (`-d '{"token":"7f3c…"}'`) run with the real one.
    pub fn check(
        &self,
        shown: &[String],
        bindings: &mut BTreeMap<String, String>,
    ) -> Result<(), String> {
        match (self.status, Answer::shown_status(shown)) {
            (Some(got), Some(want)) if got != want => {
                return Err(format!("status {got}, README shows {want}"));
            }
            (Some(got), None) if !(200..300).contains(&got) => {
                return Err(format!("status {got}, expected 2xx: {}", self.body));
            }
            _ => {}
        }
        for line in shown {
            if line.starts_with("HTTP/") {
                continue;
            }
            if line.starts_with('{') {
                let want = parse_shown(line)?;
                let got: Value = serde_json::from_str(self.body.trim())
                    .map_err(|e| format!("answer is not JSON ({e}): {}", self.body))?;
                same_json("", &want, &got, bindings)?;
                continue;
            }
            let (name, want) = line.split_once(": ").expect("header line");
            let name = name.to_ascii_lowercase();
            let got = self
                .headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| format!("no header {name}, README shows {line}"))?;
            same_text(&name, want, got)?;
        }
        Ok(())
    }
}

/// The README's JSON with its ellipses made JSON: `,…}` and `,…]` (more fields, more
/// elements) are dropped, a bare `…` (any value) becomes the string `"…"`.
fn parse_shown(text: &str) -> Result<Value, String> {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
            out.push(c);
        } else if c == ',' && chars.get(i + 1) == Some(&'…') {
            i += 1; // `,…` before `}` or `]`: nothing to check
        } else if c == '…' {
            out.push_str("\"…\"");
        } else {
            in_string = c == '"';
            out.push(c);
        }
        i += 1;
    }
    serde_json::from_str(&out).map_err(|e| format!("README answer is not JSON ({e}): {text}"))
}

fn varying(name: &str) -> bool {
    VARYING.iter().any(|(n, _)| *n == name)
}

/// Every run of ASCII digits as one `0`.
fn mask_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('0') {
            out.push('0');
        }
    }
    out
}

fn same_text(name: &str, want: &str, got: &str) -> Result<(), String> {
    if want == got || (varying(name) && mask_digits(want) == mask_digits(got)) {
        return Ok(());
    }
    Err(format!("{name}: got {got:?}, README shows {want:?}"))
}

/// `got` has every field `want` shows, with the same value (see [`VARYING`]); `name` is the
/// field's name (elements of an array keep the array's).
fn same_json(
    name: &str,
    want: &Value,
    got: &Value,
    bindings: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    match (want, got) {
        (Value::String(w), _) if w == "…" => Ok(()),
        (Value::String(w), Value::String(g)) if w.contains('…') => {
            bindings.insert(w.clone(), g.clone());
            Ok(())
        }
        (Value::String(w), Value::String(g)) => same_text(name, w, g),
        (Value::Number(_), Value::Number(_)) if varying(name) => Ok(()),
        (Value::Object(w), Value::Object(g)) => w.iter().try_for_each(|(k, wv)| {
            let gv = g
                .get(k)
                .ok_or_else(|| format!("no field {k:?} in the answer {got}"))?;
            same_json(k, wv, gv, bindings)
        }),
        (Value::Array(w), Value::Array(g)) if w.len() <= g.len() => w
            .iter()
            .zip(g)
            .try_for_each(|(wv, gv)| same_json(name, wv, gv, bindings)),
        _ if want == got => Ok(()),
        _ => Err(format!("{name}: got {got}, README shows {want}")),
    }
}

#[test]
fn ellipses_placeholders_and_varying_fields() {
    let shown = vec![
        "HTTP/1.1 429 Too Many Requests".to_string(),
        "ratelimit: \"a\";r=0;t=1".to_string(),
        r#"{"ok":false,"token":"7f3c…","key":"k:2026112401","at":…,"list":[{"n":1,…},…],"value":7}"#
            .to_string(),
    ];
    let answer = Answer {
        status: Some(429),
        headers: vec![("ratelimit".into(), "\"a\";r=10;t=41".into())],
        body: r#"{"ok":false,"token":"abc","key":"k:2026112510","at":5,"list":[{"n":1,"m":2},{"n":3}],"value":1,"more":0}"#
            .into(),
    };
    let mut bindings = BTreeMap::new();
    answer.check(&shown, &mut bindings).unwrap();
    assert_eq!(bindings.get("7f3c…").map(String::as_str), Some("abc"));

    let wrong = |body: &str| Answer {
        status: Some(429),
        headers: answer.headers.clone(),
        body: body.into(),
    };
    let fails = |a: Answer| a.check(&shown, &mut BTreeMap::new()).is_err();
    assert!(fails(wrong(
        r#"{"ok":true,"token":"a","key":"k:1","at":5,"list":[{"n":1}],"value":1}"#
    )));
    assert!(fails(wrong(
        r#"{"ok":false,"token":"a","key":"x:1","at":5,"list":[{"n":1}],"value":1}"#
    )));
    assert!(fails(wrong(
        r#"{"ok":false,"token":"a","key":"k:1","at":5,"list":[{"n":2}],"value":1}"#
    )));
    assert!(fails(wrong(
        r#"{"ok":false,"token":"a","key":"k:1","list":[{"n":1}],"value":1}"#
    )));
    assert!(fails(Answer {
        status: Some(200),
        ..wrong(&answer.body)
    }));
}
