//! [`LocalProvider::with_policies`]: a reload keeps the state of unchanged policies and
//! starts new revisions empty.

use super::{decide, fixed, policy, provider, request, set};

#[test]
fn an_unchanged_policy_keeps_its_state_across_a_reload() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(2, 60_000), 1)]);
    assert!(decide(&p, &request("api", 1, 1)).allowed);
    let reloaded = p.with_policies(set(vec![
        policy("api", 1, fixed(2, 60_000), 1),
        policy("added", 1, fixed(1, 60_000), 1),
    ]));
    let d = decide(&reloaded, &request("api", 1, 1));
    assert!(d.allowed);
    assert_eq!(d.remaining, 0, "the charge made before the reload was kept");
    assert!(!decide(&reloaded, &request("api", 1, 1)).allowed);
    // The old provider (requests in flight) and the new one share the key.
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
    assert!(decide(&reloaded, &request("added", 1, 1)).allowed);
}

#[test]
fn a_new_revision_starts_from_empty_state() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(1, 60_000), 1)]);
    assert!(decide(&p, &request("api", 1, 1)).allowed);
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
    let reloaded = p.with_policies(set(vec![policy("api", 2, fixed(3, 60_000), 1)]));
    let d = decide(&reloaded, &request("api", 1, 1));
    assert!(d.allowed);
    assert_eq!(d.limit, 3);
    assert_eq!(d.remaining, 2);
    // Back to revision 1 by a later reload: a slot never handed out before, so the
    // revision-1 entry written above is not read again.
    let back = reloaded.with_policies(set(vec![policy("api", 1, fixed(1, 60_000), 1)]));
    assert!(decide(&back, &request("api", 1, 1)).allowed);
}

#[test]
fn a_removed_policy_is_unknown_after_the_reload() {
    let (p, _clock) = provider(vec![
        policy("api", 1, fixed(1, 60_000), 1),
        policy("gone", 1, fixed(1, 60_000), 1),
    ]);
    let reloaded = p.with_policies(set(vec![policy("api", 1, fixed(1, 60_000), 1)]));
    assert!(matches!(
        reloaded.evaluate_now(&request("gone", 1, 1)),
        Err(shared_contract::RequestError::UnknownPolicy(_))
    ));
    assert!(decide(&p, &request("gone", 1, 1)).allowed);
}

fn reserve(
    p: &super::LocalProvider,
    policy: &str,
    estimate: u64,
) -> shared_contract::ReservationId {
    use shared_contract::multi::{Limit, Limits};
    let r = request(policy, 1, estimate);
    let limits = Limits::new(vec![Limit {
        policy_id: r.policy_id,
        subject: r.subject,
        cost: r.cost,
    }])
    .expect("one limit");
    let request = shared_contract::ReserveRequest {
        limits,
        ttl: shared_contract::ReservationTtl::from_millis(60_000).expect("valid"),
        deadline: r.deadline,
    };
    match p.reserve_now(&request).expect("valid") {
        shared_contract::Outcome::Evaluated(shared_contract::Reserved { id: Some(id), .. }) => id,
        other => panic!("reserved: {other:?}"),
    }
}

fn settle(
    p: &super::LocalProvider,
    id: shared_contract::ReservationId,
) -> shared_contract::SettleOutcome {
    let deadline = request("api", 1, 1).deadline;
    let request = shared_contract::SettleRequest {
        id,
        actual: vec![1],
        deadline,
    };
    p.settle_now(&request).expect("valid")
}

#[test]
fn a_reservation_outlives_a_reload_that_keeps_its_policy_and_not_one_that_changes_it() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(10, 60_000), 10)]);
    let kept = reserve(&p, "api", 5);
    let changed = reserve(&p, "api", 2);
    let same = p.with_policies(set(vec![policy("api", 1, fixed(10, 60_000), 10)]));
    let settled = settle(&same, kept);
    let shared_contract::Outcome::Evaluated(Ok(done)) = settled else {
        panic!("settled on the reloaded provider: {settled:?}");
    };
    assert_eq!(done.charged, vec![1]);
    // 10 - 1 settled - 2 outstanding.
    assert_eq!(decide(&same, &request("api", 1, 1)).remaining, 6);
    let next = same.with_policies(set(vec![policy("api", 2, fixed(10, 60_000), 10)]));
    assert!(matches!(
        settle(&next, changed),
        shared_contract::Outcome::Incompatible { .. }
    ));
}
