//! A network partition between the provider and Redis, made by the harness's TCP proxy
//! (blackhole: connections stay open, nothing crosses either way; this kernel has no netem and
//! tests never touch the host firewall), with the app's circuit breaker around the provider:
//!
//! - while partitioned, every evaluation answers within the command timeout (plus scheduling
//!   slack), as `Indeterminate` (sent into the partition, result unknown) or `Unavailable`
//!   (nothing sent: the stuck connection was replaced and the new one cannot connect, or the
//!   circuit is open), never a decision;
//! - the circuit breaker opens;
//! - when the path heals, decisions come back without any intervention (time printed with
//!   `--nocapture`; docs/operations.md reports it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::proxy::TcpProxy;
use acceptance_tests::redis_server::RedisServer;
use acceptance_tests::{conformance, rate};
use adapter_redis::{RedisProvider, RedisSettings};
use app_bootstrap::settings::BreakerSettings;
use app_bootstrap::{BreakerState, CircuitBreaker};
use shared_contract::{AlgorithmKind, EdgeRateLimitPort, RateLimitOutcome, UnavailableCategory};

const COMMAND_TIMEOUT: Duration = Duration::from_millis(100);
/// Scheduling slack on two shared cores.
const SLACK: Duration = Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_answered_within_the_timeout_opens_the_breaker_and_heals_by_itself() {
    // Every evaluation is timed against its bound: nothing else heavy beside it.
    let _heavy = crate::heavy().await;
    let server = RedisServer::start();
    let proxy = TcpProxy::start(
        format!("127.0.0.1:{}", server.port())
            .parse()
            .expect("an address"),
    );
    let policy = conformance::policy(AlgorithmKind::TokenBucket, 1, 1_000_000, 60_000, 1);
    let policies = rate::policy_set(vec![policy.clone()]);
    let mut settings = RedisSettings::new(proxy.url());
    settings.command_timeout = COMMAND_TIMEOUT;
    settings.connect_timeout = Duration::from_millis(300);
    let redis = RedisProvider::connect(settings, policies.clone())
        .await
        .expect("valid settings");
    let breaker = Arc::new(CircuitBreaker::new(
        Arc::new(redis),
        BreakerSettings {
            enabled: true,
            failure_threshold: 5,
            cool_down: Duration::from_millis(500),
        },
    ));
    let subject = rate::fresh_subject();
    let evaluate = || async {
        let started = Instant::now();
        let outcome = breaker
            .evaluate(rate::request(&policy, subject, 1))
            .await
            .expect("a valid request");
        (outcome, started.elapsed())
    };
    let (before, _) = evaluate().await;
    assert!(matches!(before, RateLimitOutcome::Evaluated(d) if d.allowed));

    proxy.blackhole();
    let partitioned = Instant::now();
    let (mut indeterminate, mut connect, mut circuit_open, mut slowest) = (0, 0, 0, Duration::ZERO);
    let mut opened_after = None;
    while partitioned.elapsed() < Duration::from_secs(2) {
        let (outcome, took) = evaluate().await;
        slowest = slowest.max(took);
        assert!(
            took <= COMMAND_TIMEOUT + SLACK,
            "an evaluation took {took:?} during the partition ({outcome:?})"
        );
        match outcome {
            RateLimitOutcome::Indeterminate { .. } => indeterminate += 1,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::CircuitOpen,
                ..
            } => circuit_open += 1,
            RateLimitOutcome::Unavailable { .. } => connect += 1,
            other => panic!("a partition must not give {other:?}"),
        }
        if opened_after.is_none() && breaker.state() != BreakerState::Closed {
            opened_after = Some(partitioned.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let opened_after = opened_after.expect("the circuit breaker opened during the partition");
    assert!(
        indeterminate >= 1,
        "the first calls were sent into the partition"
    );
    assert!(
        circuit_open >= 1,
        "the open circuit answered without sending"
    );

    proxy.pass();
    let healed = Instant::now();
    let d = eventually(
        "a decision after the heal",
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || match evaluate().await.0 {
            RateLimitOutcome::Evaluated(d) => Ok(d),
            other => Err(other),
        },
    )
    .await;
    let recovered_after = healed.elapsed();
    assert!(d.allowed);
    assert_eq!(breaker.state(), BreakerState::Closed);
    println!(
        "partition (blackhole, command_timeout {COMMAND_TIMEOUT:?}): slowest answer {slowest:?}; \
         {indeterminate} indeterminate, {connect} unavailable (connect), {circuit_open} circuit \
         open; breaker open after {opened_after:?}; decisions again {recovered_after:?} after \
         the heal"
    );
}
