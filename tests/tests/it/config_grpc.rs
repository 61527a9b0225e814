//! `[grpc]` and `[[rls.descriptors]]`: read, validated with key paths, rendered by `--check`.

use acceptance_tests::config::{errors, ok, problem_at};
use std::time::Duration;

use app_bootstrap::UnknownDescriptor;

const BASE: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 10
window = "1m"
"#;

fn with(extra: &str) -> String {
    format!("{BASE}\n{extra}")
}

#[test]
fn without_a_grpc_section_there_is_no_grpc_server() {
    let s = ok(BASE);
    assert_eq!(s.grpc.bind, None);
    assert_eq!(s.grpc.unknown_descriptor, UnknownDescriptor::Allow);
    assert!(s.rls.is_empty());
}

#[test]
fn grpc_and_descriptor_rules_are_read_and_rendered() {
    let s = ok(&with(
        r#"
[grpc]
bind = "127.0.0.1:8081"
unknown_descriptor = "deny"

[[rls.descriptors]]
domain = "edge"
entries = ["remote_address"]
policy = "api"

[[rls.descriptors]]
domain = "edge"
entries = ["tenant", "path=/login"]
policy = "api"
"#,
    ));
    assert_eq!(
        s.grpc.bind,
        Some("127.0.0.1:8081".parse().expect("address"))
    );
    assert_eq!(s.grpc.unknown_descriptor, UnknownDescriptor::Deny);
    let found = s
        .rls
        .find("edge", [("tenant", "t"), ("path", "/login")].into_iter())
        .expect("a rule matches");
    assert_eq!(found.policy().as_str(), "api");
    let text = s.render();
    for line in [
        "[grpc]",
        "bind = \"127.0.0.1:8081\"",
        "unknown_descriptor = \"deny\"",
        "[[rls.descriptors]]",
        "entries = [\"tenant\", \"path=/login\"]",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    // What --check prints is a configuration that reads back to the same settings.
    let again = ok(&text);
    assert_eq!(again.grpc, s.grpc);
    assert_eq!(again.rls.iter().count(), 2);
}

#[test]
fn the_listener_limits_are_read_rendered_and_default_as_documented() {
    let d = ok(BASE).grpc;
    assert_eq!(d.max_connections, 10_000);
    assert_eq!(d.handshake_timeout, Duration::from_secs(10));
    assert_eq!(d.idle_timeout, Duration::from_secs(60));
    assert_eq!(d.keepalive_interval, Duration::from_secs(30));
    assert_eq!(d.keepalive_timeout, Duration::from_secs(10));
    assert_eq!(d.max_concurrent_streams, 128);
    assert_eq!(d.max_message_bytes, 65_536);
    let s = ok(&with(
        r#"
[grpc]
bind = "127.0.0.1:8081"
max_connections = 500
handshake_timeout = "2s"
idle_timeout = "30s"
keepalive_interval = "15s"
keepalive_timeout = "5s"
max_concurrent_streams = 64
max_message_bytes = 16384
"#,
    ));
    let g = s.grpc;
    assert_eq!(g.max_connections, 500);
    assert_eq!(g.handshake_timeout, Duration::from_secs(2));
    assert_eq!(g.idle_timeout, Duration::from_secs(30));
    assert_eq!(g.keepalive_interval, Duration::from_secs(15));
    assert_eq!(g.keepalive_timeout, Duration::from_secs(5));
    assert_eq!(g.max_concurrent_streams, 64);
    assert_eq!(g.max_message_bytes, 16_384);
    let text = s.render();
    for line in [
        "max_connections = 500",
        "handshake_timeout = \"2s\"",
        "max_message_bytes = 16384",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    assert_eq!(ok(&text).grpc, g);
}

#[test]
fn listener_limits_out_of_bounds_are_named_by_key_path() {
    let e = errors(&with(
        r#"
[grpc]
bind = "127.0.0.1:8081"
max_connections = 0
handshake_timeout = "0s"
idle_timeout = "2h"
keepalive_interval = "0s"
keepalive_timeout = "0s"
max_concurrent_streams = 0
max_message_bytes = 999999999
"#,
    ));
    for key in [
        "max_connections",
        "max_concurrent_streams",
        "max_message_bytes",
    ] {
        assert!(
            problem_at(&e, &format!("grpc.{key}")).contains("must be between 1 and"),
            "{key}"
        );
    }
    for key in [
        "handshake_timeout",
        "idle_timeout",
        "keepalive_interval",
        "keepalive_timeout",
    ] {
        assert!(
            problem_at(&e, &format!("grpc.{key}")).contains("must be > 0"),
            "{key}"
        );
    }
}

#[test]
fn descriptor_rule_mistakes_are_named_by_key_path() {
    let e = errors(&with(
        r#"
[grpc]
bind = "nowhere"
unknown_descriptor = "maybe"
colour = "red"

[rls]
other = 1

[[rls.descriptors]]
domain = "edge"
entries = []
policy = "api"

[[rls.descriptors]]
domain = "edge"
entries = ["a", "=b", "c="]
policy = "nope"
extra = true

[[rls.descriptors]]
entries = ["remote_address"]
policy = "api"
"#,
    ));
    assert!(problem_at(&e, "grpc.bind").contains("\"nowhere\""));
    assert!(problem_at(&e, "grpc.unknown_descriptor").contains("\"allow\" or \"deny\""));
    assert!(problem_at(&e, "grpc.colour").starts_with("unknown key"));
    assert!(problem_at(&e, "rls.other").starts_with("unknown key"));
    assert!(problem_at(&e, "rls.descriptors[0].entries").contains("at least one entry"));
    assert!(problem_at(&e, "rls.descriptors[1].entries[1]").contains("empty key"));
    assert!(problem_at(&e, "rls.descriptors[1].entries[2]").contains("empty value"));
    assert!(problem_at(&e, "rls.descriptors[1].policy").contains("\"nope\" is not defined"));
    assert!(problem_at(&e, "rls.descriptors[1].extra").starts_with("unknown key"));
    assert!(problem_at(&e, "rls.descriptors[2].domain").starts_with("required"));
}

#[test]
fn a_repeated_rule_and_a_shared_port_are_refused() {
    let e = errors(&with(
        r#"
[http]
bind = "127.0.0.1:9000"

[grpc]
bind = "127.0.0.1:9000"

[[rls.descriptors]]
domain = "edge"
entries = ["k"]
policy = "api"

[[rls.descriptors]]
domain = "edge"
entries = ["k"]
policy = "api"
"#,
    ));
    assert!(problem_at(&e, "grpc.bind").contains("http.bind"));
    assert!(problem_at(&e, "rls.descriptors[1]").contains("repeats"));
}

#[test]
fn a_grpc_server_without_rate_limiting_is_refused() {
    let e = errors("[grpc]\nbind = \"127.0.0.1:8081\"\n");
    assert!(problem_at(&e, "grpc.bind").contains("rate_limit.enabled"));
}

#[test]
fn a_rule_may_charge_after_the_work_on_a_policy_that_takes_reservations() {
    let rule = |policy: &str, charge: &str| {
        format!(
            "[[rls.descriptors]]\ndomain = \"llm\"\nentries = [\"user\"]\npolicy = \"{policy}\"\ncharge = {charge}\n"
        )
    };
    let s = ok(&with(&format!(
        "[grpc]\nbind = \"127.0.0.1:8081\"\n{}",
        rule("api", "\"after\"")
    )));
    let found = s
        .rls
        .find("llm", [("user", "u")].into_iter())
        .expect("a rule");
    assert!(found.charges_after());
    let view = s.render();
    assert!(view.contains("charge = \"after\""), "{view}");
    let log =
        "[rate_limit.policies.log]\nalgorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1m\"\n";
    let e = errors(&with(&format!(
        "{log}[grpc]\nbind = \"127.0.0.1:8081\"\n{}{}",
        rule("log", "\"after\""),
        rule("api", "\"later\"").replace("\"user\"", "\"other\"")
    )));
    assert!(
        problem_at(&e, "rls.descriptors[0].charge").contains("takes reservations"),
        "{e}"
    );
    assert!(
        problem_at(&e, "rls.descriptors[1].charge").contains("\"on_request\" or \"after\""),
        "{e}"
    );
}

#[test]
fn a_rule_that_charges_after_is_read_with_either_provider() {
    let redis = BASE.replace(
        "provider = \"local\"",
        "provider = \"redis\"\nsubject_secret = \"0123456789abcdef0123456789abcdef\"",
    ) + "[rate_limit.redis]\nrole = \"coordination\"\nurl = \"redis://127.0.0.1:6379/0\"\n";
    let s = ok(&format!(
        "{redis}[grpc]\nbind = \"127.0.0.1:8081\"\n[[rls.descriptors]]\ndomain = \"llm\"\nentries = [\"user\"]\npolicy = \"api\"\ncharge = \"after\"\n"
    ));
    let found = s
        .rls
        .find("llm", [("user", "u")].into_iter())
        .expect("a rule");
    assert!(found.charges_after());
}
