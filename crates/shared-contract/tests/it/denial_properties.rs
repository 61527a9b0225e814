//! The rule the exact denial cache rests on ([`shared_contract::model::denial`]), checked per
//! rate algorithm: a denial of cost `c` at server time `T` with `retry_after = R` means that
//! no request of cost `>= c` is admitted at any server time before `T + R`, whatever other
//! consumers do meanwhile; and what a cache answers from it is what the model answers then.
//!
//! States are reached by running the model (so they are states a provider can hold), from
//! small policies that reach their limits and from the whole accepted parameter space.

use crate::common;

use common::{RawStep, policy, raw_steps, small_policy, start_time, step};
use proptest::prelude::*;
use shared_contract::model::{self, AlgorithmState, DenialBound, Evaluation, Verdict};
use shared_contract::policy::MAX_TIME_MS;
use shared_contract::{AlgorithmKind, Cost, RateLimitPolicy, Source};

/// A denial found while running a history: the state it saw, its server time and cost, and
/// what it answered.
struct Denial {
    state: Option<AlgorithmState>,
    at: u64,
    cost: Cost,
    evaluation: Evaluation<AlgorithmState>,
}

/// Runs `history` from `start` as a provider would and returns the first `max` denials.
fn denials(p: &RateLimitPolicy, start: u64, history: &[RawStep], max: usize) -> Vec<Denial> {
    let mut state: Option<AlgorithmState> = None;
    let mut now = start;
    let mut found = Vec::new();
    for &raw in history {
        let (dt, cost) = step(p, raw);
        now = now.saturating_add_signed(dt).min(MAX_TIME_MS);
        let ev = model::evaluate(p, state.as_ref(), now, cost).expect("in range");
        match ev.verdict {
            Verdict::Allowed => state = ev.new_state.clone(),
            Verdict::Denied => {
                found.push(Denial {
                    state: state.clone(),
                    at: now,
                    cost,
                    evaluation: ev,
                });
                if found.len() == max {
                    break;
                }
            }
            Verdict::ClockUnsafe => {}
        }
    }
    found
}

/// A server time in `[T - (2 * max_clock_regression + 3), T + R)` from a raw draw: before the
/// denial (clamped or unsafe clocks) as well as after it.
fn time_within(p: &RateLimitPolicy, d: &Denial, bound: &DenialBound, raw: u64) -> u64 {
    let lo = d.at.saturating_sub(2 * p.max_clock_regression_ms() + 3);
    let hi = d.at + bound.retry_after_ms; // exclusive
    (lo + raw % (hi - lo)).min(MAX_TIME_MS)
}

/// A cost `>= c` from a raw draw.
fn cost_from(p: &RateLimitPolicy, c: Cost, raw: u64) -> Cost {
    let max = p.max_cost().get();
    Cost::new(c.get() + raw % (max - c.get() + 1)).expect("cost within max_cost")
}

/// Other consumers: raw time, raw cost (any cost) and, after each, raw probe times and costs.
type Others = Vec<(u64, u64, [(u64, u64); 3])>;

fn others() -> impl Strategy<Value = Others> {
    proptest::collection::vec(
        (any::<u64>(), any::<u64>(), any::<[(u64, u64); 3]>()),
        0..12,
    )
}

/// The property for every denial of one history.
fn check_bound(
    p: &RateLimitPolicy,
    start: u64,
    history: &[RawStep],
    others: &Others,
) -> Result<(), TestCaseError> {
    for d in denials(p, start, history, 3) {
        let bound = DenialBound::of(p, &d.evaluation, d.cost).expect("a rate denial bounds");
        prop_assert!(bound.retry_after_ms > 0);
        let mut state = d.state.clone();
        let probe = |state: &Option<AlgorithmState>, raw: (u64, u64)| {
            let at = time_within(p, &d, &bound, raw.0);
            let cost = cost_from(p, d.cost, raw.1);
            let ev = model::evaluate(p, state.as_ref(), at, cost).expect("in range");
            prop_assert_ne!(
                ev.verdict,
                Verdict::Allowed,
                "admitted cost {} at {} before {} + {} (denied {} at {})",
                cost.get(),
                at,
                d.at,
                bound.retry_after_ms,
                d.cost.get(),
                d.at
            );
            Ok(())
        };
        for &(t, c, probes) in others {
            let at = time_within(p, &d, &bound, t);
            let cost = Cost::new(1 + c % p.max_cost().get()).expect("cost within max_cost");
            let ev = model::evaluate(p, state.as_ref(), at, cost).expect("in range");
            if ev.verdict == Verdict::Allowed {
                state = ev.new_state;
            }
            for raw in probes {
                probe(&state, raw)?;
            }
        }
        probe(&state, (0, 0))?;
    }
    Ok(())
}

/// What a cache answers from a denial equals the model's answer at that moment, with no
/// other consumer: a denial with the same `limit` and `reset_at`, `remaining` no more than the
/// model's (time only raises it), and `retry_after` no longer than the model's, equal for the
/// same cost when the denial's clock was not clamped.
fn check_answer(
    p: &RateLimitPolicy,
    start: u64,
    history: &[RawStep],
    probes: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    for d in denials(p, start, history, 3) {
        let bound = DenialBound::of(p, &d.evaluation, d.cost).expect("a rate denial bounds");
        for &(t, c) in probes {
            let elapsed = t % bound.retry_after_ms;
            let at = d.at + elapsed;
            if at > MAX_TIME_MS {
                continue;
            }
            let cost = cost_from(p, d.cost, c);
            let cached = bound
                .answer(p, elapsed, cost, Source::LocalCache)
                .expect("covered");
            let ev = model::evaluate(p, d.state.as_ref(), at, cost).expect("in range");
            let model = ev
                .decision(p, Source::LocalCache)
                .expect("no clock refusal after the denial");
            prop_assert!(!model.allowed && !cached.allowed);
            prop_assert_eq!(cached.limit, model.limit);
            prop_assert_eq!(cached.reset_at_ms, model.reset_at_ms);
            prop_assert_eq!(cached.certainty, model.certainty);
            prop_assert!(cached.remaining <= model.remaining);
            prop_assert!(cached.retry_after_ms <= model.retry_after_ms);
            if d.evaluation.effective_now_ms == d.at && cost == d.cost {
                prop_assert_eq!(cached.retry_after_ms, model.retry_after_ms);
            }
        }
        // Past the bound, or below the denied cost, the cache answers nothing.
        prop_assert!(
            bound
                .answer(p, bound.retry_after_ms, d.cost, Source::LocalCache)
                .is_none()
        );
        if let Some(less) = d.cost.get().checked_sub(1).and_then(|c| Cost::new(c).ok()) {
            prop_assert!(bound.answer(p, 0, less, Source::LocalCache).is_none());
        }
    }
    Ok(())
}

fn any_policy() -> impl Strategy<Value = RateLimitPolicy> {
    prop_oneof![3 => small_policy(), 1 => policy()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn a_denial_denies_every_cost_as_large_until_retry_after_whatever_others_do(
        p in any_policy(), start in start_time(), history in raw_steps(40), others in others(),
    ) {
        check_bound(&p, start.min(MAX_TIME_MS - 100_000), &history, &others)?;
    }

    #[test]
    fn a_cached_denial_is_what_the_model_answers_at_that_moment(
        p in any_policy(), start in start_time(), history in raw_steps(40),
        probes in proptest::collection::vec(any::<(u64, u64)>(), 1..6),
    ) {
        check_answer(&p, start.min(MAX_TIME_MS - 100_000), &history, &probes)?;
    }
}

/// Each algorithm, by a worked case: the denial found is cached, and its bound holds.
#[test]
fn every_rate_algorithm_yields_a_bound_and_concurrency_none() {
    use shared_contract::AlgorithmSpec;
    let ms = common::ms;
    let specs = [
        AlgorithmSpec::FixedWindow {
            limit: 2,
            window: ms(1_000),
        },
        AlgorithmSpec::SlidingWindow {
            limit: 2,
            window: ms(1_000),
        },
        AlgorithmSpec::TokenBucket {
            capacity: 2,
            refill_amount: 1,
            refill_interval: ms(500),
        },
        AlgorithmSpec::Gcra {
            limit: 2,
            period: ms(1_000),
            burst: 2,
        },
        AlgorithmSpec::SlidingLog {
            limit: 2,
            window: ms(1_000),
        },
    ];
    for algorithm in specs {
        let p = common::built("p", algorithm, 2, 0, 0).expect("valid");
        let two = Cost::new(2).expect("cost");
        let t = 1_700_000_000_250;
        let first = model::evaluate(&p, None, t, two).expect("in range");
        let denied = model::evaluate(&p, first.new_state.as_ref(), t, two).expect("in range");
        assert_eq!(denied.verdict, Verdict::Denied, "{}", p.kind());
        let bound = DenialBound::of(&p, &denied, two).expect("bounded");
        assert!(
            bound.covers(bound.retry_after_ms - 1, 2) && !bound.covers(bound.retry_after_ms, 2)
        );
        assert!(
            DenialBound::of(&p, &first, two).is_none(),
            "an allow bounds nothing"
        );
    }
    // A release frees a lease at any time: a concurrency denial bounds nothing.
    let leases = common::built(
        "c",
        AlgorithmSpec::Concurrency {
            limit: 1,
            lease_ttl: ms(1_000),
        },
        1,
        0,
        0,
    )
    .expect("valid");
    assert_eq!(leases.kind(), AlgorithmKind::Concurrency);
    let denial = Evaluation::<()> {
        verdict: Verdict::Denied,
        server_now_ms: 1,
        effective_now_ms: 1,
        limit: 1,
        remaining: 0,
        retry_after_ms: 500,
        reset_at_ms: 501,
        new_state: None,
        ttl_ms: 0,
        keeps_expiry: false,
    };
    assert!(DenialBound::of(&leases, &denial, Cost::new(1).expect("cost")).is_none());
}
