//! The Redis provider: settings, the supervised connections, and `EdgeRateLimitPort`.
//!
//! ## Connections
//!
//! The provider holds `connections` multiplexed connections (default 1): every request is
//! pipelined on one socket with the others in flight, so there is no per-call connection
//! setup and no pool checkout. Each connection has a supervisor task that connects (with
//! `connect_timeout`), checks the server version (Redis >= 7.0, the programs' manifest),
//! preloads the programs with `SCRIPT LOAD`, and then watches the connection's driver: when the
//! driver ends (server gone, reset, EOF) the connection is marked down *at once* and the
//! supervisor reconnects with a backoff capped at `reconnect_backoff_max` (250 ms by default,
//! so a restarted server is used again well within a second).
//!
//! [`RedisProvider::connect`] never fails because the server is unreachable: it waits at most
//! `connect_timeout` for the first connection and returns either way. Until a connection is up
//! every evaluation is `Unavailable(connect)` (nothing is sent) and `readiness()` says why; a
//! service can therefore start before its Redis and becomes ready when Redis does.
//!
//! ## Least privilege
//!
//! A dedicated ACL user needs only `~<key_prefix>:* +evalsha +eval +script|load +ping +time
//! +get +set` (the programs call `TIME`, `GET` and `SET`). `INFO` is optional: without it
//! the server version check is skipped. Credentials come from the URL
//! (`redis://user:password@host:port/db`); a refused login leaves the connection down
//! (`Unavailable(connect)`). Every new connection is checked before use ([`crate::acl`]):
//! a user that may not run one of the programs' commands (or `EVALSHA`, `EVAL`, `PING`) on
//! the prefix's keys makes it `Incompatible`, so every evaluation is `Incompatible(program)`
//! from the first request on and `readiness()` names what is missing and the rule to grant.
//!
//! ## At most once
//!
//! The driver is used without any retry: a command is handed to the connection once, and a
//! timeout or a broken connection after that is reported as `Indeterminate`, never resent
//! (see [`crate::failure`]). The only second command of a request is the `EVAL` after a
//! `NOSCRIPT` reply, which the server answers only when it ran nothing.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, IntoConnectionInfo, Value};
use shared_contract::{
    EdgeRateLimitPort, IncompatibleCategory, PolicyId, PolicySet, RateLimitOutcome,
    RateLimitPolicy, RateLimitRequest, Readiness, RequestError, UnavailableCategory,
};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::acl;
use crate::error::Error;
use crate::failure::{self, Failure};
use crate::keys::{PolicyKeys, check_prefix};
use crate::programs::{self, Program};
use crate::reply;
use crate::tls::{self, Tls, TlsFiles};

/// How to reach Redis and how much to ask of it.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port/db`.
    pub url: String,
    /// Longest wait for one evaluation's reply once dispatched; beyond it: `Indeterminate`.
    /// A caller deadline shorter than this is refused up front (`Unavailable(deadline)`).
    pub command_timeout: Duration,
    /// Admission bound: evaluations in flight at once; beyond it `Unavailable(admission)`
    /// and nothing is sent.
    pub max_in_flight: usize,
    /// First part of every key (`<prefix>:{tag}digest`).
    pub key_prefix: String,
    /// Longest wait for one connection attempt (TCP connect and handshake).
    pub connect_timeout: Duration,
    /// Multiplexed connections to spread requests over (default 1).
    pub connections: usize,
    /// The retry hint of `Unavailable` (except `clock`, which carries the program's own) and
    /// of `Indeterminate`.
    pub retry_after: Duration,
    /// Longest pause between two reconnection attempts.
    pub reconnect_backoff_max: Duration,
    /// CA and optional client certificate for `rediss://` (required there, refused otherwise).
    pub tls: TlsFiles,
    /// ACL user name; overrides none in the URL (giving both is refused).
    pub username: Option<String>,
    /// ACL password (from a file or the environment); never printed.
    pub password: Option<String>,
    /// Refuse a server whose `maxmemory-policy` is `allkeys-*` (it evicts limiter state
    /// silently, which under-counts and over-admits) instead of only warning.
    pub strict_eviction_policy: bool,
}

impl RedisSettings {
    /// Largest accepted `command_timeout`.
    pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
    /// Largest accepted `max_in_flight` (the semaphore's own bound is far larger).
    pub const MAX_IN_FLIGHT: usize = 1 << 20;
    /// Largest accepted `connections`.
    pub const MAX_CONNECTIONS: usize = 64;

    /// The defaults of `interface.md` for `url`: 50 ms command timeout, 1024 in flight,
    /// prefix `rl`, 1 s connect timeout, one connection, 1 s retry hint, 250 ms backoff cap.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            command_timeout: Duration::from_millis(50),
            max_in_flight: 1024,
            key_prefix: "rl".to_owned(),
            connect_timeout: Duration::from_secs(1),
            connections: 1,
            retry_after: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_millis(250),
            tls: TlsFiles::default(),
            username: None,
            password: None,
            strict_eviction_policy: false,
        }
    }

    fn validate(&self) -> Result<Endpoint, Error> {
        if self.command_timeout < Duration::from_millis(1)
            || self.command_timeout > Self::MAX_COMMAND_TIMEOUT
        {
            return Err(Error::CommandTimeout {
                got: self.command_timeout,
                max: Self::MAX_COMMAND_TIMEOUT,
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::ConnectTimeout {
                got: self.connect_timeout,
            });
        }
        if self.max_in_flight == 0 || self.max_in_flight > Self::MAX_IN_FLIGHT {
            return Err(Error::MaxInFlight {
                got: self.max_in_flight,
            });
        }
        if self.connections == 0 || self.connections > Self::MAX_CONNECTIONS {
            return Err(Error::Connections {
                got: self.connections,
            });
        }
        check_prefix(&self.key_prefix)?;
        let scheme = self.url.split("://").next().unwrap_or_default();
        let secure = match scheme {
            "redis" => false,
            "rediss" => true,
            _ => {
                return Err(Error::UnsupportedScheme {
                    scheme: scheme.chars().take(16).collect(),
                });
            }
        };
        if !secure && self.tls.any() {
            return Err(Error::Tls {
                key: "tls_ca_file",
                reason: "TLS files are set but the URL is redis://; use rediss://".to_owned(),
            });
        }
        // The driver parses `rediss://` only when built with its own TLS; this crate does the
        // TLS itself, so the rest of the URL is parsed as `redis://`.
        let plain_url = match self.url.strip_prefix("rediss://") {
            Some(rest) => format!("redis://{rest}"),
            None => self.url.clone(),
        };
        let mut info =
            plain_url
                .as_str()
                .into_connection_info()
                .map_err(|e| Error::InvalidUrl {
                    reason: e.detail().unwrap_or_else(|| e.category()).to_owned(),
                })?;
        let (host, port) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            _ => {
                return Err(Error::UnsupportedScheme {
                    scheme: scheme.to_owned(),
                });
            }
        };
        let mut redis_info = info.redis_settings().clone();
        if let Some(user) = &self.username {
            if user.is_empty() {
                return Err(Error::Credentials {
                    key: "username",
                    reason: "must not be empty".to_owned(),
                });
            }
            if redis_info.username().is_some() {
                return Err(Error::Credentials {
                    key: "username",
                    reason: "the URL already names a user; give it in one place".to_owned(),
                });
            }
            redis_info = redis_info.set_username(user);
        }
        if let Some(password) = &self.password {
            if redis_info.password().is_some() {
                return Err(Error::Credentials {
                    key: "password",
                    reason: "the URL already holds a password; give it in one place".to_owned(),
                });
            }
            redis_info = redis_info.set_password(password);
        }
        info = info.set_redis_settings(redis_info);
        let tls = if secure {
            Some(tls::build(&self.tls, &host)?)
        } else {
            None
        };
        Ok(Endpoint {
            host,
            port,
            info,
            tls,
        })
    }
}

impl fmt::Debug for RedisSettings {
    // The URL may carry a password: show only what follows the last '@'.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = match self.url.rsplit_once('@') {
            Some((_, host)) => format!("redis://<redacted>@{host}"),
            None => self.url.clone(),
        };
        f.debug_struct("RedisSettings")
            .field("url", &url)
            .field("command_timeout", &self.command_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("connections", &self.connections)
            .field("retry_after", &self.retry_after)
            .field("reconnect_backoff_max", &self.reconnect_backoff_max)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("strict_eviction_policy", &self.strict_eviction_policy)
            .finish()
    }
}

struct Endpoint {
    host: String,
    port: u16,
    info: redis::ConnectionInfo,
    tls: Option<Tls>,
}

/// Everything one policy needs per request, computed once.
#[derive(Debug)]
struct Plan {
    policy: RateLimitPolicy,
    program: &'static Program,
    keys: PolicyKeys,
    /// `ARGV[2..]`, already formatted.
    args: Vec<String>,
}

impl Plan {
    fn command(&self, verb: &str, script: &str, key: &str, cost: u64) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(script).arg(1).arg(key).arg(cost);
        for a in &self.args {
            cmd.arg(a.as_str());
        }
        cmd
    }
}

/// Consecutive command timeouts after which a connection is presumed stuck (a half-open
/// socket, a partition) and replaced: later requests then see `Unavailable(connect)` while
/// nothing answers, instead of piling up as `Indeterminate` on a dead socket.
const STUCK_AFTER_TIMEOUTS: u32 = 3;

/// A live connection, the flag its driver clears when it ends, and the notifier that tells
/// the supervisor to replace it.
pub(crate) struct Link {
    pub(crate) conn: MultiplexedConnection,
    alive: Arc<AtomicBool>,
    ended: Arc<Notify>,
    timeouts: AtomicU32,
}

impl Link {
    pub(crate) fn replied(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn timed_out(&self) {
        let n = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if n == STUCK_AFTER_TIMEOUTS {
            tracing::warn!(
                timeouts = n,
                "redis connection presumed stuck; replacing it"
            );
            self.alive.store(false, Ordering::Release);
            self.ended.notify_one();
        }
    }
}

enum SlotState {
    /// Not connected; the reason is shown by `readiness()`.
    Down(Arc<str>),
    /// Connected to a server this build cannot use (too old).
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

pub(crate) enum Pick {
    Up(Arc<Link>),
    Down(Arc<str>),
    Incompatible(Arc<str>),
}

struct Shared {
    settings: RedisSettings,
    policies: PolicySet,
    plans: HashMap<PolicyId, Plan>,
    pool: Pool,
    admission: Semaphore,
}

/// The supervised connections of one provider (rate limits or event gates): `connections`
/// slots, each kept connected by its supervisor task, picked round robin.
pub(crate) struct Pool {
    slots: Vec<Arc<Slot>>,
    next: AtomicUsize,
    _supervisors: Supervisors,
}

impl Pool {
    /// Checks `settings`, starts one supervisor per connection (each preloads `scripts`,
    /// `(name, source, sha1)`, after connecting, then checks that the ACL user may run what
    /// `acl` lists), and waits at most `connect_timeout` for every first attempt. An
    /// unreachable server is not an error.
    ///
    /// # Errors
    /// [`Error`] naming the bad setting.
    pub(crate) async fn start(
        settings: &RedisSettings,
        scripts: Arc<[Script]>,
        acl: Arc<acl::Needs>,
    ) -> Result<Self, Error> {
        let endpoint = Arc::new(settings.validate()?);
        let slots: Vec<Arc<Slot>> = (0..settings.connections)
            .map(|_| {
                Arc::new(Slot {
                    state: RwLock::new(SlotState::Down("not connected yet".into())),
                })
            })
            .collect();
        let (attempts_tx, mut attempts_rx) = watch::channel(0usize);
        let attempts_tx = Arc::new(attempts_tx);
        let handles = slots
            .iter()
            .map(|slot| {
                tokio::spawn(supervise(
                    slot.clone(),
                    endpoint.clone(),
                    settings.clone(),
                    scripts.clone(),
                    acl.clone(),
                    attempts_tx.clone(),
                ))
            })
            .collect();
        let n = slots.len();
        let wait = settings.connect_timeout + Duration::from_millis(100);
        // Either every connection finished its first attempt or the wait is over; both are
        // fine, the supervisors carry on in the background.
        let _ = tokio::time::timeout(wait, attempts_rx.wait_for(|&done| done >= n)).await;
        Ok(Self {
            slots,
            next: AtomicUsize::new(0),
            _supervisors: Supervisors(handles),
        })
    }

    /// `Ready` when a connection is up and answers `PING` within `timeout`.
    pub(crate) async fn readiness(&self, timeout: Duration) -> Readiness {
        let mut conn = match self.pick() {
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
                SlotState::Up(link) if link.alive.load(Ordering::Acquire) => {
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

/// A program to preload on every new connection: name, exact source, SHA1 of the source.
pub(crate) type Script = (&'static str, &'static str, &'static str);

/// The rate-limit programs, as [`Pool::start`] preloads them.
fn rate_scripts() -> Arc<[Script]> {
    programs::PROGRAMS
        .iter()
        .map(|p| (p.name, p.source, p.sha1()))
        .collect()
}

impl Shared {
    fn unavailable(
        &self,
        policy: &RateLimitPolicy,
        category: UnavailableCategory,
    ) -> RateLimitOutcome {
        RateLimitOutcome::Unavailable {
            policy_id: policy.id().clone(),
            retry_after_ms: self.retry_after_ms(),
            category,
        }
    }

    fn retry_after_ms(&self) -> u64 {
        self.settings
            .retry_after
            .as_millis()
            .min(u128::from(u64::MAX)) as u64
    }
}

/// Aborts the supervisor tasks when the provider is dropped.
struct Supervisors(Vec<JoinHandle<()>>);

impl Drop for Supervisors {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// The Redis provider of [`EdgeRateLimitPort`]: decisions are `global_redis`, one answer
/// across every instance that shares the server.
pub struct RedisProvider {
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("settings", &self.shared.settings)
            .field("policies", &self.shared.plans.len())
            .finish_non_exhaustive()
    }
}

impl RedisProvider {
    /// Checks `settings`, starts the connection supervisors, and waits at most
    /// `connect_timeout` for a first connection. An unreachable server is not an error: the
    /// provider then answers `Unavailable(connect)` until it connects in the background.
    ///
    /// Must be called inside a Tokio runtime (the supervisors are tasks of it).
    ///
    /// # Errors
    /// [`Error`] naming the bad setting (timeouts, bounds, key prefix, URL).
    pub async fn connect(settings: RedisSettings, policies: PolicySet) -> Result<Self, Error> {
        settings.validate()?;
        let mut plans = HashMap::new();
        for policy in policies.iter() {
            let program = programs::program(policy.kind());
            plans.insert(
                policy.id().clone(),
                Plan {
                    policy: policy.clone(),
                    program,
                    keys: PolicyKeys::new(&settings.key_prefix, policy)?,
                    args: programs::arguments(policy)
                        .into_iter()
                        .map(|a| a.to_string())
                        .collect(),
                },
            );
        }
        let acl = Arc::new(acl::Needs::rate(&settings.key_prefix));
        let pool = Pool::start(&settings, rate_scripts(), acl).await?;
        let shared = Arc::new(Shared {
            admission: Semaphore::new(settings.max_in_flight),
            settings,
            policies,
            plans,
            pool,
        });
        Ok(Self { shared })
    }

    /// The settings this provider runs with.
    pub fn settings(&self) -> &RedisSettings {
        &self.shared.settings
    }

    /// The physical key of `subject` under `policy` (for tests and operators; never logged).
    pub fn state_key(
        &self,
        policy: &PolicyId,
        subject: &shared_contract::SubjectDigest,
    ) -> Option<String> {
        self.shared
            .plans
            .get(policy)
            .map(|p| p.keys.state_key(subject))
    }

    async fn run(
        &self,
        plan: &Plan,
        mut conn: MultiplexedConnection,
        key: &str,
        cost: u64,
    ) -> RateLimitOutcome {
        let policy = &plan.policy;
        let evalsha = plan.command("EVALSHA", plan.program.sha1(), key, cost);
        let first = conn.send_packed_command(&evalsha).await;
        let failure = match classify(first) {
            Ok(value) => return reply::outcome(&value, policy),
            Err(f) => f,
        };
        let failure = match failure {
            Failure::NoScript => {
                tracing::info!(
                    program = plan.program.name,
                    "NOSCRIPT: sending the exact source with EVAL"
                );
                let eval = plan.command("EVAL", plan.program.source, key, cost);
                match classify(conn.send_packed_command(&eval).await) {
                    Ok(value) => return reply::outcome(&value, policy),
                    // The server just refused the source it was sent: it cannot run it.
                    Err(Failure::NoScript) => Failure::Incompatible(IncompatibleCategory::Program),
                    Err(f) => f,
                }
            }
            f => f,
        };
        match failure {
            Failure::Unavailable(category) => self.shared.unavailable(policy, category),
            Failure::Incompatible(category) => RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                category,
            },
            Failure::Indeterminate | Failure::NoScript => RateLimitOutcome::Indeterminate {
                policy_id: policy.id().clone(),
                retry_after_ms: self.shared.retry_after_ms(),
            },
        }
    }
}

/// A reply value, or what its failure means. Error replies arrive either as `Err` or inside
/// `Ok(Value::ServerError)` depending on the driver path; both are classified alike.
pub(crate) fn classify(result: redis::RedisResult<Value>) -> Result<Value, Failure> {
    match result {
        Ok(Value::ServerError(e)) => Err(failure::server_error(e.code())),
        Ok(value) => Ok(value),
        Err(e) => {
            let f = failure::after_dispatch(&e);
            if f == Failure::Indeterminate {
                tracing::debug!(error = %e, "command failed after dispatch");
            }
            Err(f)
        }
    }
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for RedisProvider {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        if request.evaluation_id.is_some() {
            return Err(RequestError::EvaluationIdUnsupported);
        }
        let shared = &self.shared;
        let policy = shared.policies.admit(&request)?;
        let Some(plan) = shared.plans.get(policy.id()) else {
            // Every policy of the set has a plan (built in `connect`); this is unreachable.
            return Err(RequestError::UnknownPolicy(policy.id().clone()));
        };
        let timeout = shared.settings.command_timeout;
        if request.deadline.remaining_from(Instant::now()) < timeout {
            return Ok(shared.unavailable(policy, UnavailableCategory::Deadline));
        }
        let Ok(_permit) = shared.admission.try_acquire() else {
            return Ok(shared.unavailable(policy, UnavailableCategory::Admission));
        };
        let link = match shared.pool.pick() {
            Pick::Up(link) => link,
            Pick::Down(_) => return Ok(shared.unavailable(policy, UnavailableCategory::Connect)),
            Pick::Incompatible(_) => {
                return Ok(RateLimitOutcome::Incompatible {
                    policy_id: policy.id().clone(),
                    category: IncompatibleCategory::Program,
                });
            }
        };
        let key = plan.keys.state_key(&request.subject);
        let cost = request.cost.get();
        match tokio::time::timeout(timeout, self.run(plan, link.conn.clone(), &key, cost)).await {
            Ok(outcome) => {
                link.replied();
                Ok(outcome)
            }
            Err(_elapsed) => {
                link.timed_out();
                Ok(RateLimitOutcome::Indeterminate {
                    policy_id: policy.id().clone(),
                    retry_after_ms: shared.retry_after_ms(),
                })
            }
        }
    }

    fn policies(&self) -> &PolicySet {
        &self.shared.policies
    }

    /// `Ready` when a connection is up and answers `PING` within `command_timeout`.
    async fn readiness(&self) -> Readiness {
        self.shared
            .pool
            .readiness(self.shared.settings.command_timeout)
            .await
    }
}

/// One connection attempt: TCP, handshake (AUTH/SELECT from the URL), version check, script
/// preload. Returns the live link and the notifier its driver fires when it ends.
async fn open(
    endpoint: &Endpoint,
    settings: &RedisSettings,
    scripts: &[Script],
    acl: &acl::Needs,
) -> Result<(Link, Arc<Notify>, JoinHandle<()>), Attempt> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| {
                Attempt::Down(format!(
                    "connect to {}:{}: {e}",
                    endpoint.host, endpoint.port
                ))
            })?;
        // Small requests and replies: do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let config = AsyncConnectionConfig::new()
            .set_pipeline_buffer_size(settings.max_in_flight.clamp(64, 8192));
        let handshake_failed = |e: redis::RedisError| {
            Attempt::Down(format!(
                "handshake with {}:{}: {e}",
                endpoint.host, endpoint.port
            ))
        };
        match &endpoint.tls {
            None => MultiplexedConnection::new_with_config(
                endpoint.info.redis_settings(),
                stream,
                config,
            )
            .await
            .map(|(conn, driver)| (conn, Box::pin(driver) as Driver))
            .map_err(handshake_failed),
            Some(tls) => {
                let stream = tls
                    .connector
                    .connect(tls.server_name.clone(), stream)
                    .await
                    .map_err(|e| {
                        Attempt::Down(format!(
                            "TLS handshake with {}:{}: {e}",
                            endpoint.host, endpoint.port
                        ))
                    })?;
                MultiplexedConnection::new_with_config(
                    endpoint.info.redis_settings(),
                    stream,
                    config,
                )
                .await
                .map(|(conn, driver)| (conn, Box::pin(driver) as Driver))
                .map_err(handshake_failed)
            }
        }
    };
    let (conn, driver) = tokio::time::timeout(settings.connect_timeout, attempt)
        .await
        .map_err(|_| {
            Attempt::Down(format!(
                "no connection to {}:{} within {:?}",
                endpoint.host, endpoint.port, settings.connect_timeout
            ))
        })??;
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
    };
    let setup = async {
        let mut conn = link.conn.clone();
        check_version(&mut conn).await?;
        check_eviction_policy(&mut conn, settings.strict_eviction_policy).await?;
        preload(&mut conn, scripts).await?;
        acl::check(&mut conn, acl, endpoint.info.redis_settings().username()).await
    };
    let checked = tokio::time::timeout(settings.connect_timeout, setup)
        .await
        .unwrap_or_else(|_| {
            Err(Attempt::Down(
                "no reply to INFO / SCRIPT LOAD / the ACL check in time".to_owned(),
            ))
        });
    match checked {
        Ok(()) => Ok((link, ended, driver)),
        Err(e) => {
            driver.abort();
            Err(e)
        }
    }
}

/// The task that reads replies for a connection (plain or TLS).
type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pub(crate) enum Attempt {
    Down(String),
    Incompatible(String),
}

/// Refuses servers older than the programs' minimum. A least-privilege ACL user may not be
/// allowed `INFO`; the check is then skipped (the programs still refuse to run on a server
/// that lacks what they use, which surfaces as `Incompatible(program)`).
async fn check_version(conn: &mut MultiplexedConnection) -> Result<(), Attempt> {
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
    let text = match info {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        other => return Err(Attempt::Down(format!("INFO server answered {other:?}"))),
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

/// An `allkeys-*` eviction policy may drop limiter state under memory pressure: a dropped
/// counter starts again from zero and admits beyond the limit. `noeviction` is safe (writes are
/// refused with `OOM`, classified `Unavailable`), `volatile-*` may still evict (every limiter
/// key has a TTL) but only under pressure and nearest-expiry first. Where `CONFIG` is not
/// permitted the check is skipped.
async fn check_eviction_policy(
    conn: &mut MultiplexedConnection,
    strict: bool,
) -> Result<(), Attempt> {
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
async fn preload(conn: &mut MultiplexedConnection, scripts: &[Script]) -> Result<(), Attempt> {
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
    endpoint: Arc<Endpoint>,
    settings: RedisSettings,
    scripts: Arc<[Script]>,
    acl: Arc<acl::Needs>,
    attempts: Arc<watch::Sender<usize>>,
) {
    let min_backoff = Duration::from_millis(25);
    let mut backoff = min_backoff;
    let mut first = true;
    let mut was_up = false;
    loop {
        match open(&endpoint, &settings, &scripts, &acl).await {
            Ok((link, ended, driver)) => {
                let link = Arc::new(link);
                slot.set(SlotState::Up(link.clone()));
                if first {
                    attempts.send_modify(|n| *n += 1);
                    first = false;
                }
                tracing::info!(host = %endpoint.host, port = endpoint.port, "redis connection up");
                was_up = true;
                backoff = min_backoff;
                ended.notified().await;
                // The flag is already cleared by the driver; the slot now says why.
                slot.set(SlotState::Down("connection lost; reconnecting".into()));
                tracing::warn!(host = %endpoint.host, port = endpoint.port, "redis connection lost");
                // Ended by its driver (a no-op abort) or declared stuck: close the socket.
                driver.abort();
                continue;
            }
            Err(Attempt::Down(reason)) => {
                if was_up || first {
                    tracing::warn!(%reason, "redis not reachable; retrying in the background");
                    was_up = false;
                }
                slot.set(SlotState::Down(reason.into()));
            }
            Err(Attempt::Incompatible(reason)) => {
                tracing::error!(%reason, "redis server cannot run the programs");
                slot.set(SlotState::Incompatible(reason.into()));
                // Check again now and then: the server may be upgraded in place.
                backoff = settings.reconnect_backoff_max.max(Duration::from_secs(5));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = RedisSettings::new("redis://127.0.0.1:6379/0");
        assert_eq!(s.command_timeout, Duration::from_millis(50));
        assert_eq!(s.max_in_flight, 1024);
        assert_eq!(s.key_prefix, "rl");
        assert_eq!(s.connections, 1);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn passwords_never_reach_errors_or_debug_output() {
        let s = RedisSettings::new("redis://limiter:hunter2-secret@127.0.0.1:6379/0");
        assert!(s.validate().is_ok());
        assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
        let bad = RedisSettings::new("redis://limiter:hunter2-secret@[::1/0");
        let err = bad
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("rate_limit.redis.url"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn unix_urls_are_refused_by_scheme() {
        for url in ["redis+unix:///tmp/r.sock", "unix:///tmp/r.sock"] {
            match RedisSettings::new(url).validate() {
                Err(Error::UnsupportedScheme { .. }) => {}
                other => panic!("{url}: {:?}", other.err()),
            }
        }
    }

    #[test]
    fn out_of_range_bounds_are_refused() {
        let base = || RedisSettings::new("redis://127.0.0.1:6379/0");
        let cases = [
            RedisSettings {
                max_in_flight: 0,
                ..base()
            },
            RedisSettings {
                connections: 0,
                ..base()
            },
            RedisSettings {
                connections: RedisSettings::MAX_CONNECTIONS + 1,
                ..base()
            },
            RedisSettings {
                command_timeout: Duration::from_micros(500),
                ..base()
            },
            RedisSettings {
                command_timeout: Duration::from_secs(61),
                ..base()
            },
            RedisSettings {
                connect_timeout: Duration::ZERO,
                ..base()
            },
        ];
        for s in cases {
            assert!(s.validate().is_err(), "{s:?}");
        }
    }
}
