//! The fleet share ([`RateLimitPolicy::fleet_share`]): `n` instances, each deciding alone
//! with its share and its own state, admit together at most what the whole policy admits
//! over the same span (the bound of the fleet-bounded fallback); each gets at least 1
//! whenever the policy allows one per instance; and shares started from what the global
//! provider last left admit together at most that, in its window.
//!
//! What the whole policy admits over a span `[t0, t1]` is bounded per algorithm, whatever the
//! requests: a window limit per window the span touches (fixed window, sliding counter),
//! per window length (sliding log), or the burst plus what the rate adds over the span (token
//! bucket, GCRA). Each instance's admissions are checked against its own share's bound too, so
//! the test would catch a share that the model does not keep.

use crate::common;

use common::{ms, small_policy};
use proptest::prelude::*;
use shared_contract::model::{self, AlgorithmState, Verdict, reserve};
use shared_contract::policy::{Algorithm, AlgorithmSpec};
use shared_contract::{Cost, RateLimitPolicy};

/// The most `p` admits in total over `[t0, t0 + span]` from empty state.
fn bound(p: &RateLimitPolicy, t0: u64, span: u64) -> u64 {
    let t1 = t0 + span;
    let windows = |w: u64| t1 / w - t0 / w + 1;
    match p.algorithm() {
        Algorithm::FixedWindow(a) => a.limit() * windows(a.window_ms()),
        Algorithm::SlidingWindow(a) => a.limit() * windows(a.window_ms()),
        Algorithm::SlidingLog(a) => a.limit() * (span / a.window_ms() + 1),
        Algorithm::TokenBucket(a) => {
            a.capacity() + a.refill_amount() * span / a.refill_interval_ms()
        }
        Algorithm::Gcra(a) => a.burst() + a.limit() * span / a.period_ms(),
        Algorithm::Concurrency(a) => a.limit(),
    }
}

/// Runs one instance's requests (`(delay, cost)` pairs from `t0`) and returns the cost it
/// admitted and the time of its last request.
fn admitted(p: &RateLimitPolicy, t0: u64, requests: &[(u64, u64)]) -> (u64, u64) {
    admitted_from(p, None, t0, u64::MAX, requests)
}

/// Runs one instance's requests from `state` at `t0`, and returns the cost it admitted
/// before `until` and the time of its last request.
fn admitted_from(
    p: &RateLimitPolicy,
    mut state: Option<AlgorithmState>,
    t0: u64,
    until: u64,
    requests: &[(u64, u64)],
) -> (u64, u64) {
    let mut now = t0;
    let mut total = 0;
    for &(dt, raw_cost) in requests {
        now += dt;
        if now >= until {
            break;
        }
        let cost = Cost::new(1 + raw_cost % p.max_cost().get()).expect("cost >= 1");
        let ev = model::evaluate(p, state.as_ref(), now, cost).expect("in range");
        if ev.verdict == Verdict::Allowed {
            total += cost.get();
            state = ev.new_state;
        }
    }
    (total, now)
}

/// The end of the span a started share's bound covers: the window of `t0` for a window
/// policy (the quota the last answer left is that window's), else no end.
fn first_window_end(p: &RateLimitPolicy, t0: u64) -> u64 {
    match p.algorithm() {
        Algorithm::FixedWindow(a) => t0 - t0 % a.window_ms() + a.window_ms(),
        Algorithm::SlidingWindow(a) => t0 - t0 % a.window_ms() + a.window_ms(),
        // The entry at t0 holds the log's place for one window.
        Algorithm::SlidingLog(a) => t0 + a.window_ms(),
        _ => u64::MAX,
    }
}

/// What a rate adds over `span` ms (0 for a window policy).
fn added(p: &RateLimitPolicy, span: u64) -> u64 {
    match p.algorithm() {
        Algorithm::TokenBucket(a) => a.refill_amount() * span / a.refill_interval_ms(),
        Algorithm::Gcra(a) => a.limit() * span / a.period_ms(),
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The fallback's start from the global provider's last answer: each of `n` instances
    /// charges its share down to `left / n` at `t0` (`reserve::charge_spent`), so together
    /// they admit at most `left` in the rest of `t0`'s window (plus what the rate adds, for a
    /// bucket or GCRA), where the plain shares would admit the whole limit again.
    #[test]
    fn shares_started_from_the_last_answer_admit_at_most_what_it_left(
        p in small_policy(),
        n in 1u64..8,
        t0 in 1_000_000u64..2_000_000,
        left_raw in any::<u64>(),
        requests in proptest::collection::vec(
            proptest::collection::vec((0u64..400, any::<u64>()), 1..120),
            8,
        ),
    ) {
        let Some(share) = p.fleet_share(n) else { return Ok(()) };
        let left = left_raw % (p.algorithm().limit() + 1);
        let limit = share.algorithm().limit();
        let start = reserve::charge_spent(&share, None, t0, limit - (left / n).min(limit))
            .expect("a charge up to the limit");
        prop_assert_eq!(start.evaluation.verdict, Verdict::Allowed);
        let until = first_window_end(&share, t0);
        let mut total = 0;
        let mut end = t0;
        for r in requests.iter().take(n as usize) {
            let state = start.evaluation.new_state.clone();
            let (admitted, last) = admitted_from(&share, state, t0, until, r);
            prop_assert!(
                admitted <= left / n + added(&share, last - t0),
                "one instance admitted {admitted} from {left} / {n} left"
            );
            total += admitted;
            end = end.max(last);
        }
        prop_assert!(
            total <= left + added(&p, end - t0),
            "{n} started shares admitted {total} from {left} left"
        );
    }

    #[test]
    fn a_fleet_of_shares_admits_at_most_the_policy(
        p in small_policy(),
        n in 1u64..8,
        t0 in 1_000_000u64..2_000_000,
        requests in proptest::collection::vec(
            proptest::collection::vec((0u64..400, any::<u64>()), 1..120),
            8,
        ),
    ) {
        let Some(share) = p.fleet_share(n) else {
            // Only a policy smaller than the fleet rounds to nothing.
            prop_assert!(p.algorithm().limit() < n, "no share of {p:?} for {n}");
            return Ok(());
        };
        prop_assert!(share.algorithm().limit() >= 1);
        prop_assert!(share.algorithm().limit() * n <= p.algorithm().limit());
        let mut total = 0;
        let mut end = t0;
        for r in requests.iter().take(n as usize) {
            let (admitted, last) = admitted(&share, t0, r);
            prop_assert!(admitted <= bound(&share, t0, last - t0), "one share beyond its bound");
            total += admitted;
            end = end.max(last);
        }
        prop_assert!(
            total <= bound(&p, t0, end - t0),
            "{n} shares admitted {total}, beyond the policy's {}",
            bound(&p, t0, end - t0)
        );
    }

    #[test]
    fn every_instance_gets_one_when_the_policy_allows_one_each(p in small_policy(), n in 1u64..40) {
        if p.algorithm().limit() >= n {
            let share = p.fleet_share(n);
            prop_assert!(share.is_some_and(|s| s.algorithm().limit() >= 1));
        }
    }
}

/// A worked example: 3 instances over a fixed window of 10 admit 9 together (3 each).
#[test]
fn three_instances_share_a_window_of_ten() {
    let p = common::built(
        "api",
        AlgorithmSpec::FixedWindow {
            limit: 10,
            window: ms(60_000),
        },
        1,
        0,
        0,
    )
    .expect("valid policy");
    let share = p.fleet_share(3).expect("a share");
    let each = admitted(&share, 60_000, &[(1, 0); 20]).0;
    assert_eq!(each, 3);
}
