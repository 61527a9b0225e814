//! Loading and validating the configuration: a TOML file and `APP_` environment variables,
//! merged by figment, then read key by key into the typed [`Settings`].
//!
//! The merged document is read as an untyped tree and checked field by field (rather than
//! deserialized with serde in one go) so that **every** problem is reported in one pass, each
//! as one [`Problem`] naming the full key path and the bad value: serde stops at the first
//! type error, and an operator should not have to fix a file one line per restart.
//! Secrets are never echoed, not even when they are wrong.
//!
//! Config only reads. Each settings type checks its own fields ([`RateLimitPolicy::new`],
//! [`GateSettings::new`], `validate` on the HTTP, breaker, local and Redis settings) and
//! names the field of each problem; the section's reader puts that name under its key path.
//! What is left here are the rules of the file itself: which keys exist, which are required
//! when rate limiting is enabled, and references between sections.
//!
//! Rules that hold whether or not rate limiting is enabled: every key that is present must be
//! known and valid. Rules that only hold when it is enabled: the keys it needs (provider,
//! default policy, a Redis role, URL and subject secret for the redis provider) must be there.
//!
//! | module | section |
//! | --- | --- |
//! | `reader` | the generic typed reads, the per-key description of a flat section, the `--check` writer |
//! | `env` | `APP_` (or an embedder's) variables -> a tree merged over the file |
//! | `section` | an embedding service's `[rate_limit]` table, within its own file ([`RateLimitSection`]) |
//! | `http` | `[http]` |
//! | `log` | `[log]` |
//! | `reload` | `[reload]` |
//! | `otlp` | `[otlp]` (trace export) |
//! | `rate_limit` | `[rate_limit]`, `[rate_limit.local]`, `[rate_limit.circuit_breaker]`, the subject secret |
//! | `redis` | `[rate_limit.redis]` |
//! | `policies` | `[rate_limit.policies.*]` |
//! | `routes` | `[[routes]]` |
//! | `gates` | `[event_gates.*]` |
//! | `grpc` | `[grpc]`, `[[rls.descriptors]]` |
//!
//! [`RateLimitPolicy::new`]: shared_contract::RateLimitPolicy::new
//! [`GateSettings::new`]: shared_contract::gate::GateSettings::new

mod env;
mod gates;
mod grpc;
mod http;
mod log;
mod otlp;
mod policies;
mod rate_limit;
pub(crate) mod reader;
#[cfg(feature = "redis")]
mod redis;
mod reload;
mod routes;
mod section;

#[cfg(feature = "redis")]
pub(crate) use redis::digest;

/// The `[rate_limit.redis]` section's path: the provider's (`rate_limit`) and its own.
const REDIS: &str = "rate_limit.redis";

use std::fmt;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use figment::value::Dict;

pub use env::{ENV_PREFIX, ENV_SEPARATOR};
pub use section::RateLimitSection;

use crate::settings::{RateLimitSettings, Settings};
use reader::Check;

/// The top-level sections, each named by the module that reads it.
pub const TOP_KEYS: &[&str] = &[
    http::P,
    log::P,
    reload::P,
    otlp::P,
    rate_limit::P,
    routes::P,
    gates::P,
    grpc::P,
    grpc::RLS,
];

/// One configuration problem: the full key path and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `rate_limit.policies.api.capacity`, `routes[0].subject`, or `--config` for the file.
    pub path: String,
    /// What is wrong with the value.
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

    /// One problem of the whole file, named by `label` (`--config` for the reference app).
    fn file(label: &str, problem: String) -> Self {
        Self(vec![Problem {
            path: label.into(),
            problem,
        }])
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
    let vars = match &sources.env {
        Some(vars) => vars.clone(),
        None => env::process_vars(ENV_PREFIX, |_| true)?,
    };
    let unnamed = env::unnamed(&vars, ENV_PREFIX);
    let root = merged(sources.file.as_deref(), &vars, ENV_PREFIX, "--config")?;
    let base = sources
        .file
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    match (validate(&root, base.as_deref()), unnamed.is_empty()) {
        (Ok(settings), true) => Ok(settings),
        (Ok(_), false) => Err(ConfigErrors(unnamed)),
        (Err(e), _) => {
            let mut problems = unnamed;
            problems.extend(env::attribute(e.0, &vars, ENV_PREFIX));
            Err(ConfigErrors(problems))
        }
    }
}

/// The TOML file at `file` (if any) with the variables of `vars` that start with `prefix`
/// merged over it, as one tree. `label` names the file in its problems.
fn merged(
    file: Option<&Path>,
    vars: &[(String, String)],
    prefix: &str,
    label: &str,
) -> Result<Dict, ConfigErrors> {
    let mut figment = Figment::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors::file(label, format!("cannot read {}: {e}", path.display()))
        })?;
        figment = figment.merge(Toml::string(&text));
    }
    figment = figment.merge(Serialized::defaults(env::tree(vars.to_vec(), prefix)));
    figment.extract().map_err(|e| {
        ConfigErrors(
            e.into_iter()
                .map(|e| Problem {
                    path: if e.path.is_empty() {
                        label.into()
                    } else {
                        e.path.join(".")
                    },
                    problem: without_source_lines(&e.kind.to_string()),
                })
                .collect(),
        )
    })
}

/// Reads a configuration from TOML text alone (no file, no environment): for tests and tools.
///
/// # Errors
/// As [`load`].
pub fn from_toml(text: &str) -> Result<Settings, ConfigErrors> {
    let root: Dict = Figment::from(Toml::string(text))
        .extract()
        .map_err(|e| ConfigErrors::file("--config", without_source_lines(&e.to_string())))?;
    validate(&root, None)
}

/// A TOML syntax error without the lines of the file it quotes (`3 | password = "..."`):
/// the line it names may hold a secret. The position and the reason stay.
fn without_source_lines(error: &str) -> String {
    error
        .lines()
        .filter(|l| {
            let l = l
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !l.trim_start().starts_with('|')
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Validates a merged configuration tree. `base` resolves relative secret file paths (the
/// directory of the configuration file).
///
/// # Errors
/// [`ConfigErrors`] with every problem found.
pub fn validate(root: &Dict, base: Option<&Path>) -> Result<Settings, ConfigErrors> {
    let mut c = Check::default();
    // A misspelt section (`[rate_limt]`, `APP_RATE_LIMT__ENABLED`) would otherwise be
    // ignored, and with it what it enables.
    c.unknown_keys("", root, TOP_KEYS.iter().copied());

    let http = http::read(&mut c, root.get("http"));
    let log = log::read(&mut c, root.get("log"));
    let reload = reload::read(&mut c, root.get(reload::P));
    let otlp = otlp::read(&mut c, root.get(otlp::P));
    let rate_limit = rate_limit::read(&mut c, root.get("rate_limit"), base);
    let routes = routes::read(&mut c, root.get("routes"), &rate_limit);
    let event_gates = gates::read(&mut c, root.get("event_gates"), rate_limit.gate_provider);
    // With a [rate_limit] that has problems of its own, "needs rate limiting" would be noise.
    let enabled = rate_limit
        .settings
        .as_ref()
        .is_none_or(|s| matches!(s, RateLimitSettings::Enabled(_)));
    let http_bind = http.as_ref().map(|h| h.bind);
    let grpc = grpc::read(&mut c, root.get(grpc::P), http_bind, enabled);
    let rls = grpc::read_rules(&mut c, root.get(grpc::RLS), &rate_limit);

    match (c.count() == 0, http, log, reload, otlp, rate_limit.settings) {
        (true, Some(http), Some(log), Some(reload), Some(otlp), Some(rate_limit)) => Ok(Settings {
            http,
            log,
            reload,
            otlp,
            rate_limit,
            routes: routes.unwrap_or_default(),
            event_gates: event_gates.unwrap_or_default(),
            grpc: grpc.unwrap_or_default(),
            rls: rls.unwrap_or_default(),
        }),
        _ => Err(ConfigErrors(c.into_problems())),
    }
}

impl Settings {
    /// The effective settings as TOML, defaults filled in and secrets redacted (`--check`).
    /// Each section renders itself next to where it is read, in this module's children.
    pub fn render(&self) -> String {
        render(self)
    }
}

/// The effective settings as TOML, each section rendered by its own module.
fn render(settings: &Settings) -> String {
    let mut o = reader::Toml::default();
    http::render(&mut o, &settings.http);
    log::render(&mut o, &settings.log);
    reload::render(&mut o, &settings.reload);
    otlp::render(&mut o, &settings.otlp);
    rate_limit::render(&mut o, &settings.rate_limit);
    routes::render(&mut o, &settings.routes);
    gates::render(&mut o, &settings.event_gates);
    grpc::render(&mut o, &settings.grpc, &settings.rls);
    o.finish()
}
