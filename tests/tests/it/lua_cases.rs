//! What the differential tests of the Lua programs draw: random valid policies of every
//! algorithm (edge ranges included: huge limits near the validation bounds, zero grace, zero
//! regression, calendar periods of several zones), planted states (valid, just out of range,
//! in overdraft), clock steps both ways, and the helpers every such test shares.

use std::time::Duration;

use acceptance_tests::lua::{
    Layout, Loaded, MultiReply, calendar_bounds, effective_time, encode_state_as,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use shared_contract::exact::{MAX_SAFE_INTEGER as MAX_SAFE, gcd};
use shared_contract::model::{
    AlgorithmState, Evaluation, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use shared_contract::policy::{
    MAX_DURATION_MS, MAX_TIME_MS, SLIDING_LOG_MAX_LIMIT, SLIDING_WINDOW_SCALE,
    calendar::CalendarUnit,
};
use shared_contract::{
    Algorithm, AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
};

pub(crate) const CASES: u32 = 160;
/// Milliseconds the server may spend inside one `EXEC` between `SET ... PX` and `PTTL`.
pub(crate) const PTTL_TOLERANCE_MS: u64 = 25;

/// A magnitude in `1..=max`, biased towards small values and the upper bound.
pub(crate) fn mag(max: u64) -> BoxedStrategy<u64> {
    let max = max.max(1);
    prop_oneof![
        3 => 1..=max.min(10),
        3 => 1..=max.min(1000),
        2 => 1..=max.min(1_000_000),
        2 => max.saturating_sub(1000).max(1)..=max,
        2 => 1..=max,
    ]
    .boxed()
}

/// Revision, cleanup grace, max clock regression and a max-cost selector.
pub(crate) fn common() -> impl Strategy<Value = (u32, u64, u64, (u8, u64))> {
    (
        prop_oneof![Just(1u32), 1..=300u32, Just(u32::MAX)],
        prop_oneof![Just(0u64), 0..=120_000u64, Just(MAX_DURATION_MS)],
        prop_oneof![Just(0u64), 0..=5_000u64, Just(MAX_DURATION_MS)],
        (0u8..4, any::<u64>()),
    )
}

/// 1, `max`, or uniform in `1..=max`, by a selector.
pub(crate) fn pick(sel: (u8, u64), max: u64) -> u64 {
    match sel.0 {
        0 => 1,
        1 => max,
        _ => 1 + sel.1 % max,
    }
}

pub(crate) fn spec_limit(a: &AlgorithmSpec) -> u64 {
    match a {
        AlgorithmSpec::FixedWindow { limit, .. }
        | AlgorithmSpec::CalendarWindow { limit, .. }
        | AlgorithmSpec::SlidingWindow { limit, .. }
        | AlgorithmSpec::SlidingLog { limit, .. } => *limit,
        AlgorithmSpec::TokenBucket { capacity, .. } => *capacity,
        AlgorithmSpec::Gcra { burst, .. } => *burst,
        AlgorithmSpec::Concurrency { limit, .. } => *limit,
    }
}

pub(crate) fn policy(
    algorithm: impl Strategy<Value = AlgorithmSpec>,
) -> impl Strategy<Value = RateLimitPolicy> {
    (algorithm, common()).prop_filter_map(
        "policy refused by validation",
        |(algorithm, (revision, grace, regression, max_cost))| {
            let limit = spec_limit(&algorithm);
            RateLimitPolicy::new(PolicySpec {
                id: PolicyId::new("diff").ok()?,
                revision: PolicyRevision::new(revision).ok()?,
                algorithm,
                max_cost: pick(max_cost, limit),
                cleanup_grace: Duration::from_millis(grace),
                max_clock_regression: Duration::from_millis(regression),
                failure_policy: FailurePolicy::FailClosed,
            })
            .ok()
        },
    )
}

/// Epoch-aligned windows, and half the time calendar periods.
pub(crate) fn fixed_window() -> impl Strategy<Value = AlgorithmSpec> {
    let epoch =
        (mag(MAX_SAFE), mag(MAX_DURATION_MS)).prop_map(|(limit, w)| AlgorithmSpec::FixedWindow {
            limit,
            window: Duration::from_millis(w),
        });
    prop_oneof![epoch, calendar_window()]
}

/// Calendar periods of every unit, in zones with half-hour offsets and DST changes.
pub(crate) fn calendar_window() -> impl Strategy<Value = AlgorithmSpec> {
    let units = [
        CalendarUnit::Hour,
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
    ];
    let zones = [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
    ];
    (mag(MAX_SAFE), 0..units.len(), 0..zones.len()).prop_map(move |(limit, u, z)| {
        AlgorithmSpec::CalendarWindow {
            limit,
            unit: units[u],
            time_zone: zones[z].to_owned(),
        }
    })
}

/// A fixed-window policy of calendar periods.
pub(crate) fn calendar_policy() -> impl Strategy<Value = RateLimitPolicy> {
    policy(calendar_window())
}

/// How far off the server's clock a caller's is, by a selector: mostly not at all, else up
/// to two days either way, or up to 70 days.
pub(crate) fn skew(sel: u64) -> i64 {
    let k = i64::try_from(sel >> 8).unwrap_or(i64::MAX);
    match sel % 8 {
        0..=3 => 0,
        4 => k % 3_600_000,
        5 => -(k % 172_800_000),
        6 => k % 172_800_000,
        _ => k % 6_048_000_000 - 3_024_000_000,
    }
}

/// Whether the calendar of `policy` cannot place the periods around `t` (before 1970's
/// second period, after 9999): such times are not sent to the programs (the provider
/// answers `Unavailable(clock)` itself), so a case stops there.
pub(crate) fn unplaced(policy: &RateLimitPolicy, t: u64) -> bool {
    matches!(policy.algorithm(), Algorithm::FixedWindow(p) if p.calendar().is_some())
        && calendar_bounds(policy, t).is_none()
}

pub(crate) fn sliding_window() -> impl Strategy<Value = AlgorithmSpec> {
    let max = MAX_SAFE / SLIDING_WINDOW_SCALE;
    (mag(max), mag(max)).prop_map(|(limit, w)| AlgorithmSpec::SlidingWindow {
        limit,
        window: Duration::from_millis(w),
    })
}

pub(crate) fn token_bucket() -> impl Strategy<Value = AlgorithmSpec> {
    (mag(MAX_SAFE), mag(MAX_DURATION_MS)).prop_flat_map(|(amount, interval)| {
        let g = gcd(amount, interval);
        let (scale, per_ms) = (interval / g, amount / g);
        let by_duration = u128::from(MAX_DURATION_MS) * u128::from(per_ms) / u128::from(scale);
        let cap_max = (MAX_SAFE / scale).min(u64::try_from(by_duration).unwrap_or(u64::MAX));
        mag(cap_max).prop_map(move |capacity| AlgorithmSpec::TokenBucket {
            capacity,
            refill_amount: amount,
            refill_interval: Duration::from_millis(interval),
        })
    })
}

pub(crate) fn gcra() -> impl Strategy<Value = AlgorithmSpec> {
    (mag(MAX_SAFE), mag(MAX_DURATION_MS)).prop_flat_map(|(limit, period)| {
        let g = gcd(limit, period);
        let (interval, per_ms) = (period / g, limit / g);
        let by_duration = u128::from(MAX_DURATION_MS) * u128::from(per_ms) / u128::from(interval);
        let burst_max = (MAX_SAFE / interval).min(u64::try_from(by_duration).unwrap_or(u64::MAX));
        mag(burst_max).prop_map(move |burst| AlgorithmSpec::Gcra {
            limit,
            period: Duration::from_millis(period),
            burst,
        })
    })
}

pub(crate) fn sliding_log() -> impl Strategy<Value = AlgorithmSpec> {
    (mag(SLIDING_LOG_MAX_LIMIT), mag(MAX_DURATION_MS)).prop_map(|(limit, w)| {
        AlgorithmSpec::SlidingLog {
            limit,
            window: Duration::from_millis(w),
        }
    })
}

/// How the clock moves before a step.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// Forward 0..=3 ms.
    Tiny(u64),
    /// Forward `k/64` of the policy's reset horizon.
    Frac(u64),
    /// Forward up to 2^40-1 ms.
    Huge(u64),
    /// Back 0..=10 ms.
    Back(u64),
    /// To `max_clock_regression + d` (d in -1..=1) behind the stored last_ms.
    BackAt(i64),
    /// Back up to 2^40-1 ms.
    BackFar(u64),
}

pub(crate) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u64..=3).prop_map(Step::Tiny),
        4 => (0u64..=96).prop_map(Step::Frac),
        1 => (0..=MAX_DURATION_MS).prop_map(Step::Huge),
        2 => (0u64..=10).prop_map(Step::Back),
        2 => (-1i64..=1).prop_map(Step::BackAt),
        1 => (0..=MAX_DURATION_MS).prop_map(Step::BackFar),
    ]
}

pub(crate) fn next_now(step: &Step, now: u64, last: Option<u64>, policy: &RateLimitPolicy) -> u64 {
    let horizon = policy.algorithm().reset_horizon_ms();
    let t = match *step {
        Step::Tiny(d) | Step::Huge(d) => now.saturating_add(d),
        Step::Frac(k) => now.saturating_add(
            u64::try_from(u128::from(horizon) * u128::from(k) / 64).unwrap_or(u64::MAX),
        ),
        Step::Back(d) | Step::BackFar(d) => now.saturating_sub(d),
        Step::BackAt(d) => {
            let base = last.unwrap_or(now);
            let back = policy.max_clock_regression_ms().saturating_add_signed(d);
            base.saturating_sub(back)
        }
    };
    t.min(MAX_TIME_MS)
}

pub(crate) fn start_time() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..=10_000,
        1_700_000_000_000u64..=1_900_000_000_000,
        (MAX_TIME_MS - 3 * MAX_DURATION_MS)..=MAX_TIME_MS,
    ]
}

/// 0, `bound`, `bound + 1` (out of range) or uniform in `0..=bound`.
pub(crate) fn field(sel: (u8, u64), bound: u64) -> u64 {
    match sel.0 % 5 {
        0 => 0,
        1 | 2 => bound,
        3 => bound + 1,
        _ => sel.1 % (bound + 1),
    }
}

/// Raw material for a planted state: whether to plant, last_ms offset from the start, field
/// selectors, sliding-log entries (age step, cost).
pub(crate) type Plant = (bool, i64, (u8, u64), (u8, u64), Vec<(u64, u64)>, bool);

pub(crate) fn plant() -> impl Strategy<Value = Plant> {
    (
        any::<bool>(),
        prop_oneof![-10i64..=10, -6_000i64..=6_000, -(1i64 << 41)..=(1i64 << 41),],
        (any::<u8>(), any::<u64>()),
        (any::<u8>(), any::<u64>()),
        prop::collection::vec(
            (
                0u64..=u64::MAX,
                prop_oneof![Just(0u64), 1u64..=3, 0u64..=1001],
            ),
            0..6,
        ),
        any::<bool>(),
    )
}

pub(crate) fn planted_state(
    p: &Plant,
    start: u64,
    policy: &RateLimitPolicy,
) -> Option<AlgorithmState> {
    let (yes, offset, a, b, entries, _) = p;
    if !yes {
        return None;
    }
    let last_ms = start.saturating_add_signed(*offset).min(MAX_TIME_MS);
    // An overdraft (a settlement's state) one time in three, up to just past its bound; the
    // field it needs at its bound (count at the limit, tokens 0) half of those times, so the
    // rest are states no model writes.
    let over = |bound: u64| {
        if b.0 % 3 == 0 {
            field((b.0 / 3, b.1), bound)
        } else {
            0
        }
    };
    let most = |units_per_ms: u64| units_per_ms.saturating_mul(MAX_DURATION_MS).min(MAX_SAFE);
    let pinned = |overdraft: u64, at: u64, otherwise: u64| {
        if overdraft > 0 && b.1 % 2 == 0 {
            at
        } else {
            otherwise
        }
    };
    Some(match policy.algorithm() {
        Algorithm::FixedWindow(q) => {
            let overdraft = over(MAX_SAFE - q.limit());
            AlgorithmState::FixedWindow(FixedWindowState {
                last_ms,
                count: pinned(overdraft, q.limit(), field(*a, q.limit())),
                overdraft,
            })
        }
        Algorithm::SlidingWindow(q) => {
            // `b` is the current count here: the overdraft comes from the first entry.
            let overdraft = match entries.first() {
                Some(&(raw, sel)) if sel % 3 == 0 => raw % (MAX_SAFE - q.limit() + 2),
                _ => 0,
            };
            let current = field(*b, q.limit());
            AlgorithmState::SlidingWindow(SlidingWindowState {
                last_ms,
                previous: field(*a, q.limit()),
                current: if overdraft > 0 && a.1 % 2 == 0 {
                    q.limit()
                } else {
                    current
                },
                overdraft,
            })
        }
        Algorithm::TokenBucket(q) => {
            let overdraft = over(most(q.units_per_ms()) - q.capacity_units());
            AlgorithmState::TokenBucket(TokenBucketState {
                last_ms,
                tokens: pinned(overdraft, 0, field(*a, q.capacity_units())),
                overdraft,
            })
        }
        Algorithm::Gcra(q) => {
            let overdraft = over(most(q.units_per_ms()) - q.tolerance_units());
            AlgorithmState::Gcra(GcraState {
                last_ms,
                debt: pinned(
                    overdraft,
                    q.tolerance_units(),
                    field(*a, q.tolerance_units()),
                ),
                overdraft,
            })
        }
        Algorithm::SlidingLog(q) => {
            // Newest first: ages grow by each step (a step of 0 repeats a time: malformed).
            let w = q.window_ms();
            let mut age = 0u64;
            let mut log = Vec::new();
            for &(step, cost) in entries {
                age = age.saturating_add(step % (2 * w + 1)).min(last_ms);
                log.push((last_ms - age, cost % (q.limit() + 2)));
            }
            log.reverse();
            AlgorithmState::SlidingLog(SlidingLogState {
                last_ms,
                entries: log,
            })
        }
        // Leases have their own differential test (lua_leases.rs).
        Algorithm::Concurrency(_) => return None,
    })
}

/// A policy of any algorithm that takes reservations (not a sliding log).
pub(crate) fn reservable_policy() -> impl Strategy<Value = RateLimitPolicy> {
    prop_oneof![
        policy(fixed_window()),
        policy(sliding_window()),
        policy(token_bucket()),
        policy(gcra()),
    ]
}

pub(crate) fn any_policy() -> impl Strategy<Value = RateLimitPolicy> {
    prop_oneof![
        policy(fixed_window()),
        policy(sliding_window()),
        policy(token_bucket()),
        policy(gcra()),
        policy(sliding_log()),
    ]
}

pub(crate) fn last_ms(s: &AlgorithmState) -> u64 {
    match s {
        AlgorithmState::FixedWindow(s) => s.last_ms,
        AlgorithmState::SlidingWindow(s) => s.last_ms,
        AlgorithmState::TokenBucket(s) => s.last_ms,
        AlgorithmState::Gcra(s) => s.last_ms,
        AlgorithmState::SlidingLog(s) => s.last_ms,
        AlgorithmState::Concurrency(s) => s.latest_expiry_ms().unwrap_or(0),
    }
}

pub(crate) fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Checks the PTTL `pttl` a step left on a key that `e` wrote: the model's `ttl_ms` (less
/// what the server spent in between), or no TTL at all where the model keeps the key's
/// expiry (`SET ... KEEPTTL`: every step PERSISTs its keys, so the expiry kept is none).
pub(crate) fn check_ttl<S>(at: &str, pttl: i64, e: &Evaluation<S>) -> Result<(), TestCaseError> {
    if e.keeps_expiry {
        prop_assert_eq!(pttl, -1, "{}: the expiry was not kept", at);
        return Ok(());
    }
    prop_assert!(e.ttl_ms >= 1, "{}: model ttl 0", at);
    let ttl = u64::try_from(pttl).map_err(|_| fail(format!("{at}: PTTL {pttl} after a write")))?;
    prop_assert!(
        ttl <= e.ttl_ms && ttl + PTTL_TOLERANCE_MS >= e.ttl_ms,
        "{}: PTTL {} for model ttl {}",
        at,
        ttl,
        e.ttl_ms
    );
    Ok(())
}

/// One call of the multi program and, in the same transaction, every key's value and PTTL
/// (then PERSIST, so nothing expires between steps).
pub(crate) fn multi_step(
    con: &mut redis::Connection,
    script: &Loaded,
    keys: &[String],
    args: &[Vec<u8>],
) -> Result<(MultiReply, After), TestCaseError> {
    let mut pipe = redis::pipe();
    pipe.atomic().add_command(script.command_keys(keys, args));
    for key in keys {
        pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
        pipe.cmd("PERSIST").arg(key).ignore();
    }
    let mut out: Vec<redis::Value> = pipe.query(con).map_err(fail)?;
    let reply = MultiReply::parse(&out.remove(0)).map_err(fail)?;
    let mut after = Vec::new();
    for pair in out.chunks(2) {
        let value: Option<Vec<u8>> = redis::from_redis_value(pair[0].clone()).map_err(fail)?;
        let ttl: i64 = redis::from_redis_value(pair[1].clone()).map_err(fail)?;
        after.push((value, ttl));
    }
    Ok((reply, after))
}

/// Every key's value and PTTL after a step.
pub(crate) type After = Vec<(Option<Vec<u8>>, i64)>;

/// Plants `plant` for `policy` at `key` (in the layout it selects, else the wide one); the
/// state planted and its bytes, or neither when no layout can hold it.
pub(crate) fn plant_at(
    con: &mut redis::Connection,
    key: &str,
    policy: &RateLimitPolicy,
    plant: &Plant,
    start: u64,
) -> Result<(Option<AlgorithmState>, Option<Vec<u8>>), TestCaseError> {
    let _: () = redis::cmd("DEL").arg(key).query(con).map_err(fail)?;
    let layout = if plant.5 {
        Layout::Wide
    } else {
        Layout::Compact
    };
    let revision = policy.revision().get();
    let Some(state) = planted_state(plant, start, policy) else {
        return Ok((None, None));
    };
    let Ok(bytes) = encode_state_as(layout, revision, &state)
        .or_else(|_| encode_state_as(Layout::Wide, revision, &state))
        .or_else(|_| encode_state_as(Layout::Overdraft, revision, &state))
    else {
        return Ok((None, None));
    };
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(&bytes)
        .query(con)
        .map_err(fail)?;
    Ok((Some(state), Some(bytes)))
}

/// Each member (its policy, what it is sent, its stored state) with the time its calendar
/// bounds are placed around: its effective time at `now`. `None` when a calendar cannot
/// place it (the case stops there: the provider answers such times itself).
pub(crate) fn timed<'p, 's, X: Copy>(
    members: impl IntoIterator<Item = (&'p RateLimitPolicy, X, &'s Option<AlgorithmState>)>,
    now: u64,
) -> Option<Vec<(&'p RateLimitPolicy, X, u64)>> {
    members
        .into_iter()
        .map(|(p, x, state)| {
            let t = effective_time(state.as_ref().map(last_ms), now);
            (!unplaced(p, t)).then_some((p, x, t))
        })
        .collect()
}
