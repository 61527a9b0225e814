//! Property tests of the multi-limit model: all or nothing over the single-policy models.

use std::time::Duration;

use crate::common;

use common::small_policy_named;
use proptest::prelude::*;
use shared_contract::model::multi::{self, Member, MultiVerdict};
use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::{
    AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
    Source,
};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn policies() -> impl Strategy<Value = Vec<RateLimitPolicy>> {
    const IDS: [&str; 4] = ["a", "b", "c", "d"];
    (1usize..=4).prop_flat_map(|n| {
        IDS[..n]
            .iter()
            .map(|id| small_policy_named(id))
            .collect::<Vec<_>>()
    })
}

/// Steps: a signed time step (mostly forward, sometimes back) and one raw cost per member.
fn steps() -> impl Strategy<Value = Vec<(i64, Vec<u64>)>> {
    proptest::collection::vec(
        (
            prop_oneof![4 => 0i64..400, 1 => -80i64..0],
            proptest::collection::vec(any::<u64>(), 4),
        ),
        1..60,
    )
}

fn cost(policy: &RateLimitPolicy, raw: u64) -> Cost {
    Cost::new(1 + raw % policy.max_cost().get()).expect("1..=max_cost")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Each member answers exactly what its single model answers; the evaluation admits iff
    /// every member admits; state changes only then, and then exactly as each single model
    /// writes it.
    #[test]
    fn all_or_nothing_over_the_single_models(policies in policies(), steps in steps()) {
        let mut states: Vec<Option<AlgorithmState>> = vec![None; policies.len()];
        let mut now: u64 = 1_700_000_000_000;
        for (dt, raw_costs) in steps {
            now = now.saturating_add_signed(dt);
            let costs: Vec<Cost> =
                policies.iter().zip(&raw_costs).map(|(p, &c)| cost(p, c)).collect();
            let members: Vec<Member<'_>> = policies
                .iter()
                .zip(&states)
                .zip(&costs)
                .map(|((policy, state), &cost)| Member { policy, state: state.as_ref(), cost })
                .collect();
            let multi = multi::evaluate_all(&members, now).expect("valid members");
            let singles: Vec<_> = members
                .iter()
                .map(|m| model::evaluate(m.policy, m.state, now, m.cost).expect("valid"))
                .collect();
            let all_allowed = singles.iter().all(|e| e.verdict == Verdict::Allowed);
            let clock_unsafe = singles.iter().position(|e| e.verdict == Verdict::ClockUnsafe);
            match multi.verdict {
                MultiVerdict::Allowed => prop_assert!(all_allowed),
                MultiVerdict::Denied => prop_assert!(!all_allowed && clock_unsafe.is_none()),
                MultiVerdict::ClockUnsafe { index } => prop_assert_eq!(Some(index), clock_unsafe),
            }
            for (m, s) in multi.members.iter().zip(&singles) {
                prop_assert_eq!(m.verdict, s.verdict);
                prop_assert_eq!(
                    (m.limit, m.remaining, m.retry_after_ms, m.reset_at_ms, m.effective_now_ms),
                    (s.limit, s.remaining, s.retry_after_ms, s.reset_at_ms, s.effective_now_ms)
                );
                if all_allowed {
                    prop_assert_eq!(m, s);
                } else {
                    prop_assert!(m.new_state.is_none() && m.ttl_ms == 0);
                }
            }
            if multi.verdict == MultiVerdict::Allowed {
                for (state, m) in states.iter_mut().zip(multi.members) {
                    *state = m.new_state;
                }
            }
            // A denial charged nothing: the next step sees the same states (checked by the
            // next iteration's comparison with the single models over `states`).
        }
    }

    /// With one member the multi model is the single model, step for step.
    #[test]
    fn one_member_is_the_single_model(policy in small_policy_named("a"), steps in steps()) {
        let mut multi_state: Option<AlgorithmState> = None;
        let mut single_state: Option<AlgorithmState> = None;
        let mut now: u64 = 1_700_000_000_000;
        for (dt, raw) in steps {
            now = now.saturating_add_signed(dt);
            let c = cost(&policy, raw[0]);
            let m = multi::evaluate_all(
                &[Member { policy: &policy, state: multi_state.as_ref(), cost: c }],
                now,
            )
            .expect("valid");
            let s = model::evaluate(&policy, single_state.as_ref(), now, c).expect("valid");
            prop_assert_eq!(&m.members[0], &s);
            let expected = match s.verdict {
                Verdict::Allowed => MultiVerdict::Allowed,
                Verdict::Denied => MultiVerdict::Denied,
                Verdict::ClockUnsafe => MultiVerdict::ClockUnsafe { index: 0 },
            };
            prop_assert_eq!(m.verdict, expected);
            prop_assert_eq!(
                m.decision([&policy], Source::Local).map(|d| d.decisions),
                s.decision(&policy, Source::Local).map(|d| vec![d])
            );
            if let Some(new) = m.members.into_iter().next().and_then(|e| e.new_state) {
                multi_state = Some(new);
            }
            if let Some(new) = s.new_state {
                single_state = Some(new);
            }
        }
    }
}

/// A state of another algorithm refuses the whole evaluation, naming the member.
#[test]
fn a_refused_member_refuses_the_whole_evaluation() {
    let policy = |id: &str, algorithm| {
        RateLimitPolicy::new(PolicySpec {
            id: PolicyId::new(id).expect("id"),
            revision: PolicyRevision::new(1).expect("revision"),
            algorithm,
            max_cost: 1,
            cleanup_grace: ms(0),
            max_clock_regression: ms(0),
            failure_policy: FailurePolicy::FailClosed,
        })
        .expect("policy")
    };
    let fw = policy(
        "a",
        AlgorithmSpec::FixedWindow {
            limit: 5,
            window: ms(1000),
        },
    );
    let tb = policy(
        "b",
        AlgorithmSpec::TokenBucket {
            capacity: 5,
            refill_amount: 1,
            refill_interval: ms(100),
        },
    );
    let one = Cost::new(1).expect("cost");
    let fw_state = model::evaluate(&fw, None, 1_000, one)
        .expect("fw")
        .new_state;
    let err = multi::evaluate_all(
        &[
            Member {
                policy: &fw,
                state: None,
                cost: one,
            },
            Member {
                policy: &tb,
                state: fw_state.as_ref(),
                cost: one,
            },
        ],
        1_000,
    )
    .expect_err("state of another algorithm");
    assert_eq!(err.index, 1);
}
