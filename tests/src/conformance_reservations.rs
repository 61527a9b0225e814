//! The conformance suite of reservations (a cost settled after the work), written once and
//! run on every provider that keeps reservations through [`Target`]: a settlement charges the
//! actual cost, above the estimate into an overdraft; settle and cancel charge once however
//! often they are retried; unknown, expired, cancelled and settled reservations are named; a
//! reservation of several policies is all or nothing; bad input charges nothing.
//!
//! The policies refill one token a day, so that a real clock moves their figures by less than
//! one token during a test.
//!
//! ```text
//! acceptance_tests::reservation_conformance_tests!(LocalTarget::new());
//! ```

use std::time::Duration;

use shared_contract::multi::{Limit, Limits};
use shared_contract::reservation::ReservationTtl;
use shared_contract::{
    AlgorithmSpec, CancelRequest, Cancelled, Cost, EdgeRateLimitPort, LeaseToken, Outcome,
    RateLimitPolicy, RequestError, ReservationError, ReservationId, ReserveOutcome, ReserveRequest,
    Reserved, SettleOutcome, SettleRequest, Settled, SubjectDigest,
};

use crate::conformance::{Target, fresh_policy_id};
use crate::conformance_leases::deadline;
use crate::rate::{TestPolicy, fresh_subject, policy_set, request};

/// Expands to one `#[tokio::test]` per reservation case; `$target` must implement [`Target`].
#[macro_export]
macro_rules! reservation_conformance_tests {
    ($target:expr) => {
        $crate::reservation_conformance_tests!(@cases $target;
            a_settlement_charges_the_actual_cost,
            a_settlement_above_the_estimate_overdraws,
            settle_and_cancel_charge_once,
            unknown_and_expired_reservations_are_named,
            several_policies_are_reserved_all_or_nothing,
            bad_input_charges_nothing
        );
    };
    (@cases $target:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let target = $target;
                $crate::conformance_reservations::$case(&target).await;
            }
        )*
    };
}

const DAY_MS: u64 = 86_400_000;

/// A bucket of `capacity` tokens refilled one a day.
pub(crate) fn bucket(capacity: u64) -> RateLimitPolicy {
    TestPolicy::with_id(
        fresh_policy_id("tokens"),
        AlgorithmSpec::TokenBucket {
            capacity,
            refill_amount: 1,
            refill_interval: Duration::from_millis(DAY_MS),
        },
    )
    .max_cost(capacity)
    .build()
}

/// A sliding-log policy, which takes no reservations.
pub(crate) fn sliding_log() -> RateLimitPolicy {
    TestPolicy::with_id(
        fresh_policy_id("log"),
        AlgorithmSpec::SlidingLog {
            limit: 10,
            window: Duration::from_secs(60),
        },
    )
    .build()
}

/// One reservation of `estimate` per `(policy, subject)`, live `ttl_ms`.
///
/// # Panics
/// When the port refuses the request.
pub async fn reserve(
    p: &dyn EdgeRateLimitPort,
    limits: &[(&RateLimitPolicy, SubjectDigest, u64)],
    ttl_ms: u64,
) -> ReserveOutcome {
    try_reserve(p, limits, ttl_ms)
        .await
        .expect("a valid reservation")
}

/// [`reserve`], answering what the port refuses.
///
/// # Errors
/// What the port refuses.
pub async fn try_reserve(
    p: &dyn EdgeRateLimitPort,
    limits: &[(&RateLimitPolicy, SubjectDigest, u64)],
    ttl_ms: u64,
) -> Result<ReserveOutcome, RequestError> {
    let limits = limits
        .iter()
        .map(|(policy, subject, estimate)| Limit {
            policy_id: policy.id().clone(),
            subject: *subject,
            cost: Cost::new(*estimate).expect("an estimate of at least 1"),
        })
        .collect();
    p.reserve(ReserveRequest {
        limits: Limits::new(limits).expect("valid limits"),
        ttl: ReservationTtl::from_millis(ttl_ms).expect("a valid ttl"),
        deadline: deadline(),
    })
    .await
}

/// The reservation an admitted reserve answered.
///
/// # Panics
/// For any other outcome.
pub fn reserved(o: ReserveOutcome) -> ReservationId {
    match o {
        Outcome::Evaluated(Reserved {
            id: Some(id),
            decision,
            ..
        }) if decision.allowed => id,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// # Panics
/// When the port refuses the request.
pub async fn settle(p: &dyn EdgeRateLimitPort, id: ReservationId, actual: &[u64]) -> SettleOutcome {
    p.settle(SettleRequest {
        id,
        actual: actual.to_vec(),
        deadline: deadline(),
    })
    .await
    .expect("the port keeps reservations")
}

/// # Panics
/// When the port refuses the request.
pub async fn cancel(
    p: &dyn EdgeRateLimitPort,
    id: ReservationId,
) -> Outcome<Result<Cancelled, ReservationError>> {
    p.cancel(CancelRequest {
        id,
        deadline: deadline(),
    })
    .await
    .expect("the port keeps reservations")
}

/// The settlement a settle answered.
///
/// # Panics
/// For any other outcome.
pub fn settled(o: SettleOutcome) -> Settled {
    match o {
        Outcome::Evaluated(Ok(s)) => s,
        other => panic!("expected a settlement, got {other:?}"),
    }
}

/// What `policy` has left for `s`: the `remaining` of an evaluation of cost 1, which
/// charges 1 when admitted.
pub(crate) async fn remaining(
    p: &dyn EdgeRateLimitPort,
    policy: &RateLimitPolicy,
    s: SubjectDigest,
) -> u64 {
    match p.evaluate(request(policy, s, 1)).await.expect("valid") {
        Outcome::Evaluated(d) if d.allowed => d.remaining + 1,
        Outcome::Evaluated(_) => 0,
        other => panic!("expected a decision, got {other:?}"),
    }
}

pub async fn a_settlement_charges_the_actual_cost(target: &dyn Target) {
    let policy = bucket(100);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let o = reserve(&*p, &[(&policy, s, 40)], 60_000).await;
    let Outcome::Evaluated(r) = &o else {
        panic!("{o:?}")
    };
    assert_eq!(
        (r.decision.decisions[0].remaining, r.expires_in_ms),
        (60, 60_000)
    );
    let id = reserved(o);
    let done = settled(settle(&*p, id, &[10]).await);
    assert_eq!(done.charged, vec![10]);
    assert!(!done.replayed);
    assert_eq!(done.decisions[0].remaining, 90, "{done:?}");
    assert_eq!(done.decisions[0].source, target.source());
    assert_eq!(remaining(&*p, &policy, s).await, 90);
    // Cancel refunds the whole estimate.
    let id = reserved(reserve(&*p, &[(&policy, s, 50)], 60_000).await);
    assert_eq!(
        cancel(&*p, id).await,
        Outcome::Evaluated(Ok(Cancelled { replayed: false }))
    );
    assert_eq!(remaining(&*p, &policy, s).await, 89);
}

pub async fn a_settlement_above_the_estimate_overdraws(target: &dyn Target) {
    let policy = bucket(100);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let id = reserved(reserve(&*p, &[(&policy, s, 50)], 60_000).await);
    assert_eq!(remaining(&*p, &policy, s).await, 50);
    // 49 left, then 50 more than the estimate: 1 token owed.
    settled(settle(&*p, id, &[100]).await);
    match p.evaluate(request(&policy, s, 1)).await.expect("valid") {
        Outcome::Evaluated(d) => {
            assert!(!d.allowed && d.remaining == 0, "{d:?}");
            // Paid down at one token a day: the 1 owed and the 1 asked for.
            assert!(
                d.retry_after_ms > DAY_MS && d.retry_after_ms <= 2 * DAY_MS,
                "{d:?}"
            );
            if target.exact_time() {
                assert_eq!(d.retry_after_ms, 2 * DAY_MS);
            }
        }
        other => panic!("{other:?}"),
    }
    // Nothing is reserved while the bucket is in overdraft.
    let o = reserve(&*p, &[(&policy, s, 1)], 60_000).await;
    assert!(
        matches!(&o, Outcome::Evaluated(r) if !r.decision.allowed && r.id.is_none()),
        "{o:?}"
    );
}

pub async fn settle_and_cancel_charge_once(target: &dyn Target) {
    let policy = bucket(100);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let id = reserved(reserve(&*p, &[(&policy, s, 30)], 60_000).await);
    let tries = (0..10u64).map(|i| {
        let p = p.clone();
        tokio::spawn(async move { settled(settle(&*p, id, &[10 + i]).await) })
    });
    let mut answers = Vec::new();
    for t in tries {
        answers.push(t.await.expect("no panic"));
    }
    let first: Vec<&Settled> = answers.iter().filter(|a| !a.replayed).collect();
    assert_eq!(first.len(), 1, "{answers:?}");
    let charged = first[0].charged[0];
    assert!(
        answers.iter().all(|a| a.charged == vec![charged]),
        "{answers:?}"
    );
    assert_eq!(remaining(&*p, &policy, s).await, 100 - charged);
    assert_eq!(
        cancel(&*p, id).await,
        Outcome::Evaluated(Err(ReservationError::Settled))
    );
    // A cancelled reservation: a retried cancel replays, a settle is refused.
    let id = reserved(reserve(&*p, &[(&policy, s, 20)], 60_000).await);
    assert_eq!(
        cancel(&*p, id).await,
        Outcome::Evaluated(Ok(Cancelled { replayed: false }))
    );
    assert_eq!(
        cancel(&*p, id).await,
        Outcome::Evaluated(Ok(Cancelled { replayed: true }))
    );
    let refused = settle(&*p, id, &[5]).await;
    assert_eq!(
        refused,
        Outcome::Evaluated(Err(ReservationError::Cancelled))
    );
    assert_eq!(remaining(&*p, &policy, s).await, 100 - charged - 1);
}

pub async fn unknown_and_expired_reservations_are_named(target: &dyn Target) {
    let policy = bucket(100);
    let p = target.provider(policy_set(vec![policy.clone()])).await;
    let s = fresh_subject();
    let forged = ReservationId {
        subject: s,
        token: LeaseToken::from_bytes([9; 16]),
    };
    let unknown = Outcome::Evaluated(Err(ReservationError::Unknown));
    assert_eq!(settle(&*p, forged, &[1]).await, unknown);
    assert_eq!(
        cancel(&*p, forged).await,
        Outcome::Evaluated(Err(ReservationError::Unknown))
    );
    let id = reserved(reserve(&*p, &[(&policy, s, 30)], 200).await);
    target.advance(250).await;
    match settle(&*p, id, &[1]).await {
        Outcome::Evaluated(Err(ReservationError::Expired { .. })) => {}
        other => panic!("expired: {other:?}"),
    }
    match cancel(&*p, id).await {
        Outcome::Evaluated(Err(ReservationError::Expired { .. })) => {}
        other => panic!("expired: {other:?}"),
    }
    // It stays charged at its estimate; one ttl after its expiry it is forgotten.
    assert_eq!(remaining(&*p, &policy, s).await, 70);
    target.advance(250).await;
    assert_eq!(settle(&*p, id, &[1]).await, unknown);
}

pub async fn several_policies_are_reserved_all_or_nothing(target: &dyn Target) {
    let (input, output) = (bucket(100), bucket(10));
    let p = target
        .provider(policy_set(vec![input.clone(), output.clone()]))
        .await;
    let s = fresh_subject();
    let o = reserve(&*p, &[(&input, s, 50), (&output, s, 10)], 60_000).await;
    let id = reserved(o);
    // The output bucket is empty: a second reservation takes nothing from the input bucket.
    let o = reserve(&*p, &[(&input, s, 10), (&output, s, 1)], 60_000).await;
    assert!(
        matches!(&o, Outcome::Evaluated(r) if !r.decision.allowed && r.id.is_none()),
        "{o:?}"
    );
    let done = settled(settle(&*p, id, &[20, 4]).await);
    assert_eq!(done.charged, vec![20, 4]);
    let left: Vec<u64> = done.decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(left, vec![80, 6]);
    assert_eq!(remaining(&*p, &input, s).await, 80);
    assert_eq!(remaining(&*p, &output, s).await, 6);
}

pub async fn bad_input_charges_nothing(target: &dyn Target) {
    let policy = bucket(100);
    let log = sliding_log();
    let p = target
        .provider(policy_set(vec![policy.clone(), log.clone()]))
        .await;
    let s = fresh_subject();
    match try_reserve(&*p, &[(&policy, s, 5), (&log, s, 1)], 60_000).await {
        Err(RequestError::ReservationUnsupported { policy_id, .. }) => {
            assert_eq!(&policy_id, log.id());
        }
        other => panic!("a sliding log takes no reservation: {other:?}"),
    }
    match try_reserve(&*p, &[(&policy, s, 101)], 60_000).await {
        Err(RequestError::CostAboveMax { cost: 101, .. }) => {}
        other => panic!("an estimate above max_cost: {other:?}"),
    }
    let id = reserved(reserve(&*p, &[(&policy, s, 30)], 60_000).await);
    let above = settle(&*p, id, &[101]).await;
    let expected = ReservationError::ActualAboveMax {
        index: 0,
        actual: 101,
        max_cost: 100,
    };
    assert_eq!(above, Outcome::Evaluated(Err(expected)));
    let wrong = settle(&*p, id, &[1, 2]).await;
    let expected = ReservationError::ActualCount {
        expected: 1,
        got: 2,
    };
    assert_eq!(wrong, Outcome::Evaluated(Err(expected)));
    // Still outstanding, charged at its estimate only; a good settle then goes through.
    assert_eq!(remaining(&*p, &policy, s).await, 70);
    assert_eq!(settled(settle(&*p, id, &[30]).await).charged, vec![30]);
    assert_eq!(remaining(&*p, &policy, s).await, 69);
}
