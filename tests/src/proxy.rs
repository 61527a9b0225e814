//! A TCP fault proxy: put it between a client and a server to partition them on demand.
//!
//! Partition tests cannot use the host firewall (tests must never touch it) and this kernel
//! has no netem, so faults are made in user space: the client connects to the proxy's
//! loopback port and the proxy forwards to the target, unless told otherwise:
//!
//! | mode | existing connections | new connections |
//! | --- | --- | --- |
//! | [`TcpProxy::pass`] | bytes forwarded both ways | accepted, connected to the target |
//! | [`TcpProxy::blackhole`] | open, nothing forwarded, nothing sent back | accepted, held |
//! | [`TcpProxy::reset`] | closed abruptly (RST, `SO_LINGER` 0) | accepted, reset at once |
//!
//! A blackhole behaves like a rule that drops packets for a short while: bytes sent during
//! it are *held*, not lost, and flow once the proxy passes again (TCP would retransmit
//! them), and a connection opened during it reaches the target only then. So a request sent
//! into a blackhole may still run after the heal, as in a real network. Call
//! [`TcpProxy::reset`] before [`TcpProxy::pass`] when the partitioned connections must die
//! instead.
//!
//! The proxy runs on plain threads of its own (one accepting, two per connection, ended
//! with the connection), so it works the same under any test runtime, sync or async. Drop
//! closes every connection and stops every thread.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits to connect to the target before resetting the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often threads that wait (a held connection, a blocked write) look at the state.
const RECHECK: Duration = Duration::from_millis(100);
/// How long Drop waits for the connection threads to end.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// What the proxy does with traffic; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes both ways.
    Pass,
    /// Forward nothing, send nothing back, keep every connection open.
    Blackhole,
    /// Close every connection abruptly, and every new one at once.
    Reset,
}

/// A running fault proxy on `127.0.0.1:port()`; Drop closes everything.
#[derive(Debug)]
pub struct TcpProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Notified on every change of `state` and on every aborted connection.
    changed: Condvar,
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct State {
    mode: ProxyMode,
    target: SocketAddr,
    stopping: bool,
}

/// One proxied connection: the accepted client socket, and the socket to the target once
/// the connection is forwarded. Both pump threads share it (`&TcpStream` reads and writes),
/// so the sockets close when the last of them and the registry let go.
#[derive(Debug)]
struct Connection {
    client: TcpStream,
    upstream: OnceLock<TcpStream>,
    aborted: AtomicBool,
}

impl TcpProxy {
    /// Starts a proxy on a free `127.0.0.1` port, forwarding to `target`.
    ///
    /// # Panics
    /// When no loopback port can be bound or the accepting thread cannot be started.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's bound address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: ProxyMode::Pass,
                target,
                stopping: false,
            }),
            changed: Condvar::new(),
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("proxy-{}-accept", addr.port()))
                .spawn(move || accept_loop(&shared, &listener))
                .expect("a thread for the proxy's listener")
        };
        TcpProxy {
            shared,
            addr,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The proxy's address (127.0.0.1 and [`Self::port`]).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT`, for a Redis client that should go through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// Forwards again; heals a blackhole (held bytes and held connections go through).
    pub fn pass(&self) {
        self.set_mode(ProxyMode::Pass);
    }

    /// A silent partition: nothing is forwarded or answered, connections stay open and new
    /// ones are accepted and held.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Closes every connection abruptly (RST) and resets new ones until the mode changes.
    pub fn reset(&self) {
        self.set_mode(ProxyMode::Reset);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.state().mode
    }

    /// Sends connections accepted from now on to `target`; open ones keep theirs.
    pub fn set_target(&self, target: SocketAddr) {
        self.shared.state().target = target;
    }

    /// Where new connections go.
    pub fn target(&self) -> SocketAddr {
        self.shared.state().target
    }

    /// How many client connections are open through the proxy (held ones included).
    pub fn connections(&self) -> usize {
        self.shared.registry().len()
    }

    fn set_mode(&self, mode: ProxyMode) {
        self.shared.state().mode = mode;
        if mode == ProxyMode::Reset {
            self.shared.abort_all();
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.state().stopping = true;
        self.shared.changed.notify_all();
        // Wake the listener with a connection of our own; it sees `stopping` and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        self.shared.abort_all();
        // Connection threads leave the registry last, once their sockets are done with.
        let deadline = Instant::now() + STOP_DEADLINE;
        while !self.shared.registry().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Shared {
    // A panicking test thread must not make the proxy unusable for the rest of the test, so
    // a poisoned lock is taken over: the state it guards is always consistent.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn abort_all(&self) {
        let all: Vec<Arc<Connection>> = self.registry().values().cloned().collect();
        for connection in all {
            connection.abort();
        }
        self.wake();
    }

    /// Wakes every waiting thread. Taking the lock first means a thread that checked its
    /// flags before they changed is already waiting, so it cannot miss this wake-up.
    fn wake(&self) {
        drop(self.state());
        self.changed.notify_all();
    }

    /// Blocks while the proxy is blackholed; `true` when the connection may forward now,
    /// `false` when it must end (aborted, reset, stopping, or a held client went away).
    fn wait_to_forward(&self, connection: &Connection) -> bool {
        let mut state = self.state();
        loop {
            if connection.aborted.load(Ordering::SeqCst) || state.stopping {
                return false;
            }
            match state.mode {
                ProxyMode::Pass => return true,
                ProxyMode::Reset => {
                    drop(state);
                    connection.abort();
                    return false;
                }
                ProxyMode::Blackhole => {
                    state = self
                        .changed
                        .wait_timeout(state, RECHECK)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    // A connection held since accept has no pump reading it: look whether
                    // its client has gone, so held connections do not pile up.
                    if connection.upstream.get().is_none() && client_gone(&connection.client) {
                        return false;
                    }
                }
            }
        }
    }
}

impl Connection {
    /// Makes both sockets close with RST, and wakes the pumps blocked reading them (a read
    /// shutdown sends nothing to the peer); the sockets close when the last holder drops.
    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        for socket in std::iter::once(&self.client).chain(self.upstream.get()) {
            let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
            let _ = socket.shutdown(Shutdown::Read);
        }
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    for client in listener.incoming() {
        let (stopping, mode) = {
            let state = shared.state();
            (state.stopping, state.mode)
        };
        if stopping {
            return;
        }
        // Accept errors (a client gone before accept, too many files) concern one
        // connection; the listener goes on.
        let Ok(client) = client else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let connection = Arc::new(Connection {
            client,
            upstream: OnceLock::new(),
            aborted: AtomicBool::new(false),
        });
        if mode == ProxyMode::Reset {
            connection.abort();
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        shared.registry().insert(id, Arc::clone(&connection));
        let worker = Arc::clone(shared);
        let started = std::thread::Builder::new()
            .name(format!("proxy-conn-{id}"))
            .spawn(move || {
                serve(&worker, &connection);
                worker.registry().remove(&id);
            });
        if started.is_err()
            && let Some(connection) = shared.registry().remove(&id)
        {
            connection.abort();
        }
    }
}

/// Runs one connection to its end: waits out a blackhole, connects to the target, then
/// pumps client → target here and target → client on a second thread.
fn serve(shared: &Arc<Shared>, connection: &Arc<Connection>) {
    if !shared.wait_to_forward(connection) {
        connection.abort();
        return;
    }
    let target = shared.state().target;
    let Ok(upstream) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        // Nothing listens there: the client sees its connection reset, as it would see a
        // refused connection without the proxy.
        connection.abort();
        return;
    };
    for socket in [&connection.client, &upstream] {
        let _ = socket.set_nodelay(true);
        // Bounded writes, so a pump blocked on a peer that does not read notices an abort.
        let _ = socket.set_write_timeout(Some(RECHECK));
    }
    // Only this thread sets `upstream`, once.
    let _ = connection.upstream.set(upstream);
    if connection.is_aborted() {
        // Reset while connecting: abort again so the new socket closes with RST too.
        connection.abort();
        return;
    }
    let Some(upstream) = connection.upstream.get() else {
        return;
    };
    let back = {
        let shared = Arc::clone(shared);
        let connection = Arc::clone(connection);
        std::thread::Builder::new()
            .name("proxy-pump".to_owned())
            .spawn(move || {
                if let Some(upstream) = connection.upstream.get() {
                    pump(&shared, &connection, upstream, &connection.client);
                }
            })
    };
    let Ok(back) = back else {
        connection.abort();
        return;
    };
    pump(shared, connection, &connection.client, upstream);
    let _ = back.join();
}

/// Copies `from` → `to` until EOF or abort, holding bytes (and EOF) while blackholed.
fn pump(shared: &Shared, connection: &Connection, mut from: &TcpStream, to: &TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                // A peer reset the connection: pass the abrupt end on to the other side.
                connection.abort();
                shared.wake();
                return;
            }
        };
        if !shared.wait_to_forward(connection) {
            return;
        }
        if n == 0 {
            // The peer finished sending: finish this direction, keep the other one going.
            let _ = to.shutdown(Shutdown::Write);
            return;
        }
        if write_all(shared, connection, to, &buf[..n]).is_err() {
            connection.abort();
            shared.wake();
            return;
        }
    }
}

/// `write_all` that gives up when the connection is aborted while the peer does not read.
fn write_all(
    shared: &Shared,
    connection: &Connection,
    mut to: &TcpStream,
    mut bytes: &[u8],
) -> Result<(), ()> {
    while !bytes.is_empty() {
        if connection.is_aborted() || shared.state().stopping {
            return Err(());
        }
        match to.write(bytes) {
            Ok(0) => return Err(()),
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                ) => {}
            Err(_) => return Err(()),
        }
    }
    Ok(())
}

/// Whether the peer of a socket nobody reads has closed it (EOF or error on a peek).
fn client_gone(client: &TcpStream) -> bool {
    if client.set_nonblocking(true).is_err() {
        return false;
    }
    let gone = match client.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    let _ = client.set_nonblocking(false);
    gone
}
