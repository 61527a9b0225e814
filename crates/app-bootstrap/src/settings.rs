//! The validated settings: what [`crate::config::load`] produces and [`crate::compose`]
//! builds from. Values here are checked; holding one means it is usable.
//!
//! Rate limiting is an enum, not a flag: [`RateLimitSettings::Disabled`] carries nothing, so
//! disabled mode cannot accidentally build a connection, a task or a port.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use adapter_local::LocalSettings;
use adapter_redis::{RedisSettings, Topology};
use edge_middleware::SubjectSecret;
use figment::value::Value;
use shared_contract::gate::GateSet;
use shared_contract::{Algorithm, FailurePolicy, PolicyId, PolicySet};

/// Where a route's subject is read: the middleware's type, which reads it.
pub use edge_middleware::SubjectSource;

/// Everything the reference app is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub http: HttpSettings,
    pub rate_limit: RateLimitSettings,
    /// The demo upstream's limited routes, in file order.
    pub routes: Vec<RouteSettings>,
    /// `[event_gates.*]`, validated; empty when none is configured (then nothing is built).
    pub event_gates: GateSet,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub bind: SocketAddr,
    /// Tokio worker threads serving HTTP and the provider's connections; `None`: one per
    /// CPU (Tokio's default). A sidecar that shares its cores with the service and Redis
    /// can do with fewer (docs/performance.md, "One worker thread, and the load generator's own
    /// cost").
    pub worker_threads: Option<usize>,
}

impl HttpSettings {
    /// The most `http.worker_threads` accepts.
    pub const MAX_WORKER_THREADS: usize = 1024;
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            worker_threads: None,
        }
    }
}

/// `[rate_limit]`: off (the default), or everything an enabled limiter needs.
#[derive(Debug, Clone)]
pub enum RateLimitSettings {
    Disabled,
    Enabled(Box<EnabledSettings>),
}

/// An enabled limiter's settings.
#[derive(Debug, Clone)]
pub struct EnabledSettings {
    pub provider: ProviderSettings,
    pub policies: PolicySet,
    pub failure_policy: FailurePolicy,
    /// `None`: no secret configured (allowed only for the local provider, which then uses a
    /// random per-process key).
    pub subject_secret: Option<SubjectSecret>,
    /// `[rate_limit.local]`: the local provider's, and the local fallback's, bounds.
    pub local: LocalSettings,
    /// `[rate_limit.circuit_breaker]`, applied around the redis provider.
    pub breaker: BreakerSettings,
}

/// Which provider answers.
// Built once at start-up; boxing the redis settings would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum ProviderSettings {
    Local,
    Redis(RedisProviderSettings),
}

impl ProviderSettings {
    pub fn name(&self) -> &'static str {
        match self {
            ProviderSettings::Local => "local",
            ProviderSettings::Redis(_) => "redis",
        }
    }
}

/// `[rate_limit.redis]` (role checked: coordination).
#[derive(Debug, Clone)]
pub struct RedisProviderSettings {
    pub redis: RedisSettings,
}

/// `[rate_limit.circuit_breaker]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    pub enabled: bool,
    /// Consecutive unavailable or indeterminate outcomes that open the circuit.
    pub failure_threshold: u32,
    /// How long an open circuit answers `Unavailable(circuit_open)` before a probe.
    pub cool_down: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            failure_threshold: 5,
            cool_down: Duration::from_millis(500),
        }
    }
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSettings {
    pub path_prefix: String,
    /// `None`: the default policy.
    pub policy: Option<PolicyId>,
    pub subject: SubjectSource,
}

/// Shows a Redis URL with its password replaced.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
                if userinfo.contains(':') {
                    format!("{scheme}://{user}:<redacted>@{host}")
                } else {
                    format!("{scheme}://{user}@{host}")
                }
            }
            None => url.to_owned(),
        },
        None => "<redacted>".to_owned(),
    }
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn dur(d: Duration) -> String {
    toml_str(&humantime::format_duration(d).to_string())
}

impl Settings {
    /// The effective settings as TOML, defaults filled in and secrets redacted (`--check`).
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "[http]\nbind = {}",
            toml_str(&self.http.bind.to_string())
        );
        match self.http.worker_threads {
            Some(n) => {
                let _ = writeln!(o, "worker_threads = {n}\n");
            }
            None => {
                let _ = writeln!(o, "# worker_threads: one per CPU\n");
            }
        }
        match &self.rate_limit {
            RateLimitSettings::Disabled => {
                let _ = writeln!(
                    o,
                    "[rate_limit]\nenabled = false  # no connection, task or port is created\n"
                );
            }
            RateLimitSettings::Enabled(e) => render_enabled(&mut o, e),
        }
        for r in &self.routes {
            let _ = writeln!(o, "[[routes]]");
            let _ = writeln!(o, "path_prefix = {}", toml_str(&r.path_prefix));
            match &r.policy {
                Some(p) => {
                    let _ = writeln!(o, "policy = {}", toml_str(p.as_str()));
                }
                None => {
                    let _ = writeln!(o, "# policy: the default policy");
                }
            }
            let _ = writeln!(o, "subject = {}\n", toml_str(&r.subject.to_string()));
        }
        for g in self.event_gates.iter() {
            let ms = |v: u64| dur(Duration::from_millis(v));
            let _ = writeln!(o, "[event_gates.{}]", g.id());
            let _ = writeln!(o, "mode = {}", toml_str(g.mode().as_str()));
            let _ = writeln!(o, "duration = {}", ms(g.duration_ms()));
            let _ = writeln!(o, "retention = {}", ms(g.retention_ms()));
            let _ = writeln!(o, "max_events = {}", g.max_events());
            let _ = writeln!(
                o,
                "max_clock_regression = {}\n",
                ms(g.max_clock_regression_ms())
            );
        }
        o
    }
}

fn render_enabled(o: &mut String, e: &EnabledSettings) {
    let _ = writeln!(o, "[rate_limit]\nenabled = true");
    let _ = writeln!(o, "provider = {}", toml_str(e.provider.name()));
    let _ = writeln!(
        o,
        "default_policy = {}",
        toml_str(e.policies.default_id().as_str())
    );
    let _ = writeln!(
        o,
        "failure_policy = {}",
        toml_str(e.failure_policy.as_str())
    );
    match &e.subject_secret {
        Some(s) => {
            let _ = writeln!(
                o,
                "subject_secret = \"<redacted>\"  # {} bytes, from {}",
                s.len(),
                s.source()
            );
        }
        None => {
            let _ = writeln!(
                o,
                "# subject_secret: none, a random per-process key is used (local provider only)"
            );
        }
    }
    let _ = writeln!(o);
    if let ProviderSettings::Redis(r) = &e.provider {
        let s = &r.redis;
        let _ = writeln!(
            o,
            "[rate_limit.redis]\nrole = \"coordination\"\ntopology = {}",
            toml_str(s.topology.as_str())
        );
        let urls = |urls: &[String]| {
            let shown: Vec<String> = urls.iter().map(|u| toml_str(&redact_url(u))).collect();
            format!("[{}]", shown.join(", "))
        };
        match &s.topology {
            Topology::Standalone => {
                let _ = writeln!(o, "url = {}", toml_str(&redact_url(&s.url)));
            }
            Topology::Sentinel {
                master_name,
                sentinels,
            } => {
                let _ = writeln!(o, "master_name = {}", toml_str(master_name));
                let _ = writeln!(o, "sentinels = {}", urls(sentinels));
            }
            Topology::Cluster { nodes } => {
                let _ = writeln!(o, "nodes = {}", urls(nodes));
            }
        }
        let _ = writeln!(o, "min_replicas_ack = {}", s.min_replicas_ack);
        let _ = writeln!(o, "command_timeout = {}", dur(s.command_timeout));
        let _ = writeln!(o, "max_in_flight = {}", s.max_in_flight);
        let _ = writeln!(o, "key_prefix = {}", toml_str(&s.key_prefix));
        let _ = writeln!(o, "connect_timeout = {}", dur(s.connect_timeout));
        let _ = writeln!(o, "connections = {}", s.connections);
        let _ = writeln!(o, "retry_after = {}\n", dur(s.retry_after));
        let b = &e.breaker;
        let _ = writeln!(
            o,
            "[rate_limit.circuit_breaker]\nenabled = {}\nfailure_threshold = {}\ncool_down = {}\n",
            b.enabled,
            b.failure_threshold,
            dur(b.cool_down)
        );
    }
    let _ = writeln!(o, "[rate_limit.local]\nmax_keys = {}\n", e.local.max_keys);
    for p in e.policies.iter() {
        let _ = writeln!(o, "[rate_limit.policies.{}]", p.id());
        let _ = writeln!(o, "revision = {}", p.revision());
        let _ = writeln!(o, "algorithm = {}", toml_str(p.kind().as_str()));
        let ms = |v: u64| dur(Duration::from_millis(v));
        match p.algorithm() {
            Algorithm::TokenBucket(t) => {
                let _ = writeln!(
                    o,
                    "capacity = {}\nrefill_amount = {}\nrefill_interval = {}",
                    t.capacity(),
                    t.refill_amount(),
                    ms(t.refill_interval_ms())
                );
            }
            Algorithm::Gcra(g) => {
                let _ = writeln!(
                    o,
                    "limit = {}\nperiod = {}\nburst = {}",
                    g.limit(),
                    ms(g.period_ms()),
                    g.burst()
                );
            }
            Algorithm::FixedWindow(w) => {
                let _ = writeln!(o, "limit = {}\nwindow = {}", w.limit(), ms(w.window_ms()));
            }
            Algorithm::SlidingWindow(w) => {
                let _ = writeln!(o, "limit = {}\nwindow = {}", w.limit(), ms(w.window_ms()));
            }
            Algorithm::SlidingLog(w) => {
                let _ = writeln!(o, "limit = {}\nwindow = {}", w.limit(), ms(w.window_ms()));
            }
        }
        let _ = writeln!(o, "max_cost = {}", p.max_cost().get());
        let _ = writeln!(o, "cleanup_grace = {}", ms(p.cleanup_grace_ms()));
        let _ = writeln!(
            o,
            "max_clock_regression = {}\n",
            ms(p.max_clock_regression_ms())
        );
    }
}

/// A value as configuration shows it (for gate settings not interpreted here).
pub fn show_value(v: &Value) -> String {
    format!("{v:?}")
}
