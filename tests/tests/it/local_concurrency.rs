//! The local provider under real parallelism: OS threads released together by a barrier all
//! hammer one key, so the key-level lock is contended on every call.

use std::sync::{Arc, Barrier};

use acceptance_tests::conformance::policy;
use acceptance_tests::rate::{fresh_subject, policy_set, request};
use adapter_local::{LocalProvider, LocalSettings};
use shared_contract::{AlgorithmKind, RateLimitOutcome, SystemClock};

#[test]
fn eight_threads_of_a_thousand_requests_on_one_key_admit_exactly_the_limit() {
    let (threads, per_thread, limit) = (8u64, 1_000u64, 1_000u64);
    for kind in AlgorithmKind::RATE {
        let p = policy(kind, 1, limit, 3_600_000, 1);
        let provider = Arc::new(LocalProvider::new(
            policy_set(vec![p.clone()]),
            Arc::new(SystemClock),
            LocalSettings::default(),
        ));
        let subject = fresh_subject();
        let barrier = Arc::new(Barrier::new(threads as usize));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (provider, barrier, p) =
                    (Arc::clone(&provider), Arc::clone(&barrier), p.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut allowed = 0u64;
                    for _ in 0..per_thread {
                        match provider.evaluate_now(&request(&p, subject, 1)) {
                            Ok(RateLimitOutcome::Evaluated(d)) if d.allowed => allowed += 1,
                            Ok(RateLimitOutcome::Evaluated(_)) => {}
                            other => panic!("{kind}: unexpected outcome {other:?}"),
                        }
                    }
                    allowed
                })
            })
            .collect();
        let allowed: u64 = handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread"))
            .sum();
        assert_eq!(
            allowed,
            limit,
            "{kind}: {allowed} of {} admitted",
            threads * per_thread
        );
    }
}

#[test]
fn many_keys_under_eviction_pressure_never_exceed_max_keys() {
    let p = policy(AlgorithmKind::TokenBucket, 1, 5, 60_000, 1);
    let provider = Arc::new(LocalProvider::new(
        policy_set(vec![p.clone()]),
        Arc::new(SystemClock),
        LocalSettings { max_keys: 1_000 },
    ));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (provider, p) = (Arc::clone(&provider), p.clone());
            std::thread::spawn(move || {
                for _ in 0..5_000 {
                    let outcome = provider.evaluate_now(&request(&p, fresh_subject(), 1));
                    assert!(
                        matches!(outcome, Ok(RateLimitOutcome::Evaluated(ref d)) if d.allowed),
                        "a fresh key is admitted: {outcome:?}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a worker thread");
    }
    let held = provider.stored_keys();
    assert!(held <= 1_000, "{held} keys held, bound 1000");
    // The bound is on keys, not a silent refusal to store anything.
    assert!(held > 0);
}
