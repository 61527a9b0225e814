//! `[rate_limit]`: whether rate limiting is on, with which provider, default policy, failure
//! policy and subject secret; and its two small tables, `[rate_limit.local]` and
//! `[rate_limit.circuit_breaker]`. The Redis table and the policies have their own modules.
//!
//! A table of a provider this build lacks (features `redis`, `local`) is refused when
//! present, as is a provider or failure policy that needs one.
//!
//! Disabled (the default), the section is still read and every key present must be valid,
//! but nothing is required; enabled, what enabling needs must be there
//! ([`require_when_enabled`]).

use std::path::{Path, PathBuf};

#[cfg(feature = "local")]
use adapter_local::LocalSettings;
use figment::value::{Dict, Value};
use shared_contract::{FailurePolicy, PolicyId, PolicySet, RateLimitPolicy};

#[cfg(not(feature = "redis"))]
use super::REDIS;
use super::policies;
use super::reader::{Check, Key, Toml, names, read_present, render_keys};
#[cfg(any(feature = "redis", feature = "local"))]
use super::reader::{key, read_section, render_section};
#[cfg(feature = "redis")]
use super::redis;
use crate::features::Feature;
#[cfg(feature = "redis")]
use crate::settings::{BreakerSettings, FleetConfig, RedisProviderSettings};
use crate::settings::{EnabledSettings, ProviderSettings, RateLimitSettings};
use edge_middleware::SubjectSecret;

pub(super) const P: &str = "rate_limit";
const LOCAL: &str = "rate_limit.local";
const BREAKER: &str = "rate_limit.circuit_breaker";
const FLEET: &str = "rate_limit.fleet";

/// The tables inside `[rate_limit]`, each read by its own function.
const TABLES: [&str; 5] = ["redis", "local", "circuit_breaker", "fleet", "policies"];

/// The provider `rate_limit.provider` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProviderName {
    Local,
    Redis,
}

impl ProviderName {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "local" => Some(Self::Local),
            "redis" => Some(Self::Redis),
            _ => None,
        }
    }

    /// The feature that compiles the provider in.
    fn feature(self) -> Feature {
        match self {
            Self::Local => Feature::Local,
            Self::Redis => Feature::Redis,
        }
    }
}

/// The plain keys of `[rate_limit]` as read, before the cross-key rules.
#[derive(Debug, Default)]
struct Draft {
    enabled: bool,
    provider: Option<ProviderName>,
    default_policy: Option<PolicyId>,
    failure_policy: FailurePolicy,
    inline_secret: Option<String>,
    secret_file: Option<String>,
}

/// The plain keys of `[rate_limit]`, rendered from the enabled settings (a disabled section
/// renders only `enabled = false`).
const KEYS: &[Key<Draft, EnabledSettings>] = &[
    Key {
        name: "enabled",
        read: |c, path, v, d| {
            if let Some(b) = c.bool(path, Some(v)) {
                d.enabled = b;
            }
        },
        render: |_, o| o.raw("enabled", true),
    },
    Key {
        name: "provider",
        read: |c, path, v, d| {
            let p = ProviderName::parse;
            d.provider = c.choice(path, Some(v), p, "a provider", "\"local\" or \"redis\"");
            if let (Some(name), Value::String(_, s)) = (d.provider, v) {
                c.needs(path, format_args!("{s:?}"), name.feature());
            }
        },
        render: |e, o| o.str("provider", e.provider.name()),
    },
    Key {
        name: "default_policy",
        read: |c, path, v, d| d.default_policy = policies::read_id(c, path, v),
        render: |e, o| o.str("default_policy", e.policies.default_id().as_str()),
    },
    Key {
        name: "failure_policy",
        read: |c, path, v, d| {
            let choices = "\"fail_closed\", \"fail_open\" or \"fallback_local\"";
            let p = FailurePolicy::parse;
            if let Some(f) = c.choice(path, Some(v), p, "a failure policy", choices) {
                policies::check_failure_policy(c, path, f);
                d.failure_policy = f;
            }
        },
        render: |e, o| o.str("failure_policy", e.failure_policy.as_str()),
    },
    Key {
        name: "subject_secret",
        read: |c, path, v, d| d.inline_secret = c.secret(path, Some(v)),
        render: |e, o| match &e.subject_secret {
            Some(s) => o.line(format_args!(
                "subject_secret = \"<redacted>\"  # {} bytes, from {}",
                s.len(),
                s.source()
            )),
            None => o.line(
                "# subject_secret: none, a random per-process key is used (local provider only)",
            ),
        },
    },
    Key {
        name: "subject_secret_file",
        read: |c, path, v, d| d.secret_file = c.string(path, Some(v)),
        // The path; the secret itself is shown as `subject_secret` (length and source).
        render: |e, o| match &e.subject_secret_file {
            Some(f) => o.str("subject_secret_file", &f.display().to_string()),
            None => o.line("# subject_secret_file: none"),
        },
    },
];

/// `[rate_limit.local]`. Defaults: [`LocalSettings::default`].
#[cfg(feature = "local")]
const LOCAL_KEYS: &[Key<LocalSettings>] = &[key!("max_keys", max_keys)];

/// `[rate_limit.circuit_breaker]`. Defaults: [`BreakerSettings::default`].
#[cfg(feature = "redis")]
const BREAKER_KEYS: &[Key<BreakerSettings>] = &[
    key!("enabled", enabled),
    key!("failure_threshold", failure_threshold),
    key!("cool_down", cool_down),
];

/// `[rate_limit.fleet]`. Defaults: [`FleetConfig::default`].
#[cfg(feature = "redis")]
const FLEET_KEYS: &[Key<FleetConfig>] = &[
    key!("name", name),
    key!("heartbeat", heartbeat),
    key!("ttl", ttl),
    key!("size_when_unknown", size_when_unknown),
];

/// What the section read into, plus what routes need of it: the policy ids it defines, the
/// `max_cost` of each valid policy and the default policy.
pub(super) struct RateLimit {
    /// `None` when the section has problems.
    pub(super) settings: Option<RateLimitSettings>,
    pub(super) policy_ids: Vec<PolicyId>,
    pub(super) max_costs: Vec<(PolicyId, u64)>,
    /// The valid concurrency policies: a route naming one holds a lease, an Envoy
    /// descriptor may not name one.
    pub(super) concurrency_ids: Vec<PolicyId>,
    pub(super) default_policy: Option<PolicyId>,
    /// Which provider the event gates use: local unless rate limiting is enabled with the
    /// redis provider; `None` when the section does not say (its problems are reported).
    pub(super) gate_provider: Option<Feature>,
}

pub(super) fn read(c: &mut Check, v: Option<&Value>, base: Option<&Path>) -> RateLimit {
    let Some(d) = c.section(P, v) else {
        return RateLimit {
            settings: None,
            policy_ids: Vec::new(),
            max_costs: Vec::new(),
            concurrency_ids: Vec::new(),
            default_policy: None,
            gate_provider: None,
        };
    };
    c.unknown_keys(P, d, names(KEYS).chain(TABLES));
    let before = c.count();
    let mut draft = Draft::default();
    read_present(c, P, d, KEYS, &mut draft);
    let secret = read_secret(c, &draft, base);
    let (policies, policy_ids) = policies::read(c, d.get("policies"), draft.failure_policy);
    let max_costs = policies
        .iter()
        .map(|p| (p.id().clone(), p.max_cost().get()))
        .collect();
    let concurrency_ids = policies
        .iter()
        .filter(|p| p.kind() == shared_contract::AlgorithmKind::Concurrency)
        .map(|p| p.id().clone())
        .collect();
    let default_policy = draft.default_policy.clone();
    let gate_provider = match (draft.enabled, draft.provider) {
        (false, _) => Some(Feature::Local),
        (true, name) => name.map(ProviderName::feature),
    };
    let tables = read_tables(c, d, &draft);

    if let Some(id) = &draft.default_policy
        && !policy_ids.contains(id)
    {
        c.push(
            "rate_limit.default_policy",
            policies::undefined(id, &policy_ids),
        );
    }
    let settings = if draft.enabled {
        require_when_enabled(c, d, &draft, secret.is_some(), &policy_ids);
        if c.count() == before {
            let parts = Parts {
                secret_file: secret_path(&draft, base),
                draft,
                secret,
                policies,
                tables,
            };
            enabled(c, parts).map(|e| RateLimitSettings::Enabled(Box::new(e)))
        } else {
            None
        }
    } else {
        (c.count() == before).then_some(RateLimitSettings::Disabled)
    };
    RateLimit {
        settings,
        policy_ids,
        max_costs,
        concurrency_ids,
        default_policy,
        gate_provider,
    }
}

/// The provider tables, each read in a build with its feature; `None` when it has problems
/// (reported).
struct Tables {
    #[cfg(feature = "local")]
    local: Option<LocalSettings>,
    #[cfg(feature = "redis")]
    breaker: Option<BreakerSettings>,
    #[cfg(feature = "redis")]
    fleet: Option<FleetConfig>,
    #[cfg(feature = "redis")]
    redis: Option<RedisProviderSettings>,
}

fn read_tables(c: &mut Check, d: &Dict, draft: &Draft) -> Tables {
    #[cfg(feature = "local")]
    let local = read_section(
        c,
        LOCAL,
        d.get("local"),
        LOCAL_KEYS,
        LocalSettings::validate,
    );
    #[cfg(not(feature = "local"))]
    c.unavailable_section(LOCAL, d.get("local"), Feature::Local);
    #[cfg(feature = "redis")]
    let breaker = read_section(
        c,
        BREAKER,
        d.get("circuit_breaker"),
        BREAKER_KEYS,
        BreakerSettings::validate,
    );
    #[cfg(feature = "redis")]
    let fleet = read_section(c, FLEET, d.get("fleet"), FLEET_KEYS, FleetConfig::validate);
    #[cfg(feature = "redis")]
    let redis = {
        let is_redis = draft.provider == Some(ProviderName::Redis);
        redis::read(c, d.get("redis"), draft.enabled && is_redis)
    };
    #[cfg(not(feature = "redis"))]
    {
        // Only the redis provider's table needs the draft (whether its keys are required).
        let _ = draft;
        c.unavailable_section(BREAKER, d.get("circuit_breaker"), Feature::Redis);
        c.unavailable_section(FLEET, d.get("fleet"), Feature::Redis);
        c.unavailable_section(REDIS, d.get("redis"), Feature::Redis);
    }
    Tables {
        #[cfg(feature = "local")]
        local,
        #[cfg(feature = "redis")]
        breaker,
        #[cfg(feature = "redis")]
        fleet,
        #[cfg(feature = "redis")]
        redis,
    }
}

/// Enabled: the keys enabling needs must be present.
fn require_when_enabled(
    c: &mut Check,
    d: &Dict,
    draft: &Draft,
    has_secret: bool,
    policy_ids: &[PolicyId],
) {
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
    if draft.provider == Some(ProviderName::Redis)
        && !has_secret
        && !d.contains_key("subject_secret")
        && !d.contains_key("subject_secret_file")
    {
        c.push(
            "rate_limit.subject_secret_file",
            "required when provider = \"redis\": a file holding the HMAC key (>= 32 bytes), or rate_limit.subject_secret",
        );
    }
}

/// Everything an enabled section read cleanly.
struct Parts {
    draft: Draft,
    secret: Option<SubjectSecret>,
    secret_file: Option<PathBuf>,
    policies: Vec<RateLimitPolicy>,
    tables: Tables,
}

fn enabled(c: &mut Check, p: Parts) -> Option<EnabledSettings> {
    let policies = match PolicySet::new(p.policies, p.draft.default_policy?) {
        Ok(set) => set,
        Err(e) => {
            c.push("rate_limit.policies", e.to_string());
            return None;
        }
    };
    let mut tables = p.tables;
    let provider = provider(p.draft.provider?, &mut tables)?;
    Some(EnabledSettings {
        provider,
        policies,
        failure_policy: p.draft.failure_policy,
        subject_secret: p.secret,
        subject_secret_file: p.secret_file,
        #[cfg(feature = "local")]
        local: tables.local?,
        #[cfg(feature = "redis")]
        breaker: tables.breaker?,
        #[cfg(feature = "redis")]
        fleet: tables.fleet?,
    })
}

/// The provider `name` names, with its table; `None` when it is not compiled in (refused
/// when read) or its table has problems (reported).
// Only the redis provider has a table to take.
#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
fn provider(name: ProviderName, tables: &mut Tables) -> Option<ProviderSettings> {
    match name {
        #[cfg(feature = "local")]
        ProviderName::Local => Some(ProviderSettings::Local),
        #[cfg(feature = "redis")]
        ProviderName::Redis => tables.redis.take().map(ProviderSettings::Redis),
        #[cfg(not(feature = "local"))]
        ProviderName::Local => None,
        #[cfg(not(feature = "redis"))]
        ProviderName::Redis => None,
    }
}

/// The subject secret: from `subject_secret_file` when it is set (the preferred form: it
/// wins, so a secret can move out of the configuration without editing it first), else the
/// inline `subject_secret`.
fn read_secret(c: &mut Check, draft: &Draft, base: Option<&Path>) -> Option<SubjectSecret> {
    const FILE: &str = "rate_limit.subject_secret_file";
    if let Some(path) = secret_path(draft, base) {
        let mut bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                c.push(FILE, format!("cannot read {}: {e}", path.display()));
                return None;
            }
        };
        // A trailing newline is an artefact of editors and `echo`, not key material.
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        return secret(c, FILE, bytes, SubjectSecret::FILE_SOURCE);
    }
    let inline = draft.inline_secret.clone()?;
    secret(
        c,
        "rate_limit.subject_secret",
        inline.into_bytes(),
        SubjectSecret::INLINE_SOURCE,
    )
}

/// `subject_secret_file`, a relative path resolved against `base` (the configuration
/// file's directory).
fn secret_path(draft: &Draft, base: Option<&Path>) -> Option<PathBuf> {
    let file = draft.secret_file.as_ref()?;
    Some(match base {
        Some(b) if Path::new(file).is_relative() => b.join(file),
        _ => PathBuf::from(file),
    })
}

fn secret(
    c: &mut Check,
    path: &str,
    bytes: Vec<u8>,
    source: &'static str,
) -> Option<SubjectSecret> {
    match SubjectSecret::new(bytes, source) {
        Ok(s) => Some(s),
        Err(e) => {
            c.push(path, e.to_string());
            None
        }
    }
}

pub(super) fn render(o: &mut Toml, s: &RateLimitSettings) {
    o.table(P);
    let e = match s {
        RateLimitSettings::Disabled => {
            o.line("enabled = false  # no connection, task or port is created");
            return;
        }
        RateLimitSettings::Enabled(e) => e,
    };
    render_keys(o, KEYS, e);
    #[cfg(feature = "redis")]
    if let Some(r) = e.provider.redis() {
        redis::render(o, r);
        render_section(o, BREAKER, BREAKER_KEYS, &e.breaker);
        render_section(o, FLEET, FLEET_KEYS, &e.fleet);
    }
    #[cfg(feature = "local")]
    render_section(o, LOCAL, LOCAL_KEYS, &e.local);
    policies::render(o, &e.policies);
}
