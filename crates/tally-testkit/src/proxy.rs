//! A fault-injecting TCP proxy in front of a server (a `redis-server`, a Kafka broker), for tests
//! that need the network between tally and that server to misbehave: slow, stalled, partitioned,
//! reset, refused, or losing one reply after the server ran the request.
//!
//! The proxy listens on a free loopback port and forwards each connection it accepts to the
//! upstream address. It runs on its own thread with its own tokio runtime, so a sync `#[test]`
//! and a `#[tokio::test]` use it alike. The test switches faults through a [`ProxyHandle`] (a
//! [`Proxy`] derefs to one); unless said otherwise a fault applies to the connections already
//! open and to new ones.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running proxy. Dropping it stops its thread and closes every connection, as the kernel
/// does for a server whose process dies, so a test that ends, or panics, leaves nothing behind.
pub struct Proxy {
    handle: ProxyHandle,
    thread: Option<JoinHandle<()>>,
}

/// The switches and counters of a [`Proxy`]: cheap to clone and usable from any thread, so a
/// test can hand one to a helper thread that injects faults while the main thread measures.
#[derive(Clone)]
pub struct ProxyHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// What the handle sets and the forwarders read.
#[derive(Default)]
struct Shared {
    delay_us: AtomicU64,
    /// A `watch` rather than a flag, so a paused forwarder sleeps until `resume` wakes it.
    paused: watch::Sender<bool>,
    blackhole: AtomicBool,
    refuse: AtomicBool,
    drop_next_reply: AtomicBool,
    /// Cancelled when the proxy stops; parent of `generation`.
    stop: CancellationToken,
    /// Parent of the connections open now: `reset_all` cancels it and puts a fresh one in place.
    generation: Mutex<CancellationToken>,
    open: AtomicUsize,
    accepted: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Proxy {
    /// Listen on a free loopback port and forward every connection to `upstream`. The upstream
    /// is dialled once per accepted connection; a client whose upstream cannot be reached is
    /// reset, so a proxy may be started before its server.
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = StdListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut shared = Shared::default();
        *shared.generation.get_mut().unwrap() = shared.stop.child_token();
        let shared = Arc::new(shared);
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn({
                let shared = shared.clone();
                move || runtime.block_on(accept_loop(listener, upstream, shared))
            })?;
        Ok(Proxy {
            handle: ProxyHandle { addr, shared },
            thread: Some(thread),
        })
    }

    /// A handle that outlives this borrow (for another thread or task).
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }
}

impl Deref for Proxy {
    type Target = ProxyHandle;

    fn deref(&self) -> &ProxyHandle {
        &self.handle
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.handle.shared.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl ProxyHandle {
    /// The loopback address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of [`ProxyHandle::addr`].
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `<scheme>://127.0.0.1:<port>`, e.g. `url("redis")` for a Redis client.
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    /// Every chunk forwarded, in either direction, first waits `delay` (zero: none). A request
    /// and its reply are two chunks, so a round trip takes at least twice `delay`.
    pub fn delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(us, SeqCst);
    }

    /// Stop forwarding in both directions. Bytes are held, not dropped, and the connections
    /// stay open: like SIGSTOP of the server, but for the clients of this proxy only.
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Undo [`ProxyHandle::pause`]: what was held is forwarded now.
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// A partition without RST: bytes from either side are read and discarded (never delivered,
    /// even after `heal`), and connections stay open. New connections are accepted and get
    /// nothing back.
    pub fn blackhole(&self) {
        self.shared.blackhole.store(true, SeqCst);
    }

    /// Undo [`ProxyHandle::blackhole`]: bytes read from now on are forwarded again.
    pub fn heal(&self) {
        self.shared.blackhole.store(false, SeqCst);
    }

    /// Close every open connection with a TCP RST, to the client and to the upstream alike.
    /// Connections accepted afterwards are not affected.
    pub fn reset_all(&self) {
        let fresh = self.shared.stop.child_token();
        std::mem::replace(&mut *self.shared.generation(), fresh).cancel();
    }

    /// While `on`, new connections are accepted and reset at once, as by a dead server; the
    /// connections already open carry on.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, SeqCst);
    }

    /// One shot: the next chunk the upstream sends on any connection is discarded and that
    /// connection is reset, both sides. The request reached the server and ran; the client
    /// never sees the answer. A reply that arrives in several TCP reads is caught at its first
    /// chunk, so nothing of it reaches the client.
    pub fn drop_next_reply(&self) {
        self.shared.drop_next_reply.store(true, SeqCst);
    }

    /// Client connections open now (a reset one counts until its forwarders have ended).
    pub fn connections(&self) -> usize {
        self.shared.open.load(SeqCst)
    }

    /// Client connections accepted so far, the refused ones included.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(SeqCst)
    }

    /// Bytes passed on from clients to the upstream (discarded ones not counted).
    pub fn bytes_up(&self) -> u64 {
        self.shared.bytes_up.load(SeqCst)
    }

    /// Bytes passed on from the upstream to clients (discarded ones not counted).
    pub fn bytes_down(&self) -> u64 {
        self.shared.bytes_down.load(SeqCst)
    }
}

impl Shared {
    fn generation(&self) -> MutexGuard<'_, CancellationToken> {
        self.generation.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One accepted connection, shared by its two forwarders: its reset switch, and its place in
/// `connections()` until both have ended.
struct Link {
    shared: Arc<Shared>,
    token: CancellationToken,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.open.fetch_sub(1, SeqCst);
    }
}

async fn accept_loop(listener: StdListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let client = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                // Out of descriptors, say: wait a little rather than spin on a core.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        shared.accepted.fetch_add(1, SeqCst);
        if shared.refuse.load(SeqCst) {
            let _ = client.set_zero_linger();
            continue;
        }
        // The token first: once `connections()` counts it, a `reset_all` reaches it.
        let token = shared.generation().child_token();
        shared.open.fetch_add(1, SeqCst);
        let link = Arc::new(Link {
            shared: shared.clone(),
            token,
        });
        tokio::spawn(connection(client, upstream, link));
    }
}

/// Dial the upstream for `client`, then run one forwarder per direction.
async fn connection(client: TcpStream, upstream: SocketAddr, link: Arc<Link>) {
    let upstream = tokio::select! {
        biased;
        _ = link.token.cancelled() => None,
        upstream = TcpStream::connect(upstream) => upstream.ok(),
    };
    let Some(upstream) = upstream else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    tokio::spawn(forward(client_read, upstream_write, true, link.clone()));
    tokio::spawn(forward(upstream_read, client_write, false, link));
}

/// One direction of a connection. At end of stream it passes the FIN on and leaves the other
/// direction running; on a fault, an I/O error or a reset of its connection it resets both
/// sockets (zero linger, and no FIN first, so the peers read a reset rather than an end).
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, up: bool, link: Arc<Link>) {
    let ended = tokio::select! {
        // A reset wins over bytes that are ready: after `reset_all` returns, nothing more passes.
        biased;
        _ = link.token.cancelled() => false,
        pumped = pump(&mut from, &mut to, up, &link.shared) => pumped.is_ok(),
    };
    if ended {
        let _ = to.shutdown().await;
        return;
    }
    link.token.cancel();
    let _ = from.as_ref().set_zero_linger();
    let _ = to.as_ref().set_zero_linger();
    to.forget();
}

/// Copy chunks until end of stream (Ok) or an error or a dropped reply (Err).
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    up: bool,
    shared: &Shared,
) -> io::Result<()> {
    let mut paused = shared.paused.subscribe();
    let passed = [&shared.bytes_down, &shared.bytes_up][usize::from(up)];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if shared.blackhole.load(SeqCst) {
            continue;
        }
        if !up && shared.drop_next_reply.swap(false, SeqCst) {
            return Err(io::Error::other("reply dropped"));
        }
        let delay = Duration::from_micros(shared.delay_us.load(SeqCst));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // Held here with the chunk in hand; nothing more is read, so TCP pushes back.
        let _ = paused.wait_for(|paused| !paused).await;
        passed.fetch_add(n as u64, SeqCst);
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_redis::LocalRedis;
    use crate::wait::wait_until;
    use redis::{cmd, Connection, RedisError, RedisResult};
    use std::io::Read;
    use std::time::Instant;

    const SHORT: Duration = Duration::from_millis(300);
    const LONG: Duration = Duration::from_secs(5);

    fn redis_and_proxy() -> (LocalRedis, Proxy) {
        let redis = LocalRedis::start(&[]).unwrap();
        let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], redis.port))).unwrap();
        (redis, proxy)
    }

    /// A sync connection whose setup and reads give up after `timeout`.
    fn connect(url: &str, timeout: Duration) -> RedisResult<Connection> {
        let conn = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// A connection through the proxy whose reads give up after `timeout`.
    fn via(proxy: &Proxy, timeout: Duration) -> Connection {
        let conn = connect(&proxy.url("redis"), LONG).unwrap();
        conn.set_read_timeout(Some(timeout)).unwrap();
        conn
    }

    /// A PING on a new connection (a refused or blackholed proxy fails the setup or the PING).
    fn ping_new(proxy: &Proxy, timeout: Duration) -> RedisResult<String> {
        cmd("PING").query(&mut connect(&proxy.url("redis"), timeout)?)
    }

    fn ping(conn: &mut Connection) -> RedisResult<String> {
        cmd("PING").query(conn)
    }

    fn get(conn: &mut Connection) -> RedisResult<Option<i64>> {
        cmd("GET").arg("k").query(conn)
    }

    fn incr(conn: &mut Connection) -> RedisResult<i64> {
        cmd("INCR").arg("k").query(conn)
    }

    /// A reset (RST) as the client sees it: not a timeout, not a clean end of stream.
    fn is_reset(e: &RedisError) -> bool {
        let text = e.to_string().to_lowercase();
        e.is_io_error() && (text.contains("reset") || text.contains("broken pipe"))
    }

    #[test]
    fn proxy_forwards_and_counts() {
        let (redis, proxy) = redis_and_proxy();
        let mut conn = via(&proxy, LONG);
        cmd("SET").arg("k").arg(5).exec(&mut conn).unwrap();
        assert_eq!(get(&mut conn).unwrap(), Some(5));
        let mut direct = connect(&redis.url(), LONG).unwrap();
        assert_eq!(get(&mut direct).unwrap(), Some(5));
        assert_eq!((proxy.accepted(), proxy.connections()), (1, 1));
        assert!(proxy.bytes_up() > 0 && proxy.bytes_down() > 0);
        drop(conn);
        assert!(wait_until(LONG, || proxy.connections() == 0));
    }

    #[test]
    fn proxy_delay_slows_each_direction() {
        let (_redis, proxy) = redis_and_proxy();
        let mut conn = via(&proxy, LONG);
        proxy.delay(Duration::from_millis(200));
        let started = Instant::now();
        assert_eq!(ping(&mut conn).unwrap(), "PONG");
        // The request and the reply wait 200 ms each.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(400), "PING took {took:?}");
    }

    #[test]
    fn proxy_pause_holds_bytes_until_resume() {
        let (redis, proxy) = redis_and_proxy();
        let mut direct = connect(&redis.url(), LONG).unwrap();
        let (mut reader, mut writer) = (via(&proxy, SHORT), via(&proxy, SHORT));
        proxy.pause();
        let e = get(&mut reader).unwrap_err();
        assert!(e.is_timeout(), "{e}");
        let e = incr(&mut writer).unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert_eq!(
            get(&mut direct).unwrap(),
            None,
            "the INCR passed a paused proxy"
        );
        assert_eq!(proxy.connections(), 2);
        proxy.resume();
        // The held INCR is delivered on resume.
        assert!(wait_until(LONG, || get(&mut direct).unwrap() == Some(1)));
        assert_eq!(ping_new(&proxy, LONG).unwrap(), "PONG");
    }

    #[test]
    fn proxy_blackhole_discards_requests() {
        let (redis, proxy) = redis_and_proxy();
        let mut direct = connect(&redis.url(), LONG).unwrap();
        let mut conn = via(&proxy, SHORT);
        proxy.blackhole();
        let e = incr(&mut conn).unwrap_err();
        assert!(e.is_timeout(), "{e}");
        let e = ping_new(&proxy, SHORT).unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert_eq!(
            get(&mut direct).unwrap(),
            None,
            "the server ran a blackholed INCR"
        );
        proxy.heal();
        // 1, not 2: the blackholed INCR was discarded, not held.
        assert_eq!(incr(&mut via(&proxy, LONG)).unwrap(), 1);
    }

    #[test]
    fn proxy_reset_all_sends_rst() {
        let (_redis, proxy) = redis_and_proxy();
        let mut conn = via(&proxy, LONG);
        assert_eq!(ping(&mut conn).unwrap(), "PONG");
        let mut raw = std::net::TcpStream::connect(proxy.addr()).unwrap();
        raw.set_read_timeout(Some(LONG)).unwrap();
        assert!(wait_until(LONG, || proxy.connections() == 2));
        proxy.reset_all();
        let e = ping(&mut conn).unwrap_err();
        assert!(is_reset(&e), "{e}");
        // A FIN would read Ok(0), a stalled proxy WouldBlock; a reset is ConnectionReset.
        let read = raw.read(&mut [0u8; 16]).map_err(|e| e.kind());
        assert_eq!(read, Err(io::ErrorKind::ConnectionReset));
        assert!(wait_until(LONG, || proxy.connections() == 0));
        assert_eq!(ping_new(&proxy, LONG).unwrap(), "PONG");
    }

    #[test]
    fn proxy_refuse_resets_new_connections_only() {
        let (_redis, proxy) = redis_and_proxy();
        let mut open = via(&proxy, LONG);
        proxy.refuse(true);
        let e = ping_new(&proxy, LONG).unwrap_err();
        assert!(is_reset(&e), "{e}");
        assert_eq!((proxy.accepted(), proxy.connections()), (2, 1));
        assert_eq!(ping(&mut open).unwrap(), "PONG");
        proxy.refuse(false);
        assert_eq!(ping_new(&proxy, LONG).unwrap(), "PONG");
    }

    #[test]
    fn proxy_drop_next_reply_loses_one_answer() {
        let (redis, proxy) = redis_and_proxy();
        let mut conn = via(&proxy, LONG);
        proxy.drop_next_reply();
        let e = incr(&mut conn).unwrap_err();
        assert!(is_reset(&e), "{e}");
        let mut direct = connect(&redis.url(), LONG).unwrap();
        assert_eq!(get(&mut direct).unwrap(), Some(1), "the INCR ran");
        // One shot: the next reply passes.
        assert_eq!(incr(&mut via(&proxy, LONG)).unwrap(), 2);
    }

    #[tokio::test]
    async fn proxy_needs_no_runtime_of_its_caller() {
        let (_redis, proxy) = redis_and_proxy();
        let client = redis::Client::open(proxy.url("redis")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let v: i64 = cmd("INCR").arg("k").query_async(&mut conn).await.unwrap();
        assert_eq!((v, proxy.accepted()), (1, 1));
    }
}
