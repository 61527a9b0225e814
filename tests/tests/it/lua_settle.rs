//! The settlement program (`lua/rate-settle-v1.lua`), on a real redis-server with its
//! production source (the test build takes `now` from ARGV).
//!
//! - Differential: 1..=4 members of every algorithm that takes reservations, each with its
//!   own planted state (overdrafts included, valid and just out of range), and random steps
//!   where each member is a check (`model::evaluate` of its cost, nothing written) or a
//!   settlement (`model::reserve::settle` of a random hold and actual cost: refunds, charges
//!   past the limit, holds of other windows). Every step must give the models' status, the
//!   member it names and every row; the settlements' states must be written byte for byte
//!   as the models' (the overdraft layout exactly when one is left) with their TTL, together
//!   or not at all; a check must leave its key alone.
//! - Bad headers, operations, algorithm codes and arguments are `INVALID` and write nothing.
//! - A charge past the limit is an overdraft the single programs deny on until it is paid.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use acceptance_tests::lua::{
    Loaded, MultiReply, Program, Reply, SETTLE_SOURCE, SettleOp, arguments, encode_state, get_raw,
    pack, settle_arguments, settle_arguments_at, test_build,
};
use acceptance_tests::rate::{TestPolicy, algorithm};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::model::reserve::Hold;
use shared_contract::model::{self, AlgorithmState, Evaluation, ModelError, Verdict};
use shared_contract::policy::{MAX_DURATION_MS, MAX_TIME_MS};
use shared_contract::{AlgorithmKind, Cost, RateLimitPolicy};

use crate::lua_cases::{
    CASES, Plant, Step, calendar_policy, check_ttl, fail, last_ms, multi_step, next_now, pick,
    plant, plant_at, reservable_policy, start_time, timed,
};

/// A member's operation in one step: check or settle, actual (or the check's cost), estimate,
/// and how far before `now` the hold was charged.
type OpSel = (u8, (u8, u64), (u8, u64), u64);

type SettleCase = (Vec<(RateLimitPolicy, Plant)>, u64, Vec<(Step, Vec<OpSel>)>);

fn op_sel() -> impl Strategy<Value = OpSel> {
    (
        0u8..4,
        (0u8..4, any::<u64>()),
        (0u8..4, any::<u64>()),
        prop_oneof![Just(0u64), 0u64..=10, 0u64..=100_000, 0..=MAX_DURATION_MS],
    )
}

/// 0 (selector 3), else [`pick`]'s 1, `max` or uniform.
fn cost_or_zero(sel: (u8, u64), max: u64) -> u64 {
    if sel.0 == 3 { 0 } else { pick(sel, max) }
}

fn op_of(policy: &RateLimitPolicy, (kind, a, e, back): &OpSel, now: u64) -> SettleOp {
    let max = policy.max_cost().get();
    if *kind == 0 {
        return SettleOp::Check(pick(*a, max));
    }
    SettleOp::Settle {
        actual: cost_or_zero(*a, max),
        estimate: cost_or_zero(*e, max),
        at_ms: now.saturating_sub(*back).min(MAX_TIME_MS),
    }
}

/// What the models answer for one member.
fn model_step(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    op: SettleOp,
    now: u64,
    seen: &mut BTreeMap<String, u64>,
) -> Result<Evaluation<AlgorithmState>, ModelError> {
    match op {
        SettleOp::Check(cost) => {
            let cost = Cost::new(cost).map_err(|_| ModelError::StateIncompatible("cost 0"))?;
            model::evaluate(policy, state, now, cost)
        }
        SettleOp::Settle {
            actual,
            estimate,
            at_ms,
        } => {
            let s = model::reserve::settle(policy, state, now, &Hold { at_ms, estimate }, actual)?;
            if s.refunded > 0 {
                *seen.entry("refunded".into()).or_default() += 1;
            }
            if s.overdrawn > 0 {
                *seen.entry("overdrawn".into()).or_default() += 1;
            }
            Ok(s.evaluation)
        }
    }
}

#[test]
fn settle_program_equals_the_models() {
    let expected = [
        "ALLOWED",
        "DENIED",
        "CLOCK_UNSAFE",
        "STATE_INCOMPATIBLE",
        "refunded",
        "overdrawn",
        "overdraft written",
    ];
    differential(
        "any",
        reservable_policy().boxed(),
        start_time().boxed(),
        &expected,
    );
}

/// Calendar periods alone, in this century: refunds only while the hold's period is the
/// current one, among the bounds the caller sent.
#[test]
fn calendar_settlements_equal_the_models() {
    let times = (1_700_000_000_000u64..=1_900_000_000_000).boxed();
    let expected = ["ALLOWED", "DENIED", "CLOCK_UNSAFE", "refunded", "overdrawn"];
    differential("calendar", calendar_policy().boxed(), times, &expected);
}

/// Runs the differential on members of `policies` from `times`, its keys named by `name`
/// (the tests share one server), requiring each of `expected` to be reached.
fn differential(
    name: &str,
    policies: BoxedStrategy<RateLimitPolicy>,
    times: BoxedStrategy<u64>,
    expected: &[&str],
) {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let variant = test_build("rate-settle-v1.lua", SETTLE_SOURCE).expect("a time block");
    let script = Loaded::load(&mut con.borrow_mut(), &variant).expect("the test build compiles");
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let strategy = (
        prop::collection::vec((policies, plant()), 1..=4),
        times,
        prop::collection::vec(
            (
                crate::lua_cases::step(),
                prop::collection::vec(op_sel(), 4..=4),
            ),
            1..16,
        ),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case: SettleCase| {
        *counter.borrow_mut() += 1;
        let n = *counter.borrow();
        let keys = format!("{name}{n}");
        run_case(
            &mut con.borrow_mut(),
            &script,
            &keys,
            case,
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("rate-settle-v1.lua: {e}");
    }
    let seen = seen.into_inner();
    eprintln!("rate-settle-v1.lua: {seen:?}");
    for what in expected {
        assert!(
            seen.get(*what).is_some_and(|&n| n >= 3),
            "rate-settle-v1.lua: {what} reached too rarely: {seen:?}"
        );
    }
}

fn run_case(
    con: &mut redis::Connection,
    script: &Loaded,
    case_no: &str,
    (members, start, steps): SettleCase,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let keys: Vec<String> = (0..members.len())
        .map(|i| format!("rl:{{diffs}}{case_no}-{i}"))
        .collect();
    let mut states = Vec::new();
    let mut stored = Vec::new();
    for ((policy, plant), key) in members.iter().zip(&keys) {
        let (state, bytes) = plant_at(con, key, policy, plant, start)?;
        states.push(state);
        stored.push(bytes);
    }
    let mut now = start;
    for (i, (step, sels)) in steps.iter().enumerate() {
        now = next_now(step, now, states[0].as_ref().map(last_ms), &members[0].0);
        let ops: Vec<SettleOp> = members
            .iter()
            .zip(sels)
            .map(|((p, _), sel)| op_of(p, sel, now))
            .collect();
        let sent = members.iter().zip(ops.iter().copied()).zip(&states);
        let Some(call) = timed(sent.map(|(((p, _), op), s)| (p, op, s)), now) else {
            return Ok(());
        };
        let mut args = settle_arguments_at(&call);
        args.push(now.to_string().into_bytes());
        let (reply, after) = multi_step(con, script, &keys, &args)?;
        *seen.entry(reply.status.clone()).or_default() += 1;
        let at = format!("step {i} ({step:?}, now {now}, ops {ops:?}, states {states:?})");
        prop_assert_eq!(reply.rows.len(), members.len(), "{}", at);
        prop_assert!(!reply.replayed, "{}", at);
        let mut results = Vec::new();
        for (((policy, _), state), op) in members.iter().zip(&states).zip(&ops) {
            results.push(model_step(policy, state.as_ref(), *op, now, seen));
        }
        let incompatible = Reply {
            status: "STATE_INCOMPATIBLE".into(),
            server_now_ms: now,
            effective_now_ms: 0,
            limit: 0,
            remaining: 0,
            retry_after_ms: 0,
            reset_at_ms: 0,
        };
        for (j, r) in results.iter().enumerate() {
            match r {
                Ok(e) => {
                    prop_assert_eq!(&reply.rows[j], &Reply::expected(e), "{}: member {}", at, j)
                }
                Err(ModelError::StateIncompatible(_)) => {
                    prop_assert_eq!(&reply.rows[j], &incompatible, "{}: member {}", at, j);
                }
                Err(e) => return Err(fail(format!("{at}: member {j}: model refused: {e}"))),
            }
        }
        let refused = results.iter().position(Result::is_err);
        let unsafe_at = results
            .iter()
            .position(|r| matches!(r, Ok(e) if e.verdict == Verdict::ClockUnsafe));
        let (status, index) = match (refused, unsafe_at) {
            (Some(j), _) => ("STATE_INCOMPATIBLE", j as u64 + 1),
            (None, Some(j)) => ("CLOCK_UNSAFE", j as u64 + 1),
            (None, None) => {
                let admitted = results
                    .iter()
                    .all(|r| matches!(r, Ok(e) if e.verdict == Verdict::Allowed));
                (if admitted { "ALLOWED" } else { "DENIED" }, 0)
            }
        };
        prop_assert_eq!(
            (reply.status.as_str(), reply.index),
            (status, index),
            "{}",
            at
        );
        let writes = index == 0;
        for (j, (r, op)) in results.iter().zip(&ops).enumerate() {
            let (value, ttl) = &after[j];
            let new = match (r, op) {
                (Ok(e), SettleOp::Settle { .. }) if writes => e,
                _ => {
                    prop_assert_eq!(value, &stored[j], "{}: member {} changed", at, j);
                    let expected_ttl = if stored[j].is_some() { -1 } else { -2 };
                    prop_assert_eq!(*ttl, expected_ttl, "{}: member {} TTL touched", at, j);
                    continue;
                }
            };
            let state = new
                .new_state
                .clone()
                .ok_or_else(|| fail(format!("{at}: member {j}: a settlement without state")))?;
            let revision = members[j].0.revision().get();
            let canonical = encode_state(revision, &state).map_err(fail)?;
            prop_assert_eq!(value.as_ref(), Some(&canonical), "{}: member {}", at, j);
            if canonical.len() > 21 && canonical[0] >> 4 == 2 {
                *seen.entry("overdraft written".into()).or_default() += 1;
            }
            check_ttl(&format!("{at}: member {j}"), *ttl, new)?;
            states[j] = Some(state);
            stored[j] = Some(canonical);
        }
    }
    Ok(())
}

const HOUR: Duration = Duration::from_secs(3600);

fn policy(kind: AlgorithmKind, limit: u64) -> RateLimitPolicy {
    TestPolicy::new("settle", algorithm(kind, limit, HOUR))
        .max_cost(limit)
        .build()
}

fn call(
    con: &mut redis::Connection,
    script: &Loaded,
    keys: &[&str],
    args: &[Vec<u8>],
) -> MultiReply {
    let value: redis::Value = script
        .command_keys(keys, args)
        .query(con)
        .expect("the program answers");
    MultiReply::parse(&value).expect("a well-formed reply")
}

#[test]
fn malformed_headers_operations_and_arguments_are_invalid_and_write_nothing() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, SETTLE_SOURCE).expect("compiles");
    let p = policy(AlgorithmKind::TokenBucket, 5);
    let settle = |actual, estimate| SettleOp::Settle {
        actual,
        estimate,
        at_ms: 0,
    };
    let good = settle_arguments(&[(&p, settle(2, 1))]);
    let key = "rl:{sttl}invalid";
    let mut bad: Vec<(Vec<Vec<u8>>, Vec<&str>)> = vec![
        (vec![], vec![key]),
        (good.clone(), vec![key, "rl:{sttl}extra"]),
        (good.clone(), vec![]),
        // Above the capacity: no cost may be.
        (settle_arguments(&[(&p, settle(6, 1))]), vec![key]),
        (settle_arguments(&[(&p, settle(1, 6))]), vec![key]),
        // A check of cost 0 is no evaluation.
        (settle_arguments(&[(&p, SettleOp::Check(0))]), vec![key]),
    ];
    let mut short = good[3].clone();
    short.pop();
    let mut long = good[3].clone();
    long.push(0);
    for (at, value) in [
        (0, pack(&[(0, 1), (0, 1)])),
        (0, pack(&[(9, 1), (0, 1)])),
        (0, pack(&[(1, 1), (4, 1)])),
        (0, pack(&[(1, 1)])),
        (0, pack(&[(1, 3)])),
        (1, b"charge".to_vec()),
        (1, Vec::new()),
        (2, b"5".to_vec()),
        (2, b"0".to_vec()),
        (2, b"03".to_vec()),
        (3, short),
        (3, long),
        (3, arguments(&p, 1).remove(0)),
    ] {
        let mut args = good.clone();
        args[at] = value;
        bad.push((args, vec![key]));
    }
    bad.push((good[..3].to_vec(), vec![key]));
    for (args, keys) in bad {
        let reply = call(&mut con, &script, &keys, &args);
        assert_eq!(reply.status, "INVALID", "{args:?} {keys:?}");
        assert_eq!(get_raw(&mut con, key).expect("GET"), None, "{args:?}");
    }
    // A sliding log can be checked, not settled.
    let log = policy(AlgorithmKind::SlidingLog, 5);
    let checked = call(
        &mut con,
        &script,
        &[key],
        &settle_arguments(&[(&log, SettleOp::Check(1))]),
    );
    assert_eq!(checked.status, "ALLOWED");
    assert_eq!(
        get_raw(&mut con, key).expect("GET"),
        None,
        "a check writes nothing"
    );
}

#[test]
fn a_charge_past_the_limit_is_an_overdraft_the_single_programs_deny_on() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, SETTLE_SOURCE).expect("compiles");
    for program in [
        Program::FixedWindow,
        Program::SlidingCounter,
        Program::TokenBucket,
        Program::Gcra,
    ] {
        let single = Loaded::load(&mut con, program.source()).expect("compiles");
        let p = policy(program.kind(), 10);
        let key = format!("rl:{{sttl}}over-{}", program.file_name());
        let charge = SettleOp::Settle {
            actual: 8,
            estimate: 0,
            at_ms: 0,
        };
        for remaining in [2, 0] {
            let reply = call(
                &mut con,
                &script,
                &[&key],
                &settle_arguments(&[(&p, charge)]),
            );
            assert_eq!(reply.status, "ALLOWED", "{}", program.file_name());
            assert_eq!(
                reply.rows[0].remaining,
                remaining,
                "{}",
                program.file_name()
            );
        }
        let raw = get_raw(&mut con, &key).expect("GET").expect("written");
        assert_eq!(
            raw[0] >> 4,
            2,
            "{}: the overdraft layout",
            program.file_name()
        );
        let denied = single
            .run(&mut con, &key, &arguments(&p, 1))
            .expect("a reply");
        assert_eq!(denied.status, "DENIED", "{}", program.file_name());
        let check = call(
            &mut con,
            &script,
            &[&key],
            &settle_arguments(&[(&p, SettleOp::Check(1))]),
        );
        assert_eq!(check.status, "DENIED", "{}", program.file_name());
        assert_eq!(
            get_raw(&mut con, &key).expect("GET"),
            Some(raw),
            "nothing written"
        );
    }
}
