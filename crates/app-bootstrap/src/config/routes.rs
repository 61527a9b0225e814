//! `[[routes]]`: which requests the reference app's middleware limits (by method, path
//! prefix, host and header conditions, all of which must hold), with which policy (the
//! default one when absent), whose subject (one part or a list of parts) and at what cost
//! (a whole number or `"header:NAME"`, within the policy's `max_cost`).
//!
//! The routes matching one request are one all-or-nothing evaluation of at most
//! [`MAX_LIMITS`] limits, so a set of routes where one request could match more is refused
//! here (at `routes`, naming them), rather than answered 500 at run time.

use figment::value::{Dict, Value};
use shared_contract::{Cost, MAX_LIMITS, MIN_COUNT, PolicyId};

use super::policies;
use super::rate_limit::RateLimit;
use super::reader::{Check, Toml, join, show, toml_str};
use crate::settings::{CostSource, HeaderCondition, RouteSettings, SubjectSource};

pub(super) const P: &str = "routes";

const KEYS: &[&str] = &[
    "path_prefix",
    "policy",
    "subject",
    "method",
    "host",
    "header",
    "cost",
    "shadow",
];

/// Every route, `None` when one has problems (reported). `rate_limit`: the policies a route
/// may name, their `max_cost`, the default policy.
pub(super) fn read(
    c: &mut Check,
    v: Option<&Value>,
    rate_limit: &RateLimit,
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
    let before = c.count();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("routes[{i}]");
        if let Some(d) = c.table(&path, Some(item))
            && let Some(route) = read_route(c, &path, d, rate_limit)
        {
            out.push(route);
        }
    }
    if c.count() != before {
        return None;
    }
    check_overlap(c, &out, rate_limit.default_policy.as_ref())?;
    Some(out)
}

/// Refuses routes of which more than [`MAX_LIMITS`] can match one request.
fn check_overlap(
    c: &mut Check,
    routes: &[RouteSettings],
    default: Option<&PolicyId>,
) -> Option<()> {
    if routes.len() <= MAX_LIMITS {
        return Some(());
    }
    // Without a default policy (rate limiting disabled) any id stands in: matching does not
    // depend on it.
    let fallback = PolicyId::new("default").ok()?;
    let default = default.unwrap_or(&fallback);
    let rules: Vec<_> = routes.iter().map(|r| r.rule(default)).collect();
    let group = edge_middleware::most_overlapping(&rules);
    if group.len() <= MAX_LIMITS {
        return Some(());
    }
    let named = group
        .iter()
        .map(|i| format!("routes[{i}]"))
        .collect::<Vec<_>>()
        .join(", ");
    c.push(
        P,
        format!(
            "{} routes can match one request ({named}); the routes matching a request are one evaluation of at most {MAX_LIMITS} limits: narrow them by method, path_prefix, host or header",
            group.len()
        ),
    );
    None
}

/// A string, or an array of strings (`method = "GET"`, `method = ["GET", "POST"]`), each
/// parsed by `parse`; items are named `key[i]`. `None` when any is refused (reported).
fn one_or_many<T, E: std::fmt::Display>(
    c: &mut Check,
    path: &str,
    v: &Value,
    mut parse: impl FnMut(&str) -> Result<T, E>,
) -> Option<Vec<T>> {
    match v {
        Value::Array(_, items) if items.is_empty() => {
            c.push(path, "must not be an empty list");
            None
        }
        Value::Array(_, items) => {
            let before = c.count();
            let out: Vec<T> = items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| c.parsed(&format!("{path}[{i}]"), Some(item), &mut parse))
                .collect();
            (c.count() == before).then_some(out)
        }
        one => c.parsed(path, Some(one), parse).map(|t| vec![t]),
    }
}

fn read_route(
    c: &mut Check,
    path: &str,
    d: &Dict,
    rate_limit: &RateLimit,
) -> Option<RouteSettings> {
    c.unknown_keys(path, d, KEYS.iter().copied());
    let at = |key: &str| join(path, key);
    let before = c.count();
    let methods = d.get("method").and_then(|v| {
        one_or_many(c, &at("method"), v, |m| {
            edge_middleware::parse_method(m).map(|m| m.to_string())
        })
    });
    let host = d.get("host").and_then(|v| {
        c.parsed(&at("host"), Some(v), |h| {
            RouteSettings::check_host(h).map(|()| h.to_ascii_lowercase())
        })
    });
    let header = d
        .get("header")
        .and_then(|v| one_or_many(c, &at("header"), v, HeaderCondition::parse));
    let other_condition = ["method", "host", "header"]
        .iter()
        .any(|k| d.contains_key(*k));
    let prefix = match d.get("path_prefix") {
        None if other_condition => Some("/".to_owned()),
        v => c
            .required(
                &at("path_prefix"),
                v,
                "required (unless method, host or header is given), e.g. \"/api\"",
            )
            .and_then(|v| {
                c.parsed(&at("path_prefix"), Some(v), |p| {
                    RouteSettings::check_path_prefix(p).map(|()| p.to_owned())
                })
            }),
    };
    let policy = d.get("policy").and_then(|v| {
        let id = policies::read_id(c, &at("policy"), v)?;
        if rate_limit.policy_ids.contains(&id) {
            Some(id)
        } else {
            c.push(
                at("policy"),
                policies::undefined(&id, &rate_limit.policy_ids),
            );
            None
        }
    });
    let subject = read_subject(c, &at("subject"), d.get("subject"));
    let effective = policy.as_ref().or(rate_limit.default_policy.as_ref());
    let max_cost = effective.and_then(|id| {
        rate_limit
            .max_costs
            .iter()
            .find_map(|(p, m)| (p == id).then_some(*m))
    });
    let cost = match d.get("cost") {
        None => Some(CostSource::Fixed(Cost::ONE)),
        Some(v) => read_cost(c, &at("cost"), v, effective, max_cost),
    };
    let shadow = c.bool(&at("shadow"), d.get("shadow")).unwrap_or(false);
    // A route of a concurrency policy holds one lease per request: a cost or shadow mode
    // would be silently ignored, so they are refused.
    if let Some(id) = effective.filter(|id| rate_limit.concurrency_ids.contains(id)) {
        if matches!(cost, Some(CostSource::Header(_))) {
            c.push(
                at("cost"),
                format!("does not apply to concurrency policy {id}: a request holds one lease"),
            );
        }
        if shadow {
            c.push(
                at("shadow"),
                format!(
                    "does not apply to concurrency policy {id}: a lease is never in shadow mode"
                ),
            );
        }
    }
    if c.count() != before {
        return None;
    }
    Some(RouteSettings {
        path_prefix: prefix?,
        policy,
        subject: subject?,
        methods: methods.unwrap_or_default(),
        host,
        header: header.unwrap_or_default(),
        cost: cost?,
        shadow,
    })
}

fn read_subject(c: &mut Check, path: &str, v: Option<&Value>) -> Option<Vec<SubjectSource>> {
    let v = c.required(
        path,
        v,
        "required: \"header:NAME\", \"ip\", \"path:INDEX\", \"const:TEXT\", or a list of them",
    )?;
    let parts = one_or_many(c, path, v, SubjectSource::parse)?;
    if parts.len() > RouteSettings::MAX_SUBJECT_PARTS {
        c.push(
            path,
            format!(
                "at most {} parts, got {}",
                RouteSettings::MAX_SUBJECT_PARTS,
                parts.len()
            ),
        );
        return None;
    }
    Some(parts)
}

/// `cost`: a whole number 1..=`max_cost` of the route's policy, or `"header:NAME"`.
fn read_cost(
    c: &mut Check,
    path: &str,
    v: &Value,
    policy: Option<&PolicyId>,
    max_cost: Option<u64>,
) -> Option<CostSource> {
    if let Value::String(..) = v {
        return c.parsed(path, Some(v), CostSource::parse_header);
    }
    let n = c.whole_at_least::<u64>(path, Some(v), MIN_COUNT)?;
    let cost = match Cost::new(n) {
        Ok(cost) => cost,
        Err(_) if n < MIN_COUNT => {
            c.push(path, format!("must be >= {MIN_COUNT}, got {n}"));
            return None;
        }
        Err(e) => {
            c.push(path, e.to_string());
            return None;
        }
    };
    match (policy, max_cost) {
        (Some(p), Some(max)) if n > max => {
            c.push(
                path,
                format!(
                    "{n} is above max_cost {max} of policy {p}; raise max_cost or lower the cost"
                ),
            );
            None
        }
        _ => Some(CostSource::Fixed(cost)),
    }
}

fn list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.map(|s| toml_str(&s)).collect();
    format!("[{}]", items.join(", "))
}

pub(super) fn render(o: &mut Toml, routes: &[RouteSettings]) {
    for r in routes {
        o.array_table("routes");
        o.str("path_prefix", &r.path_prefix);
        if !r.methods.is_empty() {
            o.raw("method", list(r.methods.iter().cloned()));
        }
        if let Some(h) = &r.host {
            o.str("host", h);
        }
        if !r.header.is_empty() {
            o.raw("header", list(r.header.iter().map(ToString::to_string)));
        }
        match &r.policy {
            Some(p) => o.str("policy", p.as_str()),
            None => o.line("# policy: the default policy"),
        }
        match r.subject.as_slice() {
            [one] => o.str("subject", &one.to_string()),
            parts => o.raw("subject", list(parts.iter().map(ToString::to_string))),
        }
        match &r.cost {
            CostSource::Fixed(n) => o.raw("cost", n.get()),
            header => o.str("cost", &header.to_string()),
        }
        if r.shadow {
            o.raw("shadow", true);
        }
    }
}
