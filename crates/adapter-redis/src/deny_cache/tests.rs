use std::time::{Duration, Instant};

use shared_contract::model::DenialBound;
use shared_contract::{Cost, RateLimitPolicy, Source, SubjectDigest};

use super::{DenyCache, Recorded, SHARDS, margin_ms};

fn policy(id: &str, revision: u32) -> RateLimitPolicy {
    RateLimitPolicy::fixed_window(id, 10)
        .per(Duration::from_secs(60))
        .revision(revision)
        .max_cost(10)
        .cleanup_grace(Duration::ZERO)
        .max_clock_regression(Duration::ZERO)
        .build()
        .expect("valid")
}

fn subject(n: u64) -> SubjectDigest {
    // Digests are keyed hashes: spread the test's subjects over all bytes as they would be.
    let mut bytes = [0u8; 32];
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (n >> 7);
    bytes[..8].copy_from_slice(&mixed.to_le_bytes());
    bytes[8..16].copy_from_slice(&n.to_le_bytes());
    SubjectDigest::from_bytes(bytes)
}

fn bound(cost: u64, retry_after_ms: u64) -> DenialBound {
    DenialBound {
        cost,
        retry_after_ms,
        limit: 10,
        remaining: cost - 1,
        reset_at_ms: 1_700_000_060_000,
    }
}

fn cost(c: u64) -> Cost {
    Cost::new(c).expect("cost")
}

#[test]
fn a_denial_answers_every_cost_as_large_until_its_margin_and_no_smaller_cost() {
    let (cache, p, s) = (DenyCache::new(1_000), policy("p", 1), subject(1));
    let t0 = Instant::now();
    assert_eq!(
        cache.record(&p, &s, bound(3, 10_000), t0, t0),
        Recorded::Added
    );
    let ends = t0 + Duration::from_millis(10_000 - margin_ms(10_000));
    assert_eq!(margin_ms(10_000), 11);
    let d = cache.lookup(&p, &s, cost(3), t0).expect("cached");
    assert!(!d.allowed);
    assert_eq!(
        (d.source, d.retry_after_ms),
        (Source::LocalCache, 10_000 - 11)
    );
    assert_eq!(
        (d.limit, d.remaining, d.reset_at_ms),
        (10, 2, 1_700_000_060_000)
    );
    assert_eq!((d.policy_id.as_str(), d.revision.get()), ("p", 1));
    let later = cache.lookup(&p, &s, cost(9), t0 + Duration::from_millis(4_000));
    assert_eq!(later.expect("cached").retry_after_ms, 10_000 - 11 - 4_000);
    assert!(
        cache.lookup(&p, &s, cost(2), t0).is_none(),
        "a smaller cost may fit"
    );
    let last = cache.lookup(&p, &s, cost(3), ends - Duration::from_micros(1_500));
    assert_eq!(last.expect("cached").retry_after_ms, 1);
    assert_eq!(cache.len(), 1);
    assert!(
        cache
            .lookup(&p, &s, cost(3), ends - Duration::from_micros(500))
            .is_none()
    );
    assert_eq!(cache.len(), 0, "an ended entry is cleared when read");
}

#[test]
fn another_policy_revision_or_subject_is_not_answered() {
    let cache = DenyCache::new(1_000);
    let t0 = Instant::now();
    cache.record(&policy("p", 1), &subject(1), bound(1, 5_000), t0, t0);
    assert!(
        cache
            .lookup(&policy("p", 2), &subject(1), cost(1), t0)
            .is_none()
    );
    assert!(
        cache
            .lookup(&policy("q", 1), &subject(1), cost(1), t0)
            .is_none()
    );
    assert!(
        cache
            .lookup(&policy("p", 1), &subject(2), cost(1), t0)
            .is_none()
    );
    assert!(
        cache
            .lookup(&policy("p", 1), &subject(1), cost(1), t0)
            .is_some()
    );
}

#[test]
fn a_bound_shorter_than_its_margin_or_already_over_is_not_kept() {
    let (cache, p, s) = (DenyCache::new(1_000), policy("p", 1), subject(1));
    let t0 = Instant::now();
    assert_eq!(cache.record(&p, &s, bound(1, 1), t0, t0), Recorded::Skipped);
    assert_eq!(cache.record(&p, &s, bound(1, 2), t0, t0), Recorded::Skipped);
    let late = t0 + Duration::from_millis(500);
    assert_eq!(
        cache.record(&p, &s, bound(1, 500), t0, late),
        Recorded::Skipped
    );
    assert_eq!(cache.record(&p, &s, bound(1, 3), t0, t0), Recorded::Added);
    assert!(cache.lookup(&p, &s, cost(1), t0).is_some());
}

#[test]
fn a_key_keeps_the_entry_that_covers_more() {
    let (cache, p, s) = (DenyCache::new(1_000), policy("p", 1), subject(1));
    let t0 = Instant::now();
    cache.record(&p, &s, bound(5, 10_000), t0, t0);
    // A larger cost covers fewer requests: the entry stays.
    assert_eq!(
        cache.record(&p, &s, bound(7, 20_000), t0, t0),
        Recorded::Merged
    );
    assert!(cache.lookup(&p, &s, cost(5), t0).is_some());
    // The same cost, ending later: taken.
    cache.record(&p, &s, bound(5, 20_000), t0, t0);
    let d = cache.lookup(&p, &s, cost(5), t0).expect("cached");
    assert_eq!(d.retry_after_ms, 20_000 - margin_ms(20_000));
    // A smaller cost: taken, though it ends sooner.
    cache.record(&p, &s, bound(2, 1_000), t0, t0);
    assert_eq!(
        cache
            .lookup(&p, &s, cost(2), t0)
            .expect("cached")
            .retry_after_ms,
        998
    );
    assert_eq!(cache.len(), 1);
    // An ended entry is replaced whatever its cost.
    let later = t0 + Duration::from_secs(2);
    cache.record(&p, &s, bound(9, 10_000), later, later);
    assert!(cache.lookup(&p, &s, cost(2), later).is_none());
    assert!(cache.lookup(&p, &s, cost(9), later).is_some());
}

#[test]
fn a_million_distinct_denied_keys_stay_within_the_bound() {
    let cache = DenyCache::new(100_000);
    let p = policy("p", 1);
    let t0 = Instant::now();
    let mut evicted = 0u64;
    for n in 0..1_000_000 {
        if cache.record(&p, &subject(n), bound(1, 60_000), t0, t0) == Recorded::Evicted {
            evicted += 1;
        }
        assert!(cache.len() <= cache.capacity());
    }
    assert_eq!(cache.capacity(), 100_000);
    assert_eq!(cache.len(), 100_000, "every set fills before it evicts");
    assert_eq!(cache.evictions(), evicted);
    assert_eq!(evicted, 900_000);
    let slots: usize = cache
        .shards
        .iter()
        .map(|s| super::lock(s).slots.len())
        .sum();
    assert_eq!(slots, cache.capacity(), "slots allocated once, never grown");
    // The latest keys are there; entries that were evicted answer nothing (Redis decides).
    assert!(cache.lookup(&p, &subject(999_999), cost(1), t0).is_some());
    let found = (0..1_000_000)
        .filter(|n| cache.lookup(&p, &subject(*n), cost(1), t0).is_some())
        .count();
    assert_eq!(found, 100_000);
}

#[test]
fn a_full_set_evicts_the_entry_that_ends_first() {
    // One set of 8 slots.
    let cache = DenyCache::new(8);
    assert_eq!(cache.capacity(), 8);
    let p = policy("p", 1);
    let t0 = Instant::now();
    for n in 0..8 {
        let retry = if n == 3 { 5_000 } else { 60_000 };
        assert_eq!(
            cache.record(&p, &subject(n), bound(1, retry), t0, t0),
            Recorded::Added
        );
    }
    assert_eq!(
        cache.record(&p, &subject(8), bound(1, 60_000), t0, t0),
        Recorded::Evicted
    );
    assert!(cache.lookup(&p, &subject(3), cost(1), t0).is_none());
    assert!(
        (0..9)
            .filter(|n| *n != 3)
            .all(|n| cache.lookup(&p, &subject(n), cost(1), t0).is_some())
    );
    assert_eq!((cache.len(), cache.evictions()), (8, 1));
}

#[test]
fn retain_drops_the_entries_of_policies_a_reload_changed() {
    let cache = DenyCache::new(1_000);
    let t0 = Instant::now();
    let (a, b) = (policy("a", 1), policy("b", 1));
    for n in 0..50 {
        cache.record(&a, &subject(n), bound(1, 60_000), t0, t0);
        cache.record(&b, &subject(n), bound(1, 60_000), t0, t0);
    }
    assert_eq!(cache.len(), 100);
    cache.retain(|id, _| id.as_str() == "b");
    assert_eq!(cache.len(), 50);
    assert!(cache.lookup(&a, &subject(1), cost(1), t0).is_none());
    assert!(cache.lookup(&b, &subject(1), cost(1), t0).is_some());
}

#[test]
fn forget_drops_one_keys_entry_after_a_refund() {
    let cache = DenyCache::new(1_000);
    let t0 = Instant::now();
    let (p, other) = (policy("p", 1), policy("q", 1));
    for n in 0..3 {
        cache.record(&p, &subject(n), bound(1, 60_000), t0, t0);
    }
    cache.record(&other, &subject(1), bound(1, 60_000), t0, t0);
    cache.forget(&p, &subject(1));
    assert!(cache.lookup(&p, &subject(1), cost(1), t0).is_none());
    assert!(cache.lookup(&p, &subject(2), cost(1), t0).is_some());
    assert!(cache.lookup(&other, &subject(1), cost(1), t0).is_some());
    assert_eq!(cache.len(), 3);
    cache.forget(&p, &subject(1));
    cache.forget(&policy("p", 2), &subject(2));
    assert_eq!(cache.len(), 3, "nothing else to forget");
}

#[test]
fn shards_hold_every_set_once() {
    for max in [1, 7, 8, 9, 511, 512, 513, 100_000] {
        let cache = DenyCache::new(max);
        let p = policy("p", 1);
        let t0 = Instant::now();
        for n in 0..(max as u64 * 4) {
            cache.record(&p, &subject(n), bound(1, 60_000), t0, t0);
        }
        let slots: usize = cache
            .shards
            .iter()
            .map(|s| super::lock(s).slots.len())
            .sum();
        assert_eq!(slots, cache.capacity(), "max {max}");
        assert!(
            cache.capacity() <= max && cache.capacity() > max - cache.ways,
            "max {max}"
        );
        assert_eq!(cache.len(), cache.capacity(), "max {max}");
    }
    assert_eq!(SHARDS, 64);
}

#[test]
fn concurrent_lookups_and_records_stay_consistent() {
    let cache = DenyCache::new(512);
    let p = policy("p", 1);
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (cache, p) = (&cache, &p);
            scope.spawn(move || {
                for n in 0..20_000u64 {
                    let s = subject((n * 4 + t) % 2_000);
                    if cache.lookup(p, &s, cost(1), t0).is_none() {
                        cache.record(p, &s, bound(1, 60_000), t0, t0);
                    }
                }
            });
        }
    });
    assert_eq!(cache.len(), cache.capacity());
    let found = (0..2_000)
        .filter(|n| cache.lookup(&p, &subject(*n), cost(1), t0).is_some())
        .count();
    assert_eq!(found, cache.len());
}

#[test]
fn entries_and_evictions_are_published_as_metrics() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let cache = metrics::with_local_recorder(&recorder, || DenyCache::new(8));
    let sample = |series: &str| -> Option<f64> {
        handle
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    let (p, t0) = (policy("p", 1), Instant::now());
    for n in 0..10 {
        cache.record(&p, &subject(n), bound(1, 60_000), t0, t0);
    }
    assert_eq!(sample("rate_limit_deny_cache_entries"), Some(8.0));
    assert_eq!(sample("rate_limit_deny_cache_evictions_total"), Some(2.0));
    cache.retain(|_, _| false);
    assert_eq!(sample("rate_limit_deny_cache_entries"), Some(0.0));
}

#[test]
fn a_multi_limit_evaluation_is_denied_by_any_covered_member_and_a_miss_answers_nothing() {
    let cache = DenyCache::new(1_000);
    let (a, b, c) = (policy("a", 1), policy("b", 1), policy("c", 1));
    let (s, t0) = (subject(1), Instant::now());
    cache.record(&b, &s, bound(1, 5_000), t0, t0);
    cache.record(&c, &s, bound(2, 9_000), t0, t0);
    let all = |p: &RateLimitPolicy| p.id().as_str() != "never";
    let ask = |costs: [u64; 3]| {
        let members = [
            (&a, &s, cost(costs[0])),
            (&b, &s, cost(costs[1])),
            (&c, &s, cost(costs[2])),
        ];
        cache.lookup_all(members.into_iter(), all, t0)
    };
    assert!(ask([1, 1, 1]).is_some_and(|d| !d.allowed), "b alone covers");
    let d = ask([1, 1, 2]).expect("denied from the cache");
    let shown: Vec<_> = d
        .decisions
        .iter()
        .map(|d| (d.policy_id.as_str().to_owned(), d.allowed, d.retry_after_ms))
        .collect();
    assert_eq!(
        shown,
        [
            ("a".to_owned(), true, 0),
            ("b".to_owned(), false, 5_000 - margin_ms(5_000)),
            ("c".to_owned(), false, 9_000 - margin_ms(9_000)),
        ],
        "a is not evaluated; b and c both answer their own denial"
    );
    assert!(d.decisions.iter().all(|d| d.source == Source::LocalCache));
    // c's entry covers cost 2 and more only, b's is not asked: no hit, nothing answered.
    let none = cache.lookup_all([(&a, &s, cost(1)), (&c, &s, cost(1))].into_iter(), all, t0);
    assert!(none.is_none());
    // A policy that does not cache is not looked up.
    let skip = |p: &RateLimitPolicy| p.id().as_str() != "b";
    assert!(
        cache
            .lookup_all([(&b, &s, cost(1))].into_iter(), skip, t0)
            .is_none()
    );
}
