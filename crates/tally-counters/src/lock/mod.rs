//! Locks with fencing tokens.
//!
//! A lock is a lease: `SET key token NX PX ttl` with a random 128-bit token, taken in the same
//! script step as `INCR` of the lock's fencing counter ([`ACQUIRE_LUA`]); release and extend
//! compare the token before they delete or re-expire ([`RELEASE_LUA`], [`EXTEND_LUA`]), so a
//! slow holder can never delete or prolong the next holder's lock.
//!
//! **What a lease cannot promise.** A holder can be paused (GC, SIGSTOP, a VM migration, a long
//! page fault) after it checked that it holds the lock and before it acts; the lease expires
//! meanwhile, another process takes it, and both act. A failover can also lose the lock key
//! (replication is asynchronous) and hand the lock to a second holder. No lease, Redlock
//! included, prevents this: time-based leases assume bounded pauses and clock drift.
//!
//! **What the fencing token adds.** Every acquisition gets a strictly larger number from the
//! fencing counter (it expires [`FENCE_IDLE`] after the lock's last lease ends: a name used
//! once leaves no key forever; a name idle that long starts again from 1). The holder passes it with every write to the protected
//! resource, and the resource refuses a token lower than one it has already seen. A paused
//! holder that wakes up late is then refused instead of overwriting the newer holder's work.
//! (If a failover loses the counter's latest increments, tokens can repeat: keep the resource's
//! check, and use `WAIT` or persistence where that matters.)
//!
//! [`LockGuard`] renews the lease in the background (every ttl/3, up to an optional cap) and
//! tells its holder when the lease is lost: a renewal found another token, or no renewal
//! succeeded for a whole ttl (Redis unreachable: the lease may have expired).

mod guard;

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rand::RngExt;
use serde::Serialize;

use crate::request::{Client, RequestError};
use crate::script::Script;

pub use guard::LockGuard;

/// Longest lock name, bytes (every name is a key, and lock names come from callers).
pub const MAX_NAME_BYTES: usize = 256;

/// How long a fencing counter outlives its lock's last lease (acquire and extend move it).
pub const FENCE_IDLE: Duration = Duration::from_secs(30 * 86_400);

/// The acquire script; see its header.
pub const ACQUIRE_LUA: &str = include_str!("lua/acquire.lua");
/// The release script.
pub const RELEASE_LUA: &str = include_str!("lua/release.lua");
/// The extend script.
pub const EXTEND_LUA: &str = include_str!("lua/extend.lua");
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new("lock_acquire", ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new("lock_release", RELEASE_LUA));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new("lock_extend", EXTEND_LUA));

/// What [`ACQUIRE_LUA`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Taken, with this fencing token.
    Acquired {
        /// The fencing counter after its increment.
        fence: u64,
    },
    /// Held by another token for this many more ms.
    Busy {
        /// PTTL of the lock key.
        held_for_ms: i64,
    },
}

impl AcquireReply {
    /// Parse `{1, fence}` or `{0, pttl}`.
    pub fn parse(reply: &redis::Value) -> Result<AcquireReply, RequestError> {
        match crate::request::ints("lock_acquire", reply)?.as_slice() {
            [1, fence] if *fence > 0 => Ok(AcquireReply::Acquired {
                fence: *fence as u64,
            }),
            [0, pttl] => Ok(AcquireReply::Busy { held_for_ms: *pttl }),
            _ => Err(RequestError::Reply {
                script: "lock_acquire",
                detail: format!("{reply:?}"),
            }),
        }
    }
}

/// A held lease.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lease {
    /// The lock's name.
    pub name: String,
    /// This holder's random token (128 bits, hex): proves ownership to release and extend.
    pub token: String,
    /// The fencing token: strictly larger than every earlier holder's. Pass it to the resource.
    pub fence: u64,
    /// The lease's length when taken or last extended, ms.
    pub ttl_ms: u64,
    #[serde(skip)]
    key: String,
    #[serde(skip)]
    acquired: Option<Instant>,
}

impl Lease {
    /// A lease known only by name and token (e.g. from an HTTP client) to release or extend.
    pub fn known(locks: &Locks, name: &str, token: &str) -> Lease {
        Lease {
            name: name.to_string(),
            token: token.to_string(),
            fence: 0,
            ttl_ms: 0,
            key: locks.key(name),
            acquired: None,
        }
    }

    /// When this process took the lease.
    pub fn acquired_at(&self) -> Option<Instant> {
        self.acquired
    }
}

/// The answer to an acquire that did not get the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Busy {
    /// How long the current holder's lease still runs, ms (at the last attempt).
    pub held_for_ms: i64,
}

/// Locks over one connection.
#[derive(Clone)]
pub struct Locks {
    client: Client,
}

impl Locks {
    /// Locks whose keys start with the client's prefix.
    pub fn new(client: Client) -> Locks {
        Locks { client }
    }

    /// The lock key of `name`; its fencing counter is the same with `:fence` inside the tag.
    fn key(&self, name: &str) -> String {
        crate::request::key(self.client.prefix(), "lock", name, "owner", name)
    }

    fn fence_key(&self, name: &str) -> String {
        crate::request::key(self.client.prefix(), "lock", name, "fence", name)
    }

    /// One attempt.
    pub async fn try_acquire(
        &self,
        name: &str,
        ttl: Duration,
    ) -> Result<Result<Lease, Busy>, RequestError> {
        let ttl_ms = ttl_ms(ttl)?;
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(RequestError::InvalidField {
                field: "name",
                detail: format!("a lock's name has 1 to {MAX_NAME_BYTES} bytes"),
            });
        }
        let token = format!("{:032x}", rand::random::<u128>());
        let key = self.key(name);
        let mut cmd = ACQUIRE.cmd(&[&key, &self.fence_key(name)]);
        cmd.arg(&token).arg(ttl_ms).arg(fence_ttl_ms(ttl_ms));
        let reply: redis::Value = self.client.run(&ACQUIRE, &cmd).await?;
        match AcquireReply::parse(&reply)? {
            AcquireReply::Acquired { fence } => Ok(Ok(Lease {
                name: name.to_string(),
                token,
                fence,
                ttl_ms,
                key,
                acquired: Some(Instant::now()),
            })),
            AcquireReply::Busy { held_for_ms } => Ok(Err(Busy { held_for_ms })),
        }
    }

    /// Try until `wait` has passed, retrying with jitter (at most every 50 ms, sooner when the
    /// holder's lease ends sooner).
    pub async fn acquire(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Result<Lease, Busy>, RequestError> {
        let deadline = Instant::now() + wait;
        loop {
            let busy = match self.try_acquire(name, ttl).await? {
                Ok(lease) => return Ok(Ok(lease)),
                Err(busy) => busy,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Err(busy));
            }
            let cap = Duration::from_millis(busy.held_for_ms.clamp(1, 50) as u64);
            let pause = cap.mul_f64(rand::rng().random_range(0.5..1.0));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// Give the lock back; `false` when `lease` no longer held it (nothing was deleted).
    pub async fn release(&self, lease: &Lease) -> Result<bool, RequestError> {
        let mut cmd = RELEASE.cmd(&[&lease.key]);
        cmd.arg(&lease.token);
        let n: i64 = self.client.run(&RELEASE, &cmd).await?;
        Ok(n == 1)
    }

    /// Make the lease run `ttl` from now; `false` when it was lost.
    pub async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<bool, RequestError> {
        // Checked first: `PEXPIRE key 0` would delete the lock instead of extending it.
        let ttl_ms = ttl_ms(ttl)?;
        let mut cmd = EXTEND.cmd(&[&lease.key, &self.fence_key(&lease.name)]);
        cmd.arg(&lease.token).arg(ttl_ms).arg(fence_ttl_ms(ttl_ms));
        let n: i64 = self.client.run(&EXTEND, &cmd).await?;
        Ok(n == 1)
    }

    /// Keep `lease` alive in the background until released, dropped, or `max_hold` has passed
    /// (then the lease runs out by itself).
    pub fn guard(&self, lease: Lease, max_hold: Option<Duration>) -> LockGuard {
        LockGuard::start(self.clone(), lease, max_hold)
    }
}

/// The fencing counter's expiry for a lease of `ttl_ms`: the lease plus [`FENCE_IDLE`].
fn fence_ttl_ms(ttl_ms: u64) -> u64 {
    ttl_ms.saturating_add(FENCE_IDLE.as_millis() as u64)
}

/// A lease's length in whole ms: at least 1 (0 would make `PX`/`PEXPIRE` refuse or delete).
fn ttl_ms(ttl: Duration) -> Result<u64, RequestError> {
    match u64::try_from(ttl.as_millis()) {
        Ok(0) => Err(RequestError::Invalid(
            "a lock's ttl must be at least 1ms".into(),
        )),
        Ok(ms) => Ok(ms),
        Err(_) => Err(RequestError::Invalid("a lock's ttl is too long".into())),
    }
}
