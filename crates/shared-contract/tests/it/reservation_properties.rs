//! Properties of reservations (`model::reserve`, `reservation`): a settlement charges what
//! the work cost, a refund never admits more than charging the actual cost in the first place
//! would have, and settle and cancel charge once however often they are retried.
//!
//! The reference for refunds is a second world that, at each reservation, charges the actual
//! cost at once (known to the test in advance) and at each settlement only the part above the
//! estimate; evaluations admitted in the first world are charged in the second. The first
//! world may never count less than the second: for a fixed window it counts exactly as much
//! once nothing is outstanding.

use crate::common;

use common::{RawStep, raw_steps, small_policy, start_time, step};
use proptest::prelude::*;
use shared_contract::model::multi::{self, Member, MultiVerdict, Settle};
use shared_contract::model::reserve::{self, Hold};
use shared_contract::model::{self, AlgorithmState, ModelError, Verdict};
use shared_contract::policy::{MAX_TIME_MS, SLIDING_WINDOW_SCALE};
use shared_contract::reservation::{Reservation, ReservationTtl, SettleStep};
use shared_contract::{Algorithm, AlgorithmKind, Cost, RateLimitPolicy};

/// What `policy` counts at effective time `t` (>= the state's last write), in its own units:
/// the cost in the window (fixed), `(previous, current)` weighed as the model weighs them
/// (sliding, scaled by `SLIDING_WINDOW_SCALE`), units missing from a full bucket, or debt.
fn used(policy: &RateLimitPolicy, state: Option<&AlgorithmState>, t: u64) -> u64 {
    let Some(state) = state else { return 0 };
    match (policy.algorithm(), state) {
        (Algorithm::FixedWindow(p), AlgorithmState::FixedWindow(s)) => {
            if s.last_ms / p.window_ms() == t / p.window_ms() {
                s.count + s.overdraft
            } else {
                0
            }
        }
        (Algorithm::SlidingWindow(p), AlgorithmState::SlidingWindow(s)) => {
            let w = p.window_ms();
            let (previous, current) = match t / w - s.last_ms / w {
                0 => (s.previous, s.current + s.overdraft),
                1 => (s.current, 0),
                _ => (0, 0),
            };
            let weight = ((w - t % w) * SLIDING_WINDOW_SCALE).div_ceil(w);
            previous * weight + current * SLIDING_WINDOW_SCALE
        }
        (Algorithm::TokenBucket(p), AlgorithmState::TokenBucket(s)) => {
            model::token_bucket::missing(p, s, t).expect("in range")
        }
        (Algorithm::Gcra(p), AlgorithmState::Gcra(s)) => {
            model::gcra::repay(p, s, t).expect("in range")
        }
        other => panic!("state of another algorithm: {other:?}"),
    }
}

fn last_ms(state: Option<&AlgorithmState>) -> u64 {
    match state {
        Some(AlgorithmState::FixedWindow(s)) => s.last_ms,
        Some(AlgorithmState::SlidingWindow(s)) => s.last_ms,
        Some(AlgorithmState::TokenBucket(s)) => s.last_ms,
        Some(AlgorithmState::Gcra(s)) => s.last_ms,
        _ => 0,
    }
}

/// A policy that takes reservations.
fn reservable() -> impl Strategy<Value = RateLimitPolicy> {
    small_policy().prop_filter("sliding logs take no reservations", |p| {
        p.kind() != AlgorithmKind::SlidingLog
    })
}

/// One step of a run: `(kind, time step and cost, actual selector, which reservation)`.
type Op = (u8, RawStep, u64, usize);

fn ops() -> impl Strategy<Value = Vec<Op>> {
    raw_steps(60).prop_flat_map(|steps| {
        let n = steps.len();
        (
            Just(steps),
            proptest::collection::vec((0u8..3, any::<u64>(), any::<usize>()), n),
        )
            .prop_map(|(steps, rest)| {
                steps
                    .into_iter()
                    .zip(rest)
                    .map(|(raw, (kind, a, pick))| (kind, raw, a, pick))
                    .collect()
            })
    })
}

/// The two worlds of the module docs, side by side.
struct Worlds<'a> {
    policy: &'a RateLimitPolicy,
    real: Option<AlgorithmState>,
    ideal: Option<AlgorithmState>,
    /// Outstanding reservations of the real world: hold and actual cost.
    open: Vec<(Hold, u64)>,
}

impl Worlds<'_> {
    fn charge_ideal(&mut self, now: u64, cost: u64) {
        let s = reserve::charge(self.policy, self.ideal.as_ref(), now, cost).expect("in range");
        if let Some(state) = s.evaluation.new_state {
            self.ideal = Some(state);
        }
    }

    fn step(&mut self, now: u64, (kind, raw, a, pick): Op) -> Result<(), TestCaseError> {
        let (_, cost) = step(self.policy, raw);
        let actual = a % (self.policy.max_cost().get() + 1);
        match kind {
            0 => {
                let ev =
                    model::evaluate(self.policy, self.real.as_ref(), now, cost).expect("in range");
                if let Some(state) = ev.new_state {
                    self.real = Some(state);
                    self.charge_ideal(now, cost.get());
                }
            }
            1 => {
                let (ev, hold) =
                    reserve::reserve(self.policy, self.real.as_ref(), now, cost).expect("in range");
                prop_assert_eq!(hold.is_some(), ev.verdict == Verdict::Allowed);
                if let (Some(state), Some(hold)) = (ev.new_state, hold) {
                    self.real = Some(state);
                    self.charge_ideal(now, actual.min(hold.estimate));
                    self.open.push((hold, actual));
                }
            }
            _ if !self.open.is_empty() => {
                let (hold, actual) = self.open.remove(pick % self.open.len());
                let s = reserve::settle(self.policy, self.real.as_ref(), now, &hold, actual)
                    .expect("in range");
                if let Some(state) = s.evaluation.new_state {
                    self.real = Some(state);
                    self.charge_ideal(now, actual.saturating_sub(hold.estimate));
                } else {
                    prop_assert_eq!(s.evaluation.verdict, Verdict::ClockUnsafe);
                    self.open.push((hold, actual));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// A refund never admits more than charging the actual cost at the reservation would
    /// have; for a fixed window the count is exactly that once every reservation is settled.
    #[test]
    fn a_refund_never_admits_more_than_charging_the_actual_at_once(
        policy in reservable(),
        start in start_time(),
        ops in ops(),
    ) {
        let mut worlds = Worlds { policy: &policy, real: None, ideal: None, open: Vec::new() };
        let mut now = start;
        for op in ops {
            let (dt, _) = step(&policy, op.1);
            now = now.saturating_add_signed(dt).min(MAX_TIME_MS);
            worlds.step(now, op)?;
            prop_assert_eq!(last_ms(worlds.real.as_ref()), last_ms(worlds.ideal.as_ref()));
            let t = now.max(last_ms(worlds.real.as_ref()));
            let (real, ideal) = (used(&policy, worlds.real.as_ref(), t), used(&policy, worlds.ideal.as_ref(), t));
            prop_assert!(real >= ideal, "at {}: counts {} below {}", t, real, ideal);
            // Equal once nothing is outstanding (an outstanding reservation counts its estimate).
            if policy.kind() == AlgorithmKind::FixedWindow && worlds.open.is_empty() {
                prop_assert_eq!(real, ideal, "at {}", t);
            }
        }
    }

    /// Settle retried any number of times, cancel, expiry: what the policy counts is what
    /// the reservations charged (actuals once settled, nothing once cancelled, estimates
    /// otherwise) plus what was evaluated, all inside one fixed window.
    #[test]
    fn retried_settlements_charge_once(
        limit in 1u64..200,
        steps in proptest::collection::vec((0u8..4, 1u64..10, 0u64..12, 1usize..11, any::<usize>()), 1..40),
    ) {
        let policy = common::built(
            "p",
            shared_contract::AlgorithmSpec::FixedWindow { limit, window: common::ms(60_000) },
            10.min(limit),
            0,
            0,
        ).expect("valid");
        let (start, ttl) = (1_800_000_000_000u64, ReservationTtl::from_millis(30).expect("ok"));
        let mut state: Option<AlgorithmState> = None;
        let mut reservations: Vec<Reservation> = Vec::new();
        let mut evaluated = 0;
        for (i, (kind, c, a, retries, pick)) in steps.into_iter().enumerate() {
            let now = start + i as u64;
            let cost = Cost::new(c.min(policy.max_cost().get())).expect("positive");
            let actual = a.min(policy.max_cost().get());
            match kind {
                0 => {
                    let ev = model::evaluate(&policy, state.as_ref(), now, cost).expect("ok");
                    if let Some(s) = ev.new_state { state = Some(s); evaluated += cost.get(); }
                }
                1 => {
                    let (ev, hold) = reserve::reserve(&policy, state.as_ref(), now, cost).expect("ok");
                    if let (Some(s), Some(hold)) = (ev.new_state, hold) {
                        state = Some(s);
                        reservations.push(Reservation::new(vec![hold], now, ttl));
                    }
                }
                _ if !reservations.is_empty() => {
                    let n = reservations.len();
                    let r = &mut reservations[pick % n];
                    let cancel = kind == 3;
                    for _ in 0..retries {
                        let charge = if cancel {
                            r.cancel_step(now).ok() == Some(shared_contract::reservation::CancelStep::Refund)
                        } else {
                            r.settle_step(now, &[actual]).ok() == Some(SettleStep::Charge)
                        };
                        if !charge { continue; }
                        let actual = if cancel { 0 } else { actual };
                        let hold = r.holds()[0];
                        let s = reserve::settle(&policy, state.as_ref(), now, &hold, actual).expect("ok");
                        state = s.evaluation.new_state.or(state);
                        if cancel { r.cancelled() } else { r.settled(vec![actual]) }
                    }
                }
                _ => {}
            }
            let charged: u64 = reservations.iter().map(|r| r.charged()[0]).sum();
            prop_assert_eq!(used(&policy, state.as_ref(), now), evaluated + charged);
        }
    }

    /// Several policies in one reservation are all or nothing, and so is their settlement.
    #[test]
    fn a_reservation_of_several_policies_is_all_or_nothing(
        a in reservable(),
        b in reservable(),
        start in start_time(),
        costs in proptest::collection::vec((any::<u64>(), any::<u64>()), 1..30),
    ) {
        let (mut sa, mut sb): (Option<AlgorithmState>, Option<AlgorithmState>) = (None, None);
        for (i, (x, y)) in costs.into_iter().enumerate() {
            let now = (start + i as u64).min(MAX_TIME_MS);
            let ca = Cost::new(1 + x % a.max_cost().get()).expect("positive");
            let cb = Cost::new(1 + y % b.max_cost().get()).expect("positive");
            let members = [
                Member { policy: &a, state: sa.as_ref(), cost: ca },
                Member { policy: &b, state: sb.as_ref(), cost: cb },
            ];
            let (ev, holds) = multi::reserve_all(&members, now).expect("in range");
            let written = ev.members.iter().filter(|m| m.new_state.is_some()).count();
            match ev.verdict {
                MultiVerdict::Allowed => prop_assert_eq!(written, 2),
                _ => { prop_assert_eq!(written, 0); prop_assert!(holds.is_none()); continue; }
            }
            let holds = holds.expect("admitted");
            let [na, nb] = [0, 1].map(|k| ev.members[k].new_state.clone());
            let (na, nb) = (na.expect("written"), nb.expect("written"));
            let settle = [
                Settle { policy: &a, state: Some(&na), hold: &holds[0], actual: x % (a.max_cost().get() + 1) },
                Settle { policy: &b, state: Some(&nb), hold: &holds[1], actual: y % (b.max_cost().get() + 1) },
            ];
            let settled = multi::settle_all(&settle, now).expect("in range");
            prop_assert!(settled.iter().all(|s| s.evaluation.new_state.is_some()));
            sa = settled[0].evaluation.new_state.clone();
            sb = settled[1].evaluation.new_state.clone();
        }
    }
}

fn policy(spec: shared_contract::AlgorithmSpec, max_cost: u64) -> RateLimitPolicy {
    common::built("p", spec, max_cost, 0, 0).expect("valid")
}

fn bucket() -> RateLimitPolicy {
    // 10 tokens, one more every 100 ms.
    policy(
        shared_contract::AlgorithmSpec::TokenBucket {
            capacity: 10,
            refill_amount: 1,
            refill_interval: common::ms(100),
        },
        10,
    )
}

#[test]
fn settled_at_once_a_bucket_is_refunded_exactly() {
    let p = bucket();
    let now = 1_800_000_000_000;
    let (ev, hold) = reserve::reserve(&p, None, now, Cost::new(8).expect("ok")).expect("ok");
    let hold = hold.expect("admitted");
    let s = reserve::settle(&p, ev.new_state.as_ref(), now, &hold, 3).expect("ok");
    assert_eq!(s.evaluation.remaining, 7, "{s:?}");
    let charged = reserve::charge(&p, None, now, 3).expect("ok");
    assert_eq!(s.evaluation.new_state, charged.evaluation.new_state);
}

#[test]
fn a_refund_is_less_what_the_bucket_refilled_meanwhile() {
    let p = bucket();
    let now = 1_800_000_000_000;
    let (ev, hold) = reserve::reserve(&p, None, now, Cost::new(8).expect("ok")).expect("ok");
    let hold = hold.expect("admitted");
    // 300 ms later the bucket has 2 + 3 tokens; 5 unused, less the 3 refilled, come back.
    let s = reserve::settle(&p, ev.new_state.as_ref(), now + 300, &hold, 3).expect("ok");
    assert_eq!(s.evaluation.remaining, 7, "{s:?}");
    assert_eq!(s.refunded, 2 * p_scale(&p), "{s:?}");
}

fn p_scale(p: &RateLimitPolicy) -> u64 {
    match p.algorithm() {
        Algorithm::TokenBucket(tb) => tb.scale(),
        _ => 1,
    }
}

#[test]
fn an_overdraft_denies_until_the_bucket_has_paid_it() {
    let p = bucket();
    let now = 1_800_000_000_000;
    let (ev, hold) = reserve::reserve(&p, None, now, Cost::new(10).expect("ok")).expect("ok");
    let hold = hold.expect("admitted");
    // 4 tokens more than reserved: the bucket owes 4, refilled in 400 ms, then 1 more in 100.
    let s = reserve::settle(&p, ev.new_state.as_ref(), now, &hold, 10).expect("ok");
    assert_eq!(s.overdrawn, 0);
    let s = reserve::charge(&p, s.evaluation.new_state.as_ref(), now, 4).expect("ok");
    assert_eq!(s.overdrawn, 4);
    let state = s.evaluation.new_state;
    let one = Cost::new(1).expect("ok");
    let denied = model::evaluate(&p, state.as_ref(), now + 499, one).expect("ok");
    assert_eq!(denied.verdict, Verdict::Denied);
    assert_eq!(denied.retry_after_ms, 1, "{denied:?}");
    let allowed = model::evaluate(&p, state.as_ref(), now + 500, one).expect("ok");
    assert_eq!(allowed.verdict, Verdict::Allowed);
}

#[test]
fn a_window_in_overdraft_admits_nothing_until_it_ends() {
    let p = policy(
        shared_contract::AlgorithmSpec::FixedWindow {
            limit: 10,
            window: common::ms(1_000),
        },
        10,
    );
    let now = 1_800_000_000_000;
    let (ev, hold) = reserve::reserve(&p, None, now, Cost::new(5).expect("ok")).expect("ok");
    let s = reserve::settle(&p, ev.new_state.as_ref(), now, &hold.expect("ok"), 10).expect("ok");
    let s = reserve::charge(&p, s.evaluation.new_state.as_ref(), now, 10).expect("ok");
    let state = s.evaluation.new_state;
    assert!(
        matches!(state, Some(AlgorithmState::FixedWindow(w)) if w.count == 10 && w.overdraft == 10)
    );
    let one = Cost::new(1).expect("ok");
    let denied = model::evaluate(&p, state.as_ref(), now + 999, one).expect("ok");
    assert_eq!(denied.verdict, Verdict::Denied);
    let next = model::evaluate(&p, state.as_ref(), now + 1_000, one).expect("ok");
    assert_eq!((next.verdict, next.remaining), (Verdict::Allowed, 9));
}

#[test]
fn sliding_logs_and_actual_costs_above_max_cost_are_refused() {
    let log = policy(
        shared_contract::AlgorithmSpec::SlidingLog {
            limit: 10,
            window: common::ms(1_000),
        },
        10,
    );
    let one = Cost::new(1).expect("ok");
    assert_eq!(
        reserve::reserve(&log, None, 0, one).map(|_| ()),
        Err(ModelError::ReservationUnsupported("sliding_log"))
    );
    let p = bucket();
    let hold = Hold {
        at_ms: 0,
        estimate: 1,
    };
    let e = reserve::settle(&p, None, 0, &hold, 11).expect_err("above max_cost");
    assert_eq!(
        e,
        ModelError::CostAboveMax {
            cost: 11,
            max_cost: 10
        }
    );
}
