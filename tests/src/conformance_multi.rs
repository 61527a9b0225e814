//! The multi-limit cases of the conformance suite (`EdgeRateLimitPort::evaluate_all`), run
//! by [`conformance_tests!`](crate::conformance_tests) next to the single-limit ones.
//!
//! Each case pairs a limit of the case's algorithm with one of the next algorithm (so every
//! pair of neighbours is mixed once), for one fresh subject, unless it says otherwise.

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::keys::{hash_slot, subject_tag};
use shared_contract::{
    AlgorithmKind, Cost, Deadline, EdgeRateLimitPort, EvaluationId, Limit, Limits, MultiDecision,
    MultiOutcome, MultiRequest, RateLimitPolicy, RequestError, SubjectDigest,
};

use crate::conformance::{Target, decide, policy};
use crate::rate::{fresh_subject, policy_set, random_u64};

/// A one-hour window: nothing recovers while a case runs.
const LONG_MS: u64 = 3_600_000;

/// The algorithm after `kind` in [`AlgorithmKind::RATE`] (wrapping).
fn next_kind(kind: AlgorithmKind) -> AlgorithmKind {
    let all = AlgorithmKind::RATE;
    let at = all.iter().position(|k| *k == kind).unwrap_or(0);
    all[(at + 1) % all.len()]
}

/// The Redis Cluster slot of every key of `subject` (its hash tag is the subject's alone).
pub fn subject_slot(subject: &SubjectDigest) -> u16 {
    hash_slot(subject_tag(subject).as_bytes())
}

/// A limit of `policy` for `subject` at `cost`.
pub fn limit(policy: &RateLimitPolicy, subject: SubjectDigest, cost: u64) -> Limit {
    Limit {
        policy_id: policy.id().clone(),
        subject,
        cost: Cost::new(cost).expect("a valid cost"),
    }
}

/// A multi-limit request of `limits`, with an optional evaluation id.
pub fn multi_request(limits: Vec<Limit>, id: Option<&str>) -> MultiRequest {
    MultiRequest {
        limits: Limits::new(limits).expect("valid limits"),
        evaluation_id: id.map(|id| EvaluationId::new(id).expect("a valid id")),
        deadline: Deadline::within(Duration::from_secs(10)).expect("a valid deadline"),
    }
}

/// The decision of one multi-limit evaluation; any other outcome fails the case.
pub async fn decide_all(port: &dyn EdgeRateLimitPort, request: MultiRequest) -> MultiDecision {
    match port.evaluate_all(request).await {
        Ok(MultiOutcome::Evaluated(d)) => d,
        other => panic!("expected a multi-limit decision, got {other:?}"),
    }
}

/// Two fresh policies (`kind` limit `a`, the next algorithm limit `b`, max cost up to 2), a
/// provider of both and a fresh subject.
async fn two_policies(
    target: &dyn Target,
    kind: AlgorithmKind,
    a: u64,
    b: u64,
) -> (
    RateLimitPolicy,
    RateLimitPolicy,
    Arc<dyn EdgeRateLimitPort>,
    SubjectDigest,
) {
    let pa = policy(kind, 1, a, LONG_MS, a.min(2));
    let pb = policy(next_kind(kind), 1, b, LONG_MS, b.min(2));
    let port = target
        .provider(policy_set(vec![pa.clone(), pb.clone()]))
        .await;
    (pa, pb, port, fresh_subject())
}

/// Every limit is charged when all admit; when one denies nothing is charged anywhere, and
/// the admitting members still say `allowed` with the figures they would have had.
pub async fn multi_limit_charges_all_or_nothing(target: &dyn Target, kind: AlgorithmKind) {
    let (pa, pb, port, s) = two_policies(target, kind, 2, 3).await;
    let both = || multi_request(vec![limit(&pa, s, 1), limit(&pb, s, 1)], None);
    for i in 1..=2u64 {
        let d = decide_all(&*port, both()).await;
        assert!(d.allowed && !d.replayed, "{kind} #{i}: {d:?}");
        assert_eq!(d.decisions.len(), 2);
        assert_eq!(d.decisions[0].policy_id, *pa.id());
        assert_eq!(d.decisions[1].policy_id, *pb.id());
        assert_eq!(d.decisions[0].remaining, 2 - i, "{kind} #{i}");
        assert_eq!(d.decisions[1].remaining, 3 - i, "{kind} #{i}");
        assert!(d.violated().next().is_none());
    }
    for _ in 0..3 {
        let d = decide_all(&*port, both()).await;
        assert!(!d.allowed, "{kind}: {d:?}");
        assert!(!d.decisions[0].allowed && d.decisions[0].retry_after_ms > 0);
        assert!(
            d.decisions[1].allowed,
            "{kind}: an admitting member says allowed"
        );
        assert_eq!(
            d.decisions[1].remaining, 0,
            "{kind}: figures after the charge"
        );
        assert_eq!(d.violated().count(), 1);
    }
    // B was charged exactly twice: one unit left, then none.
    assert_eq!(decide(&*port, &pb, s, 1).await.remaining, 0, "{kind}");
    assert!(!decide(&*port, &pb, s, 1).await.allowed, "{kind}");
}

/// A retry with the same evaluation id and limits answers the first decision (`replayed`)
/// and charges nothing more; the same id with other limits is another evaluation. The single
/// form with an id is deduplicated the same way.
pub async fn multi_limit_evaluation_id_charges_once(target: &dyn Target, kind: AlgorithmKind) {
    let (pa, pb, port, s) = two_policies(target, kind, 5, 5).await;
    let id = format!("conf-eval-{:016x}", random_u64());
    let both = |cost| {
        multi_request(
            vec![limit(&pa, s, cost), limit(&pb, s, cost)],
            Some(id.as_str()),
        )
    };
    let first = decide_all(&*port, both(1)).await;
    assert!(first.allowed && !first.replayed, "{kind}: {first:?}");
    for _ in 0..3 {
        let again = decide_all(&*port, both(1)).await;
        assert!(again.replayed, "{kind}: {again:?}");
        assert_eq!(again.decisions, first.decisions, "{kind}");
    }
    // Other limits under the same id: evaluated (and charged) afresh.
    let other = decide_all(&*port, both(2)).await;
    assert!(other.allowed && !other.replayed, "{kind}: {other:?}");
    assert_eq!(other.decisions[0].remaining, 2, "{kind}: 5 - 1 - 2");
    // The single form with an id.
    let mut one = crate::rate::request(&pb, s, 1);
    one.evaluation_id = Some(EvaluationId::new(&format!("{id}-single")).expect("a valid id"));
    let d1 = port.evaluate(one.clone()).await.expect("admitted request");
    let d2 = port.evaluate(one).await.expect("admitted request");
    assert_eq!(d1, d2, "{kind}: the retry answers the first decision");
    assert_eq!(d1.decision().map(|d| d.remaining), Some(1), "{kind}");
    assert_eq!(decide(&*port, &pb, s, 1).await.remaining, 0, "{kind}");
}

/// An unknown policy or a cost above `max_cost` in any member refuses the whole request and
/// charges nothing; so does a set of limits that is empty, too large or repeats a pair.
pub async fn multi_limit_request_errors_consume_nothing(target: &dyn Target, kind: AlgorithmKind) {
    let (pa, pb, port, s) = two_policies(target, kind, 1, 1).await;
    let unknown = policy(kind, 1, 1, LONG_MS, 1);
    let bad = port
        .evaluate_all(multi_request(
            vec![limit(&pa, s, 1), limit(&unknown, s, 1)],
            None,
        ))
        .await;
    assert_eq!(bad, Err(RequestError::UnknownPolicy(unknown.id().clone())));
    let bad = port
        .evaluate_all(multi_request(
            vec![limit(&pa, s, 1), limit(&pb, s, 3)],
            None,
        ))
        .await;
    assert!(
        matches!(bad, Err(RequestError::CostAboveMax { .. })),
        "{kind}: {bad:?}"
    );
    assert_eq!(Limits::new(vec![]), Err(RequestError::NoLimits));
    assert!(matches!(
        Limits::new(vec![limit(&pa, s, 1), limit(&pa, s, 1)]),
        Err(RequestError::DuplicateLimit { .. })
    ));
    assert!(decide(&*port, &pa, s, 1).await.allowed, "{kind}: consumed");
    assert!(decide(&*port, &pb, s, 1).await.allowed, "{kind}: consumed");
}

/// Limits of different subjects: decided as one where the target puts every key in one call;
/// on a cluster their keys hash to different slots, and the request is refused with
/// `SpansSlots` before anything is sent.
pub async fn multi_limit_across_subjects(target: &dyn Target, kind: AlgorithmKind) {
    let (pa, pb, port, s) = two_policies(target, kind, 1, 1).await;
    let t = loop {
        let t = fresh_subject();
        if subject_slot(&t) != subject_slot(&s) {
            break t;
        }
    };
    let request = multi_request(vec![limit(&pa, s, 1), limit(&pb, t, 1)], None);
    if target.one_slot_per_call() {
        assert_eq!(
            port.evaluate_all(request).await,
            Err(RequestError::SpansSlots { slots: 2 }),
            "{kind}"
        );
        assert!(decide(&*port, &pa, s, 1).await.allowed, "{kind}: consumed");
        assert!(decide(&*port, &pb, t, 1).await.allowed, "{kind}: consumed");
        return;
    }
    let d = decide_all(&*port, request.clone()).await;
    assert!(d.allowed, "{kind}: {d:?}");
    let d = decide_all(&*port, request).await;
    assert!(!d.allowed && !d.decisions[0].allowed && !d.decisions[1].allowed);
}
