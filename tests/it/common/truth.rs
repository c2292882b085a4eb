//! What Redis holds after a fault test (read directly, not through tally or the proxy), against
//! what a primitive's calls were answered (`ledger.rs`). A script runs at most once per call, so
//! what Redis holds lies between what was answered "yes" and that plus the calls answered
//! "unknown"; anything above is a script run twice (or an admission past the limit), anything
//! below an acknowledged write lost.

use std::collections::{BTreeMap, HashMap, HashSet};

use redis::Connection;

use super::ledger::{Call, Got, Kind, LockFloor, LIMIT, WINDOW_US};

/// One row of the accuracy table, and what broke.
pub struct Row {
    pub observed: String,
    pub truth: String,
    /// Admitted past the limit, given twice, run twice.
    pub over: i64,
    /// Acknowledged, and not in Redis.
    pub lost: i64,
    /// Calls answered "unknown" (the fault reached this many).
    pub unknown: usize,
    /// Answers no correct tally gives here.
    pub odd: Vec<String>,
}

/// What the test knows beyond the calls: the quota's size, the items filled into the pool,
/// the lock's holders and the tokens Redis was seen holding.
pub struct Context<'a> {
    pub quota_size: u64,
    pub pool_items: usize,
    pub floor: &'a LockFloor,
    pub lock_tokens: &'a HashSet<String>,
}

/// Counts of each answer per subject (or per key of a call).
#[derive(Default, Clone, Copy)]
struct Tally {
    yes: i64,
    unknown: i64,
}

fn keys(c: &mut Connection, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS").arg(pattern).query(c).unwrap()
}

/// The subject a request-path key names: `<prefix>:<kind>:<name>:<subject…>:{tag}` (subjects
/// are `s<n>`, `u<n>`; a once marker's carries its window after `@`).
fn subject_of(key: &str) -> String {
    let field = key.split(':').nth(3).unwrap_or("");
    field
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

fn pos(n: i64) -> i64 {
    n.max(0)
}

/// What a comparison found: (observed, truth, over, lost).
type Measured = (String, String, i64, i64);

/// The calls of one kind and how they were answered: per subject, and in all.
struct Answers<'a> {
    calls: &'a [Call],
    per: HashMap<&'a str, Tally>,
    yes: i64,
    unknown: i64,
}

/// Compare `calls` of `kind` with Redis.
pub fn compare(kind: Kind, calls: &[Call], c: &mut Connection, ctx: &Context) -> Row {
    let mut per: HashMap<&str, Tally> = HashMap::new();
    let mut odd = Vec::new();
    let (mut yes, mut unknown) = (0i64, 0usize);
    for call in calls {
        let t = per.entry(call.subject.as_str()).or_default();
        match &call.got {
            Got::Yes(_) => (t.yes, yes) = (t.yes + 1, yes + 1),
            Got::Unknown => (t.unknown, unknown) = (t.unknown + 1, unknown + 1),
            Got::No => {}
            Got::Odd(what) => odd.push(what.clone()),
        }
    }
    let answers = Answers {
        calls,
        per,
        yes,
        unknown: unknown as i64,
    };
    let (observed, truth, over, lost) = match kind {
        Kind::Hit => hits(&answers, c),
        Kind::Limit(algorithm) => limit(&answers, c, algorithm),
        Kind::Quota => quota(&answers, c, ctx, &mut odd),
        Kind::Once => once(&answers, c),
        Kind::Unique => unique(&answers, c),
        Kind::Pool => pool(&answers, c, ctx, &mut odd),
        Kind::Lock => lock(&answers, ctx),
    };
    Row {
        observed,
        truth,
        over,
        lost,
        unknown,
        odd,
    }
}

/// Hits: what Redis counted.
fn hits(a: &Answers, c: &mut Connection) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let counted: i64 = keys(c, "hits:*")
        .iter()
        .map(|k| redis::cmd("GET").arg(k).query::<i64>(c).unwrap())
        .sum();
    (
        format!("{yes} answered OK, {u} outcome-unknown, {counted} counted"),
        "OK <= counted <= OK + unknown".into(),
        pos(counted - yes - u),
        pos(yes - counted),
    )
}

/// A limit of `algorithm`: what Redis charged per subject.
fn limit(a: &Answers, c: &mut Connection, algorithm: &str) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let charged = charges(c, algorithm);
    let (mut over, mut lost) = (0, 0);
    let subjects: HashSet<&str> = a
        .per
        .keys()
        .copied()
        .chain(charged.keys().map(String::as_str))
        .collect();
    for s in subjects {
        let t = a.per.get(s).copied().unwrap_or_default();
        let n = charged.get(s).copied().unwrap_or(0);
        over += pos(t.yes - LIMIT as i64) + pos(n - t.yes - t.unknown);
        lost += pos(t.yes - n);
    }
    let total: i64 = charged.values().sum();
    (
        format!(
            "{yes} admitted, {u} unknown, {total} charged over {} subjects",
            a.per.len()
        ),
        format!("<= {LIMIT} per subject; admitted <= charged <= admitted + unknown"),
        over,
        lost,
    )
}

/// The quota: its users and its taken count in Redis.
fn quota(a: &Answers, c: &mut Connection, ctx: &Context, odd: &mut Vec<String>) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let users: HashSet<String> = members(c, "*quota:q:users*");
    let taken: i64 = keys(c, "*quota:q:taken*")
        .first()
        .map(|k| redis::cmd("GET").arg(k).query(c).unwrap())
        .unwrap_or(0);
    if taken != users.len() as i64 {
        odd.push(format!("{taken} taken, {} users in Redis", users.len()));
    }
    let (said, maybe) = split(a.calls);
    let over = pos(yes - ctx.quota_size as i64)
        + users
            .iter()
            .filter(|u| !said.contains_key(u.as_str()) && !maybe.contains(u.as_str()))
            .count() as i64;
    let lost = said.keys().filter(|u| !users.contains(**u)).count() as i64;
    (
        format!("{yes} admitted, {u} unknown, {taken} taken in Redis"),
        format!(
            "admitted <= {}; admitted <= taken <= admitted + unknown",
            ctx.quota_size
        ),
        over,
        lost,
    )
}

/// Once: the markers per subject, one per window it was first in.
fn once(a: &Answers, c: &mut Connection) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    // Markers per subject: one per window it was first in (the test may cross a day).
    let mut marked: HashMap<String, i64> = HashMap::new();
    for k in keys(c, "*once:o:*") {
        *marked.entry(subject_of(&k)).or_default() += 1;
    }
    marked.remove("probe");
    let (mut over, mut lost) = (0, 0);
    let subjects: HashSet<&str> = a
        .per
        .keys()
        .copied()
        .chain(marked.keys().map(String::as_str))
        .collect();
    for s in subjects {
        let t = a.per.get(s).copied().unwrap_or_default();
        let m = marked.get(s).copied().unwrap_or(0);
        // First twice in a window, or a marker no answer told of.
        over += pos(t.yes - m.max(1)) + pos(m - t.yes - t.unknown);
        lost += i64::from(m == 0 && t.yes > 0);
    }
    (
        format!(
            "{yes} first over {} subjects, {u} unknown, {} markers",
            a.per.len(),
            marked.values().sum::<i64>()
        ),
        "first at most once per subject; first <= markers <= first + unknown".into(),
        over,
        lost,
    )
}

/// Unique: the items in Redis per subject.
fn unique(a: &Answers, c: &mut Connection) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let mut seen = HashSet::new();
    for k in keys(c, "*unique:uq:*") {
        let items: Vec<String> = redis::cmd("ZRANGE")
            .arg(&k)
            .arg(0)
            .arg(-1)
            .query(c)
            .unwrap();
        seen.extend(items.into_iter().map(|i| format!("{}/{i}", subject_of(&k))));
    }
    let (said, maybe) = split(a.calls);
    let over = seen
        .iter()
        .filter(|p| !said.contains_key(p.as_str()) && !maybe.contains(p.as_str()))
        .count() as i64;
    let lost = said.keys().filter(|p| !seen.contains(**p)).count() as i64;
    (
        format!("{yes} added, {u} unknown, {} items in Redis", seen.len()),
        "added <= items in Redis <= added + unknown".into(),
        over,
        lost,
    )
}

/// The pool: what Redis gave to whom, and what is left.
fn pool(a: &Answers, c: &mut Connection, ctx: &Context, odd: &mut Vec<String>) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let given: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(
            keys(c, "*pool:p:given*")
                .first()
                .cloned()
                .unwrap_or_default(),
        )
        .query(c)
        .unwrap();
    let left: usize = redis::cmd("SCARD")
        .arg(
            keys(c, "*pool:p:items*")
                .first()
                .cloned()
                .unwrap_or_default(),
        )
        .query(c)
        .unwrap();
    let items: HashSet<&String> = given.values().collect();
    if items.len() != given.len() || given.len() + left != ctx.pool_items {
        odd.push(format!(
            "{} given ({} distinct), {left} left of {}",
            given.len(),
            items.len(),
            ctx.pool_items
        ));
    }
    let (said, maybe) = split(a.calls);
    let distinct: HashSet<&&str> = said.values().collect();
    let over = (said.len() - distinct.len()) as i64
        + given
            .keys()
            .filter(|u| !said.contains_key(u.as_str()) && !maybe.contains(u.as_str()))
            .count() as i64;
    let lost = said
        .iter()
        .filter(|(u, i)| given.get(**u).map(String::as_str) != Some(**i))
        .count() as i64;
    (
        format!(
            "{yes} given, {u} unknown, {} given in Redis, {left} left",
            given.len()
        ),
        "each item once; given <= given in Redis <= given + unknown".into(),
        over,
        lost,
    )
}

/// The lock: leases Redis held that no answer told of, and overlapping holders.
fn lock(a: &Answers, ctx: &Context) -> Measured {
    let (yes, u) = (a.yes, a.unknown);
    let granted: HashSet<&str> = a
        .calls
        .iter()
        .filter_map(|c| match &c.got {
            Got::Yes(token) => Some(token.as_str()),
            _ => None,
        })
        .collect();
    let untold = ctx
        .lock_tokens
        .iter()
        .filter(|t| !granted.contains(t.as_str()))
        .count() as i64;
    let overlaps = ctx.floor.overlaps.load(std::sync::atomic::Ordering::SeqCst) as i64;
    let lost = ctx
        .floor
        .not_in_redis
        .load(std::sync::atomic::Ordering::SeqCst) as i64;
    (
            format!("{yes} granted, {u} unknown, {untold} leases in Redis no answer told of, {overlaps} overlaps"),
            "one holder at a time; untold leases <= unknown".into(),
            overlaps + pos(untold - u),
            lost,
        )
}

/// Calls answered yes (subject → what was given, empty when nothing) and the subjects of calls
/// answered unknown.
fn split(calls: &[Call]) -> (HashMap<&str, &str>, HashSet<&str>) {
    let mut said = HashMap::new();
    let mut maybe = HashSet::new();
    for call in calls {
        match &call.got {
            Got::Yes(what) => {
                said.insert(call.subject.as_str(), what.as_str());
            }
            Got::Unknown => {
                maybe.insert(call.subject.as_str());
            }
            _ => {}
        }
    }
    (said, maybe)
}

fn members(c: &mut Connection, pattern: &str) -> HashSet<String> {
    match keys(c, pattern).first() {
        Some(k) => redis::cmd("SMEMBERS").arg(k).query(c).unwrap(),
        None => HashSet::new(),
    }
}

/// Units charged per subject by limit policy `algorithm` (named after its algorithm), from its
/// state: a fixed window's count, a sliding log's entries, a sliding counter's window counts,
/// and GCRA's theoretical arrival time (each unit moves it one interval past Redis' now; the
/// window is a year, so the seconds the test takes are far less than one interval).
fn charges(c: &mut Connection, algorithm: &str) -> HashMap<String, i64> {
    let kind = match algorithm {
        "fixed" => "limit.fixed",
        "sliding_log" => "limit.log",
        "sliding_counter" => "limit.counter",
        _ => "limit.gcra",
    };
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    let now_us = secs * 1_000_000 + micros;
    keys(c, &format!("*{kind}:{algorithm}:*"))
        .into_iter()
        .map(|k| {
            let n: i64 = match algorithm {
                "fixed" => redis::cmd("HGET").arg(&k).arg("n").query(c).unwrap(),
                "sliding_log" => redis::cmd("ZCARD").arg(&k).query(c).unwrap(),
                "sliding_counter" => redis::cmd("HVALS")
                    .arg(&k)
                    .query::<Vec<i64>>(c)
                    .unwrap()
                    .iter()
                    .sum(),
                _ => {
                    let tat: i64 = redis::cmd("GET").arg(&k).query(c).unwrap();
                    let interval = WINDOW_US / LIMIT as i64;
                    (tat - now_us + interval - 1) / interval
                }
            };
            (subject_of(&k), n)
        })
        .collect()
}
