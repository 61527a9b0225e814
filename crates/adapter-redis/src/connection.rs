//! Supervised connections to one Redis node.
//!
//! A [`NodeSet`] keeps `connections` multiplexed connections (slots) to one node: a fixed
//! address (a standalone server, a cluster shard's master) or whichever master Sentinel
//! reports now ([`Locate::Sentinel`]). Each slot has a supervisor task that connects (TCP,
//! optional TLS, handshake), checks the server (version, role, eviction policy), preloads the
//! programs, and then watches the connection. The slot is marked down *at once* and
//! reconnected, with a backoff capped at `reconnect_backoff_max`, when
//!
//! - the connection's driver ends (server gone, reset, EOF);
//! - the link is declared stuck (consecutive command timeouts: a half-open socket, a
//!   partition) or no longer a master (a `READONLY` reply after a failover);
//! - Sentinel names another master.
//!
//! Every request is pipelined on a live connection with the others in flight, so there is no
//! per-call connection setup and no pool checkout. Picking a connection is a read of a flag.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::{RedisConnectionInfo, Value};
use rustls_pki_types::ServerName;
use shared_contract::Readiness;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use crate::programs;
use crate::sentinel::SentinelMonitor;
use crate::settings::RedisSettings;
use crate::tls;
use crate::wire::{Conn, Driver};

/// A program to preload on every new connection: name, exact source, SHA1 of the source.
pub(crate) type Script = (&'static str, &'static str, &'static str);

/// What every data node of a topology is reached with: credentials and database, and the TLS
/// connector when the topology speaks `rediss://`.
pub(crate) struct Access {
    pub(crate) redis: RedisConnectionInfo,
    pub(crate) tls: Option<TlsConnector>,
}

/// One node's address and how to reach it.
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    access: Arc<Access>,
    /// The name the node's certificate must carry (its host), with TLS.
    server_name: Option<ServerName<'static>>,
}

impl Endpoint {
    /// # Errors
    /// A description when TLS is on and `host` is not a valid certificate name.
    pub(crate) fn new(host: &str, port: u16, access: Arc<Access>) -> Result<Self, String> {
        let server_name = match &access.tls {
            Some(_) => Some(tls::server_name(host)?),
            None => None,
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            access,
            server_name,
        })
    }

    /// Whether this is the node at `host:port`.
    pub(crate) fn is(&self, host: &str, port: u16) -> bool {
        self.port == port && self.host == host
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The last reason a background task (Sentinel monitor, cluster map) could not do its job,
/// for readiness messages.
pub(crate) struct LastError(std::sync::Mutex<String>);

impl LastError {
    pub(crate) fn new(initial: &str) -> Self {
        Self(std::sync::Mutex::new(initial.to_owned()))
    }

    pub(crate) fn get(&self) -> String {
        match self.0.lock() {
            Ok(e) => e.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn set(&self, error: String) {
        match self.0.lock() {
            Ok(mut e) => *e = error,
            Err(p) => *p.into_inner() = error,
        }
    }
}

/// What a new connection is checked for and loaded with.
pub(crate) struct Setup {
    /// Programs preloaded with `SCRIPT LOAD`.
    pub(crate) scripts: Arc<[Script]>,
    /// What the ACL user must be allowed, checked on every new connection.
    pub(crate) acl: Arc<crate::acl::Needs>,
}

/// Consecutive command timeouts after which a connection is presumed stuck (a half-open
/// socket, a partition) and replaced: later requests then see `Unavailable(connect)` while
/// nothing answers, instead of piling up as `Indeterminate` on a dead socket.
const STUCK_AFTER_TIMEOUTS: u32 = 3;

/// A live connection, the flag its driver clears when it ends, and the notifier that tells
/// the supervisor to replace it.
pub(crate) struct Link {
    pub(crate) conn: Conn,
    alive: Arc<AtomicBool>,
    ended: Arc<Notify>,
    timeouts: AtomicU32,
    acks: Arc<AckGroups>,
}

/// Group commit of `WAIT` on one connection (`min_replicas_ack`).
///
/// `WAIT` blocks the connection it is sent on until the replicas acknowledge every write that
/// connection made before it, and Redis runs a connection's commands in order. One `WAIT` per
/// call would therefore serialize the whole multiplexed connection on replication round
/// trips. Instead, a call whose program has replied joins the next group; one `WAIT` is sent
/// for each group, after every member's reply arrived, so it covers all of their writes, and
/// its count is every member's answer. At most one `WAIT` is in flight per connection; calls
/// that reply meanwhile form the next group.
#[derive(Default)]
struct AckGroups {
    state: std::sync::Mutex<AckState>,
}

#[derive(Default)]
struct AckState {
    waiting: Vec<tokio::sync::oneshot::Sender<u64>>,
    in_flight: bool,
}

impl AckGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, AckState> {
        match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }

    /// Sends `WAIT` for groups until nobody waits; a failed `WAIT` acknowledges nothing.
    async fn drive(self: Arc<Self>, conn: Conn, replicas: u32, ms: u64) {
        let wait = redis::cmd("WAIT").arg(replicas).arg(ms).to_owned();
        loop {
            let group = {
                let mut state = self.lock();
                if state.waiting.is_empty() {
                    state.in_flight = false;
                    return;
                }
                std::mem::take(&mut state.waiting)
            };
            let acked = match conn.send_packed_command(&wait).await {
                Ok(Value::Int(n)) => u64::try_from(n).unwrap_or(0),
                _ => 0,
            };
            for member in group {
                let _ = member.send(acked);
            }
        }
    }
}

impl Link {
    /// A reply arrived: the connection is not stuck.
    pub(crate) fn replied(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// A command timed out; after [`STUCK_AFTER_TIMEOUTS`] in a row the link is replaced.
    pub(crate) fn timed_out(&self) {
        let n = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if n == STUCK_AFTER_TIMEOUTS {
            self.retire("presumed stuck after consecutive timeouts");
        }
    }

    /// Takes the link out of service at once; its supervisor reconnects (and, under
    /// Sentinel, resolves the master again).
    pub(crate) fn retire(&self, why: &str) {
        if self.alive.swap(false, Ordering::AcqRel) {
            tracing::warn!(why, "replacing a redis connection");
            self.ended.notify_one();
        }
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// How many replicas acknowledged the writes this connection made so far (at least up to
    /// a reply the caller has received): joins the next `WAIT` group ([`AckGroups`]).
    pub(crate) async fn replicas_acked(&self, replicas: u32, ms: u64) -> u64 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lead = {
            let mut state = self.acks.lock();
            state.waiting.push(tx);
            !std::mem::replace(&mut state.in_flight, true)
        };
        if lead {
            tokio::spawn(self.acks.clone().drive(self.conn.clone(), replicas, ms));
        }
        rx.await.unwrap_or(0)
    }
}

enum SlotState {
    /// Not connected; the reason is shown by `readiness()`.
    Down(Arc<str>),
    /// Connected to a server this build cannot use (too old, refused settings).
    Incompatible(Arc<str>),
    Up(Arc<Link>),
}

struct Slot {
    state: RwLock<SlotState>,
}

impl Slot {
    fn set(&self, state: SlotState) {
        // A poisoned lock only means a panic elsewhere while holding it; the state is a
        // plain value, so overwrite it anyway.
        match self.state.write() {
            Ok(mut s) => *s = state,
            Err(p) => *p.into_inner() = state,
        }
    }
}

/// A connection to send on, or why there is none.
pub(crate) enum Pick {
    Up(Arc<Link>),
    Down(Arc<str>),
    Incompatible(Arc<str>),
}

/// Where a [`NodeSet`] connects.
#[derive(Clone)]
pub(crate) enum Locate {
    /// Always the same node.
    Fixed(Arc<Endpoint>),
    /// The master Sentinel reports now; left when Sentinel reports another.
    Sentinel(Arc<SentinelMonitor>),
}

/// Aborts tasks when dropped (supervisors, monitors).
pub(crate) struct Tasks(pub(crate) Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// `connections` supervised slots to one node, picked round robin.
pub(crate) struct NodeSet {
    slots: Vec<Arc<Slot>>,
    next: AtomicUsize,
    attempts: watch::Receiver<usize>,
    _supervisors: Tasks,
}

impl NodeSet {
    /// Starts one supervisor per connection. Returns at once; [`Self::settled`] waits for the
    /// first attempts.
    pub(crate) fn start(locate: Locate, settings: &RedisSettings, setup: Arc<Setup>) -> Self {
        let slots: Vec<Arc<Slot>> = (0..settings.connections)
            .map(|_| {
                Arc::new(Slot {
                    state: RwLock::new(SlotState::Down("not connected yet".into())),
                })
            })
            .collect();
        let (attempts_tx, attempts) = watch::channel(0usize);
        let attempts_tx = Arc::new(attempts_tx);
        let handles = slots
            .iter()
            .map(|slot| {
                tokio::spawn(supervise(
                    slot.clone(),
                    locate.clone(),
                    settings.clone(),
                    setup.clone(),
                    attempts_tx.clone(),
                ))
            })
            .collect();
        Self {
            slots,
            next: AtomicUsize::new(0),
            attempts,
            _supervisors: Tasks(handles),
        }
    }

    /// Waits until every connection has finished its first attempt (up or not).
    pub(crate) async fn settled(&self) {
        let n = self.slots.len();
        let mut attempts = self.attempts.clone();
        let _ = attempts.wait_for(|&done| done >= n).await;
    }

    /// `Ready` when a connection is up and answers `PING` within `timeout`.
    pub(crate) async fn readiness(&self, timeout: Duration) -> Readiness {
        let conn = match self.pick() {
            Pick::Up(link) => link.conn.clone(),
            Pick::Down(reason) => return Readiness::NotReady(format!("redis: {reason}")),
            Pick::Incompatible(reason) => return Readiness::NotReady(format!("redis: {reason}")),
        };
        let ping = redis::cmd("PING");
        match tokio::time::timeout(timeout, conn.send_packed_command(&ping)).await {
            Ok(Ok(Value::SimpleString(s))) if s == "PONG" => Readiness::Ready,
            Ok(Ok(other)) => Readiness::NotReady(format!("redis: unexpected PING reply {other:?}")),
            Ok(Err(e)) => Readiness::NotReady(format!("redis: PING failed: {e}")),
            Err(_) => Readiness::NotReady(format!("redis: no PING reply within {timeout:?}")),
        }
    }

    /// A live connection, round robin over the slots, skipping dead ones.
    pub(crate) fn pick(&self) -> Pick {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        // Built only on the failure path: the happy path allocates nothing.
        let mut why: Option<Pick> = None;
        for i in 0..n {
            let slot = &self.slots[(start + i) % n];
            let guard = match slot.state.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            match &*guard {
                SlotState::Up(link) if link.is_alive() => {
                    return Pick::Up(link.clone());
                }
                SlotState::Up(_) => {
                    if !matches!(why, Some(Pick::Incompatible(_))) {
                        why = Some(Pick::Down("connection lost; reconnecting".into()));
                    }
                }
                SlotState::Down(reason) => {
                    if !matches!(why, Some(Pick::Incompatible(_))) {
                        why = Some(Pick::Down(reason.clone()));
                    }
                }
                SlotState::Incompatible(reason) => why = Some(Pick::Incompatible(reason.clone())),
            }
        }
        why.unwrap_or_else(|| Pick::Down("no connection configured".into()))
    }
}

/// A connection attempt that did not give a usable link.
pub(crate) enum Attempt {
    /// Not reachable or not usable now; try again.
    Down(String),
    /// Reachable but unusable by this build or these settings.
    Incompatible(String),
}

/// TCP, optional TLS and the handshake (AUTH/SELECT), within `connect_timeout`. The driver
/// must be polled (spawned) for the connection to make progress.
pub(crate) async fn connect(
    endpoint: &Endpoint,
    settings: &RedisSettings,
) -> Result<(Conn, Driver), String> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| format!("connect to {endpoint}: {e}"))?;
        // Small requests and replies: do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let (conn, mut driver) = match (&endpoint.access.tls, &endpoint.server_name) {
            (Some(connector), Some(name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| format!("TLS handshake with {endpoint}: {e}"))?;
                Conn::new(stream)
            }
            _ => Conn::tcp(stream),
        };
        // The handshake's replies arrive only while the reader runs.
        let handshake = conn.handshake(&endpoint.access.redis);
        tokio::select! {
            done = handshake => done.map_err(|e| format!("handshake with {endpoint}: {e}"))?,
            () = &mut driver => {
                return Err(format!("handshake with {endpoint}: the connection closed"));
            }
        }
        Ok((conn, driver))
    };
    tokio::time::timeout(settings.connect_timeout, attempt)
        .await
        .map_err(|_| {
            format!(
                "no connection to {endpoint} within {:?}",
                settings.connect_timeout
            )
        })?
}

/// One connection attempt: connect, check the server, preload the programs. Returns the live
/// link, the notifier its driver fires when it ends, and the driver task.
async fn open(
    endpoint: &Endpoint,
    settings: &RedisSettings,
    setup: &Setup,
) -> Result<(Link, Arc<Notify>, JoinHandle<()>), Attempt> {
    let (conn, driver) = connect(endpoint, settings).await.map_err(Attempt::Down)?;
    let alive = Arc::new(AtomicBool::new(true));
    let ended = Arc::new(Notify::new());
    let driver = tokio::spawn({
        let alive = alive.clone();
        let ended = ended.clone();
        async move {
            driver.await;
            alive.store(false, Ordering::Release);
            ended.notify_one();
        }
    });
    let link = Link {
        conn,
        alive,
        ended: ended.clone(),
        timeouts: AtomicU32::new(0),
        acks: Arc::default(),
    };
    let checks = async {
        let conn = &link.conn;
        check_version(conn).await?;
        check_role(conn, endpoint).await?;
        check_eviction_policy(conn, settings.strict_eviction_policy).await?;
        preload(conn, &setup.scripts).await?;
        crate::acl::check(conn, &setup.acl, endpoint.access.redis.username()).await
    };
    let checked = tokio::time::timeout(settings.connect_timeout, checks)
        .await
        .unwrap_or_else(|_| {
            Err(Attempt::Down(format!(
                "{endpoint}: no reply to the connection checks (INFO, ROLE, CONFIG GET, SCRIPT LOAD, the ACL check) in time"
            )))
        });
    match checked {
        Ok(()) => Ok((link, ended, driver)),
        Err(e) => {
            driver.abort();
            Err(e)
        }
    }
}

/// The text of a bulk or verbatim string reply.
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Refuses servers older than the programs' minimum. A least-privilege ACL user may not be
/// allowed `INFO`; the check is then skipped (the programs still refuse to run on a server
/// that lacks what they use, which surfaces as `Incompatible(program)`).
async fn check_version(conn: &Conn) -> Result<(), Attempt> {
    let refused = |code: &str| {
        tracing::warn!(
            code,
            "INFO refused (ACL?); skipping the server version check"
        );
        Ok(())
    };
    let info = match conn
        .send_packed_command(redis::cmd("INFO").arg("server"))
        .await
    {
        Ok(Value::ServerError(e)) => return refused(e.code()),
        Err(e) if e.code().is_some() => return refused(e.code().unwrap_or_default()),
        Err(e) => return Err(Attempt::Down(format!("INFO server: {e}"))),
        Ok(info) => info,
    };
    let Some(text) = text(&info) else {
        return Err(Attempt::Down(format!("INFO server answered {info:?}")));
    };
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("unknown")
        .to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(Attempt::Incompatible(format!(
                "unknown server version {version:?}"
            )));
        }
    };
    let needed = programs::PROGRAMS
        .iter()
        .map(|p| p.min_redis_version)
        .max()
        .unwrap_or((7, 0));
    if (major, minor) < needed {
        return Err(Attempt::Incompatible(format!(
            "server version {version} is older than {}.{}, the programs' minimum",
            needed.0, needed.1
        )));
    }
    Ok(())
}

/// Refuses a node that is not a master: limiter state is written, and a replica would answer
/// every program with `READONLY`. After a failover a client may still be pointed at the old
/// master, now a replica (Sentinel's answer can lag), so this is checked on every connection.
/// Where `ROLE` is not permitted (ACL) the check is skipped: a replica then answers
/// `READONLY`, which retires the connection.
async fn check_role(conn: &Conn, endpoint: &Endpoint) -> Result<(), Attempt> {
    match conn.send_packed_command(&redis::cmd("ROLE")).await {
        Ok(Value::Array(items)) => match items.first().and_then(text).as_deref() {
            Some("master") => Ok(()),
            Some(role) => Err(Attempt::Down(format!(
                "{endpoint} is a {role}, not a master (writes would be refused); waiting for a master"
            ))),
            None => Err(Attempt::Down(format!(
                "{endpoint}: ROLE answered {items:?}"
            ))),
        },
        Err(e) if e.code().is_none() => Err(Attempt::Down(format!("ROLE: {e}"))),
        _ => {
            tracing::debug!("ROLE refused or unexpected (ACL?); role not checked");
            Ok(())
        }
    }
}

/// An `allkeys-*` eviction policy may drop limiter state under memory pressure: a dropped
/// counter starts again from zero and admits beyond the limit. `noeviction` is safe (writes are
/// refused with `OOM`, classified `Unavailable`), `volatile-*` may still evict (every limiter
/// key has a TTL) but only under pressure and nearest-expiry first. Where `CONFIG` is not
/// permitted the check is skipped.
async fn check_eviction_policy(conn: &Conn, strict: bool) -> Result<(), Attempt> {
    let reply = conn
        .send_packed_command(redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"))
        .await;
    let policy = match reply {
        Ok(Value::Array(items)) | Ok(Value::Set(items)) if items.len() == 2 => match &items[1] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            _ => return Ok(()),
        },
        Ok(Value::Map(pairs)) => match pairs.first() {
            Some((_, Value::BulkString(b))) => String::from_utf8_lossy(b).into_owned(),
            _ => return Ok(()),
        },
        Err(e) if e.code().is_none() => {
            return Err(Attempt::Down(format!("CONFIG GET maxmemory-policy: {e}")));
        }
        _ => {
            tracing::info!("CONFIG GET refused or unexpected (ACL?); eviction policy not checked");
            return Ok(());
        }
    };
    if policy.starts_with("allkeys-") {
        let why = format!(
            "maxmemory-policy is {policy}: under memory pressure Redis evicts limiter state \
             silently, counts restart from zero and requests are admitted beyond their limits; \
             use noeviction (or volatile-ttl)"
        );
        if strict {
            return Err(Attempt::Incompatible(format!(
                "{why} (refused: strict_eviction_policy = true)"
            )));
        }
        tracing::warn!("{why}");
    }
    Ok(())
}

/// `SCRIPT LOAD` of every program, so the first `EVALSHA` finds it. A server that forbids
/// `SCRIPT` (ACL) is fine: `NOSCRIPT` then triggers `EVAL`. A server that answers another
/// SHA1 than ours has hashed something else: unusable.
async fn preload(conn: &Conn, scripts: &[Script]) -> Result<(), Attempt> {
    for &(name, source, sha1) in scripts {
        match conn
            .send_packed_command(redis::cmd("SCRIPT").arg("LOAD").arg(source))
            .await
        {
            Ok(Value::BulkString(sha)) if sha == sha1.as_bytes() => {}
            Ok(Value::BulkString(sha)) => {
                return Err(Attempt::Incompatible(format!(
                    "{}: server hashed it to {}, this build to {}",
                    name,
                    String::from_utf8_lossy(&sha),
                    sha1
                )));
            }
            Ok(Value::ServerError(e)) => {
                tracing::warn!(
                    program = name,
                    code = e.code(),
                    "SCRIPT LOAD refused; relying on EVAL"
                );
            }
            Ok(other) => {
                return Err(Attempt::Incompatible(format!(
                    "{}: SCRIPT LOAD answered {other:?}",
                    name
                )));
            }
            Err(e) if e.code().is_some() => {
                tracing::warn!(program = name, error = %e, "SCRIPT LOAD refused; relying on EVAL");
            }
            Err(e) => return Err(Attempt::Down(format!("SCRIPT LOAD: {e}"))),
        }
    }
    Ok(())
}

/// Keeps one slot connected for the provider's lifetime.
async fn supervise(
    slot: Arc<Slot>,
    locate: Locate,
    settings: RedisSettings,
    setup: Arc<Setup>,
    attempts: Arc<watch::Sender<usize>>,
) {
    let min_backoff = Duration::from_millis(25);
    let mut backoff = min_backoff;
    let mut first = true;
    let mut was_up = false;
    loop {
        let located = match &locate {
            Locate::Fixed(endpoint) => Ok(endpoint.clone()),
            // After a failure, only a sentinel answer given since may say where to go.
            Locate::Sentinel(monitor) if first => monitor.master(settings.connect_timeout).await,
            Locate::Sentinel(monitor) => monitor.fresh_master(settings.connect_timeout).await,
        };
        let opened = match located {
            Ok(endpoint) => open(&endpoint, &settings, &setup)
                .await
                .map(|opened| (endpoint, opened)),
            Err(reason) => Err(Attempt::Down(reason)),
        };
        match opened {
            Ok((endpoint, (link, ended, driver))) => {
                let link = Arc::new(link);
                slot.set(SlotState::Up(link.clone()));
                if first {
                    attempts.send_modify(|n| *n += 1);
                    first = false;
                }
                tracing::info!(node = %endpoint, "redis connection up");
                was_up = true;
                backoff = min_backoff;
                match &locate {
                    Locate::Fixed(_) => ended.notified().await,
                    Locate::Sentinel(monitor) => {
                        tokio::select! {
                            () = ended.notified() => {}
                            () = monitor.moved_from(&endpoint) => {
                                link.retire("sentinel reports another master");
                            }
                        }
                    }
                }
                // The flag is already cleared; the slot now says why.
                slot.set(SlotState::Down("connection lost; reconnecting".into()));
                tracing::warn!(node = %endpoint, "redis connection lost");
                if let Locate::Sentinel(monitor) = &locate {
                    monitor.nudge();
                }
                // Ended by its driver (a no-op abort) or retired: close the socket.
                driver.abort();
                continue;
            }
            Err(Attempt::Incompatible(reason)) => {
                tracing::error!(%reason, "redis server cannot run the programs");
                slot.set(SlotState::Incompatible(reason.into()));
                // Check again now and then: the server may be upgraded in place.
                backoff = settings.reconnect_backoff_max.max(Duration::from_secs(5));
            }
            Err(Attempt::Down(reason)) => {
                if was_up || first {
                    tracing::warn!(%reason, "redis not reachable; retrying in the background");
                    was_up = false;
                }
                slot.set(SlotState::Down(reason.into()));
                if let Locate::Sentinel(monitor) = &locate {
                    monitor.nudge();
                }
            }
        }
        if first {
            attempts.send_modify(|n| *n += 1);
            first = false;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(settings.reconnect_backoff_max.max(min_backoff));
    }
}
