//! Properties of the concurrency model: never more than `limit` leases held, a denial
//! changes nothing and says when a place frees, a release frees exactly the lease it names,
//! and concurrency policies are refused by `evaluate`.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use shared_contract::lease::LeaseToken;
use shared_contract::model::concurrency::{self, Acquire, ConcurrencyState, Release};
use shared_contract::model::{self, ModelError};
use shared_contract::policy::{CONCURRENCY_MAX_LIMIT, ConcurrencyParams, MAX_LEASE_TTL_MS};
use shared_contract::{
    Algorithm, AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec,
    RateLimitPolicy,
};

fn spec(limit: u64, ttl_ms: u64, max_cost: u64) -> PolicySpec {
    PolicySpec {
        id: PolicyId::new("conc").expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::Concurrency {
            limit,
            lease_ttl: Duration::from_millis(ttl_ms),
        },
        max_cost,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    }
}

fn params(limit: u64, ttl_ms: u64) -> (RateLimitPolicy, ConcurrencyParams) {
    let policy = RateLimitPolicy::new(spec(limit, ttl_ms, 1)).expect("valid policy");
    let Algorithm::Concurrency(p) = *policy.algorithm() else {
        panic!("a concurrency policy")
    };
    (policy, p)
}

fn token(n: u64) -> LeaseToken {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    LeaseToken::from_bytes(b)
}

#[test]
fn validation_names_every_bad_field() {
    let fields = |s| {
        RateLimitPolicy::new(s)
            .err()
            .map(|e| e.0.iter().map(|e| e.field).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(fields(spec(0, 0, 1)), vec!["limit", "lease_ttl"]);
    assert_eq!(
        fields(spec(CONCURRENCY_MAX_LIMIT + 1, MAX_LEASE_TTL_MS + 1, 1)),
        vec!["limit", "lease_ttl"]
    );
    assert_eq!(fields(spec(10, 1000, 2)), vec!["max_cost"]);
    assert!(RateLimitPolicy::new(spec(CONCURRENCY_MAX_LIMIT, MAX_LEASE_TTL_MS, 1)).is_ok());
}

#[test]
fn a_concurrency_policy_is_never_evaluated() {
    let (policy, _) = params(3, 1000);
    assert_eq!(
        model::evaluate(&policy, None, 1, Cost::ONE).err(),
        Some(ModelError::NotRatePolicy)
    );
}

#[test]
fn denied_acquire_says_when_the_earliest_lease_expires() {
    let (_, p) = params(2, 1000);
    let mut state = None;
    for (n, at) in [(1, 100), (2, 400)] {
        let Ok(Acquire::Acquired { new_state, .. }) =
            concurrency::acquire(&p, state.as_ref(), at, token(n))
        else {
            panic!("place {n} free")
        };
        state = Some(new_state);
    }
    assert_eq!(
        concurrency::acquire(&p, state.as_ref(), 500, token(3)),
        Ok(Acquire::Denied {
            retry_after_ms: 600
        })
    );
    // At the earliest expiry the place is free again.
    assert!(matches!(
        concurrency::acquire(&p, state.as_ref(), 1100, token(3)),
        Ok(Acquire::Acquired { remaining: 0, .. })
    ));
}

#[test]
fn release_twice_or_after_expiry_is_answered_and_frees_nothing_else() {
    let (_, p) = params(5, 1000);
    let mut state = None;
    for n in 1..=2 {
        let Ok(Acquire::Acquired { new_state, .. }) =
            concurrency::acquire(&p, state.as_ref(), 0, token(n))
        else {
            panic!("place free")
        };
        state = Some(new_state);
    }
    let (v, after) = concurrency::release(state.as_ref(), 10, token(1)).expect("in range");
    assert_eq!(v, Release::Released);
    let after = after.expect("changed");
    assert_eq!(after.leases, vec![(token(2), 1000)]);
    assert_eq!(
        concurrency::release(Some(&after), 20, token(1)),
        Ok((Release::NotHeld, None))
    );
    assert_eq!(
        concurrency::release(Some(&after), 1000, token(2)),
        Ok((Release::Expired, Some(ConcurrencyState::default())))
    );
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Acquire,
    /// Release the lease acquired `n`-th (modulo how many were); may be gone already.
    Release(u64),
    /// Release a token never handed out.
    ReleaseUnknown,
    Advance(u64),
}

fn op(ttl: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        2 => any::<u64>().prop_map(Op::Release),
        1 => Just(Op::ReleaseUnknown),
        2 => (0..=ttl + ttl / 2).prop_map(Op::Advance),
    ]
}

proptest! {
    /// The model against a plain map of token -> expiry: same admissions, same answers, and
    /// never more than `limit` leases live.
    #[test]
    fn the_model_is_a_bounded_set_of_expiring_leases(
        (limit, ttl, ops) in (1u64..=6, 1u64..=5_000)
            .prop_flat_map(|(l, t)| (Just(l), Just(t), proptest::collection::vec(op(t), 1..80))),
        start in 0u64..=1u64 << 44,
    ) {
        let (_, p) = params(limit, ttl);
        let mut now = start;
        let mut state: Option<ConcurrencyState> = None;
        let mut oracle: BTreeMap<LeaseToken, u64> = BTreeMap::new();
        let mut issued = 0u64;
        for op in ops {
            match op {
                Op::Acquire => {
                    issued += 1;
                    let t = token(issued);
                    let live: Vec<u64> = oracle.values().copied().filter(|e| *e > now).collect();
                    let got = concurrency::acquire(&p, state.as_ref(), now, t).expect("in range");
                    if (live.len() as u64) < limit {
                        let Acquire::Acquired { expires_at_ms, remaining, new_state } = got else {
                            return Err(TestCaseError::fail("a free place was denied"));
                        };
                        prop_assert_eq!(expires_at_ms, now + ttl);
                        prop_assert_eq!(remaining, limit - live.len() as u64 - 1);
                        oracle.retain(|_, e| *e > now);
                        oracle.insert(t, expires_at_ms);
                        prop_assert!(new_state.held(now) as u64 <= limit);
                        state = Some(new_state);
                    } else {
                        let earliest = live.iter().min().copied().unwrap_or(now);
                        prop_assert_eq!(got, Acquire::Denied { retry_after_ms: earliest - now });
                    }
                }
                Op::ReleaseUnknown => {
                    let before = state.clone();
                    let got = concurrency::release(state.as_ref(), now, token(u64::MAX)).expect("in range");
                    prop_assert_eq!(got, (Release::NotHeld, None));
                    prop_assert_eq!(&state, &before);
                }
                Op::Release(k) => {
                    let t = token(1 + k % issued.max(1));
                    let got = concurrency::release(state.as_ref(), now, t).expect("in range");
                    let want = match oracle.remove(&t) {
                        None => Release::NotHeld,
                        Some(e) if e <= now => Release::Expired,
                        Some(_) => Release::Released,
                    };
                    prop_assert_eq!(got.0, want);
                    if let Some(s) = got.1 {
                        // Exactly the named token left; every other lease is unchanged.
                        let before = state.as_ref().map(|s| s.leases.len()).unwrap_or(0);
                        prop_assert_eq!(s.leases.len() + 1, before);
                        prop_assert!(s.leases.iter().all(|(x, _)| *x != t));
                        state = Some(s);
                    }
                }
                Op::Advance(d) => now += d,
            }
            let held = state.as_ref().map_or(0, |s| s.held(now)) as u64;
            let want = oracle.values().filter(|e| **e > now).count() as u64;
            prop_assert_eq!(held, want);
            prop_assert!(held <= limit);
        }
    }
}

#[test]
fn providers_refuse_evaluating_a_concurrency_policy_and_leasing_a_rate_policy() {
    use shared_contract::{PolicySet, RequestError};
    let (conc, _) = params(3, 1000);
    let rate = RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("rate").expect("valid id"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: 5,
            window: Duration::from_secs(1),
        },
        ..spec(1, 1, 1)
    })
    .expect("valid policy");
    let set = PolicySet::new([conc.clone(), rate.clone()], rate.id().clone()).expect("valid set");
    let request = shared_contract::RateLimitRequest {
        policy_id: conc.id().clone(),
        subject: shared_contract::SubjectDigest::from_bytes([1; 32]),
        cost: Cost::ONE,
        evaluation_id: None,
        deadline: shared_contract::Deadline::within(Duration::from_secs(1)).expect("deadline"),
    };
    assert_eq!(
        set.admit(&request).err(),
        Some(RequestError::ConcurrencyPolicy {
            policy_id: conc.id().clone()
        })
    );
    let request = shared_contract::MultiRequest::single(request);
    assert_eq!(
        set.admit_all(&request).err(),
        Some(RequestError::ConcurrencyPolicy {
            policy_id: conc.id().clone()
        })
    );
    assert!(set.admit_lease(conc.id()).is_ok());
    assert_eq!(
        set.admit_lease(rate.id()).err(),
        Some(RequestError::NotConcurrencyPolicy {
            policy_id: rate.id().clone()
        })
    );
}
