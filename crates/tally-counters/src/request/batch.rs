//! Group commit: concurrent callers' script calls sent as one call of a batch script, so Redis
//! runs one EVALSHA (one command parse, one Lua call setup, one reply) for many decisions.
//!
//! A caller that finds a free slot among [`Batching::in_flight`] calls sends its own call at
//! once with the single script: a lone caller waits for nothing. When every slot is taken, calls
//! queue; one driver task (started on first use, ended when the last [`super::Client`] is
//! dropped) waits for a slot, takes whatever is queued (up to [`Batching::max_calls`]) and sends
//! it as one call of the batch script, so while one batch is in flight the next one fills.
//!
//! A batch is not a transaction across callers: the script runs each call as if it had been
//! sent alone, in queue order, and a call that raises an error (a key of the wrong type) gets
//! that error and no other call is touched. An error of the whole batch call (a timeout, a lost
//! connection) is an unknown outcome for exactly its callers, as it is for one call.
//!
//! The queue is bounded ([`Batching::max_queued`]): while Redis is slow or gone, a call beyond it
//! is answered at once as Redis unreachable (a limit then decides by its `on_redis_error`), so
//! memory stays bounded and no caller waits behind a backlog. A queued call whose caller has
//! gone (it timed out, its client disconnected) is dropped before it is sent: an abandoned
//! decision is never charged after Redis recovers, ahead of fresh ones.
//!
//! Cluster: a script call may only touch keys of one slot, so the driver sends one call per
//! slot among what it took (each call's own keys already share one slot); they run concurrently.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};

use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::link::{Link, Written};
use super::RequestError;
use crate::script::Script;

/// How a client groups concurrent script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most calls sent as one batch; 1 turns batching off (every call is sent alone).
    pub max_calls: usize,
    /// Script calls in flight at once before further calls queue (and batch).
    pub in_flight: usize,
}

impl Default for Batching {
    /// 32 calls per batch, 4 in flight (measured in docs/lab/benchmarks.md).
    fn default() -> Batching {
        Batching {
            max_calls: 32,
            in_flight: 4,
        }
    }
}

impl Batching {
    /// Most calls waiting in the queue: 16 full batches per slot (2,048 by default). Beyond it
    /// a call is answered at once as Redis unreachable.
    pub fn max_queued(&self) -> usize {
        self.max_calls
            .saturating_mul(self.in_flight)
            .saturating_mul(16)
    }

    /// Every call sent alone, as before batching.
    pub const OFF: Batching = Batching {
        max_calls: 1,
        in_flight: usize::MAX >> 4,
    };
}

/// A script that can run batched: the text for one call, and the text that runs several calls
/// of it (the same decision function followed by `lua/batch.lua`).
pub(crate) struct ScriptPair {
    /// One call: `EVALSHA single n keys... args...`.
    pub single: Script,
    /// Several calls: see `lua/batch.lua` for its KEYS and ARGV.
    pub batch: Script,
}

/// One caller's call, waiting in the queue.
struct Job {
    pair: &'static ScriptPair,
    keys: Vec<String>,
    /// The call's ARGV (a `Cmd` used as an argument buffer).
    args: Cmd,
    /// Whether its caller waits for replicas (it needs to know where the write went).
    traced: bool,
    reply: oneshot::Sender<Result<Sent, RequestError>>,
}

/// A call's reply, and where its write went when its caller asked ([`Job::traced`]).
pub(crate) type Sent = (Value, Option<Written>);

/// The queue and the slots of one client.
pub(crate) struct Batcher {
    settings: Batching,
    slots: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Job>,
    /// Calls sent to the queue and not yet taken by the driver (bounded by `max_queued`).
    queued: Arc<AtomicUsize>,
    /// The driver's end, taken when the first call queues (the driver needs a runtime).
    rx: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
    /// The driver was started (checked on every queued call without taking the lock).
    started: Once,
}

impl Batcher {
    pub(crate) fn new(settings: Batching) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let in_flight = settings.in_flight.clamp(1, Semaphore::MAX_PERMITS);
        Batcher {
            settings: Batching {
                max_calls: settings.max_calls.max(1),
                in_flight,
            },
            slots: Arc::new(Semaphore::new(in_flight)),
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            rx: Mutex::new(Some(rx)),
            started: Once::new(),
        }
    }

    /// Run one call of `pair` with `keys` and `args`: alone if a slot is free (or batching is
    /// off), else queued for the next batch. `traced`: say where the write went.
    pub(crate) async fn run(
        &self,
        link: &Arc<Link>,
        pair: &'static ScriptPair,
        keys: Vec<String>,
        args: Cmd,
        traced: bool,
    ) -> Result<Sent, RequestError> {
        if self.settings.max_calls <= 1 {
            return run_alone(link, pair, &keys, &args, traced).await;
        }
        if let Ok(_slot) = self.slots.try_acquire() {
            return run_alone(link, pair, &keys, &args, traced).await;
        }
        let most = self.settings.max_queued();
        if self.queued.fetch_add(1, Ordering::Relaxed) >= most {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(queue_full(most));
        }
        self.start_driver(link);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            pair,
            keys,
            args,
            traced,
            reply,
        };
        if let Err(unsent) = self.tx.send(job) {
            // The driver is gone (its runtime ended): nothing was sent, so send it alone.
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let job = unsent.0;
            return run_alone(link, job.pair, &job.keys, &job.args, traced).await;
        }
        answer.await.unwrap_or_else(|_| Err(dropped()))
    }

    fn start_driver(&self, link: &Arc<Link>) {
        self.started.call_once(|| {
            let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(rx) = rx {
                let queue = Queue {
                    rx,
                    queued: self.queued.clone(),
                };
                tokio::spawn(drive(
                    link.clone(),
                    queue,
                    self.slots.clone(),
                    self.settings,
                ));
            }
        });
    }
}

/// The batch was lost before it answered (the driver's runtime ended): it may have run.
fn dropped() -> RequestError {
    RequestError::OutcomeUnknown(redis::RedisError::from(std::io::Error::other(
        "the request batch was dropped before it answered",
    )))
}

/// A call refused because `most` calls already wait: nothing was sent.
fn queue_full(most: usize) -> RequestError {
    RequestError::Unreachable(redis::RedisError::from(std::io::Error::other(format!(
        "{most} calls already wait for redis (the request queue is full)"
    ))))
}

/// The driver's end of the queue.
struct Queue {
    rx: mpsc::UnboundedReceiver<Job>,
    /// Shared with the [`Batcher`]: decremented as jobs are taken.
    queued: Arc<AtomicUsize>,
}

impl Queue {
    /// The next job whose caller still waits (the others are dropped unsent); None once the
    /// queue is closed. `wait`: wait for one, else only take what is there.
    async fn next(&mut self, wait: bool) -> Option<Job> {
        loop {
            let job = if wait {
                self.rx.recv().await?
            } else {
                self.rx.try_recv().ok()?
            };
            self.queued.fetch_sub(1, Ordering::Relaxed);
            if !job.reply.is_closed() {
                return Some(job);
            }
        }
    }
}

/// `EVALSHA` of the single script with `keys` and `args`; `traced`: say where it went.
async fn run_alone(
    link: &Link,
    pair: &ScriptPair,
    keys: &[String],
    args: &Cmd,
    traced: bool,
) -> Result<Sent, RequestError> {
    let mut cmd = pair.single.cmd(keys);
    for arg in args.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
    run_script(link, &pair.single, &cmd, traced).await
}

/// Run `cmd` of `script`, and say where it went when `traced`.
async fn run_script(
    link: &Link,
    script: &Script,
    cmd: &Cmd,
    traced: bool,
) -> Result<Sent, RequestError> {
    if traced {
        let (reply, written) = link.run_traced(Some(script), cmd).await?;
        return Ok((reply, Some(written)));
    }
    Ok((link.run(script, cmd).await?, None))
}

/// The driver: waits for a free slot, then sends everything queued (up to `max_calls`).
async fn drive(link: Arc<Link>, mut queue: Queue, slots: Arc<Semaphore>, settings: Batching) {
    while let Some(first) = queue.next(true).await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // While it waited for a slot its caller may have gone too.
        let mut jobs = Vec::with_capacity(settings.max_calls);
        if !first.reply.is_closed() {
            jobs.push(first);
        }
        while jobs.len() < settings.max_calls {
            match queue.next(false).await {
                Some(job) => jobs.push(job),
                None => break,
            }
        }
        if jobs.is_empty() {
            continue;
        }
        tokio::spawn(send(link.clone(), jobs, slot));
    }
}

/// Send `jobs` (one call per script and cluster slot) and answer each caller; the slot is
/// free again once every call has answered.
async fn send(link: Arc<Link>, jobs: Vec<Job>, _slot: OwnedSemaphorePermit) {
    let mut groups: Vec<(usize, u16, Vec<Job>)> = Vec::new();
    for job in jobs {
        let script = job.pair as *const ScriptPair as usize;
        let slot = match link.is_cluster() {
            true => job
                .keys
                .first()
                .map_or(0, |k| crate::model::layout::key_slot(k.as_bytes())),
            false => 0,
        };
        match groups
            .iter_mut()
            .find(|(s, sl, _)| *s == script && *sl == slot)
        {
            Some(group) => group.2.push(job),
            None => groups.push((script, slot, vec![job])),
        }
    }
    let last = groups.pop();
    let mut others = Vec::with_capacity(groups.len());
    for (_, _, group) in groups {
        let link = link.clone();
        others.push(tokio::spawn(async move { send_group(&link, group).await }));
    }
    if let Some((_, _, group)) = last {
        send_group(&link, group).await;
    }
    for task in others {
        let _ = task.await;
    }
}

/// One script call for `jobs` (same script, same slot): the single script when alone.
async fn send_group(link: &Link, mut jobs: Vec<Job>) {
    if jobs.len() == 1 {
        let job = jobs.remove(0);
        let result = run_alone(link, job.pair, &job.keys, &job.args, job.traced).await;
        let _ = job.reply.send(result);
        return;
    }
    let pair = jobs[0].pair;
    let keys: Vec<&String> = jobs.iter().flat_map(|j| &j.keys).collect();
    let mut cmd = pair.batch.cmd(&keys);
    cmd.arg(jobs.len());
    for job in &jobs {
        cmd.arg(job.keys.len()).arg(job.args.args_iter().len());
    }
    for job in &jobs {
        for arg in job.args.args_iter() {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
    }
    let traced = jobs.iter().any(|job| job.traced);
    match run_script(link, &pair.batch, &cmd, traced).await {
        Ok((Value::Array(replies), written)) if replies.len() == jobs.len() => {
            for (job, reply) in jobs.into_iter().zip(replies) {
                let written = written.clone().filter(|_| job.traced);
                let _ = job
                    .reply
                    .send(one_reply(reply).map(|reply| (reply, written)));
            }
        }
        Ok((other, _)) => {
            for job in jobs {
                let _ = job.reply.send(Err(RequestError::Reply {
                    script: pair.batch.name(),
                    detail: format!("{other:?}"),
                }));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(same_error(&e)));
            }
        }
    }
}

/// One call's element of the batch reply: its reply (an array), or the error it raised as a
/// status `CODE message`, made the error Redis would have answered to the call alone.
fn one_reply(reply: Value) -> Result<Value, RequestError> {
    let text = match reply {
        Value::SimpleString(text) => text,
        other => return Ok(other),
    };
    let line = format!("-{}\r\n", text.replace(['\r', '\n'], " "));
    let error = match redis::parse_redis_value(line.as_bytes()) {
        Ok(Value::ServerError(e)) => e.into(),
        Err(e) => e,
        Ok(_) => redis::RedisError::from(std::io::Error::other(text)),
    };
    Err(RequestError::Redis(error))
}

/// The error of a whole batch call, for each of its callers.
fn same_error(e: &RequestError) -> RequestError {
    match e {
        RequestError::Redis(r) => RequestError::Redis(r.clone()),
        RequestError::Unreachable(r) => RequestError::Unreachable(r.clone()),
        RequestError::OutcomeUnknown(r) => RequestError::OutcomeUnknown(r.clone()),
        RequestError::Reply { script, detail } => RequestError::Reply {
            script,
            detail: detail.clone(),
        },
        other => RequestError::OutcomeUnknown(redis::RedisError::from(std::io::Error::other(
            other.to_string(),
        ))),
    }
}
