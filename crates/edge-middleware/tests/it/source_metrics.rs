//! `rate_limit_decisions_by_source_total`: every evaluated decision of the limiter (allowed
//! or denied, enforced, shadow or part of a multi-limit evaluation) counts once under its
//! policy and its decision's source; an outcome without a decision does not.

use std::sync::Arc;
use std::time::Duration;

use edge_middleware::limiter::names;
use edge_middleware::{Limiter, Member, PolicyIndex, SubjectHasher, SubjectSecret};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use shared_contract::{
    AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySet, PolicySpec,
    RateLimitPolicy, SystemClock,
};

fn policy(id: &str, limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit,
            window: Duration::from_secs(60),
        },
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy")
}

/// A limiter over the local provider (`fallback`: its stand-in form) of policies `a` (limit 2)
/// and `b` (limit 5), its metrics registered with a recorder of its own.
fn limiter(fallback: bool) -> (Limiter, PrometheusHandle) {
    let set = PolicySet::new(
        [policy("a", 2), policy("b", 5)],
        PolicyId::new("a").expect("id"),
    )
    .expect("valid set");
    let (clock, settings) = (
        Arc::new(SystemClock),
        adapter_local::LocalSettings::default(),
    );
    let port = if fallback {
        adapter_local::LocalProvider::fallback(set, clock, settings)
    } else {
        adapter_local::LocalProvider::new(set, clock, settings)
    };
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let limiter = metrics::with_local_recorder(&recorder, || {
        Limiter::new(
            Arc::new(port),
            SubjectHasher::new(&SubjectSecret::random()),
            FailurePolicy::FailClosed,
            Duration::from_secs(1),
        )
    });
    (limiter, handle)
}

/// The value of `rate_limit_decisions_by_source_total` for `policy` and `source`, if shown.
fn by_source(handle: &PrometheusHandle, policy: &str, source: &str) -> Option<f64> {
    let series = format!(
        "{}{{policy=\"{policy}\",source=\"{source}\"}} ",
        names::DECISIONS_BY_SOURCE
    );
    let text = handle.render();
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
}

fn index(limiter: &Limiter, id: &str) -> PolicyIndex {
    let id = PolicyId::new(id).expect("valid id");
    limiter.resolve(&id).expect("a policy of the limiter")
}

#[tokio::test]
async fn every_evaluated_decision_counts_once_under_its_source() {
    let (limiter, handle) = limiter(false);
    let (a, b) = (index(&limiter, "a"), index(&limiter, "b"));
    // Two allows and a denial of `a`, enforced.
    for _ in 0..3 {
        limiter
            .evaluate(a, b"s1", Cost::ONE)
            .await
            .expect("admitted");
    }
    // A shadow denial of `a` (its quota is spent).
    let s1 = limiter.digest(b"s1");
    limiter
        .evaluate_shadow(a, s1, Cost::ONE)
        .await
        .expect("admitted");
    // One multi-limit evaluation of `a` (denied) and `b` (would admit): both are decisions.
    let members = [
        Member {
            index: a,
            subject: s1,
            cost: Cost::ONE,
        },
        Member {
            index: b,
            subject: s1,
            cost: Cost::ONE,
        },
    ];
    limiter
        .evaluate_all(&members, None)
        .await
        .expect("admitted");
    assert_eq!(
        by_source(&handle, "a", "local"),
        Some(5.0),
        "{}",
        handle.render()
    );
    assert_eq!(by_source(&handle, "b", "local"), Some(1.0));
    for other in ["global_redis", "local_cache", "local_fallback"] {
        assert_eq!(by_source(&handle, "a", other), Some(0.0), "{other}");
    }
}

#[tokio::test]
async fn the_local_fallback_counts_as_local_fallback() {
    let (limiter, handle) = limiter(true);
    limiter
        .evaluate(index(&limiter, "b"), b"s2", Cost::ONE)
        .await
        .expect("admitted");
    assert_eq!(by_source(&handle, "b", "local_fallback"), Some(1.0));
    assert_eq!(by_source(&handle, "b", "local"), Some(0.0));
}
