//! The rules of a configuration reload: which changes a running app may take without a
//! restart, and the revision rule for policies.
//!
//! A reload reads and validates the whole file again ([`crate::load`]); then [`check`]
//! compares it with the settings in force. Either every rule holds and the new settings go
//! into force as a whole, or nothing changes and every problem is named by its key path.
//!
//! | what | on reload |
//! | --- | --- |
//! | `rate_limit.policies.*`, `rate_limit.default_policy`, `rate_limit.failure_policy` | taken (the revision rule below) |
//! | `[[routes]]`, `[[rls.descriptors]]`, `grpc.unknown_descriptor`, `[reload]` | taken |
//! | `[event_gates.*]` | gates added and removed are taken; a gate that stays keeps its settings (they are stored with its events): change one by adding it under a new id |
//! | everything else (`[http]`, `[log]`, `grpc.bind`, `rate_limit.enabled`, `provider`, `[rate_limit.redis]`, `[rate_limit.local]`, `[rate_limit.circuit_breaker]`, the subject secret, `[otlp]`) | refused: these are bound to listeners, connections, stores and publishers that live as long as the process; restart to change them |
//!
//! **The revision rule.** A policy's stored state is kept under its id and revision and is
//! read under the parameters in force. So a policy that keeps its id and changes anything
//! that shapes its state or its decisions (algorithm, limits, window, `max_cost`,
//! `cleanup_grace`, `max_clock_regression`) must raise its `revision`: its state then starts
//! empty under the new revision. A revision never goes down (an older revision's state may
//! still be stored). `shadow` and `failure_policy` change no state and need no new revision.
//! Policies may be added and removed; a policy removed and later added back should come back
//! with a revision above any it had.
//!
//! Secrets are compared where the settings hold them (the subject secret); the Redis
//! credentials are read at start only (the rendered settings redact them), so a changed
//! password file takes effect on restart.

use std::collections::BTreeMap;

use crate::config::{ConfigErrors, Problem};
use crate::settings::{RateLimitSettings, Settings};

/// Key paths (and everything below them) a reload may change.
const RELOADABLE: &[&str] = &[
    "rate_limit.policies",
    "rate_limit.default_policy",
    "rate_limit.failure_policy",
    "routes",
    "rls",
    "grpc.unknown_descriptor",
    "reload",
    // Checked by `gates`.
    "event_gates",
];

/// Policy keys that change no stored state: no new revision needed.
const STATELESS_POLICY_KEYS: &[&str] = &["revision", "shadow", "failure_policy"];

/// Whether `next` may replace `running` in a running app.
///
/// # Errors
/// [`ConfigErrors`] naming every refused change by key path.
pub fn check(running: &Settings, next: &Settings) -> Result<(), ConfigErrors> {
    let old = flatten(&running.render());
    let new = flatten(&next.render());
    let mut problems = Vec::new();
    for (path, was, now) in differences(&old, &new) {
        if RELOADABLE.iter().any(|r| under(&path, r)) {
            continue;
        }
        problems.push(Problem {
            problem: format!(
                "cannot change on reload (in force: {}, in the file: {}); restart to apply it",
                shown(was),
                shown(now)
            ),
            path,
        });
    }
    if let (RateLimitSettings::Enabled(a), RateLimitSettings::Enabled(b)) =
        (&running.rate_limit, &next.rate_limit)
        && a.subject_secret != b.subject_secret
    {
        problems.push(Problem {
            path: "rate_limit.subject_secret".into(),
            problem:
                "cannot change on reload (every subject digest would change); restart to apply it"
                    .into(),
        });
    }
    revisions(running, next, &old, &new, &mut problems);
    gates(&old, &new, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(problems))
    }
}

/// Whether the event gates differ (then a reload builds them again).
pub fn gates_changed(running: &Settings, next: &Settings) -> bool {
    let section = |s: &Settings| {
        let mut flat = flatten(&s.render());
        flat.retain(|k, _| under(k, "event_gates"));
        flat
    };
    section(running) != section(next)
}

/// The gate rule: a gate may come and go, but a gate that stays keeps its settings (stored
/// with its events).
fn gates(old: &Flat, new: &Flat, problems: &mut Vec<Problem>) {
    let changed: Vec<(String, Option<&str>, Option<&str>)> = differences(old, new)
        .into_iter()
        .filter(|(path, _, _)| under(path, "event_gates"))
        .collect();
    let gate_of = |path: &str| path.split('.').nth(1).map(str::to_owned);
    let kept = |flat: &Flat, gate: &str| flat.keys().any(|k| gate_of(k).as_deref() == Some(gate));
    for (path, was, now) in changed {
        let Some(gate) = gate_of(&path) else { continue };
        if kept(old, &gate) && kept(new, &gate) {
            problems.push(Problem {
                problem: format!(
                    "a gate's settings are stored with its events and cannot change (in force: {}, in the file: {}); add the gate under a new id instead",
                    shown(was),
                    shown(now)
                ),
                path,
            });
        }
    }
}

/// The revision rule for every policy that both settings define.
fn revisions(
    running: &Settings,
    next: &Settings,
    old: &Flat,
    new: &Flat,
    problems: &mut Vec<Problem>,
) {
    let (RateLimitSettings::Enabled(a), RateLimitSettings::Enabled(b)) =
        (&running.rate_limit, &next.rate_limit)
    else {
        return;
    };
    for was in a.policies.iter() {
        let Some(now) = b.policies.get(was.id()) else {
            continue;
        };
        let at = format!("rate_limit.policies.{}", was.id());
        let path = format!("{at}.revision");
        let (r0, r1) = (was.revision().get(), now.revision().get());
        if r1 < r0 {
            problems.push(Problem {
                path,
                problem: format!(
                    "went down from {r0} to {r1}: a revision only grows (state of revision {r1} may still be stored)"
                ),
            });
            continue;
        }
        if r1 > r0 {
            continue;
        }
        let changed: Vec<String> = differences(&policy_keys(old, &at), &policy_keys(new, &at))
            .into_iter()
            .map(|(key, _, _)| key)
            .collect();
        if !changed.is_empty() {
            problems.push(Problem {
                path,
                problem: format!(
                    "the policy changed ({}) but its revision did not: set revision = {} or more, or keep the policy as it is",
                    changed.join(", "),
                    r0.saturating_add(1)
                ),
            });
        }
    }
}

/// Rendered settings as key path -> value (TOML text of a leaf or an array).
type Flat = BTreeMap<String, String>;

fn flatten(rendered: &str) -> Flat {
    let mut flat = Flat::new();
    // The rendering is this crate's own TOML; a failure to read it back would be a bug, and
    // then every path compares as absent on both sides.
    if let Ok(table) = rendered.parse::<toml::Table>() {
        walk("", &table, &mut flat);
    }
    flat
}

fn walk(prefix: &str, table: &toml::Table, flat: &mut Flat) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(t) => walk(&path, t, flat),
            other => {
                flat.insert(path, other.to_string());
            }
        }
    }
}

/// The keys of one policy (relative to it) that shape its state.
fn policy_keys(flat: &Flat, at: &str) -> Flat {
    let prefix = format!("{at}.");
    flat.iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix(&prefix)?;
            (!STATELESS_POLICY_KEYS.contains(&key)).then(|| (key.to_owned(), v.clone()))
        })
        .collect()
}

/// Every path whose value differs (or that one side lacks), in path order.
fn differences<'a>(
    old: &'a Flat,
    new: &'a Flat,
) -> Vec<(String, Option<&'a str>, Option<&'a str>)> {
    let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| {
            let (a, b) = (
                old.get(p).map(String::as_str),
                new.get(p).map(String::as_str),
            );
            (a != b).then(|| (p.clone(), a, b))
        })
        .collect()
}

fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

fn shown(value: Option<&str>) -> String {
    match value {
        Some(v) if v.chars().count() > 80 => {
            format!("{}...", v.chars().take(77).collect::<String>())
        }
        Some(v) => v.to_owned(),
        None => "absent".to_owned(),
    }
}

// The fixtures use the local provider.
#[cfg(all(test, feature = "local"))]
mod tests;
