//! How to reach Redis and how much to ask of it: [`RedisSettings`], its [`Topology`], and
//! every rule about them in one place.
//!
//! [`RedisSettings::validate`] checks every setting and returns *all* problems, each named by
//! its key under `[rate_limit.redis]` (`url`, `nodes[1]`, `command_timeout`), the way
//! `RateLimitPolicy::new` names policy fields; a configuration layer maps them to its key
//! paths and checks nothing twice. The same pass resolves the topology for the provider
//! (`Resolved`: every URL parsed, credentials applied, the TLS connector built), so what
//! `validate` accepts is exactly what `connect` can run with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use shared_contract::Deadline;

use crate::dial::{Access, Endpoint};
use crate::error::{SettingsProblem, SettingsProblems};
use crate::keys::check_prefix;
use crate::tls::{self, TlsFiles};

/// Where the Redis servers are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Topology {
    /// One server at [`RedisSettings::url`].
    #[default]
    Standalone,
    /// The master Sentinel reports for `master_name`, resolved again on every failover.
    Sentinel {
        /// The name the sentinels monitor.
        master_name: String,
        /// `redis://[user:password@]host:port` of each sentinel (their own credentials).
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, found through its seed `nodes` (`redis://host:port`, database 0).
    Cluster {
        /// `redis://host:port` of each seed node; the rest of the cluster is found from them.
        nodes: Vec<String>,
    },
}

impl Topology {
    /// `standalone`, `sentinel` or `cluster`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::Sentinel { .. } => "sentinel",
            Topology::Cluster { .. } => "cluster",
        }
    }
}

/// How to reach Redis and how much to ask of it.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port/db` (or `rediss://`); standalone only.
    pub url: String,
    /// Standalone (default), Sentinel or Cluster.
    pub topology: Topology,
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
    /// Multiplexed connections to spread requests over, per master (default 1); with a
    /// [`crate::Placement`], at least one per placed runtime.
    pub connections: usize,
    /// The retry hint of `Unavailable` (except `clock`, which carries the program's own) and
    /// of `Indeterminate`.
    pub retry_after: Duration,
    /// Longest pause between two reconnection attempts.
    pub reconnect_backoff_max: Duration,
    /// CA and optional client certificate for `rediss://` (required there, refused otherwise).
    pub tls: TlsFiles,
    /// ACL user name of the data nodes; overrides none in the URL (giving both is refused).
    pub username: Option<String>,
    /// ACL password (from a file or the environment); never printed.
    pub password: Option<String>,
    /// Refuse a server whose `maxmemory-policy` is `allkeys-*` (it evicts limiter state
    /// silently, which under-counts and over-admits) instead of only warning.
    pub strict_eviction_policy: bool,
    /// Replicas that must acknowledge each program's writes (`WAIT`) before an allow is
    /// reported; 0 (default) is off. See the provider's docs.
    pub min_replicas_ack: u32,
    /// Most entries of the exact denial cache (policies with `deny_cache`), default
    /// 100,000 (about 130 bytes each, allocated as its shards fill); see `deny_cache`.
    pub deny_cache_max_entries: usize,
    /// At most this many evaluations that are ready at the same moment for one node leave as
    /// one call of the batch program (1..=64; 1: one program call per decision).
    pub batch_max: usize,
    /// Fleet membership: announce this instance with a heartbeat and keep the last known
    /// count of live instances (see [`crate::fleet`]); `None` (default): no heartbeat.
    pub fleet: Option<FleetSettings>,
}

/// The fleet heartbeat of one instance: which fleet it belongs to and how often it says so
/// (see [`crate::fleet`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSettings {
    /// The fleet's name, 1..=64 characters of `[A-Za-z0-9_.-]`: instances of one name count
    /// each other (the hash tag of the fleet key).
    pub name: String,
    /// How often this instance announces itself (100 ms..=60 s).
    pub heartbeat: Duration,
    /// How long an announcement counts (at least twice `heartbeat`, at most 10 min): an
    /// instance that stopped leaves the count within about `ttl`.
    pub ttl: Duration,
}

impl Default for FleetSettings {
    /// Fleet `default`, a heartbeat every second, counted for 5 s.
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            heartbeat: Duration::from_secs(1),
            ttl: Duration::from_secs(5),
        }
    }
}

impl FleetSettings {
    /// Longest accepted `name`.
    pub const MAX_NAME: usize = 64;
    /// Shortest accepted `heartbeat`.
    pub const MIN_HEARTBEAT: Duration = Duration::from_millis(100);
    /// Longest accepted `heartbeat`.
    pub const MAX_HEARTBEAT: Duration = Duration::from_secs(60);
    /// Longest accepted `ttl`.
    pub const MAX_TTL: Duration = Duration::from_secs(600);

    /// Checks the name and the two durations (as part of [`RedisSettings::validate`]).
    ///
    /// # Errors
    /// Every problem found, named `fleet.name`, `fleet.heartbeat` or `fleet.ttl`.
    pub fn validate(&self) -> Result<(), SettingsProblems> {
        let mut problems = Problems::default();
        self.check(&mut problems);
        if problems.0.is_empty() {
            Ok(())
        } else {
            Err(SettingsProblems(problems.0))
        }
    }

    fn check(&self, problems: &mut Problems) {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= Self::MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            problems.push(
                "fleet.name",
                format!(
                    "must be 1..={} characters of [A-Za-z0-9_.-], got {:?}",
                    Self::MAX_NAME,
                    self.name.chars().take(80).collect::<String>()
                ),
            );
        }
        if self.heartbeat < Self::MIN_HEARTBEAT || self.heartbeat > Self::MAX_HEARTBEAT {
            problems.push(
                "fleet.heartbeat",
                format!(
                    "must be between {:?} and {:?}, got {:?}",
                    Self::MIN_HEARTBEAT,
                    Self::MAX_HEARTBEAT,
                    self.heartbeat
                ),
            );
        }
        let min_ttl = self.heartbeat.saturating_mul(2);
        if self.ttl < min_ttl || self.ttl > Self::MAX_TTL {
            problems.push(
                "fleet.ttl",
                format!(
                    "must be at least twice fleet.heartbeat ({min_ttl:?}) and at most {:?}, got {:?}",
                    Self::MAX_TTL,
                    self.ttl
                ),
            );
        }
    }

    /// [`Self::ttl`] in whole milliseconds, as the heartbeat program takes it.
    pub(crate) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }
}

impl RedisSettings {
    /// Largest accepted `command_timeout`: a second under the longest deadline a request may
    /// carry ([`Deadline::MAX_BUDGET`], a minute). The provider refuses a deadline shorter
    /// than its command timeout, and a caller gives each evaluation the timeout plus a margin,
    /// so a timeout of the whole minute would refuse every request.
    pub const MAX_COMMAND_TIMEOUT: Duration =
        Deadline::MAX_BUDGET.saturating_sub(Duration::from_secs(1));
    /// Shortest accepted `command_timeout`.
    pub const MIN_COMMAND_TIMEOUT: Duration = Duration::from_millis(1);
    /// Largest accepted `max_in_flight` (the semaphore's own bound is far larger).
    pub const MAX_IN_FLIGHT: usize = 1 << 20;
    /// Largest accepted `connections`.
    pub const MAX_CONNECTIONS: usize = 64;
    /// Largest accepted `min_replicas_ack`.
    pub const MAX_REPLICAS_ACK: u32 = 16;
    /// Most seed nodes or sentinels accepted.
    pub const MAX_NODES: usize = 64;
    /// Longest accepted Sentinel `master_name`.
    pub const MAX_MASTER_NAME: usize = 128;

    /// The documented defaults for a standalone server at `url`: 50 ms command timeout, 1024
    /// in flight, prefix `rl`, 1 s connect timeout, one connection, 1 s retry hint, 250 ms
    /// backoff cap.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            topology: Topology::Standalone,
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
            min_replicas_ack: 0,
            deny_cache_max_entries: 100_000,
            batch_max: 16,
            fleet: None,
        }
    }

    /// The defaults, for the master Sentinel reports for `master_name`.
    pub fn sentinel(master_name: impl Into<String>, sentinels: Vec<String>) -> Self {
        Self {
            topology: Topology::Sentinel {
                master_name: master_name.into(),
                sentinels,
            },
            ..Self::new("")
        }
    }

    /// The defaults, for a cluster found through the seed `nodes`.
    pub fn cluster(nodes: Vec<String>) -> Self {
        Self {
            topology: Topology::Cluster { nodes },
            ..Self::new("")
        }
    }

    /// [`Self::retry_after`] in whole milliseconds, as outcomes carry it.
    pub(crate) fn retry_after_ms(&self) -> u64 {
        u64::try_from(self.retry_after.as_millis()).unwrap_or(u64::MAX)
    }

    /// Checks every setting: the bounds, the key prefix, every URL of the topology (syntax,
    /// scheme, one scheme for all nodes, database 0 on a cluster), the credentials, and the
    /// TLS files (which it reads: a file that cannot be used is a problem too).
    ///
    /// # Errors
    /// Every problem found, each named by its key under `[rate_limit.redis]`.
    pub fn validate(&self) -> Result<(), SettingsProblems> {
        self.resolve().map(drop)
    }

    /// [`Self::validate`], keeping what it resolved for the provider to connect with.
    pub(crate) fn resolve(&self) -> Result<Resolved, SettingsProblems> {
        let mut problems = Problems::default();
        self.check_bounds(&mut problems);
        let resolved = match &self.topology {
            Topology::Standalone => self.resolve_standalone(&mut problems),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => self.resolve_sentinel(&mut problems, master_name, sentinels),
            Topology::Cluster { nodes } => self.resolve_cluster(&mut problems, nodes),
        };
        match resolved {
            Some(resolved) if problems.0.is_empty() => Ok(resolved),
            _ => Err(SettingsProblems(problems.0)),
        }
    }

    /// The bounds of every number and duration, the key prefix and the user name: what holds
    /// whatever the topology.
    fn check_bounds(&self, problems: &mut Problems) {
        if self.command_timeout < Self::MIN_COMMAND_TIMEOUT
            || self.command_timeout > Self::MAX_COMMAND_TIMEOUT
        {
            problems.push(
                "command_timeout",
                format!(
                    "must be between {:?} and {:?}, got {:?}",
                    Self::MIN_COMMAND_TIMEOUT,
                    Self::MAX_COMMAND_TIMEOUT,
                    self.command_timeout
                ),
            );
        }
        if self.connect_timeout.is_zero() {
            problems.push("connect_timeout", "must be > 0, got 0s");
        }
        if self.max_in_flight == 0 || self.max_in_flight > Self::MAX_IN_FLIGHT {
            problems.push(
                "max_in_flight",
                format!(
                    "must be between 1 and {}, got {}",
                    Self::MAX_IN_FLIGHT,
                    self.max_in_flight
                ),
            );
        }
        if self.connections == 0 || self.connections > Self::MAX_CONNECTIONS {
            problems.push(
                "connections",
                format!(
                    "must be between 1 and {}, got {}",
                    Self::MAX_CONNECTIONS,
                    self.connections
                ),
            );
        }
        if self.min_replicas_ack > Self::MAX_REPLICAS_ACK {
            problems.push(
                "min_replicas_ack",
                format!(
                    "must be between 0 and {}, got {}",
                    Self::MAX_REPLICAS_ACK,
                    self.min_replicas_ack
                ),
            );
        }
        if self.deny_cache_max_entries == 0
            || self.deny_cache_max_entries > crate::deny_cache::MAX_ENTRIES
        {
            problems.push(
                "deny_cache_max_entries",
                format!(
                    "must be between 1 and {}, got {}",
                    crate::deny_cache::MAX_ENTRIES,
                    self.deny_cache_max_entries
                ),
            );
        }
        if self.batch_max == 0 || self.batch_max > crate::programs::BATCH_MAX {
            problems.push(
                "batch_max",
                format!(
                    "must be between 1 and {}, got {}",
                    crate::programs::BATCH_MAX,
                    self.batch_max
                ),
            );
        }
        problems.check(check_prefix(&self.key_prefix));
        if let Some(fleet) = &self.fleet {
            fleet.check(problems);
        }
        if self.username.as_deref() == Some("") {
            problems.push("username", "must not be empty");
        }
    }

    fn resolve_standalone(&self, problems: &mut Problems) -> Option<Resolved> {
        let url = problems.check(parse_url("url".to_owned(), &self.url))?;
        let tls = self.tls_connector(problems, url.secure)?;
        let redis = self.credentials(problems, url.redis.clone(), "url")?;
        let access = Arc::new(Access { redis, tls });
        Some(Resolved::Standalone(problems.check(url.endpoint(access))?))
    }

    fn resolve_sentinel(
        &self,
        problems: &mut Problems,
        master_name: &str,
        sentinels: &[String],
    ) -> Option<Resolved> {
        self.no_url(problems, "sentinel");
        if master_name.is_empty()
            || master_name.len() > Self::MAX_MASTER_NAME
            || master_name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            problems.push(
                "master_name",
                format!(
                    "must be 1..={} characters without spaces (the name sentinels monitor)",
                    Self::MAX_MASTER_NAME
                ),
            );
        }
        // Sentinels authenticate with their own URLs' credentials; `username`/`password` are
        // the data nodes'.
        let redis = self.credentials(problems, RedisConnectionInfo::default(), "sentinels");
        let urls = parse_urls(problems, "sentinels", sentinels)?;
        let tls = self.tls_connector(problems, urls[0].secure)?;
        let sentinels = urls
            .iter()
            .map(|u| {
                let access = Arc::new(Access {
                    redis: u.redis.clone(),
                    tls: tls.clone(),
                });
                problems.check(u.endpoint(access))
            })
            .collect::<Vec<_>>();
        Some(Resolved::Sentinel {
            master_name: master_name.to_owned(),
            sentinels: sentinels.into_iter().collect::<Option<_>>()?,
            access: Arc::new(Access { redis: redis?, tls }),
        })
    }

    fn resolve_cluster(&self, problems: &mut Problems, nodes: &[String]) -> Option<Resolved> {
        self.no_url(problems, "cluster");
        let urls = parse_urls(problems, "nodes", nodes)?;
        for u in urls.iter().filter(|u| u.redis.db() != 0) {
            problems.push(
                &u.key,
                format!("a cluster has only database 0, got /{}", u.redis.db()),
            );
        }
        let tls = self.tls_connector(problems, urls[0].secure)?;
        // Data-node credentials: username/password, or those of the first seed URL.
        let redis = self.credentials(problems, urls[0].redis.clone(), "nodes[0]")?;
        let access = Arc::new(Access { redis, tls });
        let seeds = urls
            .iter()
            .map(|u| problems.check(u.endpoint(access.clone())))
            .collect::<Vec<_>>();
        Some(Resolved::Cluster {
            seeds: seeds.into_iter().collect::<Option<_>>()?,
            access,
        })
    }

    fn no_url(&self, problems: &mut Problems, topology: &str) {
        if !self.url.is_empty() {
            problems.push(
                "url",
                format!(
                    "not used with topology = \"{topology}\"; give the {} instead",
                    if topology == "cluster" {
                        "seed nodes in `nodes`"
                    } else {
                        "sentinels in `sentinels` and `master_name`"
                    }
                ),
            );
        }
    }

    /// The TLS connector a topology of `secure` (`rediss://`) URLs needs: `Some(None)` for
    /// plain TCP, `None` when the TLS settings are refused.
    fn tls_connector(
        &self,
        problems: &mut Problems,
        secure: bool,
    ) -> Option<Option<tokio_rustls::TlsConnector>> {
        if secure {
            problems.check(tls::build(&self.tls)).map(Some)
        } else if self.tls.any() {
            problems.push(
                "tls_ca_file",
                "TLS files are set but the URL is redis://; use rediss://",
            );
            None
        } else {
            Some(None)
        }
    }

    /// `username`/`password` applied over what `from` (a URL) already holds; giving one in
    /// both places is refused (an empty user name is refused by [`Self::check_bounds`]).
    fn credentials(
        &self,
        problems: &mut Problems,
        mut redis: RedisConnectionInfo,
        from: &str,
    ) -> Option<RedisConnectionInfo> {
        let before = problems.0.len();
        if let Some(user) = &self.username {
            if redis.username().is_some() {
                problems.push(
                    "username",
                    format!("{from} already names a user; give it in one place"),
                );
            }
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            if redis.password().is_some() {
                problems.push(
                    "password",
                    format!("{from} already holds a password; give it in one place"),
                );
            }
            redis = redis.set_password(password);
        }
        (problems.0.len() == before).then_some(redis)
    }
}

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<SettingsProblem>);

impl Problems {
    fn push(&mut self, field: impl Into<String>, problem: impl Into<String>) {
        self.0.push(SettingsProblem::new(field, problem));
    }

    /// The value, or `None` with its problem recorded.
    fn check<T>(&mut self, result: Result<T, SettingsProblem>) -> Option<T> {
        result.map_err(|p| self.0.push(p)).ok()
    }
}

/// The topology of valid settings, with every address parsed and the access built.
pub(crate) enum Resolved {
    Standalone(Endpoint),
    Sentinel {
        master_name: String,
        sentinels: Vec<Endpoint>,
        access: Arc<Access>,
    },
    Cluster {
        seeds: Vec<Endpoint>,
        access: Arc<Access>,
    },
}

/// One parsed URL: where, whether TLS, and its credentials and database.
struct ParsedUrl {
    /// The key it was given under (`url`, `nodes[1]`).
    key: String,
    secure: bool,
    host: String,
    port: u16,
    redis: RedisConnectionInfo,
}

impl ParsedUrl {
    /// The node it names, reached with `access`.
    fn endpoint(&self, access: Arc<Access>) -> Result<Endpoint, SettingsProblem> {
        Endpoint::new(&self.host, self.port, access)
            .map_err(|reason| SettingsProblem::new(&self.key, reason))
    }
}

/// Parses one URL given under `key`; the URL itself is never echoed (it may hold a password).
fn parse_url(key: String, url: &str) -> Result<ParsedUrl, SettingsProblem> {
    let scheme = url.split("://").next().unwrap_or_default();
    let secure = match scheme {
        "redis" => false,
        "rediss" => true,
        _ => return Err(unsupported_scheme(key, scheme)),
    };
    // The driver parses `rediss://` only when built with its own TLS; this crate does the
    // TLS itself, so the rest of the URL is parsed as `redis://`.
    let plain_url = match url.strip_prefix("rediss://") {
        Some(rest) => format!("redis://{rest}"),
        None => url.to_owned(),
    };
    let info = match plain_url.as_str().into_connection_info() {
        Ok(info) => info,
        Err(e) => {
            let reason = e.detail().unwrap_or_else(|| e.category()).to_owned();
            return Err(SettingsProblem::new(
                key,
                format!("not a valid Redis URL ({reason})"),
            ));
        }
    };
    let (host, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        _ => return Err(unsupported_scheme(key, scheme)),
    };
    Ok(ParsedUrl {
        key,
        secure,
        host,
        port,
        redis: info.redis_settings().clone(),
    })
}

/// A URL naming a transport this build does not speak (unix sockets, unknown schemes).
fn unsupported_scheme(key: String, scheme: &str) -> SettingsProblem {
    SettingsProblem::new(
        key,
        format!(
            "scheme {:?} is not supported by this build; use redis://host:port/db or rediss://host:port/db",
            scheme.chars().take(16).collect::<String>()
        ),
    )
}

/// Parses a list of node or sentinel URLs: 1..=MAX_NODES, all `redis://` or all `rediss://`.
/// `None` (with the problems recorded) unless every one parses.
fn parse_urls(problems: &mut Problems, key: &str, urls: &[String]) -> Option<Vec<ParsedUrl>> {
    if urls.is_empty() || urls.len() > RedisSettings::MAX_NODES {
        problems.push(
            key,
            format!(
                "needs 1..={} URLs, got {}",
                RedisSettings::MAX_NODES,
                urls.len()
            ),
        );
        return None;
    }
    let parsed = urls
        .iter()
        .enumerate()
        .map(|(i, u)| problems.check(parse_url(format!("{key}[{i}]"), u)))
        .collect::<Vec<_>>();
    let parsed = parsed.into_iter().collect::<Option<Vec<_>>>()?;
    if parsed.iter().any(|u| u.secure != parsed[0].secure) {
        problems.push(
            key,
            "mixes redis:// and rediss:// URLs; use one scheme for every node",
        );
        return None;
    }
    Some(parsed)
}

/// Shows a URL with everything before its last '@' (credentials) replaced.
fn redacted(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((head, host)) => {
            let scheme = head.split_once("://").map_or("redis", |(s, _)| s);
            format!("{scheme}://<redacted>@{host}")
        }
        None => url.to_owned(),
    }
}

impl fmt::Debug for RedisSettings {
    // URLs may carry passwords: show only what follows the last '@'.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topology = match &self.topology {
            Topology::Standalone => "standalone".to_owned(),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => format!(
                "sentinel {master_name:?} via {:?}",
                sentinels.iter().map(|u| redacted(u)).collect::<Vec<_>>()
            ),
            Topology::Cluster { nodes } => format!(
                "cluster via {:?}",
                nodes.iter().map(|u| redacted(u)).collect::<Vec<_>>()
            ),
        };
        f.debug_struct("RedisSettings")
            .field("url", &redacted(&self.url))
            .field("topology", &topology)
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
            .field("min_replicas_ack", &self.min_replicas_ack)
            .field("deny_cache_max_entries", &self.deny_cache_max_entries)
            .field("batch_max", &self.batch_max)
            .field("fleet", &self.fleet)
            .finish()
    }
}

#[cfg(test)]
mod tests;
