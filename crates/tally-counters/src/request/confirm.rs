//! Waiting for replicas, once for many decisions (group commit). `WAIT n timeout` blocks the
//! connection it is sent on until the replicas have every write made on that connection
//! before it, so one WAIT confirms every decision whose write was answered before it was sent:
//! concurrent decisions share it instead of queueing one WAIT each behind each other on the
//! multiplexed connection (a blocked client reads no further command until its WAIT returns).
//!
//! A WAIT covers only the writes of its own connection: a decision whose write went over a
//! connection that has since been replaced (it broke, a failover) cannot be confirmed by a WAIT
//! on the new one (that returns at once: the new client wrote nothing). Each decision carries
//! the connection its write went over ([`Via`]); decisions share a WAIT only with decisions
//! written over the same connection, and a WAIT that ran on another one answers them "not
//! replicated", never "confirmed".
//!
//! On a cluster each write goes to the primary of its slot over that node's connection, so
//! decisions are grouped per node connection and the WAIT goes to that one primary: a shard
//! whose replica is behind (or gone after a failover) holds up only its own decisions.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::link::{Link, Via, Written};
use super::RequestError;

/// How many replicas must have a write before a call is answered (`WAIT replicas timeout`
/// after the script). Redis replicates asynchronously: a primary can acknowledge a write and
/// die before any replica has it, and a failover then undoes an admission that was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Durability {
    /// Replicas that must have the write; 0: answer as soon as the primary has it.
    pub replicas: u32,
    /// How long to wait for them; then the answer is [`RequestError::NotReplicated`] (the
    /// write stays on the primary: a quota item taken, a limit charged, never granted).
    #[serde(with = "humantime_serde")]
    pub timeout: std::time::Duration,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            replicas: 0,
            timeout: std::time::Duration::from_millis(100),
        }
    }
}

/// What one WAIT found: the replicas that acknowledged, and the connection it ran on; None
/// when it failed (the writes it was to confirm stay unconfirmed).
type Outcome = Option<(i64, Via)>;

/// One [`Confirmer`] per durability level and connection written over, shared by a client and
/// every clone of it (a limit whose policies ask for another level than the client's gets a
/// clone per decision).
#[derive(Default)]
pub(crate) struct Confirmers(Mutex<std::collections::HashMap<(Durability, Via), Arc<Confirmer>>>);

impl Confirmers {
    /// The confirmer of writes at `durability` made over `via`. Confirmers nobody uses any
    /// more (their connection was replaced) are dropped here.
    pub(crate) fn of(&self, durability: Durability, via: &Via) -> Arc<Confirmer> {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, confirmer| Arc::strong_count(confirmer) > 1);
        Arc::clone(all.entry((durability, via.clone())).or_default())
    }
}

/// Decisions waiting for the next WAIT, and whether one is running.
#[derive(Default)]
pub(crate) struct Confirmer {
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// A WAIT is in flight: arrivals wait for the next one (this one may have been sent
    /// before their write was answered).
    running: bool,
    /// Each waiter's reply channel.
    waiting: Vec<oneshot::Sender<Outcome>>,
    /// Where the last arrival wrote: the next WAIT goes there (every waiter wrote over the
    /// same connection; the slot routes it on a cluster).
    last: Option<Written>,
}

impl Confirmer {
    /// Wait until `durability` holds for a write made as `written` says: shares a WAIT with
    /// every decision written over the same connection and waiting now.
    pub(crate) async fn confirm(
        self: &Arc<Self>,
        link: &Arc<Link>,
        durability: Durability,
        written: Written,
    ) -> Result<(), RequestError> {
        if written.via == Via::Unknown {
            return judge(durability.replicas, 0, false);
        }
        let via = written.via.clone();
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.waiting.push(tx);
            pending.last = Some(written);
            !std::mem::replace(&mut pending.running, true)
        };
        if start {
            // Its own task: a caller that goes away (a cancelled request) strands no one.
            tokio::spawn(Arc::clone(self).drive(Arc::clone(link), durability));
        }
        match rx.await {
            Ok(Some((acked, on))) => judge(durability.replicas, acked, via == on),
            _ => Err(RequestError::NotReplicated {
                wanted: durability.replicas,
                acked: 0,
            }),
        }
    }

    /// Send WAITs until no one waits: each takes every waiter present when it is sent.
    async fn drive(self: Arc<Self>, link: Arc<Link>, durability: Durability) {
        loop {
            let (batch, written) = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                match pending.last.clone() {
                    Some(written) if !pending.waiting.is_empty() => {
                        (std::mem::take(&mut pending.waiting), written)
                    }
                    _ => {
                        pending.running = false;
                        return;
                    }
                }
            };
            let ms = durability.timeout.as_millis().max(1) as u64;
            let outcome = link.wait(&written, durability.replicas, ms).await.ok();
            for tx in batch {
                let _ = tx.send(outcome.clone());
            }
        }
    }
}

/// The answer for one decision: confirmed when enough replicas acknowledged a WAIT sent on
/// the connection its write used.
fn judge(wanted: u32, acked: i64, same_connection: bool) -> Result<(), RequestError> {
    let acked = if same_connection {
        acked.max(0) as u32
    } else {
        0
    };
    if acked < wanted {
        return Err(RequestError::NotReplicated { wanted, acked });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::judge;
    use crate::request::RequestError;

    #[test]
    fn a_wait_on_another_connection_confirms_nothing() {
        assert!(judge(1, 1, true).is_ok());
        assert!(judge(1, 2, true).is_ok());
        assert!(matches!(
            judge(2, 1, true),
            Err(RequestError::NotReplicated {
                wanted: 2,
                acked: 1
            })
        ));
        // The write went over a connection since replaced: the WAIT's count says nothing of it.
        assert!(matches!(
            judge(1, 3, false),
            Err(RequestError::NotReplicated {
                wanted: 1,
                acked: 0
            })
        ));
    }
}
