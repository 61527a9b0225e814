//! Several limits as one, and evaluation ids, on the local provider.

use std::sync::Arc;
use std::time::Duration;

use shared_contract::{
    Cost, Deadline, EvaluationId, Limit, Limits, MultiDecision, MultiOutcome, MultiRequest,
    PolicyId, RateLimitOutcome, RequestError,
};

use super::{bucket, decide, fixed, policy, provider, request, subject};
use crate::LocalProvider;

fn limit(policy: &str, subject_n: u64, cost: u64) -> Limit {
    Limit {
        policy_id: PolicyId::new(policy).expect("valid id"),
        subject: subject(subject_n),
        cost: Cost::new(cost).expect("valid cost"),
    }
}

fn multi(limits: Vec<Limit>, id: Option<&str>) -> MultiRequest {
    MultiRequest {
        limits: Limits::new(limits).expect("valid limits"),
        evaluation_id: id.map(|i| EvaluationId::new(i).expect("valid id")),
        deadline: Deadline::within(Duration::from_secs(5)).expect("valid deadline"),
    }
}

fn decided(p: &LocalProvider, r: &MultiRequest) -> MultiDecision {
    match p.evaluate_all_now(r) {
        Ok(MultiOutcome::Evaluated(d)) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[test]
fn a_denial_of_one_limit_charges_none() {
    let (p, _clock) = provider(vec![
        policy("user", 1, fixed(2, 60_000), 1),
        policy("tenant", 1, bucket(10, 1, 1_000), 5),
    ]);
    let both = multi(vec![limit("user", 1, 1), limit("tenant", 9, 1)], None);
    for left in [1, 0] {
        let d = decided(&p, &both);
        assert!(d.allowed && !d.replayed);
        assert_eq!(d.decisions[0].remaining, left);
    }
    // user is exhausted: the evaluation is denied and tenant keeps its 8 tokens.
    let d = decided(&p, &both);
    assert!(!d.allowed);
    let violated: Vec<_> = d.violated().map(|v| v.policy_id.as_str()).collect();
    assert_eq!(violated, ["user"]);
    assert!(d.decisions[1].allowed, "tenant alone would admit");
    assert_eq!(decide(&p, &request("tenant", 9, 1)).remaining, 7);
}

#[test]
fn the_same_evaluation_id_charges_once_under_concurrent_retries() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(100, 60_000), 5)]);
    let p = Arc::new(p);
    let r = multi(vec![limit("api", 1, 3)], Some("retry-1"));
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let (p, r) = (Arc::clone(&p), r.clone());
            std::thread::spawn(move || decided(&p, &r))
        })
        .collect();
    let answers: Vec<MultiDecision> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    assert_eq!(answers.iter().filter(|d| !d.replayed).count(), 1);
    assert!(answers.iter().all(|d| d.decisions[0].remaining == 97));
    assert_eq!(decide(&p, &request("api", 1, 1)).remaining, 96);
    // Another id, or the same id with other limits, is another evaluation.
    assert_eq!(
        decided(&p, &multi(vec![limit("api", 1, 3)], Some("retry-2"))).decisions[0].remaining,
        93
    );
    assert_eq!(
        decided(&p, &multi(vec![limit("api", 1, 2)], Some("retry-1"))).decisions[0].remaining,
        91
    );
}

#[test]
fn an_evaluation_id_is_forgotten_after_the_replay_window() {
    let (p, clock) = provider(vec![policy("api", 1, fixed(5, 2_000), 1)]);
    let r = multi(vec![limit("api", 1, 1)], Some("e-1"));
    assert!(!decided(&p, &r).replayed);
    clock.advance(1_999);
    assert!(decided(&p, &r).replayed);
    clock.advance(1);
    assert!(!decided(&p, &r).replayed);
}

#[test]
fn the_single_form_honours_an_evaluation_id() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(1, 60_000), 1)]);
    let mut r = request("api", 1, 1);
    r.evaluation_id = Some(EvaluationId::new("e-1").expect("valid id"));
    for _ in 0..3 {
        match p.evaluate_now(&r) {
            Ok(RateLimitOutcome::Evaluated(d)) => assert!(d.allowed),
            other => panic!("{other:?}"),
        }
    }
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
}

#[test]
fn bad_limit_sets_are_refused_whole() {
    assert_eq!(Limits::new(vec![]), Err(RequestError::NoLimits));
    assert!(matches!(
        Limits::new((0..9).map(|n| limit("api", n, 1)).collect()),
        Err(RequestError::TooManyLimits { got: 9, max: 8 })
    ));
    assert!(matches!(
        Limits::new(vec![limit("api", 1, 1), limit("api", 1, 2)]),
        Err(RequestError::DuplicateLimit { .. })
    ));
    let (p, _clock) = provider(vec![
        policy("a", 1, fixed(5, 60_000), 1),
        policy("b", 1, fixed(5, 60_000), 1),
    ]);
    let over = multi(vec![limit("a", 1, 1), limit("b", 1, 2)], None);
    assert!(matches!(
        p.evaluate_all_now(&over),
        Err(RequestError::CostAboveMax { .. })
    ));
    let unknown = multi(vec![limit("a", 1, 1), limit("zz", 1, 1)], None);
    assert!(matches!(
        p.evaluate_all_now(&unknown),
        Err(RequestError::UnknownPolicy(_))
    ));
    assert_eq!(
        decide(&p, &request("a", 1, 1)).remaining,
        4,
        "nothing was charged"
    );
}
