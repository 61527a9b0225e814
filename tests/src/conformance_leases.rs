//! The conformance suite of concurrency leases, written once and run on every provider
//! (local, standalone Redis, Sentinel, cluster) through [`Target`]: at most `limit` leases
//! held, a release frees exactly the lease it names, bad releases are answered and free
//! nothing, concurrent acquires hold exactly the limit, and expired leases are reclaimed by
//! the provider's clock.
//!
//! ```text
//! acceptance_tests::lease_conformance_tests!(LocalTarget::new());
//! ```

use std::sync::Arc;
use std::time::Duration;

use shared_contract::{
    AcquireOutcome, AcquireRequest, AlgorithmSpec, Deadline, EdgeRateLimitPort, LeaseId,
    RateLimitPolicy, ReleaseOutcome, ReleaseRequest, RequestError, SubjectDigest,
};

use crate::conformance::{Target, fresh_policy_id};
use crate::rate::{TestPolicy, fresh_subject, policy_set};

/// Expands to one `#[tokio::test]` per lease case; `$target` must implement [`Target`].
#[macro_export]
macro_rules! lease_conformance_tests {
    ($target:expr) => {
        $crate::lease_conformance_tests!(@cases $target;
            at_most_limit_leases_and_a_release_frees_a_place,
            bad_releases_are_answered_and_free_nothing,
            concurrent_acquires_hold_exactly_the_limit,
            expired_leases_are_reclaimed_by_the_providers_clock
        );
    };
    (@cases $target:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let target = $target;
                $crate::conformance_leases::$case(&target).await;
            }
        )*
    };
}

fn concurrency(limit: u64, ttl_ms: u64) -> RateLimitPolicy {
    TestPolicy::with_id(
        fresh_policy_id("concurrency"),
        AlgorithmSpec::Concurrency {
            limit,
            lease_ttl: Duration::from_millis(ttl_ms),
        },
    )
    .build()
}

/// A deadline generous enough for a loaded machine.
pub fn deadline() -> Deadline {
    Deadline::within(Duration::from_secs(10)).expect("valid deadline")
}

/// One acquire of `policy` for `s`.
///
/// # Panics
/// When the port refuses the request.
pub async fn acquire(
    p: &dyn EdgeRateLimitPort,
    policy: &RateLimitPolicy,
    s: SubjectDigest,
) -> AcquireOutcome {
    p.acquire_lease(AcquireRequest {
        policy_id: policy.id().clone(),
        subject: s,
        deadline: deadline(),
    })
    .await
    .expect("a concurrency policy")
}

/// One release of `lease`.
///
/// # Panics
/// When the port refuses the request.
pub async fn release(p: &dyn EdgeRateLimitPort, lease: &LeaseId) -> ReleaseOutcome {
    p.release_lease(ReleaseRequest {
        lease: lease.clone(),
        deadline: deadline(),
    })
    .await
    .expect("a concurrency policy")
}

/// The lease of an acquire that must have succeeded.
///
/// # Panics
/// For any other outcome.
pub fn lease(o: AcquireOutcome) -> LeaseId {
    match o {
        AcquireOutcome::Acquired(l) => l.id,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn is_denied(o: &AcquireOutcome) -> bool {
    matches!(o, AcquireOutcome::Denied { .. })
}

pub async fn at_most_limit_leases_and_a_release_frees_a_place(target: &dyn Target) {
    let policy = concurrency(3, 60_000);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let mut held = Vec::new();
    for i in 0..3u64 {
        match acquire(&*p, &policy, s).await {
            AcquireOutcome::Acquired(l) => {
                assert_eq!((l.limit, l.remaining, l.ttl_ms), (3, 2 - i, 60_000));
                assert_eq!(l.source, target.source());
                held.push(l.id);
            }
            other => panic!("place {i} is free: {other:?}"),
        }
    }
    match acquire(&*p, &policy, s).await {
        AcquireOutcome::Denied {
            limit,
            retry_after_ms,
            ..
        } => assert!(limit == 3 && (1..=60_000).contains(&retry_after_ms)),
        other => panic!("all places held: {other:?}"),
    }
    // Another subject has its own places.
    lease(acquire(&*p, &policy, fresh_subject()).await);
    assert_eq!(release(&*p, &held[1]).await, ReleaseOutcome::Released);
    lease(acquire(&*p, &policy, s).await);
    assert!(is_denied(&acquire(&*p, &policy, s).await));
}

pub async fn bad_releases_are_answered_and_free_nothing(target: &dyn Target) {
    let policy = concurrency(2, 60_000);
    let rate = TestPolicy::with_id(
        fresh_policy_id("rate"),
        AlgorithmSpec::FixedWindow {
            limit: 5,
            window: Duration::from_secs(60),
        },
    )
    .build();
    let p = target
        .provider(policy_set(vec![policy.clone(), rate.clone()]))
        .await;
    let s = fresh_subject();
    let a = lease(acquire(&*p, &policy, s).await);
    let b = lease(acquire(&*p, &policy, s).await);
    assert_eq!(release(&*p, &a).await, ReleaseOutcome::Released);
    assert_eq!(release(&*p, &a).await, ReleaseOutcome::NotHeld, "twice");
    let forged = LeaseId {
        subject: fresh_subject(),
        ..b.clone()
    };
    assert_eq!(release(&*p, &forged).await, ReleaseOutcome::NotHeld);
    let on_rate = LeaseId {
        policy_id: rate.id().clone(),
        ..b.clone()
    };
    let refused = p
        .release_lease(ReleaseRequest {
            lease: on_rate,
            deadline: deadline(),
        })
        .await;
    assert!(matches!(
        refused,
        Err(RequestError::NotConcurrencyPolicy { .. })
    ));
    // b is still held: exactly one place is free.
    lease(acquire(&*p, &policy, s).await);
    assert!(is_denied(&acquire(&*p, &policy, s).await));
}

pub async fn concurrent_acquires_hold_exactly_the_limit(target: &dyn Target) {
    let policy = concurrency(10, 60_000);
    let p: Arc<dyn EdgeRateLimitPort> = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let (p, policy) = (p.clone(), policy.clone());
            tokio::spawn(async move { acquire(&*p, &policy, s).await })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        match t.await.expect("a task") {
            AcquireOutcome::Acquired(_) => acquired += 1,
            AcquireOutcome::Denied { .. } => {}
            other => panic!("neither a lease nor a denial: {other:?}"),
        }
    }
    assert_eq!(acquired, 10);
}

pub async fn expired_leases_are_reclaimed_by_the_providers_clock(target: &dyn Target) {
    let ttl = 400;
    let policy = concurrency(1, ttl);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let crashed = lease(acquire(&*p, &policy, s).await);
    if target.exact_time() {
        target.advance(ttl - 1).await;
        assert!(
            is_denied(&acquire(&*p, &policy, s).await),
            "1 ms before expiry"
        );
        target.advance(1).await;
    } else {
        assert!(is_denied(&acquire(&*p, &policy, s).await));
        target.advance(ttl + 50).await;
    }
    let next = lease(acquire(&*p, &policy, s).await);
    // The crashed holder's lease is gone: releasing it frees nothing (expired or reclaimed).
    assert!(matches!(
        release(&*p, &crashed).await,
        ReleaseOutcome::Expired | ReleaseOutcome::NotHeld
    ));
    assert!(
        is_denied(&acquire(&*p, &policy, s).await),
        "next still holds it"
    );
    assert_eq!(release(&*p, &next).await, ReleaseOutcome::Released);
}
