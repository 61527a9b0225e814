//! `[rate_limit.redis]`: the Redis provider's settings ([`RedisSettings`]), plus the two
//! things only the configuration knows: the `role` acknowledgement and which keys each
//! topology takes.
//!
//! Every key is described once in [`KEYS`]: how it is read (into [`RedisSettings::new`]'s
//! defaults, or into the draft for the keys that only make sense together: the topology's
//! and the password's) and how `--check` shows it. Every rule about the values (bounds, URL
//! syntax and schemes, how many nodes, credentials, TLS files) is
//! [`RedisSettings::validate`]'s; its problems, named by key (`nodes[1]`), are put under
//! `rate_limit.redis` by [`owner_problems`].

use std::path::PathBuf;

use adapter_redis::{RedisSettings, SettingsProblem, Topology};
use figment::value::{Dict, Value};

use super::reader::{Check, Key, Toml, join, key, read_keys, render_section, toml_str};
use crate::settings::{PasswordSource, RedisProviderSettings};

const P: &str = super::REDIS;

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
    master_name: Option<String>,
    sentinels: Option<Vec<String>>,
    nodes: Option<Vec<String>>,
    password: Option<String>,
    password_file: Option<String>,
}

/// An optional file path, or a comment saying there is none.
fn file(o: &mut Toml, key: &str, f: Option<&PathBuf>) {
    match f {
        Some(f) => o.str(key, &f.display().to_string()),
        None => o.line(format_args!("# {key}: none")),
    }
}

/// Every key of `[rate_limit.redis]`, in the order `--check` shows them (every one is shown;
/// a secret as `<redacted>` with where it came from).
const KEYS: &[Key<Draft, RedisProviderSettings>] = &[
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
        render: |s, o| o.str("topology", s.redis.topology.as_str()),
    },
    Key {
        name: "url",
        // It may hold a password: never shown, not even when it is wrong.
        read: |c, path, v, d| {
            if let Some(url) = c.secret(path, Some(v)) {
                d.settings.url = url;
            }
        },
        render: |s, o| {
            if s.redis.topology == Topology::Standalone {
                o.str("url", &redact_url(&s.redis.url));
            }
        },
    },
    Key {
        name: "master_name",
        read: |c, path, v, d| d.master_name = c.string(path, Some(v)),
        render: |s, o| {
            if let Topology::Sentinel { master_name, .. } = &s.redis.topology {
                o.str("master_name", master_name);
            }
        },
    },
    Key {
        name: "sentinels",
        read: |c, path, v, d| d.sentinels = url_list(c, path, v),
        render: |s, o| {
            if let Topology::Sentinel { sentinels, .. } = &s.redis.topology {
                o.raw("sentinels", urls(sentinels));
            }
        },
    },
    Key {
        name: "nodes",
        read: |c, path, v, d| d.nodes = url_list(c, path, v),
        render: |s, o| {
            if let Topology::Cluster { nodes } = &s.redis.topology {
                o.raw("nodes", urls(nodes));
            }
        },
    },
    key!("min_replicas_ack", settings.min_replicas_ack; redis.min_replicas_ack),
    key!("command_timeout", settings.command_timeout; redis.command_timeout),
    key!("max_in_flight", settings.max_in_flight; redis.max_in_flight),
    key!("deny_cache_max_entries", settings.deny_cache_max_entries; redis.deny_cache_max_entries),
    key!("batch_max", settings.batch_max; redis.batch_max),
    key!("key_prefix", settings.key_prefix; redis.key_prefix),
    key!("connect_timeout", settings.connect_timeout; redis.connect_timeout),
    key!("connections", settings.connections; redis.connections),
    key!("retry_after", settings.retry_after; redis.retry_after),
    Key {
        name: "username",
        read: |c, path, v, d| d.settings.username = c.string(path, Some(v)),
        render: |s, o| match &s.redis.username {
            Some(u) => o.str("username", u),
            None => o.line("# username: none (the url's, if it names one)"),
        },
    },
    Key {
        name: "password",
        read: |c, path, v, d| d.password = c.secret(path, Some(v)),
        render: |s, o| match &s.password_source {
            PasswordSource::None => o.line("# password: none"),
            PasswordSource::Url => o.line("password = \"<redacted>\"  # from url"),
            PasswordSource::Key => o.line("password = \"<redacted>\"  # from password"),
            PasswordSource::File(f) => o.line(format_args!(
                "password = \"<redacted>\"  # from password_file {}",
                toml_str(&f.display().to_string())
            )),
        },
    },
    Key {
        name: "password_file",
        read: |c, path, v, d| d.password_file = c.string(path, Some(v)),
        render: |s, o| match &s.password_source {
            PasswordSource::File(f) => file(o, "password_file", Some(f)),
            _ => file(o, "password_file", None),
        },
    },
    Key {
        name: "tls_ca_file",
        read: |c, path, v, d| d.settings.tls.ca_file = c.string(path, Some(v)).map(PathBuf::from),
        render: |s, o| file(o, "tls_ca_file", s.redis.tls.ca_file.as_ref()),
    },
    Key {
        name: "tls_cert_file",
        read: |c, path, v, d| {
            d.settings.tls.cert_file = c.string(path, Some(v)).map(PathBuf::from);
        },
        render: |s, o| file(o, "tls_cert_file", s.redis.tls.cert_file.as_ref()),
    },
    Key {
        name: "tls_key_file",
        read: |c, path, v, d| {
            d.settings.tls.key_file = c.string(path, Some(v)).map(PathBuf::from);
        },
        render: |s, o| file(o, "tls_key_file", s.redis.tls.key_file.as_ref()),
    },
    key!("strict_eviction_policy", settings.strict_eviction_policy; redis.strict_eviction_policy),
];

/// The section; `required`: rate limiting is enabled with the redis provider, so the keys a
/// connection needs are required. `None` when it has problems (reported).
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
        master_name: None,
        sentinels: None,
        nodes: None,
        password: None,
        password_file: None,
    };
    read_keys(c, P, d, KEYS, &mut draft);
    let source = password_source(&draft);
    let redis = finish(c, before, d, draft, required);
    redis
        .filter(|_| c.count() == before)
        .map(|redis| RedisProviderSettings {
            tls_file_digests: tls_file_digests(&redis),
            redis,
            password_source: source,
        })
}

/// A digest of `parts` (each length-prefixed, so that parts cannot run into each other). It
/// stays in memory: it only tells whether a secret changed, and is never shown.
pub(crate) fn digest(parts: &[&[u8]]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// A digest of each configured TLS file's content (see
/// [`RedisProviderSettings::tls_file_digests`]); the files were read by the settings' check
/// just before, so an unreadable one is already reported.
fn tls_file_digests(redis: &RedisSettings) -> Vec<(&'static str, u64)> {
    let tls = &redis.tls;
    [
        ("rate_limit.redis.tls_ca_file", &tls.ca_file),
        ("rate_limit.redis.tls_cert_file", &tls.cert_file),
        ("rate_limit.redis.tls_key_file", &tls.key_file),
    ]
    .into_iter()
    .filter_map(|(key, f)| {
        let bytes = std::fs::read(f.as_ref()?).ok()?;
        Some((key, digest(&[&bytes])))
    })
    .collect()
}

/// Where the data nodes' password comes from: `password_file` wins over `password` (as
/// [`finish`] reads them), else the userinfo of `url` or of a seed node.
fn password_source(d: &Draft) -> PasswordSource {
    if let Some(f) = &d.password_file {
        return PasswordSource::File(PathBuf::from(f));
    }
    if d.password.is_some() {
        return PasswordSource::Key;
    }
    let nodes = d.nodes.iter().flatten();
    if std::iter::once(&d.settings.url)
        .chain(nodes)
        .any(|u| userinfo(u).is_some_and(|(_, password)| password.is_some()))
    {
        return PasswordSource::Url;
    }
    PasswordSource::None
}

/// The role, the topology with its keys, the password, then the settings' own check.
/// `before`: the problem count before the section was read.
fn finish(
    c: &mut Check,
    before: usize,
    d: &Dict,
    mut draft: Draft,
    required: bool,
) -> Option<RedisSettings> {
    check_role(
        c,
        draft.role.as_deref(),
        required && !d.contains_key("role"),
    );
    let topology = topology(c, d, &mut draft, required);
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
    // The settings are checked even when the topology could not be read, on a stand-in, so
    // that the other keys' problems are reported in the same pass.
    settings.topology = topology.clone().unwrap_or_default();
    if let Err(problems) = settings.validate() {
        owner_problems(c, before, d, topology.is_some(), problems.0);
    }
    topology.map(|_| settings)
}

/// The keys whose check depends on the topology: their problems are not reported while the
/// topology cannot be read.
const TOPOLOGY_KEYS: &[&str] = &[
    "url",
    "master_name",
    "sentinels",
    "nodes",
    "username",
    "password",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The topology's address keys have no default: whether one is required is this section's
/// rule ([`topology`]), so the owner's verdict on an absent one (empty) is not reported.
const ADDRESS_KEYS: &[&str] = &["url", "master_name", "sentinels", "nodes"];

/// Puts [`RedisSettings::validate`]'s problems under `rate_limit.redis`, one problem per
/// key: a key this section already reported since `before` (it could not be read, is
/// required or misplaced) keeps that problem alone.
fn owner_problems(
    c: &mut Check,
    before: usize,
    d: &Dict,
    topology_known: bool,
    problems: Vec<SettingsProblem>,
) {
    let kept: Vec<(String, String)> = problems
        .into_iter()
        .filter(|p| {
            let key = p.field.split('[').next().unwrap_or_default();
            let absent_address = ADDRESS_KEYS.contains(&key) && !d.contains_key(key);
            let unknown_topology = !topology_known && TOPOLOGY_KEYS.contains(&key);
            !absent_address && !unknown_topology && !c.reported(before, &join(P, &p.field))
        })
        .map(|p| (p.field, p.problem))
        .collect();
    c.fields(P, kept);
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

/// The topology named, with its addresses. Each topology takes its own keys; a key of
/// another is a mistake worth naming (`url` outside standalone is the settings' own rule,
/// since they hold it; the others they cannot hold).
fn topology(c: &mut Check, d: &Dict, draft: &mut Draft, required: bool) -> Option<Topology> {
    let name = draft.topology?;
    let takes: &[&str] = match name {
        TopologyName::Standalone => &["url"],
        TopologyName::Sentinel => &["master_name", "sentinels"],
        TopologyName::Cluster => &["nodes"],
    };
    for key in ["master_name", "sentinels", "nodes"] {
        if d.contains_key(key) && !takes.contains(&key) {
            c.push(
                join(P, key),
                format!("not used with topology = \"{}\"", name.as_str()),
            );
        }
    }
    let mut require = |key: &str, problem: &str| {
        if !d.contains_key(key) {
            c.push(join(P, key), problem);
        }
    };
    match name {
        TopologyName::Standalone => {
            if required {
                require("url", "required when provider = \"redis\"");
            }
            Some(Topology::Standalone)
        }
        TopologyName::Sentinel => {
            require(
                "master_name",
                "required with topology = \"sentinel\" (the name the sentinels monitor)",
            );
            require(
                "sentinels",
                "required with topology = \"sentinel\": the sentinels' URLs",
            );
            Some(Topology::Sentinel {
                master_name: draft.master_name.take().unwrap_or_default(),
                sentinels: draft.sentinels.take().unwrap_or_default(),
            })
        }
        TopologyName::Cluster => {
            require(
                "nodes",
                "required with topology = \"cluster\": seed node URLs",
            );
            Some(Topology::Cluster {
                nodes: draft.nodes.take().unwrap_or_default(),
            })
        }
    }
}

/// A list of Redis URLs (`nodes`, `sentinels`): a TOML array of strings, or one string of
/// comma-separated URLs (handy in environment variables). An item that is not a string is
/// reported by its index (`nodes[1]`) and kept as an empty stand-in, so that the settings'
/// own problems keep naming the right index. Values are never shown (they may hold
/// passwords).
fn url_list(c: &mut Check, path: &str, v: &Value) -> Option<Vec<String>> {
    match v {
        Value::String(_, s) => Some(
            s.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect(),
        ),
        Value::Array(_, a) => Some(
            a.iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(_, s) => s.clone(),
                    _ => {
                        c.push(
                            format!("{path}[{i}]"),
                            "must be a URL string (value not shown: it may hold a password)",
                        );
                        String::new()
                    }
                })
                .collect(),
        ),
        _ => {
            c.push(
                path,
                "must be a list of URLs such as [\"redis://127.0.0.1:7000\"] (value not shown)",
            );
            None
        }
    }
}

/// `[rate_limit.redis]` with every key.
pub(super) fn render(o: &mut Toml, s: &RedisProviderSettings) {
    render_section(o, P, KEYS, s);
}

/// URLs as a TOML array, each with its password replaced.
fn urls(urls: &[String]) -> String {
    let shown: Vec<String> = urls.iter().map(|u| toml_str(&redact_url(u))).collect();
    format!("[{}]", shown.join(", "))
}

/// The user name and password of a URL's userinfo (`scheme://user:password@host`); `None`
/// without one.
fn userinfo(url: &str) -> Option<(&str, Option<&str>)> {
    let (_, rest) = url.split_once("://")?;
    let (userinfo, _) = rest.rsplit_once('@')?;
    Some(match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    })
}

/// Shows a Redis URL with its password replaced (the user name stays: it is not a secret,
/// and it tells which ACL user the limiter logs in as).
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<redacted>".to_owned();
    };
    let host = rest.rsplit_once('@').map(|(_, host)| host);
    match (userinfo(url), host) {
        (Some((user, Some(_))), Some(host)) => format!("{scheme}://{user}:<redacted>@{host}"),
        (Some((user, None)), Some(host)) => format!("{scheme}://{user}@{host}"),
        _ => format!("{scheme}://{rest}"),
    }
}
