//! `[[routes]]`: which requests the reference app's middleware limits, by path prefix, with
//! which policy (the default one when absent) and whose subject.

use figment::value::{Dict, Value};
use shared_contract::PolicyId;

use super::policies;
use super::reader::{Check, Toml, join, show};
use crate::settings::{RouteSettings, SubjectSource};

pub(super) const P: &str = "routes";

const KEYS: &[&str] = &["path_prefix", "policy", "subject"];

/// Every route, `None` when one has problems (reported). `policy_ids`: the policies a route
/// may name.
pub(super) fn read(
    c: &mut Check,
    v: Option<&Value>,
    policy_ids: &[PolicyId],
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
            && let Some(route) = read_route(c, &path, d, policy_ids)
        {
            out.push(route);
        }
    }
    (c.count() == before).then_some(out)
}

fn read_route(
    c: &mut Check,
    path: &str,
    d: &Dict,
    policy_ids: &[PolicyId],
) -> Option<RouteSettings> {
    c.unknown_keys(path, d, KEYS.iter().copied());
    let at = |key: &str| join(path, key);
    let prefix = c
        .required(
            &at("path_prefix"),
            d.get("path_prefix"),
            "required, e.g. \"/api\"",
        )
        .and_then(|v| {
            c.parsed(&at("path_prefix"), Some(v), |p| {
                RouteSettings::check_path_prefix(p).map(|()| p.to_owned())
            })
        });
    let policy = d.get("policy").and_then(|v| {
        let id = policies::read_id(c, &at("policy"), v)?;
        if policy_ids.contains(&id) {
            Some(id)
        } else {
            c.push(at("policy"), policies::undefined(&id, policy_ids));
            None
        }
    });
    let subject = c
        .required(
            &at("subject"),
            d.get("subject"),
            "required: \"header:NAME\" or \"ip\"",
        )
        .and_then(|v| c.parsed(&at("subject"), Some(v), SubjectSource::parse));
    Some(RouteSettings {
        path_prefix: prefix?,
        policy,
        subject: subject?,
    })
}

pub(super) fn render(o: &mut Toml, routes: &[RouteSettings]) {
    for r in routes {
        o.array_table("routes");
        o.str("path_prefix", &r.path_prefix);
        match &r.policy {
            Some(p) => o.str("policy", p.as_str()),
            None => o.line("# policy: the default policy"),
        }
        o.str("subject", &r.subject.to_string());
    }
}
