//! The watchdog: a task that renews a lease every ttl/3 and reports its loss.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Lease, Locks};
use crate::request::RequestError;

/// A held lock, renewed in the background. Released on [`LockGuard::release`], or (best
/// effort, on a spawned task) when dropped.
pub struct LockGuard {
    locks: Locks,
    lease: Option<Lease>,
    /// The watchdog's latest word: read against the clock, so a holder resuming from a pause
    /// (GC, SIGSTOP) learns the loss at once, before the watchdog itself has run again.
    status: watch::Receiver<Status>,
    task: tokio::task::JoinHandle<()>,
}

impl LockGuard {
    pub(super) fn start(locks: Locks, lease: Lease, max_hold: Option<Duration>) -> LockGuard {
        let valid_until =
            lease.acquired_at().unwrap_or_else(Instant::now) + Duration::from_millis(lease.ttl_ms);
        let (tx, status) = watch::channel(Status {
            lost: false,
            valid_until,
        });
        let task = tokio::spawn(watchdog(locks.clone(), lease.clone(), max_hold, tx));
        LockGuard {
            locks,
            lease: Some(lease),
            status,
            task,
        }
    }

    /// The lease (token, fencing token).
    pub fn lease(&self) -> &Lease {
        self.lease.as_ref().expect("held until released")
    }

    /// The fencing token to pass to the protected resource.
    pub fn fence(&self) -> u64 {
        self.lease().fence
    }

    /// Whether the lease is lost: taken over, or past its last confirmed expiry.
    pub fn is_lost(&self) -> bool {
        self.status.borrow().is_lost(Instant::now())
    }

    /// Resolves when the lease is lost (taken over, or not renewed for a whole ttl).
    pub async fn lost(&mut self) {
        loop {
            let status = *self.status.borrow_and_update();
            if status.is_lost(Instant::now()) {
                return;
            }
            tokio::select! {
                changed = self.status.changed() => {
                    if changed.is_err() {
                        // The watchdog ended: it only does so once it has said "lost".
                        return;
                    }
                }
                _ = tokio::time::sleep_until(status.valid_until.into()) => return,
            }
        }
    }

    /// Stop renewing and give the lock back; `false` when it was no longer held.
    pub async fn release(mut self) -> Result<bool, RequestError> {
        self.task.abort();
        let lease = self.lease.take().expect("held until released");
        self.locks.release(&lease).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(lease) = self.lease.take() {
            let locks = self.locks.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = locks.release(&lease).await;
                });
            }
        }
    }
}

/// What the watchdog knows of the lease.
#[derive(Debug, Clone, Copy)]
struct Status {
    /// A renewal found the lease gone or taken, or could not confirm it in time.
    lost: bool,
    /// The lease is safe until here: last confirmed renewal's send time + ttl.
    valid_until: Instant,
}

impl Status {
    fn is_lost(&self, now: Instant) -> bool {
        self.lost || now >= self.valid_until
    }
}

async fn watchdog(
    locks: Locks,
    lease: Lease,
    max_hold: Option<Duration>,
    status: watch::Sender<Status>,
) {
    let ttl = Duration::from_millis(lease.ttl_ms);
    let every = (ttl / 3).max(Duration::from_millis(1));
    let started = lease.acquired_at().unwrap_or_else(Instant::now);
    // The lease is safe until this instant (as far as this process can tell).
    let mut valid_until = started + ttl;
    loop {
        tokio::time::sleep(every).await;
        let now = Instant::now();
        if max_hold.is_some_and(|cap| now.duration_since(started) + every > cap) {
            // No more renewals: the lease runs out by itself; say so when it has.
            tokio::time::sleep_until(valid_until.into()).await;
            status.send_modify(|s| s.lost = true);
            return;
        }
        let sent = Instant::now();
        // A renewal not answered before the lease runs out cannot save it: bound the wait, or
        // a connection stuck on a dead or restarted server would keep "lost" from being said.
        let renewal = tokio::time::timeout_at(valid_until.into(), locks.extend(&lease, ttl));
        match renewal.await {
            Ok(Ok(true)) => {
                valid_until = sent + ttl;
                status.send_modify(|s| s.valid_until = valid_until);
            }
            Ok(Ok(false)) | Err(_) => {
                status.send_modify(|s| s.lost = true);
                return;
            }
            Ok(Err(_)) if Instant::now() >= valid_until => {
                status.send_modify(|s| s.lost = true);
                return;
            }
            Ok(Err(_)) => {}
        }
        if Instant::now() >= valid_until {
            // The renewal came back after the lease had already run out.
            status.send_modify(|s| s.lost = true);
            return;
        }
    }
}
