//! Every rule of [`RedisSettings`], each refusal named by its key, and no secret in any
//! message or debug output.

use super::*;
use crate::error::Error;

/// The settings' problems as the provider shows them (`rate_limit.redis.<key>: ...`).
fn refusal(s: &RedisSettings) -> String {
    match s.validate() {
        Ok(()) => panic!("expected a refusal: {s:?}"),
        Err(e) => Error::Settings(e).to_string(),
    }
}

/// The keys of the problems of `s`, in order.
fn fields(s: &RedisSettings) -> Vec<String> {
    match s.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.0.into_iter().map(|p| p.field).collect(),
    }
}

#[test]
fn defaults_are_the_documented_ones() {
    let s = RedisSettings::new("redis://127.0.0.1:6379/0");
    assert_eq!(s.command_timeout, Duration::from_millis(50));
    assert_eq!(s.max_in_flight, 1024);
    assert_eq!(s.key_prefix, "rl");
    assert_eq!(s.connections, 1);
    assert_eq!(s.batch_max, 16);
    assert!(s.validate().is_ok());
}

#[test]
fn passwords_never_reach_errors_or_debug_output() {
    let s = RedisSettings::new("redis://limiter:hunter2-secret@127.0.0.1:6379/0");
    assert!(s.validate().is_ok());
    assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
    let bad = RedisSettings::new("redis://limiter:hunter2-secret@[::1/0");
    let err = refusal(&bad);
    assert!(err.contains("rate_limit.redis.url"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn unix_urls_are_refused_by_scheme() {
    for url in ["redis+unix:///tmp/r.sock", "unix:///tmp/r.sock"] {
        let s = RedisSettings::new(url);
        assert_eq!(fields(&s), ["url"], "{url}");
        let err = refusal(&s);
        assert!(
            err.contains("is not supported by this build"),
            "{url}: {err}"
        );
    }
}

#[test]
fn out_of_range_bounds_are_refused() {
    let base = || RedisSettings::new("redis://127.0.0.1:6379/0");
    let cases = [
        (
            RedisSettings {
                max_in_flight: 0,
                ..base()
            },
            "max_in_flight",
        ),
        (
            RedisSettings {
                connections: 0,
                ..base()
            },
            "connections",
        ),
        (
            RedisSettings {
                connections: RedisSettings::MAX_CONNECTIONS + 1,
                ..base()
            },
            "connections",
        ),
        (
            RedisSettings {
                command_timeout: Duration::from_micros(500),
                ..base()
            },
            "command_timeout",
        ),
        (
            RedisSettings {
                command_timeout: Duration::from_secs(61),
                ..base()
            },
            "command_timeout",
        ),
        (
            RedisSettings {
                connect_timeout: Duration::ZERO,
                ..base()
            },
            "connect_timeout",
        ),
        (
            RedisSettings {
                batch_max: 0,
                ..base()
            },
            "batch_max",
        ),
        (
            RedisSettings {
                batch_max: 65,
                ..base()
            },
            "batch_max",
        ),
    ];
    for (s, field) in cases {
        assert_eq!(fields(&s), [field], "{s:?}");
    }
}

#[test]
fn the_command_timeout_leaves_a_deadline_room_for_its_margin() {
    let with = |t| RedisSettings {
        command_timeout: t,
        ..RedisSettings::new("redis://127.0.0.1:6379/0")
    };
    assert_eq!(RedisSettings::MAX_COMMAND_TIMEOUT, Duration::from_secs(59));
    assert!(with(Duration::from_millis(1)).validate().is_ok());
    assert!(with(Duration::from_secs(59)).validate().is_ok());
    assert_eq!(fields(&with(Duration::from_secs(60))), ["command_timeout"]);
    assert_eq!(
        fields(&with(Duration::from_millis(59_001))),
        ["command_timeout"]
    );
}

#[test]
fn every_problem_is_reported_at_once_by_key() {
    let s = RedisSettings {
        command_timeout: Duration::ZERO,
        max_in_flight: 0,
        key_prefix: "a{b".to_owned(),
        min_replicas_ack: RedisSettings::MAX_REPLICAS_ACK + 1,
        username: Some(String::new()),
        ..RedisSettings::cluster(vec![
            "redis://a:7000".to_owned(),
            "unix:///tmp/x".to_owned(),
            "redis://[::1".to_owned(),
        ])
    };
    assert_eq!(
        fields(&s),
        [
            "command_timeout",
            "max_in_flight",
            "min_replicas_ack",
            "key_prefix",
            "username",
            "nodes[1]",
            "nodes[2]",
        ]
    );
    let s = RedisSettings {
        url: "redis://127.0.0.1:6379".to_owned(),
        username: Some(String::new()),
        ..RedisSettings::sentinel("my master", vec!["redis://127.0.0.1:26379".to_owned()])
    };
    assert_eq!(fields(&s), ["username", "url", "master_name"]);
}

#[test]
fn topology_settings_that_cannot_work_are_refused_by_key() {
    let cluster =
        |nodes: &[&str]| RedisSettings::cluster(nodes.iter().map(|n| (*n).to_owned()).collect());
    assert!(
        cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
            .validate()
            .is_ok()
    );
    let e = refusal(&cluster(&[]));
    assert!(e.starts_with("rate_limit.redis.nodes:"), "{e}");
    let e = refusal(&cluster(&["redis://127.0.0.1:7000/3"]));
    assert!(e.contains("only database 0"), "{e}");
    assert!(e.starts_with("rate_limit.redis.nodes[0]:"), "{e}");
    let e = refusal(&cluster(&["redis://a:7000", "rediss://b:7001"]));
    assert!(e.contains("mixes"), "{e}");
    let e = refusal(&cluster(&["redis://a:7000", "unix:///tmp/x"]));
    assert!(e.starts_with("rate_limit.redis.nodes[1]:"), "{e}");
    let with_url = RedisSettings {
        url: "redis://127.0.0.1:6379".into(),
        ..cluster(&["redis://a:7000"])
    };
    assert!(refusal(&with_url).starts_with("rate_limit.redis.url:"));
    let sentinel =
        |name: &str| RedisSettings::sentinel(name, vec!["redis://127.0.0.1:26379".to_owned()]);
    assert!(sentinel("mymaster").validate().is_ok());
    assert!(refusal(&sentinel("")).starts_with("rate_limit.redis.master_name:"));
    assert!(refusal(&sentinel("my master")).contains("master_name"));
    let too_many = RedisSettings {
        min_replicas_ack: RedisSettings::MAX_REPLICAS_ACK + 1,
        ..sentinel("mymaster")
    };
    assert!(refusal(&too_many).contains("min_replicas_ack"));
}

#[test]
fn credentials_are_given_in_one_place() {
    let s = RedisSettings {
        username: Some("limiter".to_owned()),
        password: Some("secret".to_owned()),
        ..RedisSettings::new("redis://127.0.0.1:6379/0")
    };
    assert!(s.validate().is_ok());
    let s = RedisSettings {
        username: Some("limiter".to_owned()),
        password: Some("secret".to_owned()),
        ..RedisSettings::new("redis://other:pw@127.0.0.1:6379/0")
    };
    assert_eq!(fields(&s), ["username", "password"]);
    let seeds = RedisSettings {
        password: Some("secret".to_owned()),
        ..RedisSettings::cluster(vec!["redis://:pw@a:7000".to_owned()])
    };
    let e = refusal(&seeds);
    assert!(
        e.starts_with("rate_limit.redis.password: nodes[0] already"),
        "{e}"
    );
    assert!(!e.contains("pw@"), "{e}");
}

#[test]
fn tls_files_need_rediss_and_rediss_needs_a_ca() {
    let files = TlsFiles {
        ca_file: Some("/nonexistent/ca.crt".into()),
        ..TlsFiles::default()
    };
    let plain = RedisSettings {
        tls: files.clone(),
        ..RedisSettings::new("redis://127.0.0.1:6379/0")
    };
    assert_eq!(fields(&plain), ["tls_ca_file"]);
    assert!(refusal(&plain).contains("use rediss://"));
    let no_ca = RedisSettings::new("rediss://127.0.0.1:6379/0");
    assert_eq!(fields(&no_ca), ["tls_ca_file"]);
    let unreadable = RedisSettings {
        tls: files,
        ..RedisSettings::new("rediss://127.0.0.1:6379/0")
    };
    assert!(refusal(&unreadable).contains("/nonexistent/ca.crt"));
}

#[test]
fn node_and_sentinel_passwords_never_reach_debug_output() {
    let s = RedisSettings::sentinel(
        "mymaster",
        vec!["redis://admin:sentinel-secret@127.0.0.1:26379".to_owned()],
    );
    let shown = format!("{s:?}");
    assert!(!shown.contains("sentinel-secret"), "{shown}");
    assert!(shown.contains("127.0.0.1:26379"), "{shown}");
    let c = RedisSettings::cluster(vec!["rediss://u:node-secret@h:7000".to_owned()]);
    assert!(!format!("{c:?}").contains("node-secret"));
}
