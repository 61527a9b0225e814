//! The Redis provider's honest outcomes under faults, each on a private server: killed before
//! a request (`Unavailable(connect)`), not up yet when the provider starts, frozen with
//! SIGSTOP during a request (`Indeterminate` within the command timeout), stuck for three
//! timeouts (the connection is replaced), restarted (decisions again within a second),
//! slow but within the command timeout (a decision); the admission bound and the caller's
//! deadline answer without sending anything.
//!
//! Every test starts its own server, so they run in parallel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::rate::{allowed, outcome, request, subject};
use acceptance_tests::redis_provider::{OnePolicy, connect, daily_policy, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::RedisProvider;
use shared_contract::{
    AlgorithmKind, Deadline, EdgeRateLimitPort, RateLimitDecision, RateLimitOutcome,
    RateLimitPolicy, Readiness, SubjectDigest, UnavailableCategory,
};

/// How often a wait for a decision asks again.
const POLL: Duration = Duration::from_millis(10);

/// Waits up to `within` for the next decision on `subject` and returns it.
async fn decision_within(
    what: &str,
    within: Duration,
    provider: &RedisProvider,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
) -> RateLimitDecision {
    eventually(what, within, POLL, async || {
        match outcome(provider, policy, subject).await {
            RateLimitOutcome::Evaluated(d) => Ok(d),
            other => Err(other),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_before_a_request_is_unavailable_connect() {
    let mut f = OnePolicy::start("killed", AlgorithmKind::FixedWindow, 5, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    assert!(allowed(provider, p, subject(6)).await);
    assert_eq!(provider.readiness().await, Readiness::Ready);
    f.server.stop();
    // The connection's end is noticed as soon as the socket closes; give the driver a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    match outcome(provider, p, subject(6)).await {
        RateLimitOutcome::Unavailable {
            category,
            retry_after_ms,
            ..
        } => {
            assert_eq!(category, UnavailableCategory::Connect);
            assert!(retry_after_ms > 0);
        }
        other => panic!("expected Unavailable(connect), got {other:?}"),
    }
    assert!(matches!(provider.readiness().await, Readiness::NotReady(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_started_before_its_server_connects_when_it_comes_up() {
    let mut server = RedisServer::start();
    server.stop();
    let p = daily_policy("late", AlgorithmKind::TokenBucket, 1, 5);
    let mut s = settings(&server);
    s.connect_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let provider = connect(s, vec![p.clone()]).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connect must not wait for the server"
    );
    assert!(matches!(
        outcome(&provider, &p, subject(7)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));
    match provider.readiness().await {
        Readiness::NotReady(why) => assert!(why.contains("redis"), "{why}"),
        Readiness::Ready => panic!("ready without a server"),
    }
    server.restart();
    decision_within(
        "a decision after the server came up",
        Duration::from_secs(1),
        &provider,
        &p,
        subject(7),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_frozen_during_a_request_is_indeterminate_within_the_command_timeout() {
    let timeout = Duration::from_millis(200);
    let f = OnePolicy::start("frozen", AlgorithmKind::SlidingWindow, 5, |s| {
        s.command_timeout = timeout;
    })
    .await;
    let (provider, p) = (&f.provider, &f.policy);
    assert!(allowed(provider, p, subject(8)).await);
    f.server.pause();
    let started = Instant::now();
    let got = outcome(provider, p, subject(8)).await;
    let took = started.elapsed();
    f.server.resume();
    assert!(
        matches!(got, RateLimitOutcome::Indeterminate { retry_after_ms, .. } if retry_after_ms > 0),
        "expected Indeterminate, got {got:?}"
    );
    assert!(took >= timeout, "answered before the timeout: {took:?}");
    assert!(took < timeout + Duration::from_millis(150), "took {took:?}");
    // Thawed, the same connection serves again (the late reply was discarded).
    decision_within(
        "a decision after the thaw",
        Duration::from_secs(1),
        provider,
        p,
        subject(8),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_stuck_for_three_timeouts_is_replaced_and_then_unavailable() {
    let f = OnePolicy::start("stuck", AlgorithmKind::FixedWindow, 50, |s| {
        s.command_timeout = Duration::from_millis(100);
        s.connect_timeout = Duration::from_millis(300);
    })
    .await;
    let (provider, p) = (&f.provider, &f.policy);
    assert!(allowed(provider, p, subject(13)).await);
    f.server.pause();
    for i in 0..3 {
        let got = outcome(provider, p, subject(13)).await;
        assert!(
            matches!(got, RateLimitOutcome::Indeterminate { .. }),
            "timeout {i}: {got:?}"
        );
    }
    // Presumed stuck: nothing more is sent on it, and a new connection cannot complete its
    // handshake with a frozen server, so the honest answer is now "not connected".
    let started = Instant::now();
    let got = outcome(provider, p, subject(13)).await;
    assert!(
        matches!(
            got,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::Connect,
                ..
            }
        ),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(50));
    f.server.resume();
    decision_within(
        "a decision after the thaw",
        Duration::from_secs(2),
        provider,
        p,
        subject(13),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restarted_evaluations_succeed_again_within_a_second() {
    let mut f = OnePolicy::start("restarted", AlgorithmKind::Gcra, 50, |_| {}).await;
    assert!(allowed(&f.provider, &f.policy, subject(9)).await);
    f.server.restart();
    let d = eventually(
        "a decision after the restart",
        Duration::from_secs(1),
        POLL,
        async || match outcome(&f.provider, &f.policy, subject(9)).await {
            RateLimitOutcome::Evaluated(d) => Ok(d),
            failed @ (RateLimitOutcome::Unavailable { .. }
            | RateLimitOutcome::Indeterminate { .. }) => Err(failed),
            other => panic!("unexpected outcome while reconnecting: {other:?}"),
        },
    )
    .await;
    // The restarted server is empty: a fresh bucket.
    assert!(d.allowed && d.remaining == 49, "{d:?}");
    assert_eq!(f.provider.readiness().await, Readiness::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_bound_reached_is_unavailable_admission_and_sends_nothing() {
    let OnePolicy {
        server,
        policy: p,
        provider,
    } = OnePolicy::start("admission", AlgorithmKind::FixedWindow, 5, |s| {
        s.max_in_flight = 1;
    })
    .await;
    let provider = Arc::new(provider);
    assert!(allowed(&*provider, &p, subject(10)).await);
    server.pause();
    let first = tokio::spawn({
        let (provider, p) = (provider.clone(), p.clone());
        async move { outcome(&*provider, &p, subject(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let second = outcome(&*provider, &p, subject(11)).await;
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "admission must not wait"
    );
    server.resume();
    assert!(
        matches!(
            second,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::Admission,
                ..
            }
        ),
        "{second:?}"
    );
    assert!(matches!(
        first.await.expect("a task"),
        RateLimitOutcome::Evaluated(_)
    ));
    let key = provider.state_key(p.id(), &subject(11)).expect("a key");
    let n: i64 = query(&server, redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "the refused request reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_command_timeout_is_unavailable_deadline() {
    let f = OnePolicy::start("deadline", AlgorithmKind::TokenBucket, 5, |s| {
        s.command_timeout = Duration::from_millis(100);
    })
    .await;
    let (provider, p) = (&f.provider, &f.policy);
    let mut r = request(p, subject(12), 1);
    r.deadline = Deadline::within(Duration::from_millis(20)).expect("a valid deadline");
    assert!(matches!(
        provider.evaluate(r).await,
        Ok(RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Deadline,
            ..
        })
    ));
    let key = provider.state_key(p.id(), &subject(12)).expect("a key");
    let n: i64 = f.query(redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "nothing may be sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reply_within_the_command_timeout_is_a_decision() {
    // The driver has a response timeout of its own (500 ms by default); only the provider's
    // command_timeout may decide when a reply is too late.
    let OnePolicy {
        mut server,
        policy: p,
        provider,
    } = OnePolicy::start("slow", AlgorithmKind::TokenBucket, 5, |s| {
        s.command_timeout = Duration::from_secs(3);
    })
    .await;
    assert_eq!(provider.readiness().await, Readiness::Ready);
    server.pause();
    let started = Instant::now();
    let pending = tokio::spawn(async move { provider.evaluate(request(&p, subject(77), 1)).await });
    tokio::time::sleep(Duration::from_millis(900)).await;
    server.resume();
    let outcome = pending.await.expect("task").expect("valid request");
    assert!(
        matches!(&outcome, RateLimitOutcome::Evaluated(d) if d.allowed),
        "{outcome:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_millis(850));
    server.stop();
}
