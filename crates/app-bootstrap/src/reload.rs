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
//! | secrets and TLS material: the subject secret (inline or its file's content), the credentials in `rate_limit.redis.url`, `sentinels` and `nodes`, `rate_limit.redis.password`, the content of `password_file` and of the `tls_*_file`s | refused as restart-only like the rest of `[rate_limit.redis]`, by key path, with a problem that says the secret changed and never shows it: the running connections keep the credentials and the TLS connector they were built with, so taking such a change would report what is not applied |
//!
//! **The revision rule.** A policy's stored state is kept under its id and revision and is
//! read under the parameters in force. So a policy that keeps its id and changes anything
//! that shapes its state or its decisions (algorithm, limits, window, `max_cost`,
//! `cleanup_grace`, `max_clock_regression`) must raise its `revision`: its state then starts
//! empty under the new revision. A revision never goes down (an older revision's state may
//! still be stored). `shadow`, `failure_policy` and `deny_cache` change no state and need no
//! new revision.
//! Policies may be added and removed; a policy removed and later added back should come back
//! with a revision above any it had.
//!
//! **Secrets.** The check compares the rendered settings, which redact every secret (a
//! password in a URL, the password, the subject secret) and show a file by its path only.
//! So every secret is also compared by value: the subject secret as it is, the Redis ones
//! (URL credentials, password, TLS files' content) by a digest taken when they were read. A
//! change that the rendering cannot see (a password alone, a file's content under the same
//! path) is refused by key path like any restart-only change, and neither value is shown or
//! logged.

use std::collections::BTreeMap;

#[cfg(feature = "redis")]
use crate::config::digest;
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
const STATELESS_POLICY_KEYS: &[&str] = &["revision", "shadow", "failure_policy", "deny_cache"];

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
    // The subject secret is compared by value (its `Eq`).
    if let (RateLimitSettings::Enabled(a), RateLimitSettings::Enabled(b)) =
        (&running.rate_limit, &next.rate_limit)
        && a.subject_secret != b.subject_secret
    {
        problems.push(Problem {
            path: "rate_limit.subject_secret".into(),
            problem:
                "cannot change on reload: the subject secret changed, and every subject digest would change with it (neither value is shown); restart to apply it"
                    .into(),
        });
    }
    #[cfg(feature = "redis")]
    redis_secrets(running, next, &mut problems);
    revisions(running, next, &old, &new, &mut problems);
    gates(&old, &new, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(problems))
    }
}

/// A secret as a key path, what its change is, and a digest of its value.
#[cfg(feature = "redis")]
type Secrets = BTreeMap<&'static str, (u64, &'static str)>;

/// The Redis secrets [`Settings::render`] redacts (or shows by path only: the TLS files),
/// compared by a digest of their value; a change is named by the key path the secret is
/// configured at (unless the rendering already named it). The subject secret is compared by
/// value in [`check`].
#[cfg(feature = "redis")]
fn redis_secrets(running: &Settings, next: &Settings, problems: &mut Vec<Problem>) {
    let (old, new) = (secrets(running), secrets(next));
    for (path, (was, why)) in &old {
        // A secret on one side only has moved (url, password, password_file): the rendering
        // shows that. On both sides, the digests tell a change the rendering redacts.
        let Some((now, _)) = new.get(path) else {
            continue;
        };
        if was != now && !problems.iter().any(|p| p.path == *path) {
            problems.push(Problem {
                path: (*path).to_owned(),
                problem: format!(
                    "cannot change on reload: {why} (neither value is shown); restart to apply it"
                ),
            });
        }
    }
}

/// The Redis secrets of `s` by key path (see [`redis_secrets`]).
#[cfg(feature = "redis")]
fn secrets(s: &Settings) -> Secrets {
    use adapter_redis::Topology;

    use crate::settings::PasswordSource;

    let mut out = Secrets::new();
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        return out;
    };
    let Some(r) = e.provider.redis() else {
        return out;
    };
    let urls = |urls: &[String]| digest(&urls.iter().map(String::as_bytes).collect::<Vec<_>>());
    match &r.redis.topology {
        Topology::Standalone => {
            let d = digest(&[r.redis.url.as_bytes()]);
            out.insert("rate_limit.redis.url", (d, "the credentials in it changed"));
        }
        Topology::Sentinel { sentinels, .. } => {
            let d = urls(sentinels);
            let why = "the credentials in a sentinel's URL changed";
            out.insert("rate_limit.redis.sentinels", (d, why));
        }
        Topology::Cluster { nodes } => {
            let d = urls(nodes);
            let why = "the credentials in a node's URL changed";
            out.insert("rate_limit.redis.nodes", (d, why));
        }
    }
    let password = r.redis.password.as_deref().unwrap_or_default().as_bytes();
    match &r.password_source {
        PasswordSource::Key => {
            let why = "the password changed";
            out.insert("rate_limit.redis.password", (digest(&[password]), why));
        }
        PasswordSource::File(_) => {
            let why = "the password in the file changed";
            out.insert("rate_limit.redis.password_file", (digest(&[password]), why));
        }
        PasswordSource::Url | PasswordSource::None => {}
    }
    for &(path, d) in &r.tls_file_digests {
        out.insert(path, (d, "the file's content changed"));
    }
    out
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
