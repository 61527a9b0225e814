//! Concurrency leases on the local provider: the same answers as the model, a release frees
//! only the lease it names, and expiry by the provider's clock reclaims a crashed holder's
//! leases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use shared_contract::model::concurrency::{self, Acquire, ConcurrencyState, Release};
use shared_contract::{AcquireOutcome, AcquireRequest};
use shared_contract::{
    Algorithm, AlgorithmSpec, Deadline, LeaseId, LeaseToken, PolicyId, ReleaseOutcome,
    ReleaseRequest, RequestError, SequenceTokens, TokenSource,
};

use super::{fixed, policy, provider, request, subject};
use crate::LocalProvider;

fn conc(limit: u64, ttl_ms: u64) -> AlgorithmSpec {
    AlgorithmSpec::Concurrency {
        limit,
        lease_ttl: Duration::from_millis(ttl_ms),
    }
}

fn leasing(limit: u64, ttl_ms: u64) -> (LocalProvider, shared_contract::ManualClock) {
    let (p, clock) = provider(vec![
        policy("jobs", 1, conc(limit, ttl_ms), 1),
        policy("api", 1, fixed(5, 1000), 1),
    ]);
    (p.with_tokens(Arc::new(SequenceTokens::default())), clock)
}

fn deadline() -> Deadline {
    Deadline::within(Duration::from_secs(5)).expect("valid deadline")
}

fn acquire(p: &LocalProvider, subject_n: u64) -> AcquireOutcome {
    p.acquire_now(&AcquireRequest {
        policy_id: PolicyId::new("jobs").expect("valid id"),
        subject: subject(subject_n),
        deadline: deadline(),
    })
    .expect("a concurrency policy")
}

fn release(p: &LocalProvider, lease: &LeaseId) -> ReleaseOutcome {
    p.release_now(&ReleaseRequest {
        lease: lease.clone(),
        deadline: deadline(),
    })
    .expect("a concurrency policy")
}

fn lease_of(o: AcquireOutcome) -> LeaseId {
    match o {
        AcquireOutcome::Acquired(l) => l.id,
        other => panic!("expected a lease, got {other:?}"),
    }
}

#[test]
fn at_most_limit_leases_and_a_release_frees_a_place() {
    let (p, clock) = leasing(2, 10_000);
    let a = lease_of(acquire(&p, 1));
    let _b = lease_of(acquire(&p, 1));
    clock.advance(100);
    assert_eq!(
        acquire(&p, 1),
        AcquireOutcome::Denied {
            policy_id: PolicyId::new("jobs").expect("valid id"),
            limit: 2,
            retry_after_ms: 9_900,
            source: crate::Source::Local,
        }
    );
    // Another subject has its own places.
    lease_of(acquire(&p, 2));
    assert_eq!(release(&p, &a), ReleaseOutcome::Released);
    lease_of(acquire(&p, 1));
}

#[test]
fn bad_releases_are_answered_and_free_nothing() {
    let (p, clock) = leasing(3, 1_000);
    let a = lease_of(acquire(&p, 1));
    let b = lease_of(acquire(&p, 1));
    assert_eq!(release(&p, &a), ReleaseOutcome::Released);
    assert_eq!(release(&p, &a), ReleaseOutcome::NotHeld, "released twice");
    // The same token under another subject names no lease of subject 2.
    let forged = LeaseId {
        subject: subject(2),
        ..b.clone()
    };
    assert_eq!(release(&p, &forged), ReleaseOutcome::NotHeld);
    let jobs = PolicyId::new("jobs").expect("valid id");
    assert_eq!(p.held_leases(&jobs, &subject(1)), 1, "b still held");
    clock.advance(1_000);
    assert_eq!(release(&p, &b), ReleaseOutcome::Expired, "after expiry");
    assert_eq!(p.held_leases(&jobs, &subject(1)), 0);
}

#[test]
fn a_crashed_holders_leases_expire_by_the_provider_clock() {
    let (p, clock) = leasing(2, 5_000);
    lease_of(acquire(&p, 1));
    lease_of(acquire(&p, 1));
    clock.advance(4_999);
    assert!(matches!(
        acquire(&p, 1),
        AcquireOutcome::Denied {
            retry_after_ms: 1,
            ..
        }
    ));
    clock.advance(1);
    lease_of(acquire(&p, 1));
}

#[test]
fn rate_and_concurrency_policies_refuse_each_others_calls() {
    let (p, _) = leasing(2, 5_000);
    let on_rate = p.acquire_now(&AcquireRequest {
        policy_id: PolicyId::new("api").expect("valid id"),
        subject: subject(1),
        deadline: deadline(),
    });
    assert!(matches!(
        on_rate,
        Err(RequestError::NotConcurrencyPolicy { .. })
    ));
    assert!(matches!(
        p.evaluate_now(&request("jobs", 1, 1)),
        Err(RequestError::ConcurrencyPolicy { .. })
    ));
    // Refused: nothing was charged, every place is still free.
    lease_of(acquire(&p, 1));
    lease_of(acquire(&p, 1));
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(u64),
    /// The `k`-th lease handed out (modulo), possibly released or expired already.
    Release(u64),
    /// The `k`-th lease's token under another subject.
    ReleaseForged(u64),
    Advance(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The provider is the model plus storage: the same sequence gives the same answers.
    #[test]
    fn leases_equal_the_reference_model(
        limit in 1u64..=4,
        ttl in 1u64..=3_000,
        ops in proptest::collection::vec(prop_oneof![
            4 => (0u64..3).prop_map(Op::Acquire),
            2 => any::<u64>().prop_map(Op::Release),
            1 => any::<u64>().prop_map(Op::ReleaseForged),
            2 => (0u64..2_000).prop_map(Op::Advance),
        ], 1..80),
    ) {
        let (p, clock) = leasing(limit, ttl);
        let Algorithm::Concurrency(params) = *p.policies.get(&PolicyId::new("jobs").expect("id")).expect("jobs").algorithm() else {
            return Err(TestCaseError::fail("a concurrency policy"));
        };
        let tokens = SequenceTokens::default();
        let mut states: HashMap<u64, ConcurrencyState> = HashMap::new();
        let mut issued: Vec<(u64, LeaseToken)> = Vec::new();
        for op in ops {
            let now = shared_contract::Clock::now_ms(&clock);
            match op {
                Op::Acquire(n) => {
                    let token = tokens.next_token();
                    let got = acquire(&p, n);
                    let want = concurrency::acquire(&params, states.get(&n), now, token).expect("in range");
                    match (want, got) {
                        (Acquire::Acquired { expires_at_ms, remaining, new_state }, AcquireOutcome::Acquired(l)) => {
                            prop_assert_eq!((l.expires_at_ms, l.remaining, l.id.token), (expires_at_ms, remaining, token));
                            states.insert(n, new_state);
                            issued.push((n, token));
                        }
                        (Acquire::Denied { retry_after_ms }, AcquireOutcome::Denied { retry_after_ms: got, .. }) => {
                            prop_assert_eq!(got, retry_after_ms);
                        }
                        (want, got) => return Err(TestCaseError::fail(format!("{want:?} vs {got:?}"))),
                    }
                }
                Op::Release(k) | Op::ReleaseForged(k) if !issued.is_empty() => {
                    let (n, token) = issued[(k % issued.len() as u64) as usize];
                    let n = if matches!(op, Op::ReleaseForged(_)) { n + 10 } else { n };
                    let id = LeaseId { policy_id: PolicyId::new("jobs").expect("id"), subject: subject(n), token };
                    let got = match release(&p, &id) {
                        ReleaseOutcome::Released => Release::Released,
                        ReleaseOutcome::Expired => Release::Expired,
                        ReleaseOutcome::NotHeld => Release::NotHeld,
                        other => return Err(TestCaseError::fail(format!("{other:?}"))),
                    };
                    let (want, new_state) = concurrency::release(states.get(&n), now, token).expect("in range");
                    prop_assert!(
                        concurrency::release_answer_allowed(want, got, states.get(&n), now),
                        "model {:?}, provider {:?}", want, got
                    );
                    if let Some(s) = new_state {
                        states.insert(n, s);
                    }
                }
                Op::Release(_) | Op::ReleaseForged(_) => {}
                Op::Advance(ms) => clock.advance(ms),
            }
        }
    }
}
