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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::thread::ThreadId;
use std::time::Duration;

use redis::Value;
use shared_contract::Readiness;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::acl::{self, Needs};
use crate::background::Tasks;
use crate::checks;
use crate::dial::{self, Attempt, Endpoint};
use crate::placement::Placement;
use crate::script::Script;
use crate::sentinel::SentinelMonitor;
use crate::settings::RedisSettings;
use crate::wire::Conn;

/// How the connections of one provider are made, checked and kept: built once from the
/// settings, shared by every supervisor (of every master, on a cluster).
pub(crate) struct Setup {
    /// Connections per node.
    pub(crate) connections: usize,
    /// Longest wait for one attempt: the dial, then the checks.
    pub(crate) connect_timeout: Duration,
    /// Longest pause between two attempts.
    pub(crate) reconnect_backoff_max: Duration,
    /// Refuse an `allkeys-*` eviction policy instead of warning.
    pub(crate) strict_eviction_policy: bool,
    /// Programs preloaded with `SCRIPT LOAD` (and whose minimum Redis version is checked).
    pub(crate) scripts: Vec<&'static Script>,
    /// What the ACL user must be allowed, checked on every new connection.
    pub(crate) acl: Needs,
    /// The serving threads' runtimes the connections are spread over (empty: the caller's).
    pub(crate) placement: Placement,
}

impl Setup {
    pub(crate) fn new(
        settings: &RedisSettings,
        scripts: Vec<&'static Script>,
        acl: Needs,
        placement: Placement,
    ) -> Self {
        Self {
            connections: settings.connections,
            connect_timeout: settings.connect_timeout,
            reconnect_backoff_max: settings.reconnect_backoff_max,
            strict_eviction_policy: settings.strict_eviction_policy,
            scripts,
            acl,
            placement,
        }
    }

    /// Connections per node: `connections`, and at least one per placed runtime.
    fn per_node(&self) -> usize {
        self.connections.max(self.placement.len())
    }
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
            let acked = match conn.send(&wait).await {
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
    /// With a [`Placement`]: the thread whose runtime runs this slot's connection.
    home: OnceLock<ThreadId>,
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

/// `connections` supervised slots to one node, picked round robin; with a [`Placement`], at
/// least one per placed runtime, and a caller on a placed thread takes its own while it is up.
pub(crate) struct NodeSet {
    slots: Vec<Arc<Slot>>,
    next: AtomicUsize,
    placed: bool,
    attempts: watch::Receiver<usize>,
    _supervisors: Tasks,
}

impl NodeSet {
    /// Starts one supervisor per connection. Returns at once; [`Self::settled`] waits for the
    /// first attempts.
    pub(crate) fn start(locate: Locate, setup: Arc<Setup>) -> Self {
        let slots: Vec<Arc<Slot>> = (0..setup.per_node())
            .map(|_| {
                Arc::new(Slot {
                    state: RwLock::new(SlotState::Down("not connected yet".into())),
                    home: OnceLock::new(),
                })
            })
            .collect();
        let (attempts_tx, attempts) = watch::channel(0usize);
        let attempts_tx = Arc::new(attempts_tx);
        let handles = slots
            .iter()
            .enumerate()
            .map(|(k, slot)| {
                let supervisor = supervise(
                    slot.clone(),
                    locate.clone(),
                    setup.clone(),
                    attempts_tx.clone(),
                );
                match setup.placement.runtime(k) {
                    // The supervisor, and so the connection's driver and reconnects, live on
                    // that runtime's one thread.
                    Some(runtime) => {
                        let slot = slot.clone();
                        runtime.spawn(async move {
                            let _ = slot.home.set(crate::placement::this_thread());
                            supervisor.await;
                        })
                    }
                    None => tokio::spawn(supervisor),
                }
            })
            .collect();
        Self {
            slots,
            next: AtomicUsize::new(0),
            placed: !setup.placement.is_empty(),
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
        match tokio::time::timeout(timeout, conn.send(&ping)).await {
            Ok(Ok(Value::SimpleString(s))) if s == "PONG" => Readiness::Ready,
            Ok(Ok(other)) => Readiness::NotReady(format!("redis: unexpected PING reply {other:?}")),
            Ok(Err(e)) => Readiness::NotReady(format!("redis: PING failed: {e}")),
            Err(_) => Readiness::NotReady(format!("redis: no PING reply within {timeout:?}")),
        }
    }

    /// A live connection: the caller's thread's own when placed and up; otherwise round robin
    /// over the slots, skipping dead ones.
    pub(crate) fn pick(&self) -> Pick {
        if self.placed
            && let Some(link) = self.own()
        {
            return Pick::Up(link);
        }
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

impl NodeSet {
    /// The live connection whose runtime runs on the caller's thread, if any.
    fn own(&self) -> Option<Arc<Link>> {
        let me = crate::placement::this_thread();
        let slot = self.slots.iter().find(|s| s.home.get() == Some(&me))?;
        let guard = match slot.state.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match &*guard {
            SlotState::Up(link) if link.is_alive() => Some(link.clone()),
            _ => None,
        }
    }
}

/// One connection attempt: connect, check the server, preload the programs. Returns the live
/// link, the notifier its driver fires when it ends, and the driver task.
async fn open(
    endpoint: &Endpoint,
    setup: &Setup,
) -> Result<(Link, Arc<Notify>, JoinHandle<()>), Attempt> {
    let (conn, driver) = dial::dial(endpoint, setup.connect_timeout)
        .await
        .map_err(Attempt::Down)?;
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
        checks::server(conn, endpoint, &setup.scripts, setup.strict_eviction_policy).await?;
        acl::check(conn, &setup.acl, endpoint.access.redis.username()).await
    };
    let checked = tokio::time::timeout(setup.connect_timeout, checks)
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

/// Keeps one slot connected for the provider's lifetime.
async fn supervise(
    slot: Arc<Slot>,
    locate: Locate,
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
            Locate::Sentinel(monitor) if first => monitor.master(setup.connect_timeout).await,
            Locate::Sentinel(monitor) => monitor.fresh_master(setup.connect_timeout).await,
        };
        let opened = match located {
            Ok(endpoint) => open(&endpoint, &setup)
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
                backoff = setup.reconnect_backoff_max.max(Duration::from_secs(5));
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
        backoff = (backoff * 2).min(setup.reconnect_backoff_max.max(min_backoff));
    }
}
