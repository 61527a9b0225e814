//! `[rate_limit.redis]`: the Redis provider's settings ([`RedisSettings`]), plus the two
//! things only the configuration knows: the `role` acknowledgement and which keys each
//! topology takes.
//!
//! Every key is described once in [`KEYS`]: how it is read (into [`RedisSettings::new`]'s
//! defaults, or into the draft for the keys that only make sense together: the topology's
//! and the password's) and how `--check` shows it.

use std::path::PathBuf;
use std::time::Duration;

use adapter_redis::{RedisSettings, Topology};
use figment::value::{Dict, Value};

use super::reader::{Check, Key, Toml, join, key, read_keys, render_section};
use crate::settings::RedisProviderSettings;

const P: &str = "rate_limit.redis";

/// The topologies `rate_limit.redis.topology` names (the enum [`Topology`] holds each one's
/// addresses; this is only the name, read before the addresses are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyName {
    Standalone,
    Sentinel,
    Cluster,
}

impl TopologyName {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "standalone" => Some(Self::Standalone),
            "sentinel" => Some(Self::Sentinel),
            "cluster" => Some(Self::Cluster),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Sentinel => "sentinel",
            Self::Cluster => "cluster",
        }
    }
}

/// The section as read: the provider's settings over their defaults, and the keys that only
/// make sense together, kept apart until [`finish`] puts them in place.
struct Draft {
    settings: RedisSettings,
    role: Option<String>,
    /// `None`: unreadable (reported).
    topology: Option<TopologyName>,
    url: Option<String>,
    master_name: Option<String>,
    sentinels: Option<Vec<String>>,
    nodes: Option<Vec<String>>,
    password: Option<String>,
    password_file: Option<String>,
}

/// Renders nothing: a key `--check` does not show.
fn hidden(_: &RedisSettings, _: &mut Toml) {}

/// Every key of `[rate_limit.redis]`, in the order `--check` shows them.
const KEYS: &[Key<Draft, RedisSettings>] = &[
    Key {
        name: "role",
        read: |c, path, v, d| d.role = c.string(path, Some(v)),
        render: |_, o| o.str("role", "coordination"),
    },
    Key {
        name: "topology",
        read: |c, path, v, d| {
            let choices = "\"standalone\", \"sentinel\" or \"cluster\"";
            let name = c.choice(path, Some(v), TopologyName::parse, "a topology", choices);
            // A value that is not even a string (reported) keeps the default, so the
            // standalone keys are still checked; a string that names no topology leaves none.
            if name.is_some() || matches!(v, Value::String(..)) {
                d.topology = name;
            }
        },
        render: |s, o| o.str("topology", s.topology.as_str()),
    },
    Key {
        name: "url",
        // It may hold a password: never shown, not even when it is wrong.
        read: |c, path, v, d| d.url = c.secret(path, Some(v)),
        render: |s, o| {
            if s.topology == Topology::Standalone {
                o.str("url", &redact_url(&s.url));
            }
        },
    },
    Key {
        name: "master_name",
        read: |c, path, v, d| d.master_name = c.string(path, Some(v)),
        render: |s, o| {
            if let Topology::Sentinel { master_name, .. } = &s.topology {
                o.str("master_name", master_name);
            }
        },
    },
    Key {
        name: "sentinels",
        read: |c, path, v, d| d.sentinels = url_list(c, path, v),
        render: |s, o| {
            if let Topology::Sentinel { sentinels, .. } = &s.topology {
                o.raw("sentinels", urls(sentinels));
            }
        },
    },
    Key {
        name: "nodes",
        read: |c, path, v, d| d.nodes = url_list(c, path, v),
        render: |s, o| {
            if let Topology::Cluster { nodes } = &s.topology {
                o.raw("nodes", urls(nodes));
            }
        },
    },
    key!("min_replicas_ack", settings.min_replicas_ack; min_replicas_ack),
    key!("command_timeout", settings.command_timeout; command_timeout),
    key!("max_in_flight", settings.max_in_flight; max_in_flight),
    key!("key_prefix", settings.key_prefix; key_prefix),
    key!("connect_timeout", settings.connect_timeout; connect_timeout),
    key!("connections", settings.connections; connections),
    key!("retry_after", settings.retry_after; retry_after),
    Key {
        name: "username",
        read: |c, path, v, d| d.settings.username = c.string(path, Some(v)),
        render: hidden,
    },
    Key {
        name: "password",
        read: |c, path, v, d| d.password = c.secret(path, Some(v)),
        render: hidden,
    },
    Key {
        name: "password_file",
        read: |c, path, v, d| d.password_file = c.string(path, Some(v)),
        render: hidden,
    },
    Key {
        name: "tls_ca_file",
        read: |c, path, v, d| d.settings.tls.ca_file = c.string(path, Some(v)).map(PathBuf::from),
        render: hidden,
    },
    Key {
        name: "tls_cert_file",
        read: |c, path, v, d| {
            d.settings.tls.cert_file = c.string(path, Some(v)).map(PathBuf::from);
        },
        render: hidden,
    },
    Key {
        name: "tls_key_file",
        read: |c, path, v, d| {
            d.settings.tls.key_file = c.string(path, Some(v)).map(PathBuf::from);
        },
        render: hidden,
    },
    Key {
        name: "strict_eviction_policy",
        read: |c, path, v, d| {
            if let Some(b) = c.bool(path, Some(v)) {
                d.settings.strict_eviction_policy = b;
            }
        },
        render: hidden,
    },
];

/// The section; `required`: rate limiting is enabled with the redis provider, so the keys
/// that need are required. `None` when it has problems (reported).
pub(super) fn read(
    c: &mut Check,
    v: Option<&Value>,
    required: bool,
) -> Option<RedisProviderSettings> {
    let d = c.section(P, v)?;
    let before = c.count();
    let mut draft = Draft {
        settings: RedisSettings::new(""),
        role: None,
        topology: Some(TopologyName::Standalone),
        url: None,
        master_name: None,
        sentinels: None,
        nodes: None,
        password: None,
        password_file: None,
    };
    read_keys(c, P, d, KEYS, &mut draft);
    let redis = finish(c, d, draft, required);
    redis
        .filter(|_| c.count() == before)
        .map(|redis| RedisProviderSettings { redis })
}

/// The role, the topology with its keys, the password, then the settings' own rules.
fn finish(c: &mut Check, d: &Dict, mut draft: Draft, required: bool) -> Option<RedisSettings> {
    check_role(
        c,
        draft.role.as_deref(),
        required && !d.contains_key("role"),
    );
    let topology = topology(c, &mut draft, required);
    draft.settings.password = match &draft.password_file {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(s) => Some(s.trim_end_matches(['\n', '\r']).to_owned()),
            Err(e) => {
                c.push(join(P, "password_file"), format!("cannot read {f}: {e}"));
                None
            }
        },
        None => draft.password.take(),
    };
    let mut settings = draft.settings;
    rules(c, &settings);
    settings.topology = topology?;
    Some(settings)
}

fn check_role(c: &mut Check, role: Option<&str>, missing: bool) {
    let path = join(P, "role");
    match role {
        Some("coordination") => {}
        Some(r) => c.push(
            path,
            format!("{r:?} is not accepted; the only accepted role is \"coordination\" (a Redis dedicated to rate-limit state, never an application cache)"),
        ),
        None if missing => c.push(
            path,
            "required when provider = \"redis\"; set role = \"coordination\"",
        ),
        None => {}
    }
}

/// The topology named, with its addresses; each topology takes its own keys, and a key of
/// another is a mistake worth naming.
fn topology(c: &mut Check, d: &mut Draft, required: bool) -> Option<Topology> {
    let name = d.topology?;
    let given = [
        ("url", d.url.is_some()),
        ("master_name", d.master_name.is_some()),
        ("sentinels", d.sentinels.is_some()),
        ("nodes", d.nodes.is_some()),
    ];
    let takes: &[&str] = match name {
        TopologyName::Standalone => &["url"],
        TopologyName::Sentinel => &["master_name", "sentinels"],
        TopologyName::Cluster => &["nodes"],
    };
    for (key, _) in given.iter().filter(|(k, g)| *g && !takes.contains(k)) {
        c.push(
            join(P, key),
            format!("not used with topology = \"{}\"", name.as_str()),
        );
    }
    // A URL is checked wherever it is given, like every key that is present.
    d.settings.url = d
        .url
        .clone()
        .and_then(|u| check_url(c, &join(P, "url"), u))
        .unwrap_or_default();
    match name {
        TopologyName::Standalone => {
            if d.url.is_none() && required {
                c.push(join(P, "url"), "required when provider = \"redis\"");
            }
            Some(Topology::Standalone)
        }
        TopologyName::Sentinel => {
            if d.master_name.as_deref().is_none_or(str::is_empty) {
                c.push(
                    join(P, "master_name"),
                    "required with topology = \"sentinel\" (the name the sentinels monitor)",
                );
            }
            if d.sentinels.is_none() {
                c.push(
                    join(P, "sentinels"),
                    "required with topology = \"sentinel\": the sentinels' URLs",
                );
            }
            Some(Topology::Sentinel {
                master_name: d.master_name.take().unwrap_or_default(),
                sentinels: d.sentinels.take().unwrap_or_default(),
            })
        }
        TopologyName::Cluster => {
            if d.nodes.is_none() {
                c.push(
                    join(P, "nodes"),
                    "required with topology = \"cluster\": seed node URLs",
                );
            }
            Some(Topology::Cluster {
                nodes: d.nodes.take().unwrap_or_default(),
            })
        }
    }
}

/// The bounds of the provider's settings.
fn rules(c: &mut Check, s: &RedisSettings) {
    let at = |key: &str| join(P, key);
    if s.min_replicas_ack > RedisSettings::MAX_REPLICAS_ACK {
        c.push(
            at("min_replicas_ack"),
            format!(
                "must be between 0 and {}, got {}",
                RedisSettings::MAX_REPLICAS_ACK,
                s.min_replicas_ack
            ),
        );
    }
    // The edge gives each evaluation a deadline of command_timeout plus a margin, and a
    // deadline is at most a minute: so the timeout must leave room for the margin.
    let max_timeout = shared_contract::Deadline::MAX_BUDGET - Duration::from_secs(1);
    if s.command_timeout.is_zero() {
        c.push(at("command_timeout"), "must be > 0, got \"0s\"");
    } else if s.command_timeout > max_timeout {
        c.push(
            at("command_timeout"),
            format!("must be <= {max_timeout:?}, got {:?}", s.command_timeout),
        );
    }
    if s.connect_timeout.is_zero() {
        c.push(at("connect_timeout"), "must be > 0, got \"0s\"");
    }
    for (key, n, max) in [
        (
            "max_in_flight",
            s.max_in_flight,
            RedisSettings::MAX_IN_FLIGHT,
        ),
        ("connections", s.connections, RedisSettings::MAX_CONNECTIONS),
    ] {
        if !(1..=max).contains(&n) {
            c.push(at(key), format!("must be between 1 and {max}, got {n}"));
        }
    }
    if adapter_redis::keys::check_prefix(&s.key_prefix).is_err() {
        c.push(
            at("key_prefix"),
            format!(
                "must be 1..=32 characters of [A-Za-z0-9_.-], got {:?}",
                s.key_prefix.chars().take(40).collect::<String>()
            ),
        );
    }
}

/// A list of Redis URLs (`nodes`, `sentinels`): a TOML array of strings, or one string of
/// comma-separated URLs (handy in environment variables). Each is checked like `url`, by its
/// index (`nodes[1]`); values are never shown (they may hold passwords).
fn url_list(c: &mut Check, path: &str, v: &Value) -> Option<Vec<String>> {
    let items: Vec<String> = match v {
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
    if !matches!(scheme, Some("redis" | "rediss")) {
        c.push(
            path,
            "must be a URL such as \"redis://127.0.0.1:6379/0\" (value not shown: it may hold a password)",
        );
        return None;
    }
    if !url_parses(&url) {
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
fn url_parses(url: &str) -> bool {
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

/// `[rate_limit.redis]` with every shown key.
pub(super) fn render(o: &mut Toml, s: &RedisSettings) {
    render_section(o, P, KEYS, s);
}

/// URLs as a TOML array, each with its password replaced.
fn urls(urls: &[String]) -> String {
    let shown: Vec<String> = urls
        .iter()
        .map(|u| super::reader::toml_str(&redact_url(u)))
        .collect();
    format!("[{}]", shown.join(", "))
}

/// Shows a Redis URL with its password replaced (the user name stays: it is not a secret,
/// and it tells which ACL user the limiter logs in as).
fn redact_url(url: &str) -> String {
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
