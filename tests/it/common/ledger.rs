//! Every request-path primitive driven over HTTP by several threads, with a ledger of what each
//! call was answered: what `proxy_faults` compares with what Redis holds afterwards (see
//! `truth.rs`). One table of primitives, one worker loop: a primitive is its subjects, its
//! request and how its answers read.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_testkit::http::Client;

/// Units every limit policy admits per subject, in its window of `LIMIT_WINDOW`.
pub const LIMIT: u64 = 5;
/// A year (the longest window is 366 days): no window ends during the test, and a GCRA unit is
/// 73 days (the test's seconds are nothing beside it).
pub const LIMIT_WINDOW: &str = "365d";
/// `LIMIT_WINDOW`, µs.
pub const WINDOW_US: i64 = 365 * 86_400 * 1_000_000;
/// Calls per limit subject: more than `LIMIT`, so each subject is driven past its limit.
const LIMIT_ASKS: u64 = 8;
/// Calls per `once` subject: the first may answer first, the others must not.
const ONCE_ASKS: u64 = 3;
/// A lock lease: far longer than a holder holds it (a few ms) plus the response timeout, so
/// a granted lease cannot expire while its holder is inside.
pub const LOCK_TTL_MS: u64 = 3000;

/// A primitive of the request path, as the test configures it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/hit` on counter `hits` (four keys).
    Hit,
    /// `/v1/limit` on the policy named after its algorithm (`LIMIT` per subject).
    Limit(&'static str),
    /// `/v1/quota` on `q` (once per user, every user new).
    Quota,
    /// `/v1/once` on `o`.
    Once,
    /// `/v1/unique` on `uq` (ten new items per subject).
    Unique,
    /// `/v1/pool` on `p` (filled before the faults, every user new).
    Pool,
    /// `/v1/locks/L`: acquire, hold, release.
    Lock,
}

/// Every primitive, each limit algorithm once.
pub const KINDS: [Kind; 10] = [
    Kind::Hit,
    Kind::Limit("fixed"),
    Kind::Limit("sliding_log"),
    Kind::Limit("sliding_counter"),
    Kind::Limit("gcra"),
    Kind::Quota,
    Kind::Once,
    Kind::Unique,
    Kind::Pool,
    Kind::Lock,
];

/// What one call was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Got {
    /// It took effect and said so: counted, admitted, first, given (the item), acquired (the
    /// lease's token).
    Yes(String),
    /// Answered without effect: denied, sold out, not first, empty, busy; a call refused before
    /// it ran (503 `redis-unavailable`: the documented "did not run", for every primitive).
    No,
    /// It may or may not have run: a 503 `outcome-unknown`, a limit decided without Redis
    /// (`on_redis_error = "closed"`).
    Unknown,
    /// An answer no correct tally gives here (a new user already served): `.0` says which.
    Odd(String),
}

/// One call: who asked, what came back.
pub struct Call {
    pub subject: String,
    pub got: Got,
    /// From sending the call to its answer.
    pub took: Duration,
}

/// Mutual exclusion as the lock's holders see it.
#[derive(Default)]
pub struct LockFloor {
    /// Set while a holder is inside.
    inside: AtomicBool,
    /// Grants made while another holder was inside.
    pub overlaps: AtomicU64,
    /// Grants whose token Redis did not hold when the holder looked (directly).
    pub not_in_redis: AtomicU64,
    /// Releases answered 503 (the fault reached the lock there too).
    pub releases_unknown: AtomicU64,
    /// The lock's owner key, found at the first grant.
    pub owner_key: OnceLock<String>,
}

/// The calls of one primitive.
pub struct Ledger {
    pub kind: Kind,
    seq: AtomicU64,
    calls: Mutex<Vec<Call>>,
}

impl Kind {
    /// The row's primitive in the accuracy table.
    pub fn label(self) -> String {
        match self {
            Kind::Hit => "hit".into(),
            Kind::Limit(a) => format!("limit, {a} ({LIMIT} per subject)"),
            Kind::Quota => "quota".into(),
            Kind::Once => "once".into(),
            Kind::Unique => "unique".into(),
            Kind::Pool => "pool".into(),
            Kind::Lock => "lock".into(),
        }
    }

    fn subject(self, seq: u64) -> String {
        match self {
            Kind::Hit => format!("k{}", seq % 4),
            Kind::Limit(_) => format!("s{}", seq / LIMIT_ASKS),
            Kind::Quota | Kind::Pool => format!("u{seq}"),
            Kind::Once => format!("s{}", seq / ONCE_ASKS),
            Kind::Unique => format!("s{}/i{seq}", seq / 10),
            Kind::Lock => "L".into(),
        }
    }

    fn request(self, s: &str) -> (String, String) {
        let (path, body) = match self {
            Kind::Hit => (
                "/v1/hit",
                format!(r#"{{"counter":"hits","dimensions":{{"k":"{s}"}}}}"#),
            ),
            Kind::Limit(p) => (
                "/v1/limit",
                format!(r#"{{"policies":["{p}"],"subject":"{s}"}}"#),
            ),
            Kind::Quota => ("/v1/quota", format!(r#"{{"quota":"q","user":"{s}"}}"#)),
            Kind::Once => ("/v1/once", format!(r#"{{"name":"o","subject":"{s}"}}"#)),
            Kind::Unique => {
                let (subject, item) = s.split_once('/').unwrap_or_default();
                let body = format!(r#"{{"name":"uq","subject":"{subject}","item":"{item}"}}"#);
                ("/v1/unique", body)
            }
            Kind::Pool => ("/v1/pool", format!(r#"{{"pool":"p","user":"{s}"}}"#)),
            Kind::Lock => (
                "/v1/locks/L/acquire",
                format!(r#"{{"ttl_ms":{LOCK_TTL_MS}}}"#),
            ),
        };
        (path.to_string(), body)
    }

    fn read(self, status: u16, b: &Value) -> Got {
        let odd = || Got::Odd(format!("{status} {b}"));
        if status == 503 {
            let kind = b["type"].as_str().unwrap_or("");
            return match self {
                Kind::Limit(_) => odd(),
                _ if kind.ends_with("/redis-unavailable") => Got::No,
                _ if kind.ends_with("/outcome-unknown") => Got::Unknown,
                _ => odd(),
            };
        }
        if status != 200 {
            return odd();
        }
        let outcome = b["outcome"].as_str().unwrap_or("");
        match self {
            Kind::Hit if b["value"].is_i64() => Got::Yes(String::new()),
            Kind::Limit(_) if b["without_redis"] == true => Got::Unknown,
            Kind::Limit(_) if b["admitted"] == true => Got::Yes(String::new()),
            Kind::Limit(_) if b["admitted"] == false => Got::No,
            Kind::Quota if outcome == "admitted" => Got::Yes(String::new()),
            Kind::Quota if outcome == "sold_out" => Got::No,
            Kind::Once if b["ok"] == true => Got::Yes(String::new()),
            Kind::Once if b["ok"] == false => Got::No,
            Kind::Unique if b["count"].is_u64() => Got::Yes(String::new()),
            Kind::Pool if outcome == "given" => Got::Yes(b["item"].as_str().unwrap_or("").into()),
            Kind::Pool if outcome == "empty" => Got::No,
            Kind::Lock if b["acquired"] == true => {
                Got::Yes(b["lease"]["token"].as_str().unwrap_or("").into())
            }
            Kind::Lock if b["acquired"] == false => Got::No,
            _ => odd(),
        }
    }
}

impl Ledger {
    pub fn new(kind: Kind) -> Ledger {
        Ledger {
            kind,
            seq: AtomicU64::new(0),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Call until `stop`; a lock's grants are held (checked against `floor` and Redis through
    /// `direct`) and released.
    pub fn drive(
        &self,
        port: u16,
        stop: &AtomicBool,
        floor: &LockFloor,
        direct: &mut redis::Connection,
    ) {
        let client = Client::new(Duration::from_secs(20));
        while !stop.load(SeqCst) {
            let subject = self.kind.subject(self.seq.fetch_add(1, SeqCst));
            let (path, body) = self.kind.request(&subject);
            // tally answers every call within its request timeout (10 s), faults or not.
            let sent = Instant::now();
            let answer = client
                .post_json(port, &path, &body)
                .unwrap_or_else(|e| panic!("tally did not answer {path}: {e}"));
            let json = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
            let (got, took) = (self.kind.read(answer.status, &json), sent.elapsed());
            if let (Kind::Lock, Got::Yes(token)) = (self.kind, &got) {
                floor.hold(token, direct);
                let release = format!(r#"{{"token":"{token}"}}"#);
                // Its answer does not matter: a release that is lost leaves a lease that
                // expires.
                let released = client.post_json(port, "/v1/locks/L/release", &release);
                if released.is_ok_and(|a| a.status == 503) {
                    floor.releases_unknown.fetch_add(1, SeqCst);
                }
            }
            self.calls.lock().unwrap().push(Call { subject, got, took });
        }
    }

    /// The calls made, in no particular order.
    pub fn calls(&self) -> std::sync::MutexGuard<'_, Vec<Call>> {
        self.calls.lock().unwrap()
    }
}

impl LockFloor {
    /// Inside the lock: no other holder may be, and Redis must hold this token.
    fn hold(&self, token: &str, direct: &mut redis::Connection) {
        if self.inside.swap(true, SeqCst) {
            self.overlaps.fetch_add(1, SeqCst);
        }
        let held = self.holder(direct);
        if held.as_deref() != Some(token) {
            self.not_in_redis.fetch_add(1, SeqCst);
        }
        self.inside.store(false, SeqCst);
    }

    /// The token Redis holds for the lock now, read directly.
    pub fn holder(&self, direct: &mut redis::Connection) -> Option<String> {
        if self.owner_key.get().is_none() {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*lock:L:owner*")
                .query(direct)
                .unwrap();
            // Not taken yet: looked for again next time.
            let _ = self.owner_key.set(keys.into_iter().next()?);
        }
        let key = self.owner_key.get()?;
        redis::cmd("GET").arg(key).query(direct).unwrap()
    }

    /// Every lease token Redis held while `stop` was unset, sampled every 2 ms: a lease no
    /// answer told of (a script run twice, or one whose answer was lost) is held for its whole
    /// ttl, so it is seen.
    pub fn watch(&self, stop: &AtomicBool, direct: &mut redis::Connection) -> HashSet<String> {
        let mut seen = HashSet::new();
        while !stop.load(SeqCst) {
            seen.extend(self.holder(direct));
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    }
}
