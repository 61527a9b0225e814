//! `[grpc]` (the Envoy rate-limit service's listener) and `[[rls.descriptors]]` (which policy
//! limits a gateway's descriptor, and whose values are its subject).

use std::net::SocketAddr;

use edge_middleware::descriptors::{
    DescriptorError, DescriptorRule, DescriptorRules, EntryMatcher, UnknownDescriptor,
};
use figment::value::{Dict, Value};
use shared_contract::PolicyId;

use super::policies;
use super::reader::{
    Check, Key, Toml, array_of_tables, join, key, read_keys, render_section, show, toml_str,
};
use crate::settings::{GrpcSettings, RateLimitSettings};

pub(super) const P: &str = "grpc";
pub(super) const RLS: &str = "rls";

const KEYS: &[Key<GrpcSettings>] = &[
    Key {
        name: "bind",
        read: |c, path, v, s| {
            s.bind = c.parsed(path, Some(v), |a| {
                a.parse::<SocketAddr>()
                    .map_err(|_| format!("{a:?} is not an address such as \"127.0.0.1:8081\""))
            });
        },
        render: |s, o| match s.bind {
            Some(a) => o.str("bind", &a.to_string()),
            None => o.line("# bind: absent, no gRPC server"),
        },
    },
    Key {
        name: "unknown_descriptor",
        read: |c, path, v, s| {
            if let Some(u) = c.choice(
                path,
                Some(v),
                UnknownDescriptor::parse,
                "an unknown-descriptor answer",
                "\"allow\" or \"deny\"",
            ) {
                s.unknown_descriptor = u;
            }
        },
        render: |s, o| o.str("unknown_descriptor", s.unknown_descriptor.as_str()),
    },
    key!("max_connections", max_connections),
    key!("handshake_timeout", handshake_timeout),
    key!("idle_timeout", idle_timeout),
    key!("keepalive_interval", keepalive_interval),
    key!("keepalive_timeout", keepalive_timeout),
    key!("max_concurrent_streams", max_concurrent_streams),
    key!("max_message_bytes", max_message_bytes),
];

const RULE_KEYS: &[&str] = &["domain", "entries", "policy", "charge"];

/// `[grpc]`; `None` when it has problems (reported). `http_bind`: the HTTP listener's address,
/// which the gRPC one may not share; `enabled`: whether rate limiting is on (a server without
/// a limiter to ask is refused).
pub(super) fn read(
    c: &mut Check,
    v: Option<&Value>,
    http_bind: Option<SocketAddr>,
    enabled: bool,
) -> Option<GrpcSettings> {
    let d = c.section(P, v)?;
    let before = c.count();
    let mut s = GrpcSettings::default();
    read_keys(c, P, d, KEYS, &mut s);
    c.owned(P, s.validate());
    if let Some(bind) = s.bind {
        if http_bind == Some(bind) && bind.port() != 0 {
            c.push(
                join(P, "bind"),
                format!("{bind} is already http.bind; give the gRPC server its own port"),
            );
        }
        if !enabled {
            c.push(
                join(P, "bind"),
                "a gRPC server needs rate limiting: set rate_limit.enabled = true, or remove grpc.bind",
            );
        }
    }
    (c.count() == before).then_some(s)
}

/// `[rls]` and its `[[rls.descriptors]]`; `None` when one has problems (reported).
/// `rate_limit`: the policies a rule may name (a concurrency policy is refused: a descriptor
/// is one rate evaluation).
pub(super) fn read_rules(
    c: &mut Check,
    v: Option<&Value>,
    rate_limit: &super::rate_limit::RateLimit,
) -> Option<DescriptorRules> {
    let policy_ids = &rate_limit.policy_ids[..];
    let d = c.section(RLS, v)?;
    c.unknown_keys(RLS, d, ["descriptors"].into_iter());
    let path = join(RLS, "descriptors");
    let rules = array_of_tables(c, &path, d.get("descriptors"), |c, at, d| {
        let rule = read_rule(c, at, d, policy_ids)?;
        let rule = read_charge(c, at, d, rule, rate_limit)?;
        if rate_limit.concurrency_ids.contains(rule.policy()) {
            c.push(
                join(at, "policy"),
                format!(
                    "{} is a concurrency policy; a descriptor is a rate evaluation",
                    rule.policy()
                ),
            );
            return None;
        }
        Some(rule)
    })?;
    match DescriptorRules::new(rules) {
        Ok(rules) => Some(rules),
        Err(e) => {
            let at = match &e {
                DescriptorError::Duplicate { index, .. } => format!("{path}[{index}]"),
                _ => path,
            };
            c.push(at, e.to_string());
            None
        }
    }
}

/// `charge`: `"on_request"` (the default) or `"after"`, costs known after the work
/// (Envoy's stream-done call): on a policy that takes reservations (either provider).
fn read_charge(
    c: &mut Check,
    path: &str,
    d: &Dict,
    rule: DescriptorRule,
    rate_limit: &super::rate_limit::RateLimit,
) -> Option<DescriptorRule> {
    let at = join(path, "charge");
    let after = match d.get("charge") {
        None => false,
        Some(Value::String(_, s)) if s == "on_request" => false,
        Some(Value::String(_, s)) if s == "after" => true,
        Some(v) => {
            c.push(
                at,
                format!("must be \"on_request\" or \"after\", got {}", show(v)),
            );
            return None;
        }
    };
    if !after {
        return Some(rule);
    }
    let kind = match &rate_limit.settings {
        Some(RateLimitSettings::Enabled(e)) => e.policies.get(rule.policy()).map(|p| p.kind()),
        _ => None,
    };
    if let Some(kind) = kind.filter(|k| !k.takes_reservations()) {
        c.push(
            at,
            format!(
                "\"after\" needs a policy that takes reservations; {} is a {kind} policy",
                rule.policy()
            ),
        );
        return None;
    }
    Some(rule.charging_after())
}

fn read_rule(
    c: &mut Check,
    path: &str,
    d: &Dict,
    policy_ids: &[PolicyId],
) -> Option<DescriptorRule> {
    c.unknown_keys(path, d, RULE_KEYS.iter().copied());
    let at = |key: &str| join(path, key);
    let domain = c
        .required(&at("domain"), d.get("domain"), "required, e.g. \"edge\"")
        .and_then(|v| c.string(&at("domain"), Some(v)));
    let entries = c
        .required(
            &at("entries"),
            d.get("entries"),
            "required: the descriptor's keys in order, e.g. [\"remote_address\"]",
        )
        .and_then(|v| read_entries(c, &at("entries"), v));
    let policy = c
        .required(&at("policy"), d.get("policy"), "required: a policy id")
        .and_then(|v| policies::read_ref(c, &at("policy"), v, policy_ids));
    let (domain, entries, policy) = (domain?, entries?, policy?);
    match DescriptorRule::new(domain, entries, policy) {
        Ok(rule) => Some(rule),
        Err(e) => {
            let key = match e {
                DescriptorError::EmptyDomain => "domain",
                _ => "entries",
            };
            c.push(at(key), e.to_string());
            None
        }
    }
}

fn read_entries(c: &mut Check, path: &str, v: &Value) -> Option<Vec<EntryMatcher>> {
    let Value::Array(_, items) = v else {
        c.push(
            path,
            format!("must be an array of strings, got {}", show(v)),
        );
        return None;
    };
    let before = c.count();
    let mut out = Vec::with_capacity(items.len());
    for (j, item) in items.iter().enumerate() {
        let at = format!("{path}[{j}]");
        if let Some(e) = c.parsed(&at, Some(item), EntryMatcher::parse) {
            out.push(e);
        }
    }
    (c.count() == before).then_some(out)
}

pub(super) fn render(o: &mut Toml, grpc: &GrpcSettings, rules: &DescriptorRules) {
    render_section(o, P, KEYS, grpc);
    for r in rules.iter() {
        o.array_table("rls.descriptors");
        o.str("domain", r.domain());
        let entries: Vec<String> = r
            .entries()
            .iter()
            .map(|e| toml_str(&e.to_string()))
            .collect();
        o.raw("entries", format_args!("[{}]", entries.join(", ")));
        o.str("policy", r.policy().as_str());
        o.str(
            "charge",
            if r.charges_after() {
                "after"
            } else {
                "on_request"
            },
        );
    }
}
