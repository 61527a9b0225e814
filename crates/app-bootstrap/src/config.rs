//! Loading and validating the configuration: a TOML file and `APP_` environment variables,
//! merged by figment, then read key by key into the typed [`Settings`].
//!
//! The merged document is read as an untyped tree and checked field by field (rather than
//! deserialized with serde in one go) so that **every** problem is reported in one pass, each
//! as one [`Problem`] naming the full key path and the bad value: serde stops at the first
//! type error, and an operator should not have to fix a file one line per restart.
//! Secrets are never echoed, not even when they are wrong.
//!
//! Rules that hold whether or not rate limiting is enabled: every key that is present must be
//! known and valid. Rules that only hold when it is enabled: the keys it needs (provider,
//! default policy, a Redis role, URL and subject secret for the redis provider) must be there.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use adapter_local::LocalSettings;
use adapter_redis::{RedisSettings, Topology};
use edge_middleware::SubjectSecret;
use figment::Figment;
use figment::providers::{Format, Toml};
use figment::value::{Dict, Value};
use shared_contract::gate::{GateId, GateMode, GateSet, GateSettings, GateSpec};
use shared_contract::{
    AlgorithmKind, AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySet, PolicySpec,
    RateLimitPolicy,
};

use crate::settings::{
    BreakerSettings, EnabledSettings, HttpSettings, ProviderSettings, RateLimitSettings,
    RedisProviderSettings, RouteSettings, Settings, SubjectSource,
};

/// Prefix of the environment variables that override file keys (`APP_RATE_LIMIT__ENABLED`).
pub const ENV_PREFIX: &str = "APP_";
/// Separator of nested keys in environment variable names.
pub const ENV_SEPARATOR: &str = "__";

/// One configuration problem: the full key path and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `rate_limit.policies.api.capacity`, `routes[0].subject`, or `--config` for the file.
    pub path: String,
    pub problem: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// Every problem of a configuration, in document order (one line each when displayed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Problem>);

impl ConfigErrors {
    /// Whether some problem names `path` exactly.
    pub fn names(&self, path: &str) -> bool {
        self.0.iter().any(|p| p.path == path)
    }
}

/// Where configuration comes from.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The TOML file (`--config PATH`); `None`: built-in defaults and environment only.
    pub file: Option<PathBuf>,
    /// The environment variables to read; `None` reads the process environment. Tests pass
    /// their own so that they do not depend on (or change) the process's.
    pub env: Option<Vec<(String, String)>>,
}

/// Reads and validates the configuration of `sources`.
///
/// # Errors
/// [`ConfigErrors`] with every problem found (an unreadable file or TOML syntax error is one
/// problem on `--config`).
pub fn load(sources: &Sources) -> Result<Settings, ConfigErrors> {
    let mut figment = Figment::new();
    if let Some(path) = &sources.file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![Problem {
                path: "--config".into(),
                problem: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        figment = figment.merge(Toml::string(&text));
    }
    // Environment values stay the strings they are: figment's `Env` would parse them into
    // TOML-like values, which turns "5" into an unsigned number the checks did not read and
    // an all-digit secret into a number without its leading zeros. The checks below accept
    // digit strings for whole numbers and "true"/"false" for booleans instead.
    let vars: Vec<(String, String)> = match &sources.env {
        Some(vars) => vars.clone(),
        None => process_env()?,
    };
    let mut root = Dict::new();
    for (name, value) in vars {
        let Some(rest) = strip_prefix_ignore_case(&name, ENV_PREFIX) else {
            continue;
        };
        let path = env_key_path(rest);
        if path.iter().any(String::is_empty) {
            continue;
        }
        insert_path(&mut root, &path, env_value(value));
    }
    figment = figment.merge(figment::providers::Serialized::defaults(root));
    let root: Dict = figment.extract().map_err(|e| {
        ConfigErrors(
            e.into_iter()
                .map(|e| Problem {
                    path: if e.path.is_empty() {
                        "--config".into()
                    } else {
                        e.path.join(".")
                    },
                    problem: e.kind.to_string(),
                })
                .collect(),
        )
    })?;
    let base = sources
        .file
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    validate(&root, base.as_deref())
}

/// Reads a configuration from TOML text alone (no file, no environment): for tests and tools.
///
/// # Errors
/// As [`load`].
pub fn from_toml(text: &str) -> Result<Settings, ConfigErrors> {
    let root: Dict = Figment::from(Toml::string(text)).extract().map_err(|e| {
        ConfigErrors(vec![Problem {
            path: "--config".into(),
            problem: e.to_string(),
        }])
    })?;
    validate(&root, None)
}

fn strip_prefix_ignore_case<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    (name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &name[prefix.len()..])
}

/// The key path an `APP_` variable names, from the part after the prefix
/// (`RATE_LIMIT__REDIS__URL` -> `rate_limit`, `redis`, `url`).
fn env_key_path(rest: &str) -> Vec<String> {
    rest.split(ENV_SEPARATOR)
        .map(|s| s.to_ascii_lowercase())
        .collect()
}

/// One environment value: the text itself, except that a value in double quotes is the text
/// between them (`"50ms"`, as TOML writes a string) and a value in brackets is a TOML-like
/// array (`["redis://a:7000", "redis://b:7001"]`).
fn env_value(text: String) -> Value {
    let t = text.trim();
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        return Value::from(t[1..t.len() - 1].to_owned());
    }
    if t.starts_with('[')
        && t.ends_with(']')
        && let Ok(array @ Value::Array(..)) = t.parse::<Value>()
    {
        return array;
    }
    Value::from(text)
}

/// The process's `APP_` variables; one that is not UTF-8 is a problem named by its key path.
fn process_env() -> Result<Vec<(String, String)>, ConfigErrors> {
    let mut vars = Vec::new();
    let mut problems = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = strip_prefix_ignore_case(name, ENV_PREFIX) else {
            continue;
        };
        match value.into_string() {
            Ok(value) => vars.push((name.to_owned(), value)),
            Err(_) => problems.push(Problem {
                path: env_key_path(rest).join("."),
                problem: format!("{name} is not valid UTF-8"),
            }),
        }
    }
    if problems.is_empty() {
        Ok(vars)
    } else {
        Err(ConfigErrors(problems))
    }
}

fn insert_path(dict: &mut Dict, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, d) = entry {
                insert_path(d, rest, value);
            }
        }
    }
}

/// Collects problems while the tree is read.
struct Check {
    problems: Vec<Problem>,
}

impl Check {
    fn push(&mut self, path: impl Into<String>, problem: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            problem: problem.into(),
        });
    }

    /// Reports every key of `dict` that is not in `known`.
    fn unknown_keys(&mut self, path: &str, dict: &Dict, known: &[&str]) {
        for key in dict.keys() {
            if !known.contains(&key.as_str()) {
                self.push(
                    join(path, key),
                    format!("unknown key (known here: {})", known.join(", ")),
                );
            }
        }
    }

    fn table<'d>(&mut self, path: &str, v: Option<&'d Value>) -> Option<&'d Dict> {
        match v {
            None => None,
            Some(Value::Dict(_, d)) => Some(d),
            Some(other) => {
                self.push(path, format!("must be a table, got {}", show(other)));
                None
            }
        }
    }

    fn string(&mut self, path: &str, v: Option<&Value>) -> Option<String> {
        match v {
            None => None,
            Some(Value::String(_, s)) => Some(s.clone()),
            Some(other) => {
                self.push(path, format!("must be a string, got {}", show(other)));
                None
            }
        }
    }

    /// A secret: like [`Self::string`], but the value is never shown.
    fn secret(&mut self, path: &str, v: Option<&Value>) -> Option<String> {
        match v {
            None => None,
            Some(Value::String(_, s)) => Some(s.clone()),
            Some(_) => {
                self.push(path, "must be a string (value not shown: it is a secret)");
                None
            }
        }
    }

    fn bool(&mut self, path: &str, v: Option<&Value>) -> Option<bool> {
        match v {
            None => None,
            Some(Value::Bool(_, b)) => Some(*b),
            // From the environment.
            Some(Value::String(_, t)) if t.eq_ignore_ascii_case("true") => Some(true),
            Some(Value::String(_, t)) if t.eq_ignore_ascii_case("false") => Some(false),
            Some(other) => {
                self.push(path, format!("must be true or false, got {}", show(other)));
                None
            }
        }
    }

    fn u64(&mut self, path: &str, v: Option<&Value>) -> Option<u64> {
        match v {
            None => None,
            // From the environment: digits only, as a TOML integer would be written.
            Some(Value::String(_, t)) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
                match t.parse::<u64>() {
                    Ok(u) => Some(u),
                    Err(_) => {
                        self.push(path, format!("must be <= {}, got {t}", u64::MAX));
                        None
                    }
                }
            }
            Some(Value::Num(_, n)) => match integer(n) {
                Some(i) if i < 0 => {
                    self.push(path, format!("must be >= 0, got {i}"));
                    None
                }
                Some(i) => match u64::try_from(i) {
                    Ok(u) => Some(u),
                    Err(_) => {
                        self.push(path, format!("must be <= {}, got {i}", u64::MAX));
                        None
                    }
                },
                None => {
                    self.push(
                        path,
                        format!(
                            "must be a whole number, got {}",
                            show(&Value::Num(Default::default(), *n))
                        ),
                    );
                    None
                }
            },
            Some(other) => {
                self.push(path, format!("must be a whole number, got {}", show(other)));
                None
            }
        }
    }

    /// A humantime duration string (`"50ms"`, `"1s"`, `"2m"`).
    fn duration(&mut self, path: &str, v: Option<&Value>) -> Option<Duration> {
        match v {
            None => None,
            Some(Value::String(_, s)) => match humantime::parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.push(
                        path,
                        format!("{s:?} is not a duration such as \"50ms\" or \"1s\" ({e})"),
                    );
                    None
                }
            },
            Some(Value::Num(_, n)) => {
                // An integer has no f64 reading here; it is finite.
                let what = if n.to_f64().is_none_or(f64::is_finite) {
                    "must be a duration string such as \"50ms\" or \"1s\" (a bare number has no unit)"
                } else {
                    "must be a finite duration string such as \"50ms\" or \"1s\""
                };
                self.push(
                    path,
                    format!("{what}, got {}", show(&Value::Num(Default::default(), *n))),
                );
                None
            }
            Some(other) => {
                self.push(
                    path,
                    format!(
                        "must be a duration string such as \"50ms\", got {}",
                        show(other)
                    ),
                );
                None
            }
        }
    }

    /// A positive duration.
    fn positive_duration(&mut self, path: &str, v: Option<&Value>) -> Option<Duration> {
        let d = self.duration(path, v)?;
        if d.is_zero() {
            self.push(path, "must be > 0, got \"0s\"");
            return None;
        }
        Some(d)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A whole number of any width and sign; `None` for a float.
fn integer(n: &figment::value::Num) -> Option<i128> {
    n.to_i128()
        .or_else(|| n.to_u128().and_then(|u| i128::try_from(u).ok()))
}

/// A short rendering of a value for an error message.
fn show(v: &Value) -> String {
    match v {
        Value::String(_, s) => format!("{:?}", s.chars().take(80).collect::<String>()),
        Value::Char(_, c) => format!("{c:?}"),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => match n.to_f64() {
            Some(f) if f.is_nan() => "nan".into(),
            Some(f) if f.is_infinite() => {
                if f > 0.0 {
                    "inf".into()
                } else {
                    "-inf".into()
                }
            }
            _ => match integer(n) {
                Some(i) => i.to_string(),
                None => n.to_f64().map(|f| f.to_string()).unwrap_or_default(),
            },
        },
        Value::Empty(..) => "nothing".into(),
        Value::Dict(..) => "a table".into(),
        Value::Array(..) => "an array".into(),
    }
}

/// The top-level sections.
pub const TOP_KEYS: &[&str] = &["http", "rate_limit", "routes", "event_gates"];
const HTTP_KEYS: &[&str] = &["bind", "worker_threads"];
const RATE_LIMIT_KEYS: &[&str] = &[
    "enabled",
    "provider",
    "default_policy",
    "failure_policy",
    "subject_secret",
    "subject_secret_file",
    "redis",
    "local",
    "circuit_breaker",
    "policies",
];
const REDIS_KEYS: &[&str] = &[
    "role",
    "url",
    "command_timeout",
    "max_in_flight",
    "key_prefix",
    "connect_timeout",
    "connections",
    "retry_after",
    "topology",
    "username",
    "password",
    "password_file",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "strict_eviction_policy",
    "nodes",
    "sentinels",
    "master_name",
    "min_replicas_ack",
];
const LOCAL_KEYS: &[&str] = &["max_keys"];
const BREAKER_KEYS: &[&str] = &["enabled", "failure_threshold", "cool_down"];
const POLICY_COMMON_KEYS: &[&str] = &[
    "revision",
    "algorithm",
    "max_cost",
    "cleanup_grace",
    "max_clock_regression",
];
const ALGORITHM_KEYS: &[&str] = &[
    "limit",
    "window",
    "capacity",
    "refill_amount",
    "refill_interval",
    "period",
    "burst",
];
const ROUTE_KEYS: &[&str] = &["path_prefix", "policy", "subject"];
const GATE_KEYS: &[&str] = &[
    "mode",
    "duration",
    "retention",
    "max_events",
    "max_clock_regression",
];

/// The parameters of each algorithm, in the order they are documented.
fn parameters(kind: AlgorithmKind) -> &'static [&'static str] {
    match kind {
        AlgorithmKind::TokenBucket => &["capacity", "refill_amount", "refill_interval"],
        AlgorithmKind::Gcra => &["limit", "period", "burst"],
        _ => &["limit", "window"],
    }
}

/// Validates a merged configuration tree. `base` resolves relative secret file paths (the
/// directory of the configuration file).
///
/// # Errors
/// [`ConfigErrors`] with every problem found.
pub fn validate(root: &Dict, base: Option<&Path>) -> Result<Settings, ConfigErrors> {
    let mut c = Check {
        problems: Vec::new(),
    };
    // Unknown top-level keys are not reported: every `APP_*` variable of the environment
    // lands there, and unrelated ones (`APP_ENV`, ...) must not stop the service. The known
    // ones are `TOP_KEYS`.

    let http = read_http(&mut c, root.get("http"));
    let rate_limit = read_rate_limit(&mut c, root.get("rate_limit"), base);
    let routes = read_routes(&mut c, root.get("routes"), &rate_limit);
    let event_gates = read_event_gates(&mut c, root.get("event_gates"));

    match (c.problems.is_empty(), http, rate_limit.settings) {
        (true, Some(http), Some(rate_limit)) => Ok(Settings {
            http,
            rate_limit,
            routes: routes.unwrap_or_default(),
            event_gates: event_gates.unwrap_or_default(),
        }),
        _ => Err(ConfigErrors(c.problems)),
    }
}

fn read_http(c: &mut Check, v: Option<&Value>) -> Option<HttpSettings> {
    let default = HttpSettings::default();
    let Some(d) = c.table("http", v) else {
        return v.is_none().then_some(default);
    };
    c.unknown_keys("http", d, HTTP_KEYS);
    let bind = match c.string("http.bind", d.get("bind")) {
        None => Some(default.bind),
        Some(s) => match s.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                c.push(
                    "http.bind",
                    format!("{s:?} is not an address such as \"127.0.0.1:8080\""),
                );
                None
            }
        },
    };
    let worker_threads = match d.get("worker_threads") {
        None => Some(None),
        v => bounded_usize(
            c,
            "http.worker_threads",
            v,
            HttpSettings::MAX_WORKER_THREADS,
        )
        .map(Some),
    };
    Some(HttpSettings {
        bind: bind?,
        worker_threads: worker_threads?,
    })
}

/// What the rate_limit section read into, plus the policy ids it defines (routes need them).
struct ReadRateLimit {
    /// `None` when the section has problems.
    settings: Option<RateLimitSettings>,
    policy_ids: Vec<PolicyId>,
}

impl ReadRateLimit {
    fn defines(&self, id: &PolicyId) -> bool {
        self.policy_ids.contains(id)
    }
}

fn read_rate_limit(c: &mut Check, v: Option<&Value>, base: Option<&Path>) -> ReadRateLimit {
    let (policy_ids, settings) = read_rate_limit_settings(c, v, base);
    ReadRateLimit {
        settings,
        policy_ids,
    }
}

fn read_rate_limit_settings(
    c: &mut Check,
    v: Option<&Value>,
    base: Option<&Path>,
) -> (Vec<PolicyId>, Option<RateLimitSettings>) {
    const P: &str = "rate_limit";
    let empty = Dict::new();
    let d = match c.table(P, v) {
        Some(d) => d,
        None if v.is_none() => &empty,
        None => return (Vec::new(), None),
    };
    c.unknown_keys(P, d, RATE_LIMIT_KEYS);
    let before = c.problems.len();

    let enabled = c
        .bool("rate_limit.enabled", d.get("enabled"))
        .unwrap_or(false);
    let provider = c
        .string("rate_limit.provider", d.get("provider"))
        .and_then(|s| match s.as_str() {
            "local" | "redis" => Some(s),
            _ => {
                c.push(
                    "rate_limit.provider",
                    format!("{s:?} is not a provider; use \"local\" or \"redis\""),
                );
                None
            }
        });
    let failure_policy = match c.string("rate_limit.failure_policy", d.get("failure_policy")) {
        None => FailurePolicy::default(),
        Some(s) => FailurePolicy::parse(&s).unwrap_or_else(|| {
            c.push(
                "rate_limit.failure_policy",
                format!("{s:?} is not a failure policy; use \"fail_closed\", \"fail_open\" or \"fallback_local\""),
            );
            FailurePolicy::default()
        }),
    };
    let default_policy = c
        .string("rate_limit.default_policy", d.get("default_policy"))
        .and_then(|s| match PolicyId::new(&s) {
            Ok(id) => Some(id),
            Err(e) => {
                c.push("rate_limit.default_policy", e.to_string());
                None
            }
        });
    let secret = read_secret(c, d, base);
    let (policies, policy_ids) = read_policies(c, d.get("policies"), failure_policy);
    let local = read_local(c, d.get("local"));
    let breaker = read_breaker(c, d.get("circuit_breaker"));
    let is_redis = provider.as_deref() == Some("redis");
    let redis = read_redis(c, d.get("redis"), enabled && is_redis);

    if let Some(id) = &default_policy
        && !policy_ids.contains(id)
    {
        c.push(
            "rate_limit.default_policy",
            format!(
                "{:?} is not defined under rate_limit.policies (defined: {})",
                id.as_str(),
                list(&policy_ids)
            ),
        );
    }

    if !enabled {
        let ok = c.problems.len() == before;
        return (policy_ids, ok.then_some(RateLimitSettings::Disabled));
    }

    // Enabled: what enabling needs must be present.
    if !d.contains_key("provider") {
        c.push(
            "rate_limit.provider",
            "required when rate_limit.enabled = true; use \"local\" or \"redis\"",
        );
    }
    if !d.contains_key("default_policy") {
        c.push(
            "rate_limit.default_policy",
            "required when rate_limit.enabled = true",
        );
    }
    if policy_ids.is_empty() && !d.contains_key("policies") {
        c.push(
            "rate_limit.policies",
            "at least one policy is required when rate_limit.enabled = true",
        );
    }
    if is_redis
        && secret.is_none()
        && !d.contains_key("subject_secret")
        && !d.contains_key("subject_secret_file")
    {
        c.push(
            "rate_limit.subject_secret_file",
            "required when provider = \"redis\": a file holding the HMAC key (>= 32 bytes), or rate_limit.subject_secret",
        );
    }
    if c.problems.len() != before {
        return (policy_ids, None);
    }
    let Some(default_policy) = default_policy else {
        return (policy_ids, None);
    };
    let policy_set = match PolicySet::new(policies, default_policy) {
        Ok(set) => set,
        Err(e) => {
            c.push("rate_limit.policies", e.to_string());
            return (policy_ids, None);
        }
    };
    let provider = match (provider.as_deref(), redis) {
        (Some("redis"), Some(redis)) => ProviderSettings::Redis(redis),
        (Some("redis"), None) => return (policy_ids, None),
        _ => ProviderSettings::Local,
    };
    let settings = RateLimitSettings::Enabled(Box::new(EnabledSettings {
        provider,
        policies: policy_set,
        failure_policy,
        subject_secret: secret,
        local,
        breaker,
    }));
    (policy_ids, Some(settings))
}

fn list(ids: &[PolicyId]) -> String {
    if ids.is_empty() {
        "none".into()
    } else {
        ids.iter()
            .map(PolicyId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn read_secret(c: &mut Check, d: &Dict, base: Option<&Path>) -> Option<SubjectSecret> {
    let inline = c.secret("rate_limit.subject_secret", d.get("subject_secret"));
    let file = c.string(
        "rate_limit.subject_secret_file",
        d.get("subject_secret_file"),
    );
    // The file is the preferred form: when both are set it wins, so a secret can move out of
    // the configuration without editing it first.
    if let Some(file) = file {
        let path = match base {
            Some(b) if Path::new(&file).is_relative() => b.join(&file),
            _ => PathBuf::from(&file),
        };
        return match std::fs::read(&path) {
            Err(e) => {
                c.push(
                    "rate_limit.subject_secret_file",
                    format!("cannot read {}: {e}", path.display()),
                );
                None
            }
            Ok(mut bytes) => {
                // A trailing newline is an artefact of editors and `echo`, not key material.
                while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    bytes.pop();
                }
                match SubjectSecret::new(bytes, SubjectSecret::FILE_SOURCE) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        c.push("rate_limit.subject_secret_file", e.to_string());
                        None
                    }
                }
            }
        };
    }
    let inline = inline?;
    match SubjectSecret::new(inline.into_bytes(), SubjectSecret::INLINE_SOURCE) {
        Ok(s) => Some(s),
        Err(e) => {
            c.push("rate_limit.subject_secret", e.to_string());
            None
        }
    }
}

fn read_local(c: &mut Check, v: Option<&Value>) -> LocalSettings {
    let mut s = LocalSettings::default();
    if let Some(d) = c.table("rate_limit.local", v) {
        c.unknown_keys("rate_limit.local", d, LOCAL_KEYS);
        if let Some(n) = c.u64("rate_limit.local.max_keys", d.get("max_keys")) {
            if n == 0 {
                c.push("rate_limit.local.max_keys", "must be > 0, got 0");
            }
            s.max_keys = n;
        }
    }
    s
}

fn read_breaker(c: &mut Check, v: Option<&Value>) -> BreakerSettings {
    const P: &str = "rate_limit.circuit_breaker";
    let mut s = BreakerSettings::default();
    if let Some(d) = c.table(P, v) {
        c.unknown_keys(P, d, BREAKER_KEYS);
        if let Some(b) = c.bool(&join(P, "enabled"), d.get("enabled")) {
            s.enabled = b;
        }
        if let Some(n) = c.u64(&join(P, "failure_threshold"), d.get("failure_threshold")) {
            match u32::try_from(n) {
                Ok(n) if n > 0 => s.failure_threshold = n,
                _ => c.push(
                    join(P, "failure_threshold"),
                    format!("must be between 1 and {}, got {n}", u32::MAX),
                ),
            }
        }
        if let Some(d) = c.positive_duration(&join(P, "cool_down"), d.get("cool_down")) {
            if d > Duration::from_secs(3600) {
                c.push(join(P, "cool_down"), format!("must be <= 1h, got {d:?}"));
            }
            s.cool_down = d;
        }
    }
    s
}

fn read_redis(c: &mut Check, v: Option<&Value>, required: bool) -> Option<RedisProviderSettings> {
    const P: &str = "rate_limit.redis";
    let empty = Dict::new();
    let d = match c.table(P, v) {
        Some(d) => d,
        None if v.is_none() => &empty,
        None => return None,
    };
    c.unknown_keys(P, d, REDIS_KEYS);
    let before = c.problems.len();

    match c.string(&join(P, "role"), d.get("role")) {
        Some(r) if r == "coordination" => {}
        Some(r) => c.push(
            join(P, "role"),
            format!("{r:?} is not accepted; the only accepted role is \"coordination\" (a Redis dedicated to rate-limit state, never an application cache)"),
        ),
        None if required && !d.contains_key("role") => c.push(
            join(P, "role"),
            "required when provider = \"redis\"; set role = \"coordination\"",
        ),
        None => {}
    }
    let topology = match c.string(&join(P, "topology"), d.get("topology")).as_deref() {
        None | Some("standalone") => Some(TopologyKind::Standalone),
        Some("sentinel") => Some(TopologyKind::Sentinel),
        Some("cluster") => Some(TopologyKind::Cluster),
        Some(t) => {
            c.push(
                join(P, "topology"),
                format!("{t:?} is not a topology; use \"standalone\", \"sentinel\" or \"cluster\""),
            );
            None
        }
    };
    let url = c.secret(&join(P, "url"), d.get("url"));
    let nodes = url_list(c, &join(P, "nodes"), d.get("nodes"));
    let sentinels = url_list(c, &join(P, "sentinels"), d.get("sentinels"));
    let master_name = c.string(&join(P, "master_name"), d.get("master_name"));
    // Each topology takes its own keys; a key of another is a mistake worth naming.
    let misplaced = |c: &mut Check, key: &str, given: bool, topology: &str| {
        if given {
            c.push(
                join(P, key),
                format!("not used with topology = \"{topology}\""),
            );
        }
    };
    let topology = match topology {
        Some(TopologyKind::Standalone) => {
            misplaced(c, "nodes", nodes.is_some(), "standalone");
            misplaced(c, "sentinels", sentinels.is_some(), "standalone");
            misplaced(c, "master_name", master_name.is_some(), "standalone");
            if url.is_none() && required {
                c.push(join(P, "url"), "required when provider = \"redis\"");
            }
            Some(Topology::Standalone)
        }
        Some(TopologyKind::Sentinel) => {
            misplaced(c, "url", url.is_some(), "sentinel");
            misplaced(c, "nodes", nodes.is_some(), "sentinel");
            if master_name.as_deref().is_none_or(str::is_empty) {
                c.push(
                    join(P, "master_name"),
                    "required with topology = \"sentinel\" (the name the sentinels monitor)",
                );
            }
            if sentinels.is_none() {
                c.push(
                    join(P, "sentinels"),
                    "required with topology = \"sentinel\": the sentinels' URLs",
                );
            }
            Some(Topology::Sentinel {
                master_name: master_name.unwrap_or_default(),
                sentinels: sentinels.unwrap_or_default(),
            })
        }
        Some(TopologyKind::Cluster) => {
            misplaced(c, "url", url.is_some(), "cluster");
            misplaced(c, "sentinels", sentinels.is_some(), "cluster");
            misplaced(c, "master_name", master_name.is_some(), "cluster");
            if nodes.is_none() {
                c.push(
                    join(P, "nodes"),
                    "required with topology = \"cluster\": seed node URLs",
                );
            }
            Some(Topology::Cluster {
                nodes: nodes.unwrap_or_default(),
            })
        }
        None => None,
    };
    let url = url.and_then(|u| check_url(c, &join(P, "url"), u));
    let min_replicas_ack = match c.u64(&join(P, "min_replicas_ack"), d.get("min_replicas_ack")) {
        None => 0,
        Some(n) => match u32::try_from(n) {
            Ok(n) if n <= RedisSettings::MAX_REPLICAS_ACK => n,
            _ => {
                c.push(
                    join(P, "min_replicas_ack"),
                    format!(
                        "must be between 0 and {}, got {n}",
                        RedisSettings::MAX_REPLICAS_ACK
                    ),
                );
                0
            }
        },
    };
    let username = c.string(&join(P, "username"), d.get("username"));
    let password_inline = c.secret(&join(P, "password"), d.get("password"));
    let password_file = c.string(&join(P, "password_file"), d.get("password_file"));
    let password = match password_file {
        Some(f) => match std::fs::read_to_string(&f) {
            Ok(s) => Some(s.trim_end_matches(['\n', '\r']).to_owned()),
            Err(e) => {
                c.push(join(P, "password_file"), format!("cannot read {f}: {e}"));
                None
            }
        },
        None => password_inline,
    };

    let tls_ca_file = c.string(&join(P, "tls_ca_file"), d.get("tls_ca_file"));
    let tls_cert_file = c.string(&join(P, "tls_cert_file"), d.get("tls_cert_file"));
    let tls_key_file = c.string(&join(P, "tls_key_file"), d.get("tls_key_file"));

    let strict_eviction_policy = c
        .bool(
            &join(P, "strict_eviction_policy"),
            d.get("strict_eviction_policy"),
        )
        .unwrap_or(false);

    let defaults = RedisSettings::new("");
    let command_timeout = c
        .positive_duration(&join(P, "command_timeout"), d.get("command_timeout"))
        .unwrap_or(defaults.command_timeout);
    // The edge gives each evaluation a deadline of command_timeout plus a margin, and a
    // deadline is at most a minute: so the timeout must leave room for the margin.
    let max_timeout = shared_contract::Deadline::MAX_BUDGET - Duration::from_secs(1);
    if command_timeout > max_timeout {
        c.push(
            join(P, "command_timeout"),
            format!("must be <= {max_timeout:?}, got {command_timeout:?}"),
        );
    }
    let connect_timeout = c
        .positive_duration(&join(P, "connect_timeout"), d.get("connect_timeout"))
        .unwrap_or(defaults.connect_timeout);
    let retry_after = c
        .duration(&join(P, "retry_after"), d.get("retry_after"))
        .unwrap_or(defaults.retry_after);
    let max_in_flight = bounded_usize(
        c,
        &join(P, "max_in_flight"),
        d.get("max_in_flight"),
        RedisSettings::MAX_IN_FLIGHT,
    )
    .unwrap_or(defaults.max_in_flight);
    let connections = bounded_usize(
        c,
        &join(P, "connections"),
        d.get("connections"),
        RedisSettings::MAX_CONNECTIONS,
    )
    .unwrap_or(defaults.connections);
    let key_prefix = c
        .string(&join(P, "key_prefix"), d.get("key_prefix"))
        .unwrap_or_else(|| defaults.key_prefix.clone());
    if adapter_redis::keys::check_prefix(&key_prefix).is_err() {
        c.push(
            join(P, "key_prefix"),
            format!(
                "must be 1..=32 characters of [A-Za-z0-9_.-], got {:?}",
                key_prefix.chars().take(40).collect::<String>()
            ),
        );
    }
    if c.problems.len() != before {
        return None;
    }
    let topology = topology?;
    let mut redis = RedisSettings::new(url.unwrap_or_default());
    redis.topology = topology;
    redis.min_replicas_ack = min_replicas_ack;
    redis.username = username;
    redis.strict_eviction_policy = strict_eviction_policy;
    redis.password = password;
    redis.tls = adapter_redis::TlsFiles {
        ca_file: tls_ca_file.map(Into::into),
        cert_file: tls_cert_file.map(Into::into),
        key_file: tls_key_file.map(Into::into),
    };
    redis.command_timeout = command_timeout;
    redis.connect_timeout = connect_timeout;
    redis.retry_after = retry_after;
    redis.max_in_flight = max_in_flight;
    redis.connections = connections;
    redis.key_prefix = key_prefix;
    Some(RedisProviderSettings { redis })
}

fn bounded_usize(c: &mut Check, path: &str, v: Option<&Value>, max: usize) -> Option<usize> {
    let n = c.u64(path, v)?;
    match usize::try_from(n) {
        Ok(u) if (1..=max).contains(&u) => Some(u),
        _ => {
            c.push(path, format!("must be between 1 and {max}, got {n}"));
            None
        }
    }
}

/// The topologies `rate_limit.redis.topology` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyKind {
    Standalone,
    Sentinel,
    Cluster,
}

/// A list of Redis URLs (`nodes`, `sentinels`): a TOML array of strings, or one string of
/// comma-separated URLs (handy in environment variables). Each is checked like `url`, by its
/// index (`nodes[1]`); values are never shown (they may hold passwords).
fn url_list(c: &mut Check, path: &str, v: Option<&Value>) -> Option<Vec<String>> {
    let items: Vec<String> = match v? {
        Value::String(_, s) => s
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect(),
        Value::Array(_, a) => {
            let mut out = Vec::with_capacity(a.len());
            for (i, item) in a.iter().enumerate() {
                match item {
                    Value::String(_, s) => out.push(s.clone()),
                    _ => c.push(
                        format!("{path}[{i}]"),
                        "must be a URL string (value not shown: it may hold a password)",
                    ),
                }
            }
            out
        }
        _ => {
            c.push(
                path,
                "must be a list of URLs such as [\"redis://127.0.0.1:7000\"] (value not shown)",
            );
            return None;
        }
    };
    if items.is_empty() || items.len() > RedisSettings::MAX_NODES {
        c.push(
            path,
            format!(
                "must hold 1..={} URLs, got {}",
                RedisSettings::MAX_NODES,
                items.len()
            ),
        );
        return None;
    }
    let checked: Vec<String> = items
        .into_iter()
        .enumerate()
        .filter_map(|(i, u)| check_url(c, &format!("{path}[{i}]"), u))
        .collect();
    Some(checked)
}

/// Checks the URL's shape without echoing it (it may hold a password).
fn check_url(c: &mut Check, path: &str, url: String) -> Option<String> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis") => {}
        Some("rediss") => {}
        _ => {
            c.push(path, "must be a URL such as \"redis://127.0.0.1:6379/0\" (value not shown: it may hold a password)");
            return None;
        }
    }
    use redis_url_check::parses;
    if !parses(&url) {
        c.push(
            path,
            "not a valid redis:// URL (value not shown: it may hold a password)",
        );
        return None;
    }
    Some(url)
}

/// The minimal URL syntax check this crate can make without a Redis client: a host, an
/// optional numeric port, an optional numeric database. The provider parses it fully.
mod redis_url_check {
    pub fn parses(url: &str) -> bool {
        let Some(rest) = url
            .strip_prefix("redis://")
            .or_else(|| url.strip_prefix("rediss://"))
        else {
            return false;
        };
        let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let (hostport, db) = rest.split_once('/').unwrap_or((rest, ""));
        let db_ok = db.is_empty() || db.parse::<u32>().is_ok();
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
            _ => (hostport, None),
        };
        let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
        !host.is_empty() && db_ok && port_ok
    }
}

/// The valid policies, and the ids of every policy table (valid or not), so that references
/// to a policy with problems are not reported as undefined too.
fn read_policies(
    c: &mut Check,
    v: Option<&Value>,
    failure_policy: FailurePolicy,
) -> (Vec<RateLimitPolicy>, Vec<PolicyId>) {
    let mut out = Vec::new();
    let mut declared = Vec::new();
    let Some(d) = c.table("rate_limit.policies", v) else {
        return (out, declared);
    };
    for (name, value) in d {
        let path = format!("rate_limit.policies.{name}");
        let id = match PolicyId::new(name) {
            Ok(id) => {
                declared.push(id.clone());
                Some(id)
            }
            Err(e) => {
                c.push(&path, e.to_string());
                None
            }
        };
        let Some(p) = c.table(&path, Some(value)) else {
            continue;
        };
        if let Some(policy) = read_policy(c, &path, id, p, failure_policy) {
            out.push(policy);
        }
    }
    (out, declared)
}

fn read_policy(
    c: &mut Check,
    path: &str,
    id: Option<PolicyId>,
    d: &Dict,
    failure_policy: FailurePolicy,
) -> Option<RateLimitPolicy> {
    let before = c.problems.len();
    let mut known: Vec<&str> = POLICY_COMMON_KEYS.to_vec();
    known.extend_from_slice(ALGORITHM_KEYS);
    c.unknown_keys(path, d, &known);

    let revision = match c.u64(&join(path, "revision"), d.get("revision")) {
        None => PolicyRevision::new(1).ok(),
        Some(r) => match u32::try_from(r)
            .ok()
            .and_then(|r| PolicyRevision::new(r).ok())
        {
            Some(r) => Some(r),
            None => {
                c.push(
                    join(path, "revision"),
                    format!("must be between 1 and {}, got {r}", u32::MAX),
                );
                None
            }
        },
    };
    let kind = match c.string(&join(path, "algorithm"), d.get("algorithm")) {
        None => {
            if !d.contains_key("algorithm") {
                c.push(
                    join(path, "algorithm"),
                    "required; one of fixed_window, sliding_window, token_bucket, gcra, sliding_log",
                );
            }
            None
        }
        Some(a) => match AlgorithmKind::parse(&a) {
            Some(k) => Some(k),
            None => {
                c.push(
                    join(path, "algorithm"),
                    format!("{a:?} is not an algorithm; use fixed_window, sliding_window, token_bucket, gcra or sliding_log"),
                );
                None
            }
        },
    };
    let max_cost = c
        .u64(&join(path, "max_cost"), d.get("max_cost"))
        .unwrap_or(1);
    let grace = c
        .duration(&join(path, "cleanup_grace"), d.get("cleanup_grace"))
        .unwrap_or(Duration::from_secs(60));
    let regression = c
        .duration(
            &join(path, "max_clock_regression"),
            d.get("max_clock_regression"),
        )
        .unwrap_or(Duration::from_secs(2));

    let algorithm = kind.and_then(|kind| {
        let params = parameters(kind);
        for key in ALGORITHM_KEYS {
            if d.contains_key(*key) && !params.contains(key) {
                c.push(
                    join(path, key),
                    format!(
                        "is not a parameter of algorithm {kind} (its parameters: {})",
                        params.join(", ")
                    ),
                );
            }
        }
        let num = |c: &mut Check, key: &str| {
            let p = join(path, key);
            match d.get(key) {
                None => {
                    c.push(p, format!("required by algorithm {kind}"));
                    None
                }
                v => c.u64(&p, v),
            }
        };
        let dur = |c: &mut Check, key: &str| {
            let p = join(path, key);
            match d.get(key) {
                None => {
                    c.push(p, format!("required by algorithm {kind}"));
                    None
                }
                v => c.duration(&p, v),
            }
        };
        match kind {
            AlgorithmKind::TokenBucket => {
                let capacity = num(c, "capacity");
                let refill_amount = num(c, "refill_amount");
                let refill_interval = dur(c, "refill_interval");
                Some(AlgorithmSpec::TokenBucket {
                    capacity: capacity?,
                    refill_amount: refill_amount?,
                    refill_interval: refill_interval?,
                })
            }
            AlgorithmKind::Gcra => {
                let limit = num(c, "limit");
                let period = dur(c, "period");
                let burst = num(c, "burst");
                Some(AlgorithmSpec::Gcra {
                    limit: limit?,
                    period: period?,
                    burst: burst?,
                })
            }
            AlgorithmKind::FixedWindow
            | AlgorithmKind::SlidingWindow
            | AlgorithmKind::SlidingLog => {
                let limit = num(c, "limit")?;
                let window = dur(c, "window")?;
                Some(match kind {
                    AlgorithmKind::FixedWindow => AlgorithmSpec::FixedWindow { limit, window },
                    AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow { limit, window },
                    _ => AlgorithmSpec::SlidingLog { limit, window },
                })
            }
            // `AlgorithmKind` is non-exhaustive: an algorithm this crate does not know how to
            // configure is refused rather than guessed.
            #[allow(unreachable_patterns)]
            _ => {
                c.push(
                    join(path, "algorithm"),
                    format!("{kind} cannot be configured by this build"),
                );
                None
            }
        }
    });
    // The contract's checks run whenever the parameters could be read, even next to other
    // problems of this policy, so that they are reported in the same pass.
    let spec = PolicySpec {
        // An invalid table name is reported already; a stand-in id still lets the
        // parameters be checked.
        id: match id {
            Some(id) => id,
            None => PolicyId::new("invalid").ok()?,
        },
        revision: revision?,
        algorithm: algorithm?,
        max_cost,
        cleanup_grace: grace,
        max_clock_regression: regression,
        failure_policy,
    };
    match RateLimitPolicy::new(spec) {
        Ok(p) if c.problems.len() == before => Some(p),
        Ok(_) => None,
        Err(errors) => {
            for e in errors.0 {
                c.push(join(path, e.field), e.problem);
            }
            None
        }
    }
}

fn read_routes(
    c: &mut Check,
    v: Option<&Value>,
    rate_limit: &ReadRateLimit,
) -> Option<Vec<RouteSettings>> {
    let items = match v {
        None => return Some(Vec::new()),
        Some(Value::Array(_, items)) => items,
        Some(other) => {
            c.push(
                "routes",
                format!(
                    "must be an array of tables ([[routes]]), got {}",
                    show(other)
                ),
            );
            return None;
        }
    };
    let before = c.problems.len();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("routes[{i}]");
        let Some(d) = c.table(&path, Some(item)) else {
            continue;
        };
        c.unknown_keys(&path, d, ROUTE_KEYS);
        let prefix = match c.string(&join(&path, "path_prefix"), d.get("path_prefix")) {
            None => {
                c.push(join(&path, "path_prefix"), "required, e.g. \"/api\"");
                None
            }
            Some(p) if !p.starts_with('/') || p.contains(['?', '#']) => {
                c.push(
                    join(&path, "path_prefix"),
                    format!("{p:?} must be a path starting with '/'"),
                );
                None
            }
            Some(p) => Some(p),
        };
        let policy = match c.string(&join(&path, "policy"), d.get("policy")) {
            None => None,
            Some(s) => match PolicyId::new(&s) {
                Err(e) => {
                    c.push(join(&path, "policy"), e.to_string());
                    None
                }
                Ok(id) => {
                    if !rate_limit.defines(&id) {
                        c.push(
                            join(&path, "policy"),
                            format!(
                                "{s:?} is not defined under rate_limit.policies (defined: {})",
                                list(&rate_limit.policy_ids)
                            ),
                        );
                        None
                    } else {
                        Some(id)
                    }
                }
            },
        };
        let subject = match c.string(&join(&path, "subject"), d.get("subject")) {
            None => {
                c.push(
                    join(&path, "subject"),
                    "required: \"header:NAME\" or \"ip\"",
                );
                None
            }
            Some(s) => match SubjectSource::parse(&s) {
                Ok(src) => Some(src),
                Err(problem) => {
                    c.push(join(&path, "subject"), problem);
                    None
                }
            },
        };
        if let (Some(path_prefix), Some(subject)) = (prefix, subject) {
            out.push(RouteSettings {
                path_prefix,
                policy,
                subject,
            });
        }
    }
    (c.problems.len() == before).then_some(out)
}

/// `[event_gates.<id>]`: every gate, each field checked here (types, names) and then by
/// [`GateSettings::new`] (ranges), whose field names complete the key path.
fn read_event_gates(c: &mut Check, v: Option<&Value>) -> Option<GateSet> {
    let Some(d) = c.table("event_gates", v) else {
        return v.is_none().then(GateSet::default);
    };
    let mut gates = Vec::new();
    let mut ok = true;
    for (name, value) in d {
        let path = join("event_gates", name);
        let Some(g) = c.table(&path, Some(value)) else {
            ok = false;
            continue;
        };
        c.unknown_keys(&path, g, GATE_KEYS);
        let id = match GateId::new(name) {
            Ok(id) => Some(id),
            Err(e) => {
                c.push(&path, e.to_string());
                None
            }
        };
        let mode_path = join(&path, "mode");
        let mode = match c.string(&mode_path, g.get("mode")) {
            None => {
                if g.get("mode").is_none() {
                    c.push(&mode_path, "required (\"only_once\" or \"strictly_once\")");
                }
                None
            }
            Some(m) => match GateMode::parse(&m) {
                Some(m) => Some(m),
                None => {
                    c.push(
                        &mode_path,
                        format!("{m:?} is not a mode; use \"only_once\" or \"strictly_once\""),
                    );
                    None
                }
            },
        };
        let duration_path = join(&path, "duration");
        let duration = c.duration(&duration_path, g.get("duration"));
        if g.get("duration").is_none() {
            c.push(&duration_path, "required (a duration such as \"3s\")");
        }
        let retention = c.duration(&join(&path, "retention"), g.get("retention"));
        let max_events = c.u64(&join(&path, "max_events"), g.get("max_events"));
        let regression = c.duration(
            &join(&path, "max_clock_regression"),
            g.get("max_clock_regression"),
        );
        let (Some(id), Some(mode), Some(duration)) = (id, mode, duration) else {
            ok = false;
            continue;
        };
        let mut spec = GateSpec::new(id, mode, duration);
        if let Some(r) = retention {
            spec.retention = r;
        }
        if let Some(m) = max_events {
            spec.max_events = m;
        }
        if let Some(r) = regression {
            spec.max_clock_regression = r;
        }
        match GateSettings::new(spec) {
            Ok(s) => gates.push(s),
            Err(errors) => {
                ok = false;
                for e in errors.0 {
                    c.push(join(&path, e.field), e.problem);
                }
            }
        }
    }
    if !ok {
        return None;
    }
    match GateSet::new(gates) {
        Ok(set) => Some(set),
        Err(e) => {
            c.push("event_gates", e.to_string());
            None
        }
    }
}
