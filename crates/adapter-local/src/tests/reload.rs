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
