//! The validated settings: what [`crate::config::load`] produces and [`crate::compose`]
//! builds from. Values here are checked; holding one means it is usable.
//!
//! Rate limiting is an enum, not a flag: [`RateLimitSettings::Disabled`] carries nothing, so
//! disabled mode cannot accidentally build a connection, a task or a port.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "local")]
use adapter_local::LocalSettings;
#[cfg(feature = "redis")]
use adapter_redis::RedisSettings;
use edge_middleware::SubjectSecret;
use shared_contract::gate::GateSet;
use shared_contract::{FailurePolicy, PolicyError, PolicyErrors, PolicyId, PolicySet};

use edge_middleware::Rule;
// The gRPC server's descriptor rules and unknown-descriptor answer: the edge's types.
pub use edge_middleware::descriptors::{DescriptorRules, UnknownDescriptor};
// Where a route's subject and cost are read, and its header conditions: the middleware's
// types, which read them.
pub use edge_middleware::{CostSource, HeaderCondition, SubjectSource};

/// Everything the reference app is configured with. An embedding service reads only the
/// rate-limit part, from its own file: [`crate::RateLimitSection`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[http]`: the HTTP listener.
    pub http: HttpSettings,
    /// `[log]`: how log lines are written.
    pub log: LogSettings,
    /// `[reload]`: whether a change to the configuration file reloads it.
    pub reload: ReloadSettings,
    /// `[otlp]`: OpenTelemetry trace export; no endpoint (the default) exports nothing.
    pub otlp: OtlpSettings,
    /// `[rate_limit]`: off, or the enabled limiter's provider, policies and secret.
    pub rate_limit: RateLimitSettings,
    /// The demo upstream's limited routes, in file order.
    pub routes: Vec<RouteSettings>,
    /// `[event_gates.*]`, validated; empty when none is configured (then nothing is built).
    pub event_gates: GateSet,
    /// `[grpc]`: the Envoy rate-limit service's listener.
    pub grpc: GrpcSettings,
    /// `[[rls.descriptors]]`, in file order: which policy limits a gateway's descriptor.
    pub rls: DescriptorRules,
}

/// `[grpc]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcSettings {
    /// `None` (the default): no gRPC server, no port.
    pub bind: Option<SocketAddr>,
    /// What answers a descriptor that no `[[rls.descriptors]]` rule matches.
    pub unknown_descriptor: UnknownDescriptor,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// How long a new connection has to send the HTTP/2 preface and its first SETTINGS frame.
    pub handshake_timeout: Duration,
    /// How long a connection may carry no call before it is sent GOAWAY.
    pub idle_timeout: Duration,
    /// How often the server pings a connection.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
    /// Calls in flight at once on one connection (HTTP/2 streams).
    pub max_concurrent_streams: usize,
    /// The largest request message (bytes); larger is `INVALID_ARGUMENT`.
    pub max_message_bytes: usize,
}

impl GrpcSettings {
    /// The most `grpc.max_connections` accepts.
    pub const MAX_CONNECTIONS: usize = HttpSettings::MAX_CONNECTIONS;
    /// The longest timeout or interval accepted.
    pub const MAX_TIMEOUT: Duration = HttpSettings::MAX_TIMEOUT;
    /// The most `grpc.max_concurrent_streams` accepts.
    pub const MAX_CONCURRENT_STREAMS: usize = 65_536;
    /// The most `grpc.max_message_bytes` accepts (4 MiB, gRPC's usual default).
    pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

    /// Checks the fields' bounds.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per field out of bounds: a count of zero or over its
    /// `MAX_*`, a timeout or interval of zero or over [`Self::MAX_TIMEOUT`].
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        listener_bounds(
            &[
                (
                    "max_connections",
                    self.max_connections,
                    Self::MAX_CONNECTIONS,
                ),
                (
                    "max_concurrent_streams",
                    self.max_concurrent_streams,
                    Self::MAX_CONCURRENT_STREAMS,
                ),
                (
                    "max_message_bytes",
                    self.max_message_bytes,
                    Self::MAX_MESSAGE_BYTES,
                ),
            ],
            &[
                ("handshake_timeout", self.handshake_timeout),
                ("idle_timeout", self.idle_timeout),
                ("keepalive_interval", self.keepalive_interval),
                ("keepalive_timeout", self.keepalive_timeout),
            ],
        )
    }
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            bind: None,
            unknown_descriptor: UnknownDescriptor::default(),
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_concurrent_streams: 128,
            max_message_bytes: 65_536,
        }
    }
}

impl Settings {
    /// Descriptors to keep free for the rate-limit provider beyond those it holds once
    /// connected: a reconnect opens its new connection before the old one is gone, and
    /// Sentinel and Cluster also reach nodes they learn about. The listeners' connection caps
    /// are fitted under the open-file limit with this (and what is open at start) kept aside,
    /// so that no client can take the descriptors a Redis reconnect needs.
    pub fn provider_descriptor_reserve(&self) -> u64 {
        let RateLimitSettings::Enabled(e) = &self.rate_limit else {
            return 0;
        };
        #[cfg(feature = "redis")]
        if let Some(r) = e.provider.redis() {
            // At least one connection per serving thread (thread per core).
            let per_master = 2 * r.redis.connections.max(self.http.serving_threads()) as u64;
            return match &r.redis.topology {
                adapter_redis::Topology::Standalone => per_master,
                adapter_redis::Topology::Sentinel { sentinels, .. } => {
                    per_master + 2 * sentinels.len() as u64
                }
                // The masters are not known before start: at least three, and a connection
                // to every seed node while the slots are learnt.
                adapter_redis::Topology::Cluster { nodes } => {
                    per_master * (nodes.len() as u64).max(3) + nodes.len() as u64
                }
            };
        }
        // The local provider holds no descriptor.
        let _ = e;
        0
    }
}

/// `[reload]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReloadSettings {
    /// Reload when the configuration file changes (`SIGHUP` reloads in any case).
    pub watch: bool,
}

impl Default for ReloadSettings {
    fn default() -> Self {
        Self { watch: true }
    }
}

/// `[log]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogSettings {
    /// `log.format`; the level is `RUST_LOG`'s.
    pub format: LogFormat,
}

/// `[otlp]`: where finished spans are sent over OTLP/gRPC, as which service, and how many of
/// the traces this app starts are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpSettings {
    /// The collector's OTLP/gRPC endpoint (`http://`: the exporter has no TLS); `None` (the
    /// default): no exporter, no task, no per-request span.
    pub endpoint: Option<String>,
    /// The `service.name` resource attribute of every exported span.
    pub service_name: String,
    /// The share of new traces sampled, `0.0..=1.0`, parent-based: a request whose
    /// `traceparent` says sampled is always kept, one that says not sampled never.
    pub sample_ratio: f64,
}

impl Default for OtlpSettings {
    fn default() -> Self {
        Self {
            endpoint: None,
            service_name: "inbound-web".to_owned(),
            sample_ratio: 1.0,
        }
    }
}

impl OtlpSettings {
    /// Checks the fields.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per bad field: an `endpoint` that is not an `http://`
    /// URL with a host and, when given, a port that fits 16 bits (`https://` too: the
    /// exporter is built without TLS), an empty `service_name`, a `sample_ratio` outside
    /// `0.0..=1.0`.
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut errors = Vec::new();
        if let Some(endpoint) = &self.endpoint
            && let Err(problem) = check_endpoint(endpoint)
        {
            errors.push(PolicyError {
                field: "endpoint",
                problem,
            });
        }
        if self.service_name.trim().is_empty() {
            errors.push(PolicyError {
                field: "service_name",
                problem: "must not be empty".to_owned(),
            });
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            errors.push(PolicyError {
                field: "sample_ratio",
                problem: format!("must be between 0.0 and 1.0, got {}", self.sample_ratio),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(errors))
        }
    }
}

/// `http://host[:port][/path]`, the shape the exporter's transport accepts.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "{endpoint:?} is not an OTLP endpoint such as \"http://127.0.0.1:4317\" ({why})"
        ))
    };
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return bad("no scheme");
    };
    if scheme.eq_ignore_ascii_case("https") {
        // TLS in the exporter would put rustls under tonic, which the gRPC server shares and
        // keeps free of TLS; a collector agent beside the app takes plain OTLP.
        return bad("https is not supported: send to a collector over http, such as a local agent");
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return bad("the scheme must be http");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return bad("credentials do not belong in the URL");
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal without a port (`[::1]`) has colons inside its brackets.
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("no host");
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return bad("the port must be a number up to 65535");
    }
    if endpoint.chars().any(char::is_whitespace) {
        return bad("it holds whitespace");
    }
    Ok(())
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (ANSI colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and
    /// the event's fields), `span` and `spans`, for log shippers.
    Json,
}

impl LogFormat {
    /// The format `log.format` names (`"text"` or `"json"`); `None` for any other value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }

    /// The `log.format` spelling: `"text"` or `"json"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// The listen address (`http.bind`); port 0 takes a free port.
    pub bind: SocketAddr,
    /// Threads serving HTTP and gRPC, thread per core (docs/operations.md); `None`: one per
    /// CPU.
    pub worker_threads: Option<usize>,
    /// How long a client has to send a complete request head; then the connection is closed.
    pub header_read_timeout: Duration,
    /// How long a connection may pass without a byte read or written before it is closed.
    pub idle_timeout: Duration,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// The largest request body the routes read (larger: 413).
    pub max_body_bytes: usize,
}

impl HttpSettings {
    /// The threads that serve: `worker_threads`, or one per CPU.
    pub fn serving_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }

    /// The most `http.worker_threads` accepts.
    pub const MAX_WORKER_THREADS: usize = 1024;
    /// The longest `header_read_timeout` and `idle_timeout` accepted.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
    /// The most `http.max_connections` accepts.
    pub const MAX_CONNECTIONS: usize = 1_000_000;
    /// The most `http.max_body_bytes` accepts (16 MiB).
    pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

    /// Checks the fields' bounds.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per field out of bounds: `worker_threads` outside
    /// `1..=`[`Self::MAX_WORKER_THREADS`], a timeout of zero or over [`Self::MAX_TIMEOUT`],
    /// `max_connections` outside `1..=`[`Self::MAX_CONNECTIONS`], `max_body_bytes` outside
    /// `1..=`[`Self::MAX_BODY_BYTES`].
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut counts = vec![
            (
                "max_connections",
                self.max_connections,
                Self::MAX_CONNECTIONS,
            ),
            ("max_body_bytes", self.max_body_bytes, Self::MAX_BODY_BYTES),
        ];
        if let Some(n) = self.worker_threads {
            counts.insert(0, ("worker_threads", n, Self::MAX_WORKER_THREADS));
        }
        listener_bounds(
            &counts,
            &[
                ("header_read_timeout", self.header_read_timeout),
                ("idle_timeout", self.idle_timeout),
            ],
        )
    }
}

/// The bounds of a listener section: each count in `1..=max`, each timeout `> 0` and at most
/// [`HttpSettings::MAX_TIMEOUT`]; one error per field out of bounds.
fn listener_bounds(
    counts: &[(&'static str, usize, usize)],
    timeouts: &[(&'static str, Duration)],
) -> Result<(), PolicyErrors> {
    let mut errors = Vec::new();
    for &(field, n, max) in counts {
        if !(1..=max).contains(&n) {
            errors.push(PolicyError {
                field,
                problem: format!("must be between 1 and {max}, got {n}"),
            });
        }
    }
    for &(field, d) in timeouts {
        if d.is_zero() || d > HttpSettings::MAX_TIMEOUT {
            errors.push(PolicyError {
                field,
                problem: format!("must be > 0 and <= 1h, got {d:?}"),
            });
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(PolicyErrors(errors))
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            worker_threads: None,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            max_body_bytes: 65_536,
        }
    }
}

/// `[rate_limit]`: off (the default), or everything an enabled limiter needs.
#[derive(Debug, Clone)]
pub enum RateLimitSettings {
    /// `rate_limit.enabled = false` (the default): nothing is built.
    Disabled,
    /// `rate_limit.enabled = true`, with everything the limiter needs.
    Enabled(Box<EnabledSettings>),
}

/// An enabled limiter's settings. Which fields exist depends on the crate's features (hence
/// `non_exhaustive`: enabling a feature elsewhere in a build must not break a constructor).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EnabledSettings {
    /// Which provider answers (`rate_limit.provider`), with its own settings.
    pub provider: ProviderSettings,
    /// `rate_limit.policies`, with `rate_limit.default_policy` as the default.
    pub policies: PolicySet,
    /// `rate_limit.failure_policy`: what a request the provider could not decide gets, unless its
    /// policy sets its own.
    pub failure_policy: FailurePolicy,
    /// `None`: no secret configured (allowed only for the local provider, which then uses a
    /// random per-process key).
    pub subject_secret: Option<SubjectSecret>,
    /// The file `subject_secret` was read from (`rate_limit.subject_secret_file`, resolved
    /// against the configuration file's directory), shown by `--check`.
    pub subject_secret_file: Option<PathBuf>,
    /// `[rate_limit.local]`: the local provider's, and the local fallback's, bounds.
    #[cfg(feature = "local")]
    pub local: LocalSettings,
    /// `[rate_limit.circuit_breaker]`, applied around the redis provider.
    #[cfg(feature = "redis")]
    pub breaker: BreakerSettings,
    /// `[rate_limit.fleet]`: the fleet whose size divides the local fallback's limits.
    #[cfg(feature = "redis")]
    pub fleet: FleetConfig,
}

/// Which provider answers: one variant per provider this build holds (features `local` and
/// `redis`), so that a provider not compiled in cannot be chosen. Without either feature
/// there is none, and configuration refuses every enabled section.
// Built once at start-up; boxing the redis settings would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ProviderSettings {
    /// The local provider: limits held in this process's memory.
    #[cfg(feature = "local")]
    Local,
    /// The redis provider: one limit shared by every instance.
    #[cfg(feature = "redis")]
    Redis(RedisProviderSettings),
}

impl ProviderSettings {
    /// The `rate_limit.provider` spelling: `"local"` or `"redis"`.
    pub fn name(&self) -> &'static str {
        match *self {
            #[cfg(feature = "local")]
            ProviderSettings::Local => "local",
            #[cfg(feature = "redis")]
            ProviderSettings::Redis(_) => "redis",
        }
    }

    /// The redis provider's settings; `None` for another provider.
    #[cfg(feature = "redis")]
    pub fn redis(&self) -> Option<&RedisProviderSettings> {
        match self {
            ProviderSettings::Redis(r) => Some(r),
            #[cfg(feature = "local")]
            ProviderSettings::Local => None,
        }
    }
}

/// `[rate_limit.redis]` (role checked: coordination).
#[cfg(feature = "redis")]
#[derive(Debug, Clone)]
pub struct RedisProviderSettings {
    /// The connection, timeout and key settings of `[rate_limit.redis]`.
    pub redis: RedisSettings,
    /// Where the data nodes' password came from (`--check` names it, never the password).
    pub password_source: PasswordSource,
    /// A digest of each TLS file's content as read at load (`tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`, by key path), never shown. The TLS connector is built from the files
    /// once, so a reload compares these: the same path with new content is a change.
    pub tls_file_digests: Vec<(&'static str, u64)>,
}

/// Where `[rate_limit.redis]`'s password came from.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PasswordSource {
    /// No password.
    #[default]
    None,
    /// The userinfo of `url` (or of a cluster seed node's URL).
    Url,
    /// The `password` key (the file or `APP_RATE_LIMIT__REDIS__PASSWORD`).
    Key,
    /// `password_file`: the file at this path.
    File(PathBuf),
}

/// `[rate_limit.fleet]` (feature `redis`): with the redis provider and a policy that falls
/// back locally, each instance announces itself in Redis every `heartbeat` (counted for
/// `ttl`) under the fleet `name`, and while Redis is unavailable admits its share of each
/// limit: the limit divided by the live instances last counted, or by `size_when_unknown`
/// before any count (an instance started during an outage).
#[cfg(feature = "redis")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// `rate_limit.fleet.name`: instances of one name count each other.
    pub name: String,
    /// `rate_limit.fleet.heartbeat`: how often this instance announces itself.
    pub heartbeat: Duration,
    /// `rate_limit.fleet.ttl`: how long an announcement counts.
    pub ttl: Duration,
    /// `rate_limit.fleet.size_when_unknown`: the fleet size assumed before any count.
    pub size_when_unknown: u64,
}

#[cfg(feature = "redis")]
impl Default for FleetConfig {
    /// Fleet `default`, a heartbeat every second counted for 5 s; alone until counted.
    fn default() -> Self {
        let redis = adapter_redis::settings::FleetSettings::default();
        Self {
            name: redis.name,
            heartbeat: redis.heartbeat,
            ttl: redis.ttl,
            size_when_unknown: 1,
        }
    }
}

#[cfg(feature = "redis")]
impl FleetConfig {
    /// Largest accepted `size_when_unknown`.
    pub const MAX_SIZE_WHEN_UNKNOWN: u64 = 10_000;

    /// The heartbeat's settings, as the redis provider takes them.
    pub fn heartbeat_settings(&self) -> adapter_redis::settings::FleetSettings {
        adapter_redis::settings::FleetSettings {
            name: self.name.clone(),
            heartbeat: self.heartbeat,
            ttl: self.ttl,
        }
    }

    /// Checks every field (the heartbeat's by the provider's own rules).
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per refused field (`name`, `heartbeat`, `ttl`,
    /// `size_when_unknown`).
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut errors: Vec<PolicyError> = match self.heartbeat_settings().validate() {
            Ok(()) => Vec::new(),
            Err(problems) => problems
                .0
                .into_iter()
                .map(|p| PolicyError {
                    field: match p.field.as_str() {
                        "fleet.name" => "name",
                        "fleet.heartbeat" => "heartbeat",
                        _ => "ttl",
                    },
                    problem: p.problem,
                })
                .collect(),
        };
        if !(1..=Self::MAX_SIZE_WHEN_UNKNOWN).contains(&self.size_when_unknown) {
            errors.push(PolicyError {
                field: "size_when_unknown",
                problem: format!(
                    "must be between 1 and {}, got {}",
                    Self::MAX_SIZE_WHEN_UNKNOWN,
                    self.size_when_unknown
                ),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(errors))
        }
    }
}

/// `[rate_limit.circuit_breaker]` (feature `redis`: the breaker guards the redis provider).
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// `rate_limit.circuit_breaker.enabled`: whether the breaker guards the redis provider.
    pub enabled: bool,
    /// Consecutive unavailable or indeterminate outcomes that open the circuit.
    pub failure_threshold: u32,
    /// How long an open circuit answers `Unavailable(circuit_open)` before a probe.
    pub cool_down: Duration,
}

#[cfg(feature = "redis")]
impl BreakerSettings {
    /// The longest accepted `cool_down`.
    pub const MAX_COOL_DOWN: Duration = Duration::from_secs(3600);

    /// Checks every field: a threshold of at least one failure, a cool-down of
    /// `(0, `[`Self::MAX_COOL_DOWN`]`]`.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per refused field (`failure_threshold`, `cool_down`).
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut errors = Vec::new();
        if self.failure_threshold == 0 {
            errors.push(PolicyError {
                field: "failure_threshold",
                problem: format!("must be between 1 and {}, got 0", u32::MAX),
            });
        }
        if self.cool_down.is_zero() {
            errors.push(PolicyError {
                field: "cool_down",
                problem: "must be > 0, got \"0s\"".into(),
            });
        } else if self.cool_down > Self::MAX_COOL_DOWN {
            errors.push(PolicyError {
                field: "cool_down",
                problem: format!("must be <= 1h, got {:?}", self.cool_down),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(errors))
        }
    }
}

#[cfg(feature = "redis")]
impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            failure_threshold: 5,
            cool_down: Duration::from_millis(500),
        }
    }
}

/// One `[[routes]]` entry: a rule of the middleware ([`edge_middleware::Rule`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSettings {
    /// A path starting with `/`, without query or fragment ([`Self::check_path_prefix`]);
    /// `/` when the route gives none.
    pub path_prefix: String,
    /// `None`: the default policy.
    pub policy: Option<PolicyId>,
    /// The subject's parts, in order: 1..=[`Self::MAX_SUBJECT_PARTS`].
    pub subject: Vec<SubjectSource>,
    /// Upper-case method names; empty: any method.
    pub methods: Vec<String>,
    /// Lower-case host name, without a port; `None`: any host.
    pub host: Option<String>,
    /// Header conditions, all of which must hold.
    pub header: Vec<HeaderCondition>,
    /// What one request costs: fixed, or read from a header; at most the policy's `max_cost`.
    pub cost: CostSource,
    /// Shadow mode for this route alone: its limit is evaluated and charged, never denies
    /// (a policy in shadow mode is in it under every route).
    pub shadow: bool,
}

impl RouteSettings {
    /// Most parts of one subject.
    pub const MAX_SUBJECT_PARTS: usize = 8;

    /// Checks a `path_prefix`: it is matched against request paths, so it must be one.
    ///
    /// # Errors
    /// A message naming `prefix` when it does not start with `/` or holds `?` or `#`.
    pub fn check_path_prefix(prefix: &str) -> Result<(), String> {
        if !prefix.starts_with('/') || prefix.contains(['?', '#']) {
            return Err(format!("{prefix:?} must be a path starting with '/'"));
        }
        Ok(())
    }

    /// Checks a `host`: a host name or address without a port, as requests name it.
    ///
    /// # Errors
    /// A message naming `host` when it is empty or holds anything but letters, digits, `.`
    /// and `-`.
    pub fn check_host(host: &str) -> Result<(), String> {
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        if valid {
            Ok(())
        } else {
            Err(format!(
                "{host:?} is not a host name (letters, digits, '.' and '-'; no port)"
            ))
        }
    }

    /// The middleware's rule for this route; `default_policy` when it names none.
    pub fn rule(&self, default_policy: &PolicyId) -> Rule {
        let policy = self
            .policy
            .clone()
            .unwrap_or_else(|| default_policy.clone());
        let first = self.subject.first().cloned().unwrap_or(SubjectSource::Ip);
        let mut rule = Rule::new(self.path_prefix.clone(), policy, first)
            .with_subject(self.subject.iter().cloned())
            .with_methods(
                self.methods
                    .iter()
                    .filter_map(|m| edge_middleware::parse_method(m).ok()),
            )
            .with_headers(self.header.iter().cloned())
            .with_cost(self.cost.clone())
            .with_shadow(self.shadow);
        if let Some(host) = &self.host {
            rule = rule.with_host(host.clone());
        }
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(s: &HttpSettings) -> Vec<&'static str> {
        s.validate()
            .err()
            .map(|e| e.0.into_iter().map(|p| p.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn http_defaults_are_valid_and_each_listener_bound_is_checked() {
        let ok = HttpSettings::default();
        assert_eq!(fields(&ok), Vec::<&str>::new());
        let bad = HttpSettings {
            header_read_timeout: Duration::ZERO,
            idle_timeout: HttpSettings::MAX_TIMEOUT + Duration::from_millis(1),
            max_connections: 0,
            max_body_bytes: HttpSettings::MAX_BODY_BYTES + 1,
            ..ok.clone()
        };
        let mut got = fields(&bad);
        got.sort_unstable();
        assert_eq!(
            got,
            [
                "header_read_timeout",
                "idle_timeout",
                "max_body_bytes",
                "max_connections"
            ]
        );
        let edge = HttpSettings {
            header_read_timeout: Duration::from_millis(1),
            idle_timeout: HttpSettings::MAX_TIMEOUT,
            max_connections: 1,
            max_body_bytes: HttpSettings::MAX_BODY_BYTES,
            ..ok
        };
        assert_eq!(fields(&edge), Vec::<&str>::new());
    }
}
