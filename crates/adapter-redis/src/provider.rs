//! The Redis provider: settings, topology, and `EdgeRateLimitPort`.
//!
//! ## Connections
//!
//! The provider holds `connections` multiplexed connections (default 1) to each master it
//! uses (see [`crate::pool`] for the topologies): every request is pipelined on one socket
//! with the others in flight, so there is no per-call connection setup and no pool checkout.
//! Supervisor tasks connect (with `connect_timeout`), check the server (Redis >= 7.0, a
//! master, its eviction policy), preload the programs with `SCRIPT LOAD`, and replace a
//! connection at once when it ends, is stuck or stops being the master ([`crate::connection`]).
//!
//! [`RedisProvider::connect`] never fails because the server is unreachable: it waits at most
//! about `connect_timeout` for the first connection and returns either way. Until a connection
//! is up every evaluation is `Unavailable(connect)` (nothing is sent) and `readiness()` says
//! why; a service can therefore start before its Redis and becomes ready when Redis does.
//!
//! ## Least privilege
//!
//! A dedicated ACL user needs only `~<key_prefix>:* +evalsha +eval +script|load +ping +time
//! +get +set` (the programs call `TIME`, `GET` and `SET`); a cluster also `+cluster|slots`,
//! and `min_replicas_ack` `+wait`. `INFO`, `ROLE` and `CONFIG GET` are optional: without
//! them the server version, role and eviction checks are skipped. A refused login leaves the
//! connection down (`Unavailable(connect)`), a refused command or key is
//! `Incompatible(program)`.
//!
//! ## At most once
//!
//! The driver is used without any retry: a command is handed to the connection once, and a
//! timeout or a broken connection after that is reported as `Indeterminate`, never resent
//! (see [`crate::failure`]). A program is sent again only after a reply proving it did not
//! run (`NOSCRIPT`, `MOVED`, `ASK`).
//!
//! ## `min_replicas_ack`
//!
//! With `min_replicas_ack = n`, each program's reply is followed by `WAIT n <command_timeout /
//! 2>`, shared by every call whose reply arrived on the same connection meanwhile (group
//! commit: one `WAIT` covers all writes its connection made before it). An allow whose writes fewer than `n` replicas acknowledged is reported
//! `Indeterminate` (it consumed quota on the master, but a failover now could lose that, and
//! an allow that may be forgotten is exactly the over-admission this setting exists to
//! prevent). A denial consumed nothing, so it stands, and does not wait for the replicas.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use shared_contract::{
    EdgeRateLimitPort, PolicyId, PolicySet, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    Readiness, RequestError, UnavailableCategory,
};
use tokio::sync::Semaphore;

use crate::connection::{Access, Endpoint, Script, Setup};
use crate::error::Error;
use crate::failure::Failure;
use crate::keys::{PolicyKeys, check_prefix, hash_slot};
use crate::pool::Pool;
use crate::programs;
use crate::reply;
use crate::tls::{self, TlsFiles};
use crate::wire;

/// Where the Redis servers are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Topology {
    /// One server at [`RedisSettings::url`].
    #[default]
    Standalone,
    /// The master Sentinel reports for `master_name`, resolved again on every failover.
    Sentinel {
        master_name: String,
        /// `redis://[user:password@]host:port` of each sentinel (their own credentials).
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, found through its seed `nodes` (`redis://host:port`, database 0).
    Cluster { nodes: Vec<String> },
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
    /// Multiplexed connections to spread requests over, per master (default 1).
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
    /// reported; 0 (default) is off. See the module docs.
    pub min_replicas_ack: u32,
}

impl RedisSettings {
    /// Largest accepted `command_timeout`.
    pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
    /// Largest accepted `max_in_flight` (the semaphore's own bound is far larger).
    pub const MAX_IN_FLIGHT: usize = 1 << 20;
    /// Largest accepted `connections`.
    pub const MAX_CONNECTIONS: usize = 64;
    /// Largest accepted `min_replicas_ack`.
    pub const MAX_REPLICAS_ACK: u32 = 16;
    /// Most seed nodes or sentinels accepted.
    pub const MAX_NODES: usize = 64;

    /// The defaults of `interface.md` for a standalone server at `url`: 50 ms command
    /// timeout, 1024 in flight, prefix `rl`, 1 s connect timeout, one connection, 1 s retry
    /// hint, 250 ms backoff cap.
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

    /// Checks every setting and resolves the topology's addresses and access.
    pub(crate) fn validate(&self) -> Result<Resolved, Error> {
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
        if self.min_replicas_ack > Self::MAX_REPLICAS_ACK {
            return Err(Error::MinReplicasAck {
                got: self.min_replicas_ack,
            });
        }
        check_prefix(&self.key_prefix)?;
        match &self.topology {
            Topology::Standalone => {
                let url = parse_url("url".to_owned(), &self.url)?;
                self.check_tls_use(url.secure)?;
                let redis = self.credentials(url.redis, "url")?;
                let access = self.access(redis, url.secure)?;
                Ok(Resolved::Standalone(endpoint(&url.host, url.port, access)?))
            }
            Topology::Sentinel {
                master_name,
                sentinels,
            } => {
                self.no_url("sentinel")?;
                if master_name.is_empty()
                    || master_name.len() > 128
                    || master_name
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(Error::Topology {
                        key: "master_name",
                        reason:
                            "must be 1..=128 characters without spaces (the name sentinels monitor)"
                                .to_owned(),
                    });
                }
                let urls = parse_urls("sentinels", sentinels)?;
                let secure = urls[0].secure;
                self.check_tls_use(secure)?;
                let tls = self.tls_connector(secure)?;
                let sentinels = urls
                    .into_iter()
                    .map(|u| {
                        let access = Arc::new(Access {
                            redis: u.redis,
                            tls: tls.clone(),
                        });
                        endpoint(&u.host, u.port, access)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let redis = self.credentials(RedisConnectionInfo::default(), "sentinels")?;
                Ok(Resolved::Sentinel {
                    master_name: master_name.clone(),
                    sentinels,
                    access: self.access(redis, secure)?,
                })
            }
            Topology::Cluster { nodes } => {
                self.no_url("cluster")?;
                let urls = parse_urls("nodes", nodes)?;
                let secure = urls[0].secure;
                self.check_tls_use(secure)?;
                if let Some(u) = urls.iter().find(|u| u.redis.db() != 0) {
                    return Err(Error::Topology {
                        key: "nodes",
                        reason: format!(
                            "{}: a cluster has only database 0, got /{}",
                            u.key,
                            u.redis.db()
                        ),
                    });
                }
                // Data-node credentials: username/password, or those of the first seed URL.
                let redis = self.credentials(urls[0].redis.clone(), "nodes")?;
                let access = self.access(redis, secure)?;
                let seeds = urls
                    .iter()
                    .map(|u| endpoint(&u.host, u.port, access.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Resolved::Cluster { seeds, access })
            }
        }
    }

    fn no_url(&self, topology: &str) -> Result<(), Error> {
        if self.url.is_empty() {
            Ok(())
        } else {
            Err(Error::Topology {
                key: "url",
                reason: format!(
                    "not used with topology = \"{topology}\"; give the {} instead",
                    if topology == "cluster" {
                        "seed nodes in `nodes`"
                    } else {
                        "sentinels in `sentinels` and `master_name`"
                    }
                ),
            })
        }
    }

    fn check_tls_use(&self, secure: bool) -> Result<(), Error> {
        if !secure && self.tls.any() {
            return Err(Error::Tls {
                key: "tls_ca_file",
                reason: "TLS files are set but the URL is redis://; use rediss://".to_owned(),
            });
        }
        Ok(())
    }

    fn tls_connector(&self, secure: bool) -> Result<Option<tokio_rustls::TlsConnector>, Error> {
        secure.then(|| tls::build(&self.tls)).transpose()
    }

    fn access(&self, redis: RedisConnectionInfo, secure: bool) -> Result<Arc<Access>, Error> {
        Ok(Arc::new(Access {
            redis,
            tls: self.tls_connector(secure)?,
        }))
    }

    /// `username`/`password` applied over what `from` (a URL) already holds; giving one in
    /// both places is refused.
    fn credentials(
        &self,
        mut redis: RedisConnectionInfo,
        from: &str,
    ) -> Result<RedisConnectionInfo, Error> {
        if let Some(user) = &self.username {
            if user.is_empty() {
                return Err(Error::Credentials {
                    key: "username",
                    reason: "must not be empty".to_owned(),
                });
            }
            if redis.username().is_some() {
                return Err(Error::Credentials {
                    key: "username",
                    reason: format!("{from} already names a user; give it in one place"),
                });
            }
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            if redis.password().is_some() {
                return Err(Error::Credentials {
                    key: "password",
                    reason: format!("{from} already holds a password; give it in one place"),
                });
            }
            redis = redis.set_password(password);
        }
        Ok(redis)
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

fn endpoint(host: &str, port: u16, access: Arc<Access>) -> Result<Endpoint, Error> {
    Endpoint::new(host, port, access).map_err(|reason| Error::Tls { key: "url", reason })
}

/// One parsed URL: where, whether TLS, and its credentials and database.
struct ParsedUrl {
    key: String,
    secure: bool,
    host: String,
    port: u16,
    redis: RedisConnectionInfo,
}

fn parse_url(key: String, url: &str) -> Result<ParsedUrl, Error> {
    let scheme = url.split("://").next().unwrap_or_default();
    let secure = match scheme {
        "redis" => false,
        "rediss" => true,
        _ => {
            return Err(Error::UnsupportedScheme {
                key,
                scheme: scheme.chars().take(16).collect(),
            });
        }
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
            return Err(Error::InvalidUrl {
                key,
                reason: e.detail().unwrap_or_else(|| e.category()).to_owned(),
            });
        }
    };
    let (host, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        _ => {
            return Err(Error::UnsupportedScheme {
                key,
                scheme: scheme.to_owned(),
            });
        }
    };
    Ok(ParsedUrl {
        key,
        secure,
        host,
        port,
        redis: info.redis_settings().clone(),
    })
}

/// Parses a list of node or sentinel URLs: 1..=MAX_NODES, all `redis://` or all `rediss://`.
fn parse_urls(key: &'static str, urls: &[String]) -> Result<Vec<ParsedUrl>, Error> {
    if urls.is_empty() || urls.len() > RedisSettings::MAX_NODES {
        return Err(Error::Topology {
            key,
            reason: format!(
                "needs 1..={} URLs, got {}",
                RedisSettings::MAX_NODES,
                urls.len()
            ),
        });
    }
    let parsed = urls
        .iter()
        .enumerate()
        .map(|(i, u)| parse_url(format!("{key}[{i}]"), u))
        .collect::<Result<Vec<_>, _>>()?;
    if parsed.iter().any(|u| u.secure != parsed[0].secure) {
        return Err(Error::Topology {
            key,
            reason: "mixes redis:// and rediss:// URLs; use one scheme for every node".to_owned(),
        });
    }
    Ok(parsed)
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
            .finish()
    }
}

/// Everything one policy needs per request, computed once.
#[derive(Debug)]
struct Plan {
    program: &'static programs::Program,
    keys: PolicyKeys,
    /// How many arguments follow the key (`ARGV[1]` the cost, then `ARGV[2..]`).
    argc: usize,
    /// `ARGV[2..]`, already encoded as RESP bulk strings.
    args_resp: Vec<u8>,
}

impl Plan {
    /// Writes `verb script 1 key cost args...` as RESP straight into the connection's
    /// buffer: no command object and no copy per call.
    fn encode(&self, out: &mut Vec<u8>, verb: &str, script: &str, key: &str, cost: u64) {
        wire::write_array(out, 4 + self.argc);
        wire::write_bulk(out, verb.as_bytes());
        wire::write_bulk(out, script.as_bytes());
        out.extend_from_slice(b"$1\r\n1\r\n");
        wire::write_bulk(out, key.as_bytes());
        wire::write_bulk_u64(out, cost);
        out.extend_from_slice(&self.args_resp);
    }
}

struct Shared {
    settings: RedisSettings,
    policies: PolicySet,
    plans: HashMap<PolicyId, Plan>,
    pool: Pool,
    admission: Semaphore,
}

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

    fn indeterminate(&self, policy: &RateLimitPolicy) -> RateLimitOutcome {
        RateLimitOutcome::Indeterminate {
            policy_id: policy.id().clone(),
            retry_after_ms: self.retry_after_ms(),
        }
    }

    fn retry_after_ms(&self) -> u64 {
        self.settings
            .retry_after
            .as_millis()
            .min(u128::from(u64::MAX)) as u64
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
    /// Checks `settings`, starts the connection supervisors (and, per topology, the Sentinel
    /// monitor or the cluster slot map), and waits at most about `connect_timeout` for a
    /// first connection. An unreachable server is not an error: the provider then answers
    /// `Unavailable(connect)` until it connects in the background.
    ///
    /// Must be called inside a Tokio runtime (the supervisors are tasks of it).
    ///
    /// # Errors
    /// [`Error`] naming the bad setting (timeouts, bounds, key prefix, URLs, topology).
    pub async fn connect(settings: RedisSettings, policies: PolicySet) -> Result<Self, Error> {
        settings.validate()?;
        let mut plans = HashMap::new();
        for policy in policies.iter() {
            let program = programs::program(policy.kind());
            let args = programs::arguments(policy);
            let mut args_resp = Vec::new();
            for a in &args {
                wire::write_bulk_u64(&mut args_resp, *a);
            }
            plans.insert(
                policy.id().clone(),
                Plan {
                    program,
                    keys: PolicyKeys::new(&settings.key_prefix, policy)?,
                    argc: 1 + args.len(),
                    args_resp,
                },
            );
        }
        let pool = Pool::start(
            &settings,
            Setup {
                scripts: rate_scripts(),
                acl: Arc::new(
                    crate::acl::Needs::rate(&settings.key_prefix).for_settings(&settings),
                ),
            },
        )
        .await?;
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
        let key = plan.keys.state_key(&request.subject);
        let cost = request.cost.get();
        let encode = |out: &mut Vec<u8>, verb: &str, script: &str| {
            plan.encode(out, verb, script, &key, cost)
        };
        let slot = hash_slot(key.as_bytes());
        let reply = match shared
            .pool
            .run_script(
                (plan.program.name, plan.program.source, plan.program.sha1()),
                slot,
                &encode,
                &reply::is_allowed,
                timeout,
            )
            .await
        {
            Ok(reply) => reply,
            Err(Failure::Unavailable(category)) => {
                return Ok(shared.unavailable(policy, category));
            }
            Err(Failure::Incompatible(category)) => {
                return Ok(RateLimitOutcome::Incompatible {
                    policy_id: policy.id().clone(),
                    category,
                });
            }
            Err(Failure::Indeterminate | Failure::NoScript) => {
                return Ok(shared.indeterminate(policy));
            }
        };
        let outcome = reply::outcome(&reply.value, policy);
        let allowed = matches!(&outcome, RateLimitOutcome::Evaluated(d) if d.allowed);
        if allowed && !reply.durable(shared.settings.min_replicas_ack) {
            tracing::debug!(
                program = plan.program.name,
                wanted = shared.settings.min_replicas_ack,
                acked = reply.replicas_acked,
                "allow not acknowledged by enough replicas; reported indeterminate"
            );
            return Ok(shared.indeterminate(policy));
        }
        Ok(outcome)
    }

    fn policies(&self) -> &PolicySet {
        &self.shared.policies
    }

    /// `Ready` when a connection is up and answers `PING` within `command_timeout` (on a
    /// cluster: every slot's master).
    async fn readiness(&self) -> Readiness {
        self.shared
            .pool
            .readiness(self.shared.settings.command_timeout)
            .await
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

    fn topology_error(s: &RedisSettings) -> String {
        match s.validate() {
            Ok(_) => panic!("expected a refusal: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn topology_settings_that_cannot_work_are_refused_by_key() {
        let cluster = |nodes: &[&str]| {
            RedisSettings::cluster(nodes.iter().map(|n| (*n).to_owned()).collect())
        };
        assert!(
            cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
                .validate()
                .is_ok()
        );
        let e = topology_error(&cluster(&[]));
        assert!(e.starts_with("rate_limit.redis.nodes:"), "{e}");
        let e = topology_error(&cluster(&["redis://127.0.0.1:7000/3"]));
        assert!(e.contains("only database 0"), "{e}");
        let e = topology_error(&cluster(&["redis://a:7000", "rediss://b:7001"]));
        assert!(e.contains("mixes"), "{e}");
        let e = topology_error(&cluster(&["redis://a:7000", "unix:///tmp/x"]));
        assert!(e.starts_with("rate_limit.redis.nodes[1]:"), "{e}");
        let with_url = RedisSettings {
            url: "redis://127.0.0.1:6379".into(),
            ..cluster(&["redis://a:7000"])
        };
        assert!(topology_error(&with_url).starts_with("rate_limit.redis.url:"));
        let sentinel =
            |name: &str| RedisSettings::sentinel(name, vec!["redis://127.0.0.1:26379".to_owned()]);
        assert!(sentinel("mymaster").validate().is_ok());
        assert!(topology_error(&sentinel("")).starts_with("rate_limit.redis.master_name:"));
        assert!(topology_error(&sentinel("my master")).contains("master_name"));
        let too_many = RedisSettings {
            min_replicas_ack: RedisSettings::MAX_REPLICAS_ACK + 1,
            ..sentinel("mymaster")
        };
        assert!(topology_error(&too_many).contains("min_replicas_ack"));
    }

    #[test]
    fn node_and_sentinel_passwords_never_reach_debug_output() {
        let s = RedisSettings::sentinel(
            "mymaster",
            vec!["redis://admin:sentinel-secret@127.0.0.1:26379".to_owned()],
        );
        let shown = format!("{s:?}");
        assert!(!shown.contains("sentinel-secret"), "{shown}");
        assert!(shown.contains("127.0.0.1:26379"), "{shown}");
        let c = RedisSettings::cluster(vec!["rediss://u:node-secret@h:7000".to_owned()]);
        assert!(!format!("{c:?}").contains("node-secret"));
    }
}
