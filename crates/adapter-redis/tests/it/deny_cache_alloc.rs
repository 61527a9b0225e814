//! A deny-cache hit and a miss allocate nothing: counted per thread by `allocation-counter`'s
//! global allocator (so the other tests of this binary, on other threads, count nowhere here).

use std::time::{Duration, Instant};

use adapter_redis::deny_cache::DenyCache;
use shared_contract::model::DenialBound;
use shared_contract::{
    AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
    SubjectDigest,
};

#[test]
fn a_hit_and_a_miss_allocate_nothing() {
    let policy = RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("p").expect("id"),
        revision: PolicyRevision::new(1).expect("revision"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: 5,
            window: Duration::from_secs(60),
        },
        max_cost: 5,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid");
    let cache = DenyCache::new(1_000);
    let (hot, cold) = (
        SubjectDigest::from_bytes([7; 32]),
        SubjectDigest::from_bytes([9; 32]),
    );
    let now = Instant::now();
    let bound = DenialBound {
        cost: 1,
        retry_after_ms: 30_000,
        limit: 5,
        remaining: 0,
        reset_at_ms: 1_700_000_030_000,
    };
    cache.record(&policy, &hot, bound, now, now);
    let cost = Cost::new(2).expect("cost");
    let mut answered = 0;
    let counted = allocation_counter::measure(|| {
        for _ in 0..1_000 {
            let hit = cache.lookup(&policy, &hot, cost, now);
            answered += usize::from(hit.is_some_and(|d| !d.allowed));
            answered += usize::from(cache.lookup(&policy, &cold, cost, now).is_none());
        }
    });
    assert_eq!(answered, 2_000);
    assert_eq!(
        counted.count_total, 0,
        "allocations in 1,000 hits and misses"
    );
    // The counter counts (so the zero above can fail): a first record allocates its shard.
    let first = allocation_counter::measure(|| {
        let other = DenyCache::new(1_000);
        other.record(&policy, &hot, bound, now, now);
    });
    assert!(first.count_total > 0);
}
