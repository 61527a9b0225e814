//! Batched decisions through the Redis provider (`batch_max`), on private servers: requests
//! ready at once (after the first, which finds nothing else in flight) leave as one call of
//! the batch program and are decided exactly as single calls in that order would be; concurrent load admits exactly the limit; a batch that gets
//! no reply makes every member `Indeterminate`, never an allow; `batch_max = 1` never sends
//! the batch program. The cluster case (one batch per slot) is in `cluster_provider.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::rate::{TestPolicy, request, subject};
use acceptance_tests::redis_provider::{connect, daily_policy, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{BatchStats, RedisProvider};
use futures::future::join_all;
use shared_contract::{
    AlgorithmKind, EdgeRateLimitPort, RateLimitOutcome, RateLimitPolicy, SubjectDigest,
};

/// `(subject, cost)` of a burst: two subjects interleaved, costs that cross the limit of 10
/// part-way, so later members see what earlier ones charged (and a denial charges nothing).
const BURST: [(u8, u64); 12] = [
    (1, 3),
    (2, 4),
    (1, 4),
    (1, 4),
    (2, 4),
    (1, 2),
    (2, 3),
    (1, 1),
    (2, 1),
    (1, 1),
    (2, 1),
    (1, 1),
];

/// What single calls in `BURST` order decide on a fresh daily policy of limit 10 (nothing
/// refills or rolls over within a test): allowed and remaining per member.
fn sequential(burst: &[(u8, u64)]) -> Vec<(bool, u64)> {
    let mut used = [0u64; 256];
    burst
        .iter()
        .map(|&(s, cost)| {
            let u = &mut used[usize::from(s)];
            if *u + cost <= 10 {
                *u += cost;
                (true, 10 - *u)
            } else {
                (false, 10 - *u)
            }
        })
        .collect()
}

/// A daily policy of `kind` admitting 10, at most 4 per request.
fn policy(id: &str, kind: AlgorithmKind) -> RateLimitPolicy {
    TestPolicy::of(id, kind, 10, Duration::from_secs(86_400))
        .max_cost(4)
        .max_clock_regression(Duration::from_secs(2))
        .build()
}

/// Runs `BURST` with the subjects `base + s`, fresh per run so runs do not share state.
async fn burst(provider: &RedisProvider, policy: &RateLimitPolicy, kind: AlgorithmKind, base: u8) {
    let subject = |s: u8| -> SubjectDigest { subject(base + s) };
    let calls = BURST
        .iter()
        .map(|&(s, cost)| provider.evaluate(request(policy, subject(s), cost)));
    // `join_all` polls every call once before any of them runs again: they are all ready
    // at the same moment, in this order.
    let outcomes = join_all(calls).await;
    let got: Vec<(bool, u64)> = outcomes
        .into_iter()
        .map(|o| match o.expect("a valid request") {
            RateLimitOutcome::Evaluated(d) => (d.allowed, d.remaining),
            other => panic!("{kind}: expected a decision, got {other:?}"),
        })
        .collect();
    assert_eq!(got, sequential(&BURST), "{kind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_ready_at_once_is_one_batch_decided_in_order_for_every_algorithm() {
    let server = RedisServer::start();
    for (i, kind) in (0u8..).zip(AlgorithmKind::RATE) {
        let policy = policy("burst", kind);
        let provider = connect(settings(&server), vec![policy.clone()]).await;
        let before = provider.batch_stats();
        burst(&provider, &policy, kind, 16 * i).await;
        let after = provider.batch_stats();
        // The first goes alone (nothing else is in flight when it starts), the rest join
        // one batch behind it on the same connection.
        assert_eq!(
            (after.calls - before.calls, after.members - before.members),
            (1, BURST.len() as u64 - 1),
            "{kind}: one batch call of every member after the first"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_load_admits_exactly_the_limit_in_batches() {
    let server = RedisServer::start();
    let policy = daily_policy("load", AlgorithmKind::FixedWindow, 1, 100);
    let provider = Arc::new(connect(settings(&server), vec![policy.clone()]).await);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (provider, policy) = (provider.clone(), policy.clone());
            tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..40 {
                    match provider.evaluate(request(&policy, subject(200), 1)).await {
                        Ok(RateLimitOutcome::Evaluated(d)) => allowed += u64::from(d.allowed),
                        other => panic!("expected a decision, got {other:?}"),
                    }
                }
                allowed
            })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.expect("task");
    }
    assert_eq!(allowed, 100, "320 requests on a limit of 100");
    let BatchStats { calls, members } = provider.batch_stats();
    assert!(
        calls > 0 && members > calls,
        "no batches formed: {calls} calls of {members} members"
    );
    eprintln!("{calls} batch calls of {members} members (of 320 requests)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_max_one_sends_every_decision_alone() {
    let server = RedisServer::start();
    let policy = policy("alone", AlgorithmKind::TokenBucket);
    let mut s = settings(&server);
    s.batch_max = 1;
    let provider = connect(s, vec![policy.clone()]).await;
    burst(&provider, &policy, AlgorithmKind::TokenBucket, 0).await;
    assert_eq!(provider.batch_stats(), BatchStats::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_without_a_reply_is_indeterminate_for_every_member() {
    let timeout = Duration::from_millis(200);
    let server = RedisServer::start();
    let policy = daily_policy("frozen", AlgorithmKind::SlidingLog, 1, 100);
    let mut s = settings(&server);
    s.command_timeout = timeout;
    let provider = connect(s, vec![policy.clone()]).await;
    server.pause();
    let started = Instant::now();
    let calls = (0..6u8).map(|i| provider.evaluate(request(&policy, subject(i % 2), 1)));
    let outcomes = join_all(calls).await;
    let took = started.elapsed();
    server.resume();
    for o in outcomes {
        let o = o.expect("a valid request");
        assert!(
            matches!(o, RateLimitOutcome::Indeterminate { .. }),
            "expected Indeterminate, got {o:?}"
        );
    }
    assert!(took >= timeout, "answered before the timeout: {took:?}");
    assert_eq!(provider.batch_stats().calls, 1);
}
