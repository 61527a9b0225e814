//! The conformance suite of charges after the work ([`EdgeRateLimitPort::charge`], Envoy's
//! stream-done call of a rule with `charge = "after"`), written once and run on every
//! provider that charges through [`Target`]: a check charges nothing; a charge is never
//! denied and overdraws the policy past its limit, on every algorithm that takes
//! reservations; the charges of one request are written together, also when a check of it
//! denies; bad input charges nothing.
//!
//! The policies refill one token a day, or count windows of months or decades, so that a
//! real clock moves their figures by nothing during a test.
//!
//! ```text
//! acceptance_tests::charge_conformance_tests!(LocalTarget::new());
//! ```

use std::time::Duration;

use shared_contract::{
    AlgorithmSpec, ChargeLimit, ChargeOutcome, ChargeRequest, EdgeRateLimitPort, Outcome,
    RateLimitPolicy, RequestError, SubjectDigest,
};

use crate::conformance::{Target, fresh_policy_id};
use crate::conformance_leases::deadline;
use crate::conformance_reservations::{bucket, remaining, sliding_log};
use crate::rate::{TestPolicy, fresh_subject, policy_set};

/// Expands to one `#[tokio::test]` per charge case; `$target` must implement [`Target`].
#[macro_export]
macro_rules! charge_conformance_tests {
    ($target:expr) => {
        $crate::charge_conformance_tests!(@cases $target;
            charges_after_the_work_are_never_denied,
            every_algorithm_overdraws_and_its_checks_deny,
            a_requests_charges_stick_when_its_check_denies
        );
    };
    (@cases $target:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let target = $target;
                $crate::conformance_charges::$case(&target).await;
            }
        )*
    };
}

/// Checks (cost 0) and charges (cost above 0) of `(policy, subject, cost)`.
///
/// # Errors
/// What the port refuses.
pub async fn charge(
    p: &dyn EdgeRateLimitPort,
    limits: &[(&RateLimitPolicy, SubjectDigest, u64)],
) -> Result<ChargeOutcome, RequestError> {
    let limits = limits
        .iter()
        .map(|(policy, subject, cost)| ChargeLimit {
            policy_id: policy.id().clone(),
            subject: *subject,
            cost: *cost,
        })
        .collect();
    p.charge(ChargeRequest {
        limits,
        deadline: deadline(),
    })
    .await
}

/// Whether the request was admitted, and each limit's `(allowed, remaining)`.
fn figures(o: &ChargeOutcome) -> (bool, Vec<(bool, u64)>) {
    match o {
        Outcome::Evaluated(d) => (
            d.allowed,
            d.decisions
                .iter()
                .map(|d| (d.allowed, d.remaining))
                .collect(),
        ),
        other => panic!("expected decisions, got {other:?}"),
    }
}

pub async fn charges_after_the_work_are_never_denied(target: &dyn Target) {
    let policy = bucket(100);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let left = |o: &ChargeOutcome| {
        let (allowed, limits) = figures(o);
        (allowed, limits[0].1)
    };
    // A check charges nothing.
    let check = charge(&*p, &[(&policy, s, 0)]).await.expect("valid");
    assert_eq!(left(&check), (true, 99), "a cost of 1 would leave 99");
    assert_eq!(
        left(&charge(&*p, &[(&policy, s, 70)]).await.expect("valid")),
        (true, 30)
    );
    // 70 more than the 30 left: charged anyway, 40 owed.
    assert_eq!(
        left(&charge(&*p, &[(&policy, s, 70)]).await.expect("valid")),
        (true, 0)
    );
    assert_eq!(
        left(&charge(&*p, &[(&policy, s, 0)]).await.expect("valid")),
        (false, 0)
    );
    assert_eq!(remaining(&*p, &policy, s).await, 0);
    let log = sliding_log();
    let p = target
        .provider(policy_set(vec![policy.clone(), log.clone()]))
        .await;
    let refused = charge(&*p, &[(&log, s, 1)]).await;
    assert!(
        matches!(refused, Err(RequestError::ReservationUnsupported { .. })),
        "{refused:?}"
    );
    let twice = charge(&*p, &[(&policy, s, 1), (&policy, s, 2)]).await;
    assert!(
        matches!(twice, Err(RequestError::DuplicateLimit { .. })),
        "{twice:?}"
    );
    let above = charge(&*p, &[(&policy, s, 101)]).await;
    assert!(
        matches!(above, Err(RequestError::CostAboveMax { .. })),
        "{above:?}"
    );
}

/// A policy of `spec` with a fresh id and a max cost of 10.
fn ten(name: &str, spec: AlgorithmSpec) -> RateLimitPolicy {
    TestPolicy::with_id(fresh_policy_id(name), spec)
        .max_cost(10)
        .build()
}

/// One policy of each algorithm that takes reservations, each admitting 10.
fn every_algorithm() -> Vec<RateLimitPolicy> {
    // Epoch-aligned windows of 34 years (fixed) and 104 days (sliding, its longest): no
    // window ends during a test but by a vanishing chance.
    vec![
        ten(
            "fixed",
            AlgorithmSpec::FixedWindow {
                limit: 10,
                window: Duration::from_millis((1 << 40) - 1),
            },
        ),
        ten(
            "sliding",
            AlgorithmSpec::SlidingWindow {
                limit: 10,
                window: Duration::from_millis(9_000_000_000),
            },
        ),
        bucket(10),
        ten(
            "gcra",
            AlgorithmSpec::Gcra {
                limit: 1,
                period: Duration::from_secs(86_400),
                burst: 10,
            },
        ),
    ]
}

pub async fn every_algorithm_overdraws_and_its_checks_deny(target: &dyn Target) {
    let policies = every_algorithm();
    let p = target.provider(policy_set(policies.clone())).await;
    let s = fresh_subject();
    let all = |cost| -> Vec<(&RateLimitPolicy, SubjectDigest, u64)> {
        policies.iter().map(|p| (p, s, cost)).collect()
    };
    let first = charge(&*p, &all(7)).await.expect("valid");
    assert_eq!(figures(&first), (true, vec![(true, 3); 4]));
    // 7 more than the 3 left: every policy charged past its limit, none denied.
    let second = charge(&*p, &all(7)).await.expect("valid");
    assert_eq!(figures(&second), (true, vec![(true, 0); 4]));
    let checks = charge(&*p, &all(0)).await.expect("valid");
    assert_eq!(figures(&checks), (false, vec![(false, 0); 4]));
    for policy in &policies {
        assert_eq!(remaining(&*p, policy, s).await, 0, "{}", policy.id());
    }
}

pub async fn a_requests_charges_stick_when_its_check_denies(target: &dyn Target) {
    let (spent, other) = (bucket(5), bucket(10));
    let p = target
        .provider(policy_set(vec![spent.clone(), other.clone()]))
        .await;
    let s = fresh_subject();
    let overdrawn = charge(&*p, &[(&spent, s, 5)]).await.expect("valid");
    assert_eq!(figures(&overdrawn), (true, vec![(true, 0)]));
    let mixed = charge(&*p, &[(&spent, s, 0), (&other, s, 3)])
        .await
        .expect("valid");
    assert_eq!(figures(&mixed), (false, vec![(false, 0), (true, 7)]));
    assert_eq!(remaining(&*p, &other, s).await, 7, "the charge stuck");
    assert_eq!(
        remaining(&*p, &spent, s).await,
        0,
        "the check charged nothing"
    );
}
