//! `[grpc]` and `[[rls.descriptors]]`: read, validated with key paths, rendered by `--check`.

use acceptance_tests::config::{errors, ok, problem_at};
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
