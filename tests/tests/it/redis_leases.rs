//! Concurrency leases on the Redis provider against a real server: exact under contention
//! across two instances, releases that free exactly what they name, expiry on the server's
//! clock, and the leases key under the subject's hash tag with a TTL of its latest lease.
//!
//! Every test starts its own server, so they run in parallel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::conformance_leases::{acquire, deadline, lease, release};
use acceptance_tests::rate::{TestPolicy, subject};
use acceptance_tests::redis_provider::{connect, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::RedisProvider;
use shared_contract::{
    AcquireOutcome, AcquireRequest, AlgorithmKind, AlgorithmSpec, EdgeRateLimitPort, LeaseId,
    RateLimitPolicy, ReleaseOutcome, RequestError, SubjectDigest,
};

fn concurrency(id: &str, limit: u64, ttl: Duration) -> RateLimitPolicy {
    TestPolicy::new(
        id,
        AlgorithmSpec::Concurrency {
            limit,
            lease_ttl: ttl,
        },
    )
    .build()
}

/// `n` acquires at once, alternating between `a` and `b`: the leases acquired, and how
/// many were denied; any other outcome fails.
async fn wave(
    a: &Arc<RedisProvider>,
    b: &Arc<RedisProvider>,
    policy: &RateLimitPolicy,
    s: SubjectDigest,
    n: usize,
) -> (Vec<LeaseId>, usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let port = if i % 2 == 0 { a.clone() } else { b.clone() };
            let policy = policy.clone();
            tokio::spawn(async move { acquire(&*port, &policy, s).await })
        })
        .collect();
    let (mut leases, mut denied) = (Vec::new(), 0);
    for t in tasks {
        match t.await.expect("a task") {
            AcquireOutcome::Acquired(l) => leases.push(l.id),
            AcquireOutcome::Denied { .. } => denied += 1,
            other => panic!("neither a lease nor a denial: {other:?}"),
        }
    }
    (leases, denied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_concurrent_acquires_over_two_instances_hold_exactly_the_limit() {
    let server = RedisServer::start();
    let p = concurrency("jobs", 100, Duration::from_secs(120));
    // Two independent providers: two connections, as two service instances, each admitting
    // its 1,500 calls at once (the default `max_in_flight`, 1,024, would refuse some as
    // `Unavailable(admission)` when the machine is slow to drain them).
    let wide = || {
        let mut s = settings(&server);
        s.max_in_flight = 2_000;
        s
    };
    let a = Arc::new(connect(wide(), vec![p.clone()]).await);
    let b = Arc::new(connect(wide(), vec![p.clone()]).await);
    let s = subject(7);
    let key = a.state_key(p.id(), &s).expect("a key");
    let started = Instant::now();
    let (leases, denied) = wave(&a, &b, &p, s, 3_000).await;
    let acquire_took = started.elapsed();
    assert_eq!((leases.len(), denied), (100, 2_900));
    let held: u64 = query(&server, redis::cmd("ZCARD").arg(&key));
    assert_eq!(
        held, 100,
        "the sorted set holds exactly the leases answered"
    );
    // Every lease released, half through each instance: each frees exactly its place.
    let started = Instant::now();
    let releases: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let port = if i % 2 == 0 { b.clone() } else { a.clone() };
            let l = l.clone();
            tokio::spawn(async move { release(&*port, &l).await })
        })
        .collect();
    for r in releases {
        assert_eq!(r.await.expect("a task"), ReleaseOutcome::Released);
    }
    let release_took = started.elapsed();
    let held: u64 = query(&server, redis::cmd("ZCARD").arg(&key));
    assert_eq!(held, 0);
    // The freed places are usable again, exactly as many.
    let (again, denied) = wave(&a, &b, &p, s, 3_000).await;
    assert_eq!((again.len(), denied), (100, 2_900));
    eprintln!(
        "3000 concurrent acquires over two instances: {acquire_took:?}; 100 releases: {release_took:?}"
    );
    assert!(
        acquire_took < Duration::from_secs(30) && release_took < Duration::from_secs(10),
        "bounded in time: {acquire_took:?}, {release_took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_releases_are_answered_and_free_no_other_lease() {
    let server = RedisServer::start();
    let p = concurrency("jobs", 2, Duration::from_millis(1_500));
    let provider = connect(settings(&server), vec![p.clone()]).await;
    let s = subject(8);
    let first = lease(acquire(&provider, &p, s).await);
    assert_eq!(release(&provider, &first).await, ReleaseOutcome::Released);
    assert_eq!(
        release(&provider, &first).await,
        ReleaseOutcome::NotHeld,
        "released twice"
    );
    let a = lease(acquire(&provider, &p, s).await);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let b = lease(acquire(&provider, &p, s).await);
    // The same token under another subject names nothing of this subject.
    let forged = LeaseId {
        subject: subject(9),
        ..b.clone()
    };
    assert_eq!(release(&provider, &forged).await, ReleaseOutcome::NotHeld);
    assert!(
        matches!(
            acquire(&provider, &p, s).await,
            AcquireOutcome::Denied { .. }
        ),
        "a and b still hold both places"
    );
    // a has expired (1.5 s after its acquire), b has not (0.8 s later).
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        release(&provider, &a).await,
        ReleaseOutcome::Expired,
        "after expiry"
    );
    assert_eq!(release(&provider, &b).await, ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_key_shares_the_subjects_tag_and_expires_with_its_latest_lease() {
    let server = RedisServer::start();
    let p = concurrency("jobs", 3, Duration::from_secs(30));
    let rate = TestPolicy::of(
        "api",
        AlgorithmKind::FixedWindow,
        5,
        Duration::from_secs(60),
    )
    .build();
    let provider = connect(settings(&server), vec![p.clone(), rate.clone()]).await;
    let s = subject(10);
    lease(acquire(&provider, &p, s).await);
    let key = provider.state_key(p.id(), &s).expect("a key");
    let rate_key = provider.state_key(rate.id(), &s).expect("a key");
    let tag = |k: &str| k.split_once('}').map(|(t, _)| t.to_owned());
    assert_eq!(tag(&key), tag(&rate_key), "one slot per subject");
    let kind: String = query(&server, redis::cmd("TYPE").arg(&key));
    assert_eq!(kind, "zset");
    let pttl: i64 = query(&server, redis::cmd("PTTL").arg(&key));
    assert!((29_000..=30_000).contains(&pttl), "PTTL {pttl}");
    // Each kind of policy refuses the other's calls; nothing is taken.
    let wrong = provider
        .acquire_lease(AcquireRequest {
            policy_id: rate.id().clone(),
            subject: s,
            deadline: deadline(),
        })
        .await;
    assert!(matches!(
        wrong,
        Err(RequestError::NotConcurrencyPolicy { .. })
    ));
    let evaluated = provider
        .evaluate(acceptance_tests::rate::request(&p, s, 1))
        .await;
    assert!(matches!(
        evaluated,
        Err(RequestError::ConcurrencyPolicy { .. })
    ));
    let held: u64 = query(&server, redis::cmd("ZCARD").arg(&key));
    assert_eq!(held, 1);
}
