//! Property tests of the reference models: the guarantees every provider inherits.
//!
//! Policies are drawn from the whole accepted parameter space (log-uniform up to the
//! validation bounds), times from realistic epochs and from the top of the supported range,
//! and sequences mix small steps, steps of the order of the policy's horizon, and backward
//! steps around `max_clock_regression`.

use crate::common;

use std::time::Duration;

use common::{RawStep, policy, raw_steps, small_policy, start_time, step};
use proptest::prelude::*;
use shared_contract::model::multi::{self, Member};
use shared_contract::model::{self, AlgorithmState, Evaluation, ModelError, Verdict};
use shared_contract::policy::MAX_TIME_MS;
use shared_contract::{
    Algorithm, AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec,
    RateLimitPolicy,
};

/// One admitted request: effective time and cost.
#[derive(Debug, Clone, Copy)]
struct Admission {
    at: u64,
    cost: u64,
}

/// Runs a sequence from `start`, keeping state as a provider would; returns admissions.
fn run(
    policy: &RateLimitPolicy,
    start: u64,
    steps: &[RawStep],
) -> Result<Vec<Admission>, ModelError> {
    let mut state: Option<AlgorithmState> = None;
    let mut now = start;
    let mut admitted = Vec::new();
    for &raw in steps {
        let (dt, cost) = step(policy, raw);
        now = now.saturating_add_signed(dt).min(MAX_TIME_MS);
        let ev = model::evaluate(policy, state.as_ref(), now, cost)?;
        if ev.verdict == Verdict::Allowed {
            admitted.push(Admission {
                at: ev.effective_now_ms,
                cost: cost.get(),
            });
        }
        if let Some(s) = ev.new_state {
            state = Some(s);
        }
    }
    Ok(admitted)
}

/// A policy of any rate algorithm, of small horizons (up to 5 s), with a cleanup
/// grace from 0 to beyond an eighth of the horizon and a clock regression allowed up to 100
/// ms, so that both the quantum (an eighth of the horizon) and its cap (grace less
/// regression) decide, and a grace below the regression happens too.
fn expiring_policy() -> impl Strategy<Value = RateLimitPolicy> {
    let spec = prop_oneof![
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::FixedWindow {
            limit,
            window: Duration::from_millis(w)
        }),
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::SlidingWindow {
            limit,
            window: Duration::from_millis(w)
        }),
        (1u64..20, 1u64..20, 1u64..5_000).prop_map(|(capacity, refill_amount, i)| {
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval: Duration::from_millis(i),
            }
        }),
        (1u64..20, 1u64..5_000, 1u64..20).prop_map(|(limit, p, burst)| AlgorithmSpec::Gcra {
            limit,
            period: Duration::from_millis(p),
            burst,
        }),
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::SlidingLog {
            limit,
            window: Duration::from_millis(w)
        }),
    ];
    (spec, 1u64..20, 0u64..100, 0u64..2_000).prop_filter_map(
        "max_cost above limit",
        |(algorithm, max_cost, regression, grace)| {
            common::built("p", algorithm, max_cost, grace, regression)
        },
    )
}

/// Over every interval between two admissions, the admitted cost stays within
/// `burst + floor(t * amount / per_ms)`: the envelope of a token bucket or a GCRA.
fn check_envelope(
    admitted: &[Admission],
    burst: u64,
    amount: u64,
    per_ms: u64,
) -> Result<(), String> {
    for (i, first) in admitted.iter().enumerate() {
        let mut sum = 0u128;
        for later in &admitted[i..] {
            sum += u128::from(later.cost);
            let t = u128::from(later.at - first.at);
            let bound = u128::from(burst) + t * u128::from(amount) / u128::from(per_ms);
            if sum > bound {
                return Err(format!("{sum} > {bound} over {t} ms"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_intermediate_value_leaves_the_exact_integer_range(
        p in policy(), start in start_time(), steps in raw_steps(40),
    ) {
        if let Err(e) = run(&p, start, &steps) {
            prop_assert!(false, "model error {e} for {p:?}");
        }
    }

    #[test]
    fn any_state_that_passes_validation_evaluates_in_range(
        p in policy(), now in start_time(), last in start_time(), a in any::<u64>(), b in any::<u64>(),
    ) {
        let limit = p.algorithm().limit();
        let state = match p.algorithm() {
            Algorithm::FixedWindow(_) => AlgorithmState::FixedWindow(model::FixedWindowState {
                last_ms: last, count: a % (limit + 1),
                overdraft: 0,
            }),
            Algorithm::SlidingWindow(_) => AlgorithmState::SlidingWindow(model::SlidingWindowState {
                last_ms: last, previous: a % (limit + 1), current: b % (limit + 1),
                overdraft: 0,
            }),
            Algorithm::TokenBucket(tb) => AlgorithmState::TokenBucket(model::TokenBucketState {
                last_ms: last, tokens: a % (tb.capacity_units() + 1),
                overdraft: 0,
            }),
            Algorithm::Gcra(g) => AlgorithmState::Gcra(model::GcraState {
                last_ms: last, debt: a % (g.tolerance_units() + 1),
                overdraft: 0,
            }),
            Algorithm::SlidingLog(sl) => {
                let n = a % (limit + 1);
                let entries = (0..n).map(|i| (last.saturating_sub((n - i) * (b % 7)), 1)).collect::<Vec<_>>();
                let mut entries = entries;
                entries.dedup_by_key(|e| e.0);
                let _ = sl;
                AlgorithmState::SlidingLog(model::SlidingLogState { last_ms: last, entries })
            }
            Algorithm::Concurrency(_) => return Ok(()),
        };
        let cost = p.max_cost();
        match model::evaluate(&p, Some(&state), now, cost) {
            Ok(_) | Err(ModelError::StateIncompatible(_)) => {}
            Err(e) => prop_assert!(false, "model error {e} for {p:?} / {state:?}"),
        }
    }

    #[test]
    fn fixed_window_never_admits_more_than_limit_per_window(
        p in small_policy(), start in start_time(), steps in raw_steps(80),
    ) {
        let Algorithm::FixedWindow(fw) = *p.algorithm() else { return Ok(()) };
        let admitted = run(&p, start, &steps).expect("in range");
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for a in admitted {
            *per_window.entry(a.at / fw.window_ms()).or_default() += a.cost;
        }
        for (w, sum) in per_window {
            prop_assert!(sum <= fw.limit(), "window {w}: {sum} > {}", fw.limit());
        }
    }

    #[test]
    fn sliding_log_never_admits_more_than_limit_in_any_window(
        p in small_policy(), start in start_time(), steps in raw_steps(80),
    ) {
        let Algorithm::SlidingLog(sl) = *p.algorithm() else { return Ok(()) };
        let admitted = run(&p, start, &steps).expect("in range");
        for a in &admitted {
            let sum: u64 = admitted.iter()
                .filter(|b| b.at <= a.at && b.at + sl.window_ms() > a.at)
                .map(|b| b.cost).sum();
            prop_assert!(sum <= sl.limit(), "window ending {}: {sum} > {}", a.at, sl.limit());
        }
    }

    #[test]
    fn sliding_window_admits_at_most_twice_the_limit_in_any_window(
        p in small_policy(), start in start_time(), steps in raw_steps(80),
    ) {
        // The counter is approximate: it can never admit more than `limit` within one aligned
        // window, so at most `2 * limit` in any sliding window of the same length.
        let Algorithm::SlidingWindow(sw) = *p.algorithm() else { return Ok(()) };
        let admitted = run(&p, start, &steps).expect("in range");
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for a in &admitted {
            *per_window.entry(a.at / sw.window_ms()).or_default() += a.cost;
        }
        for (_, sum) in per_window {
            prop_assert!(sum <= sw.limit());
        }
    }

    #[test]
    fn token_bucket_admits_at_most_capacity_plus_refill_over_any_interval(
        p in small_policy(), start in start_time(), steps in raw_steps(80),
    ) {
        let Algorithm::TokenBucket(tb) = *p.algorithm() else { return Ok(()) };
        let admitted = run(&p, start, &steps).expect("in range");
        if let Err(e) = check_envelope(&admitted, tb.capacity(), tb.refill_amount(), tb.refill_interval_ms()) {
            prop_assert!(false, "{e}");
        }
    }

    #[test]
    fn gcra_matches_its_burst_and_rate_envelope(
        p in small_policy(), start in start_time(), steps in raw_steps(80),
    ) {
        let Algorithm::Gcra(g) = *p.algorithm() else { return Ok(()) };
        let admitted = run(&p, start, &steps).expect("in range");
        if let Err(e) = check_envelope(&admitted, g.burst(), g.limit(), g.period_ms()) {
            prop_assert!(false, "{e}");
        }
        // And the envelope is reached: from empty state a full burst goes through at once.
        let mut state = None;
        let mut got = 0;
        while got < g.burst() {
            let ev = model::evaluate(&p, state.as_ref(), start, Cost::ONE).expect("in range");
            prop_assert_eq!(ev.verdict, Verdict::Allowed);
            state = ev.new_state;
            got += 1;
        }
    }

    #[test]
    fn a_denial_leaves_state_unchanged(
        p in small_policy(), start in start_time(), steps in raw_steps(60),
    ) {
        let mut state: Option<AlgorithmState> = None;
        let mut now = start;
        for raw in steps {
            let (dt, cost) = step(&p, raw);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS);
            let ev = model::evaluate(&p, state.as_ref(), now, cost).expect("in range");
            if ev.verdict != Verdict::Allowed {
                prop_assert!(ev.new_state.is_none());
                prop_assert_eq!(ev.ttl_ms, 0);
                // Denying again at the same instant gives the same answer: nothing was consumed.
                let again = model::evaluate(&p, state.as_ref(), now, cost).expect("in range");
                prop_assert_eq!(&again, &ev);
            } else {
                prop_assert!(ev.new_state.is_some());
                prop_assert!(ev.ttl_ms >= 1);
                state = ev.new_state;
            }
        }
    }

    /// The local provider's entry points, `decide` and `decide_all`, answer what `evaluate`
    /// and `evaluate_all` do but for the write's expiry, which they leave unset.
    #[test]
    fn decide_is_evaluate_without_the_expiry(
        p in prop_oneof![small_policy(), policy()], start in start_time(), steps in raw_steps(60),
    ) {
        let mut state: Option<AlgorithmState> = None;
        let mut now = start;
        for raw in steps {
            let (dt, cost) = step(&p, raw);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS);
            let mut want = model::evaluate(&p, state.as_ref(), now, cost).expect("in range");
            let got = model::decide(&p, state.as_ref(), now, cost).expect("in range");
            if want.new_state.is_some() {
                prop_assert!(want.ttl_ms >= 1, "evaluate sets an expiry");
            }
            want.ttl_ms = 0;
            want.keeps_expiry = false;
            prop_assert_eq!(&got, &want);
            let member = [Member { policy: &p, state: state.as_ref(), cost }];
            let mut all = multi::evaluate_all(&member, now).expect("in range");
            for m in &mut all.members {
                m.ttl_ms = 0;
                m.keeps_expiry = false;
            }
            prop_assert_eq!(multi::decide_all(&member, now).expect("in range"), all);
            if let Some(s) = got.new_state {
                state = Some(s);
            }
        }
    }

    #[test]
    fn after_retry_after_a_denied_request_alone_is_allowed_and_not_before(
        p in small_policy(), start in start_time(), steps in raw_steps(60),
    ) {
        let mut state: Option<AlgorithmState> = None;
        let mut now = start;
        for raw in steps {
            let (dt, cost) = step(&p, raw);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS - 100_000);
            let ev = model::evaluate(&p, state.as_ref(), now, cost).expect("in range");
            match ev.verdict {
                Verdict::Denied => {
                    prop_assert!(ev.retry_after_ms > 0);
                    let at = ev.effective_now_ms + ev.retry_after_ms;
                    let later = model::evaluate(&p, state.as_ref(), at, cost).expect("in range");
                    prop_assert_eq!(later.verdict, Verdict::Allowed, "not allowed at retry_after for {:?}", ev);
                    let before = model::evaluate(&p, state.as_ref(), at - 1, cost).expect("in range");
                    prop_assert_ne!(before.verdict, Verdict::Allowed, "retry_after not minimal for {:?}", ev);
                }
                Verdict::Allowed => {
                    prop_assert_eq!(ev.retry_after_ms, 0);
                    state = ev.new_state;
                }
                Verdict::ClockUnsafe => {}
            }
        }
    }

    #[test]
    fn state_past_its_reset_horizon_decides_like_no_state(
        p in small_policy(), start in start_time(), steps in raw_steps(30), extra in 0u64..10_000, c in any::<u64>(),
    ) {
        let mut state: Option<AlgorithmState> = None;
        let mut last_write = start;
        let mut now = start;
        for raw in steps {
            let (dt, cost) = step(&p, raw);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS - (1 << 43));
            let ev = model::evaluate(&p, state.as_ref(), now, cost).expect("in range");
            if let Some(s) = ev.new_state {
                // The TTL a provider sets covers the horizon of this write: a deadline on the
                // provider's clock (longer than from the effective time under a regression),
                // a bucket's, a GCRA's and a sliding log's rounded up to an eighth of the
                // horizon, at most the grace less the allowed regression.
                let due = ev.reset_at_ms + p.cleanup_grace_ms();
                let room = p.cleanup_grace_ms().saturating_sub(p.max_clock_regression_ms());
                let quantum = (p.algorithm().reset_horizon_ms() / 8).min(room).max(1);
                match p.algorithm() {
                    Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_) => {
                        prop_assert_eq!(now + ev.ttl_ms, due);
                    }
                    Algorithm::TokenBucket(_) | Algorithm::Gcra(_) | Algorithm::SlidingLog(_) => {
                        let deadline = now + ev.ttl_ms;
                        prop_assert!(deadline >= due && deadline < due + quantum);
                        prop_assert_eq!(deadline % quantum, 0);
                    }
                    Algorithm::Concurrency(_) => {
                        return Err(TestCaseError::fail("a concurrency policy is not evaluated"));
                    }
                }
                last_write = ev.effective_now_ms;
                state = Some(s);
            }
        }
        let at = last_write + p.algorithm().reset_horizon_ms() + extra;
        let cost = Cost::new(1 + c % p.max_cost().get()).expect("valid cost");
        let with = model::evaluate(&p, state.as_ref(), at, cost).expect("in range");
        let without = model::evaluate(&p, None, at, cost).expect("in range");
        prop_assert_eq!(with, without);
    }

    /// A store under the expiry rule of the fixed window, sliding counter, token bucket or
    /// GCRA (a write sets the deadline now + ttl unless it keeps the stored one; a key is
    /// gone at its deadline) decides exactly like a store that never forgets, under any clock
    /// steps and any grace, and a kept deadline is the one the write would have set. Where the grace covers the
    /// allowed regression, some writes are a build's before this rule (a TTL of reset_at -
    /// effective time + grace, never kept), as in a rolling upgrade: a deadline such a write
    /// set and a later write kept is never before the kept state is full, and the two stores
    /// still decide alike. Expiry between two steps is not simulated: a step at or past the
    /// deadline always writes, so only a clock that passed it and came back unseen could
    /// differ, which no store with a TTL can tell.
    #[test]
    fn a_key_expires_unseen_and_keeping_its_expiry_loses_nothing(
        p in expiring_policy(), start in start_time(), steps in raw_steps(60),
        builds in prop::collection::vec(any::<bool>(), 60),
    ) {
        let mixed = p.cleanup_grace_ms() >= p.max_clock_regression_ms();
        let mut forever: Option<AlgorithmState> = None;
        // The state, its key's deadline, and whether an older build set it.
        let mut expiring: Option<(AlgorithmState, u64, bool)> = None;
        let mut now = start;
        for (raw, older) in steps.into_iter().zip(builds) {
            let older = older && mixed;
            let (dt, cost) = step(&p, raw);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS - (1 << 43));
            if expiring.as_ref().is_some_and(|(_, deadline, _)| now >= *deadline) {
                expiring = None;
            }
            let ev = model::evaluate(&p, expiring.as_ref().map(|(s, ..)| s), now, cost)
                .expect("in range");
            let want = model::evaluate(&p, forever.as_ref(), now, cost).expect("in range");
            prop_assert_eq!(&ev, &want);
            let Some(s) = ev.new_state else { continue };
            let deadline = if older {
                now + ev.reset_at_ms - ev.effective_now_ms + p.cleanup_grace_ms()
            } else if ev.keeps_expiry {
                let Some((_, kept, by_older)) = expiring else {
                    return Err(TestCaseError::fail("kept an expiry with no key"));
                };
                if by_older {
                    prop_assert!(kept >= ev.reset_at_ms, "kept {} < reset {}", kept, ev.reset_at_ms);
                } else {
                    prop_assert_eq!(kept, now + ev.ttl_ms, "a kept deadline is the one set");
                }
                kept
            } else {
                now + ev.ttl_ms
            };
            let by_older = older || (ev.keeps_expiry && expiring.is_some_and(|e| e.2));
            expiring = Some((s.clone(), deadline, by_older));
            forever = Some(s);
        }
    }

    #[test]
    fn small_clock_regression_clamps_and_large_regression_is_unsafe_and_touches_nothing(
        p in small_policy(), start in 1_600_000_000_000u64..2_000_000_000_000, back in 0u64..300,
        c in any::<u64>(),
    ) {
        let first = model::evaluate(&p, None, start, Cost::ONE).expect("in range");
        let state = first.new_state.expect("first request is allowed");
        let cost = Cost::new(1 + c % p.max_cost().get()).expect("valid cost");
        let ev = model::evaluate(&p, Some(&state), start - back, cost).expect("in range");
        if back <= p.max_clock_regression_ms() {
            let at_last = model::evaluate(&p, Some(&state), start, cost).expect("in range");
            prop_assert_eq!(ev.effective_now_ms, start);
            // The same decision and state; the state lives at least as long.
            prop_assert!(ev.ttl_ms >= at_last.ttl_ms);
            prop_assert_eq!(Evaluation { server_now_ms: start, ttl_ms: at_last.ttl_ms, ..ev }, at_last);
        } else {
            prop_assert_eq!(ev.verdict, Verdict::ClockUnsafe);
            prop_assert!(ev.new_state.is_none());
            prop_assert_eq!(ev.retry_after_ms, back);
        }
    }

    #[test]
    fn token_refill_at_many_intermediate_times_equals_refill_once(
        p in policy(), start in 1_600_000_000_000u64..2_000_000_000_000, tokens in any::<u64>(),
        cuts in proptest::collection::vec(any::<u64>(), 1..20), total in any::<u64>(),
    ) {
        let Algorithm::TokenBucket(tb) = *p.algorithm() else { return Ok(()) };
        let s0 = model::TokenBucketState { last_ms: start, tokens: tokens % (tb.capacity_units() + 1), overdraft: 0 };
        let (times, end) = intermediate_times(&p, start, &cuts, total);
        let mut s = s0;
        for t in times {
            s = model::TokenBucketState { last_ms: t, tokens: model::token_bucket::refill(&tb, &s, t).expect("in range"), overdraft: 0 };
        }
        let stepwise = model::token_bucket::refill(&tb, &s, end).expect("in range");
        let once = model::token_bucket::refill(&tb, &s0, end).expect("in range");
        prop_assert_eq!(stepwise, once);
    }

    #[test]
    fn gcra_repayment_at_many_intermediate_times_equals_repayment_once(
        p in policy(), start in 1_600_000_000_000u64..2_000_000_000_000, debt in any::<u64>(),
        cuts in proptest::collection::vec(any::<u64>(), 1..20), total in any::<u64>(),
    ) {
        let Algorithm::Gcra(g) = *p.algorithm() else { return Ok(()) };
        let s0 = model::GcraState { last_ms: start, debt: debt % (g.tolerance_units() + 1), overdraft: 0 };
        let (times, end) = intermediate_times(&p, start, &cuts, total);
        let mut s = s0;
        for t in times {
            s = model::GcraState { last_ms: t, debt: model::gcra::repay(&g, &s, t).expect("in range"), overdraft: 0 };
        }
        prop_assert_eq!(model::gcra::repay(&g, &s, end).expect("in range"), model::gcra::repay(&g, &s0, end).expect("in range"));
    }
}

/// An end within the policy's reset horizon after `start` (from `total`), and sorted times
/// between `start` and that end (from `cuts`).
fn intermediate_times(
    p: &RateLimitPolicy,
    start: u64,
    cuts: &[u64],
    total: u64,
) -> (Vec<u64>, u64) {
    let span = p.algorithm().reset_horizon_ms().max(1);
    let end = start + total % (span + 1);
    let mut times: Vec<u64> = cuts.iter().map(|c| start + c % (end - start + 1)).collect();
    times.sort_unstable();
    (times, end)
}

/// A worked example from docs/algorithms.md: 100 tokens, 10 per second.
#[test]
fn token_bucket_worked_example() {
    let p = policy_of(
        AlgorithmSpec::TokenBucket {
            capacity: 100,
            refill_amount: 10,
            refill_interval: Duration::from_secs(1),
        },
        100,
    );
    let t0 = 1_764_672_000_000;
    let all = Cost::new(100).expect("cost");
    let ev = model::evaluate(&p, None, t0, all).expect("in range");
    assert_eq!(
        (ev.verdict, ev.remaining, ev.reset_at_ms),
        (Verdict::Allowed, 0, t0 + 10_000)
    );
    let s = ev.new_state;
    // 150 ms later: 1.5 tokens. One is admitted, the half token carries over.
    let ev = model::evaluate(&p, s.as_ref(), t0 + 150, Cost::ONE).expect("in range");
    assert_eq!((ev.verdict, ev.remaining), (Verdict::Allowed, 0));
    let s = ev.new_state;
    let ev = model::evaluate(&p, s.as_ref(), t0 + 150, Cost::ONE).expect("in range");
    assert_eq!((ev.verdict, ev.retry_after_ms), (Verdict::Denied, 50));
    let ev = model::evaluate(&p, s.as_ref(), t0 + 200, Cost::ONE).expect("in range");
    assert_eq!(ev.verdict, Verdict::Allowed);
}

fn policy_of(algorithm: AlgorithmSpec, max_cost: u64) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("api").expect("id"),
        revision: PolicyRevision::new(1).expect("rev"),
        algorithm,
        max_cost,
        cleanup_grace: Duration::from_secs(60),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid")
}

/// docs/algorithms.md, sliding-window example: the previous minute had 10, this one 2.
#[test]
fn sliding_window_worked_example() {
    let p = policy_of(
        AlgorithmSpec::SlidingWindow {
            limit: 10,
            window: Duration::from_secs(60),
        },
        1,
    );
    let minute = 1_764_672_000_000 / 60_000 * 60_000;
    let state = AlgorithmState::SlidingWindow(model::SlidingWindowState {
        last_ms: minute + 1_000,
        previous: 10,
        current: 2,
        overdraft: 0,
    });
    let ev = model::evaluate(&p, Some(&state), minute + 15_000, Cost::ONE).expect("in range");
    assert_eq!(
        (ev.verdict, ev.remaining, ev.retry_after_ms),
        (Verdict::Denied, 0, 3_000)
    );
    let ev = model::evaluate(&p, Some(&state), minute + 18_000, Cost::ONE).expect("in range");
    assert_eq!((ev.verdict, ev.remaining), (Verdict::Allowed, 0));
}

/// docs/algorithms.md, GCRA example: 100 per minute, burst 20 -> 600 ms per request.
#[test]
fn gcra_worked_example() {
    let p = policy_of(
        AlgorithmSpec::Gcra {
            limit: 100,
            period: Duration::from_secs(60),
            burst: 20,
        },
        1,
    );
    let t0 = 1_764_672_000_000;
    let mut state = None;
    for i in 0..20 {
        let ev = model::evaluate(&p, state.as_ref(), t0, Cost::ONE).expect("in range");
        assert_eq!((ev.verdict, ev.remaining), (Verdict::Allowed, 19 - i));
        state = ev.new_state;
    }
    let ev = model::evaluate(&p, state.as_ref(), t0, Cost::ONE).expect("in range");
    assert_eq!(
        (ev.verdict, ev.retry_after_ms, ev.reset_at_ms),
        (Verdict::Denied, 600, t0 + 12_000)
    );
}

/// docs/algorithms.md, fixed-window example: 5 per 10 s.
#[test]
fn fixed_window_worked_example() {
    let p = policy_of(
        AlgorithmSpec::FixedWindow {
            limit: 5,
            window: Duration::from_secs(10),
        },
        1,
    );
    let start = 1_764_672_000_000;
    let mut state = None;
    for i in 0..5 {
        let ev = model::evaluate(&p, state.as_ref(), start + 3_000, Cost::ONE).expect("in range");
        assert_eq!((ev.verdict, ev.remaining), (Verdict::Allowed, 4 - i));
        state = ev.new_state;
    }
    let ev = model::evaluate(&p, state.as_ref(), start + 4_000, Cost::ONE).expect("in range");
    assert_eq!((ev.verdict, ev.retry_after_ms), (Verdict::Denied, 6_000));
    let ev = model::evaluate(&p, state.as_ref(), start + 10_000, Cost::ONE).expect("in range");
    assert_eq!((ev.verdict, ev.remaining), (Verdict::Allowed, 4));
}
