//! The shipped example configurations are valid, enabled, and mean what their comments say.

use std::path::Path;

use app_bootstrap::config::{self, Sources};
use app_bootstrap::{ProviderSettings, RateLimitSettings};

fn load(name: &str) -> app_bootstrap::Settings {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    config::load(&Sources {
        file: Some(path),
        env: Some(Vec::new()),
    })
    .unwrap_or_else(|e| panic!("examples/{name}:\n{e}"))
}

#[test]
fn local_example_is_valid_and_limits_api_by_api_key() {
    let s = load("local.toml");
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        panic!("examples/local.toml must enable rate limiting");
    };
    assert!(matches!(e.provider, ProviderSettings::Local));
    assert_eq!(s.routes[0].path_prefix, "/api");
    // README: "the example policy admits 5 per 10 s".
    let api = e
        .policies
        .get(e.policies.default_id())
        .expect("default policy");
    assert_eq!(api.algorithm().quota_window(), (5, 10));
}

#[test]
fn redis_example_is_valid_and_uses_a_coordination_redis() {
    let s = load("redis.toml");
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        panic!("examples/redis.toml must enable rate limiting");
    };
    match &e.provider {
        ProviderSettings::Redis(r) => assert_eq!(r.redis.url, "redis://127.0.0.1:6379/0"),
        other => panic!("expected redis, got {other:?}"),
    }
    assert!(e.subject_secret.is_some());
}

/// The README's gate commands post to `orders`, and say they work with either example.
#[test]
fn both_examples_define_the_gate_the_readme_uses() {
    for name in ["local.toml", "redis.toml"] {
        let s = load(name);
        assert!(
            s.event_gates.iter().any(|g| g.id().as_str() == "orders"),
            "examples/{name} must define [event_gates.orders]"
        );
    }
}

#[test]
fn envoy_example_serves_grpc_and_maps_both_descriptors() {
    let s = load("envoy.toml");
    assert_eq!(
        s.grpc.bind,
        Some("127.0.0.1:8081".parse().expect("address")),
        "docs/envoy.md points Envoy at 127.0.0.1:8081"
    );
    for (key, policy) in [("remote_address", "per_ip"), ("tenant", "per_tenant")] {
        let rule = s
            .rls
            .find("edge", [(key, "some-value")].into_iter())
            .unwrap_or_else(|| panic!("a rule for {key}"));
        assert_eq!(rule.policy().as_str(), policy);
    }
}
