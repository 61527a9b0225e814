//! Differential property tests: each Lua program (its test build, `now` taken from ARGV)
//! against its reference model, on a real redis-server.
//!
//! For random valid policies (edge ranges included: huge limits near the validation bounds,
//! zero grace, zero regression), an optional planted state (valid or just out of range), and
//! random sequences of (time step, cost) with small and large steps both ways, every step
//! must give exactly the model's seven fields; an allow must store exactly the model's new
//! state with a TTL of the model's `ttl_ms`; anything else must leave the value and TTL alone.
//!
//! The multi-limit program is held to `model::multi::evaluate_all` the same way, on 1..=4
//! members of mixed algorithms with their own planted states, every step checking the status,
//! the member it names, every member's row, and every key's value and TTL.
//!
//! Keys never expire during a case: each step runs `EVALSHA; GET; PTTL; PERSIST` in one
//! transaction (Redis does not expire keys within `EXEC`), so model time and real time can
//! differ freely while the TTL written by the program is still observed exactly.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use acceptance_tests::lua::{
    Layout, Loaded, MULTI_SOURCE, MultiReply, Program, Reply, arguments, decode_state,
    encode_state, encode_state_as, multi_arguments, test_build,
};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::exact::{MAX_SAFE_INTEGER as MAX_SAFE, gcd};
use shared_contract::model::multi::{Member, MultiVerdict};
use shared_contract::model::{
    self, AlgorithmState, FixedWindowState, GcraState, ModelError, SlidingLogState,
    SlidingWindowState, TokenBucketState,
};
use shared_contract::policy::{
    MAX_DURATION_MS, MAX_TIME_MS, SLIDING_LOG_MAX_LIMIT, SLIDING_WINDOW_SCALE,
};
use shared_contract::{
    Algorithm, AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec,
    RateLimitPolicy,
};

pub(crate) const CASES: u32 = 160;
/// Milliseconds the server may spend inside one `EXEC` between `SET ... PX` and `PTTL`.
pub(crate) const PTTL_TOLERANCE_MS: u64 = 25;

/// A magnitude in `1..=max`, biased towards small values and the upper bound.
fn mag(max: u64) -> BoxedStrategy<u64> {
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
fn common() -> impl Strategy<Value = (u32, u64, u64, (u8, u64))> {
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

fn spec_limit(a: &AlgorithmSpec) -> u64 {
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

fn policy(
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

fn fixed_window() -> impl Strategy<Value = AlgorithmSpec> {
    (mag(MAX_SAFE), mag(MAX_DURATION_MS)).prop_map(|(limit, w)| AlgorithmSpec::FixedWindow {
        limit,
        window: Duration::from_millis(w),
    })
}

fn sliding_window() -> impl Strategy<Value = AlgorithmSpec> {
    let max = MAX_SAFE / SLIDING_WINDOW_SCALE;
    (mag(max), mag(max)).prop_map(|(limit, w)| AlgorithmSpec::SlidingWindow {
        limit,
        window: Duration::from_millis(w),
    })
}

fn token_bucket() -> impl Strategy<Value = AlgorithmSpec> {
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

fn gcra() -> impl Strategy<Value = AlgorithmSpec> {
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

fn sliding_log() -> impl Strategy<Value = AlgorithmSpec> {
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
fn field(sel: (u8, u64), bound: u64) -> u64 {
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

fn planted_state(p: &Plant, start: u64, policy: &RateLimitPolicy) -> Option<AlgorithmState> {
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

type Case = (RateLimitPolicy, Plant, u64, Vec<(Step, (u8, u64))>);

fn differential(program: Program, policies: impl Strategy<Value = RateLimitPolicy>) {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let variant = program
        .test_variant()
        .expect("a well-formed @time-source block");
    let script = Loaded::load(&mut con.borrow_mut(), &variant).expect("the test build compiles");
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let strategy = (
        policies,
        plant(),
        start_time(),
        prop::collection::vec((step(), (0u8..4, any::<u64>())), 1..24),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case: Case| {
        *counter.borrow_mut() += 1;
        let key = format!("rl:{{diff}}{}-{}", program.file_name(), counter.borrow());
        run_case(
            &mut con.borrow_mut(),
            &script,
            &key,
            case,
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("{}: {e}", program.file_name());
    }
    // The generators must reach every outcome, or a passing run proves little.
    let seen = seen.into_inner();
    eprintln!("{}: statuses {seen:?}", program.file_name());
    for status in ["ALLOWED", "DENIED", "CLOCK_UNSAFE", "STATE_INCOMPATIBLE"] {
        assert!(
            seen.get(status).is_some_and(|&n| n >= 3),
            "{}: {status} reached too rarely: {seen:?}",
            program.file_name()
        );
    }
}

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

fn run_case(
    con: &mut redis::Connection,
    script: &Loaded,
    key: &str,
    (policy, plant, start, steps): Case,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let revision = policy.revision().get();
    let mut state = planted_state(&plant, start, &policy);
    let mut stored: Option<Vec<u8>> = None;
    let _: () = redis::cmd("DEL").arg(key).query(con).map_err(fail)?;
    // Planted in either layout (the wide one also holds what the compact one cannot); a
    // state neither can hold (a sliding-log entry older than 2^40 ms) is not planted.
    let layout = if plant.5 {
        Layout::Wide
    } else {
        Layout::Compact
    };
    let planted = state.as_ref().and_then(|s| {
        encode_state_as(layout, revision, s)
            .or_else(|_| encode_state_as(Layout::Wide, revision, s))
            .or_else(|_| encode_state_as(Layout::Overdraft, revision, s))
            .ok()
    });
    if planted.is_none() {
        state = None;
    }
    if let Some(bytes) = planted {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(&bytes)
            .query(con)
            .map_err(fail)?;
        stored = Some(bytes);
    }
    let mut now = start;
    for (i, (step, cost_sel)) in steps.iter().enumerate() {
        let last = state.as_ref().map(last_ms);
        now = next_now(step, now, last, &policy);
        let cost = pick(*cost_sel, policy.max_cost().get());
        let mut args = arguments(&policy, cost);
        args.push(now.to_string().into_bytes());
        let (reply, value, ttl): (redis::Value, Option<Vec<u8>>, i64) = redis::pipe()
            .atomic()
            .add_command(script.command(key, &args))
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .cmd("PERSIST")
            .arg(key)
            .ignore()
            .query(con)
            .map_err(fail)?;
        let reply = Reply::parse(&reply).map_err(fail)?;
        *seen.entry(reply.status.clone()).or_default() += 1;
        let at = format!("step {i} ({step:?}, now {now}, cost {cost}, state {state:?})");
        let cost = Cost::new(cost).map_err(fail)?;
        match model::evaluate(&policy, state.as_ref(), now, cost) {
            Err(ModelError::StateIncompatible(why)) => {
                let expected = Reply {
                    status: "STATE_INCOMPATIBLE".into(),
                    server_now_ms: now,
                    effective_now_ms: 0,
                    limit: 0,
                    remaining: 0,
                    retry_after_ms: 0,
                    reset_at_ms: 0,
                };
                prop_assert_eq!(&reply, &expected, "{} ({})", at, why);
                prop_assert_eq!(&value, &stored, "{}: incompatible state was rewritten", at);
                prop_assert_eq!(ttl, -1, "{}: incompatible state got a TTL", at);
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("{at}: model refused: {e}"))),
            Ok(e) => {
                prop_assert_eq!(&reply, &Reply::expected(&e), "{}", at);
                match e.new_state {
                    Some(new) => {
                        let bytes =
                            value.ok_or_else(|| fail(format!("{at}: allow wrote nothing")))?;
                        let decoded = decode_state(&bytes).map_err(fail)?;
                        prop_assert_eq!(&decoded, &(revision, new.clone()), "{}", at);
                        // Byte for byte the canonical encoding (compact whenever it fits).
                        let canonical = encode_state(revision, &new).map_err(fail)?;
                        prop_assert_eq!(&bytes, &canonical, "{}", at);
                        prop_assert!(e.ttl_ms >= 1, "{}: model ttl 0", at);
                        let ttl = u64::try_from(ttl)
                            .map_err(|_| fail(format!("{at}: PTTL {ttl} after an allow")))?;
                        prop_assert!(
                            ttl <= e.ttl_ms && ttl + PTTL_TOLERANCE_MS >= e.ttl_ms,
                            "{}: PTTL {} for model ttl {}",
                            at,
                            ttl,
                            e.ttl_ms
                        );
                        state = Some(new);
                        stored = Some(bytes);
                    }
                    None => {
                        prop_assert_eq!(&value, &stored, "{}: a non-allow changed the value", at);
                        let expected_ttl = if stored.is_some() { -1 } else { -2 };
                        prop_assert_eq!(ttl, expected_ttl, "{}: a non-allow touched the TTL", at);
                    }
                }
            }
        }
    }
    Ok(())
}

type MultiCase = (
    Vec<(RateLimitPolicy, Plant)>,
    u64,
    Vec<(Step, Vec<(u8, u64)>)>,
);

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

#[test]
fn multi_program_equals_the_multi_model() {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let variant = test_build("rate-multi-v2.lua", MULTI_SOURCE).expect("a time block");
    let script = Loaded::load(&mut con.borrow_mut(), &variant).expect("the test build compiles");
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let strategy = (
        prop::collection::vec((any_policy(), plant()), 1..=4),
        start_time(),
        prop::collection::vec(
            (step(), prop::collection::vec((0u8..4, any::<u64>()), 4..=4)),
            1..16,
        ),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case: MultiCase| {
        *counter.borrow_mut() += 1;
        let n = *counter.borrow();
        run_multi_case(
            &mut con.borrow_mut(),
            &script,
            n,
            case,
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("rate-multi-v2.lua: {e}");
    }
    let seen = seen.into_inner();
    eprintln!("rate-multi-v2.lua: statuses {seen:?}");
    for status in ["ALLOWED", "DENIED", "CLOCK_UNSAFE", "STATE_INCOMPATIBLE"] {
        assert!(
            seen.get(status).is_some_and(|&n| n >= 3),
            "rate-multi-v2.lua: {status} reached too rarely: {seen:?}"
        );
    }
}

/// Every key's value and PTTL after a step.
pub(crate) type After = Vec<(Option<Vec<u8>>, i64)>;

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

fn run_multi_case(
    con: &mut redis::Connection,
    script: &Loaded,
    case_no: u64,
    (members, start, steps): MultiCase,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let keys: Vec<String> = (0..members.len())
        .map(|i| format!("rl:{{diffm}}{case_no}-{i}"))
        .collect();
    let mut states = Vec::new();
    let mut stored = Vec::new();
    for ((policy, plant), key) in members.iter().zip(&keys) {
        let (state, bytes) = plant_at(con, key, policy, plant, start)?;
        states.push(state);
        stored.push(bytes);
    }
    let first = &members[0].0;
    let mut now = start;
    for (i, (step, cost_sels)) in steps.iter().enumerate() {
        now = next_now(step, now, states[0].as_ref().map(last_ms), first);
        let costs: Vec<u64> = members
            .iter()
            .zip(cost_sels)
            .map(|((p, _), sel)| pick(*sel, p.max_cost().get()))
            .collect();
        let call: Vec<(&RateLimitPolicy, u64)> = members
            .iter()
            .map(|(p, _)| p)
            .zip(costs.iter().copied())
            .collect();
        let mut args = multi_arguments(&call, 0);
        args.push(now.to_string().into_bytes());
        let (reply, after) = multi_step(con, script, &keys, &args)?;
        *seen.entry(reply.status.clone()).or_default() += 1;
        let at = format!("step {i} ({step:?}, now {now}, costs {costs:?}, states {states:?})");
        prop_assert_eq!(reply.rows.len(), members.len(), "{}", at);
        prop_assert!(!reply.replayed, "{}", at);
        let model_members: Vec<Member<'_>> = members
            .iter()
            .zip(&states)
            .zip(&costs)
            .map(|(((policy, _), state), &cost)| {
                Cost::new(cost).map(|cost| Member {
                    policy,
                    state: state.as_ref(),
                    cost,
                })
            })
            .collect::<Result<_, _>>()
            .map_err(fail)?;
        let evaluation = match model::multi::evaluate_all(&model_members, now) {
            Err(e) => {
                let ModelError::StateIncompatible(why) = e.error else {
                    return Err(fail(format!("{at}: model refused: {e}")));
                };
                prop_assert_eq!(&reply.status, "STATE_INCOMPATIBLE", "{} ({})", at, why);
                prop_assert_eq!(reply.index, e.index as u64 + 1, "{}", at);
                let row = &reply.rows[e.index];
                prop_assert_eq!(
                    (row.status.as_str(), row.server_now_ms, row.limit),
                    ("STATE_INCOMPATIBLE", now, 0),
                    "{}",
                    at
                );
                for (j, (value, ttl)) in after.iter().enumerate() {
                    prop_assert_eq!(value, &stored[j], "{}: member {} rewritten", at, j);
                    prop_assert!(*ttl < 0, "{}: member {} got a TTL", at, j);
                }
                return Ok(());
            }
            Ok(evaluation) => evaluation,
        };
        let (status, index) = match evaluation.verdict {
            MultiVerdict::Allowed => ("ALLOWED", 0),
            MultiVerdict::Denied => ("DENIED", 0),
            MultiVerdict::ClockUnsafe { index } => ("CLOCK_UNSAFE", index as u64 + 1),
        };
        prop_assert_eq!(
            (reply.status.as_str(), reply.index),
            (status, index),
            "{}",
            at
        );
        for (j, e) in evaluation.members.iter().enumerate() {
            prop_assert_eq!(&reply.rows[j], &Reply::expected(e), "{}: member {}", at, j);
            let (value, ttl) = &after[j];
            let Some(new) = &e.new_state else {
                prop_assert_eq!(value, &stored[j], "{}: member {} changed", at, j);
                let expected_ttl = if stored[j].is_some() { -1 } else { -2 };
                prop_assert_eq!(*ttl, expected_ttl, "{}: member {} TTL touched", at, j);
                continue;
            };
            let revision = members[j].0.revision().get();
            let canonical = encode_state(revision, new).map_err(fail)?;
            prop_assert_eq!(value.as_ref(), Some(&canonical), "{}: member {}", at, j);
            let ttl = u64::try_from(*ttl).map_err(|_| fail(format!("{at}: PTTL {ttl}")))?;
            prop_assert!(
                ttl <= e.ttl_ms && ttl + PTTL_TOLERANCE_MS >= e.ttl_ms,
                "{}: member {} PTTL {} for model ttl {}",
                at,
                j,
                ttl,
                e.ttl_ms
            );
            states[j] = Some(new.clone());
            stored[j] = Some(canonical);
        }
    }
    Ok(())
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

#[test]
fn fixed_window_program_equals_the_model() {
    differential(Program::FixedWindow, policy(fixed_window()));
}

#[test]
fn sliding_counter_program_equals_the_model() {
    differential(Program::SlidingCounter, policy(sliding_window()));
}

#[test]
fn token_bucket_program_equals_the_model() {
    differential(Program::TokenBucket, policy(token_bucket()));
}

#[test]
fn gcra_program_equals_the_model() {
    differential(Program::Gcra, policy(gcra()));
}

#[test]
fn sliding_log_program_equals_the_model() {
    differential(Program::SlidingLog, policy(sliding_log()));
}
