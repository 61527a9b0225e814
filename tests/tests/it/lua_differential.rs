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

use acceptance_tests::lua::{
    Loaded, MULTI_SOURCE, Program, Reply, arguments_at, calendar_bounds, decode_state,
    effective_time, encode_state, multi_arguments_at, test_build,
};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::model::multi::{Member, MultiVerdict};
use shared_contract::model::{self, ModelError, Verdict};
use shared_contract::policy::MAX_TIME_MS;
use shared_contract::{Cost, RateLimitPolicy};

use crate::lua_cases::*;

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
        // Calendar periods too, for the fixed window (their state checks are the epoch's).
        let calendar = format!("calendar {status}");
        let checked = program == Program::FixedWindow && status != "STATE_INCOMPATIBLE";
        // A write whose state has the stored state's deadline keeps the key's expiry.
        let keeps = matches!(
            program,
            Program::FixedWindow
                | Program::SlidingCounter
                | Program::TokenBucket
                | Program::Gcra
                | Program::SlidingLog
        );
        assert!(
            !keeps || seen.get("expiry kept").is_some_and(|&n| n >= 3),
            "writes that keep the expiry reached too rarely: {seen:?}"
        );
        assert!(
            program != Program::FixedWindow
                || seen.get("calendar outside").is_some_and(|&n| n >= 3),
            "calendar bounds that miss the effective time reached too rarely: {seen:?}"
        );
        assert!(
            !checked || seen.get(&calendar).is_some_and(|&n| n >= 3),
            "{calendar} reached too rarely: {seen:?}"
        );
    }
}

fn run_case(
    con: &mut redis::Connection,
    script: &Loaded,
    key: &str,
    (policy, plant, start, steps): Case,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let revision = policy.revision().get();
    // Planted in either layout (the wide one also holds what the compact one cannot); a
    // state neither can hold (a sliding-log entry older than 2^40 ms) is not planted.
    let (mut state, mut stored) = plant_at(con, key, &policy, &plant, start)?;
    let mut now = start;
    for (i, (step, cost_sel)) in steps.iter().enumerate() {
        let last = state.as_ref().map(last_ms);
        now = next_now(step, now, last, &policy);
        let cost = pick(*cost_sel, policy.max_cost().get());
        // A calendar window's bounds come from the caller's clock, which may be a little
        // (or much) off the server's: the program picks the period holding its effective
        // time among them, and answers CLOCK_UNSAFE when none does.
        let eff = effective_time(state.as_ref().map(last_ms), now);
        let t = eff.saturating_add_signed(skew(cost_sel.1)).min(MAX_TIME_MS);
        if unplaced(&policy, eff) || unplaced(&policy, t) {
            return Ok(());
        }
        let bounds = calendar_bounds(&policy, t);
        let mut args = arguments_at(&policy, cost, t);
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
        if calendar_bounds(&policy, t).is_some() {
            *seen
                .entry(format!("calendar {}", reply.status))
                .or_default() += 1;
        }
        let at = format!("step {i} ({step:?}, now {now}, cost {cost}, state {state:?})");
        let cost = Cost::new(cost).map_err(fail)?;
        let outside = |eff: u64| bounds.is_some_and(|b| eff < b[0] || eff >= b[3]);
        match model::evaluate(&policy, state.as_ref(), now, cost) {
            Ok(e) if e.verdict != Verdict::ClockUnsafe && outside(e.effective_now_ms) => {
                let eff = e.effective_now_ms;
                let expected = Reply {
                    status: "CLOCK_UNSAFE".into(),
                    server_now_ms: now,
                    effective_now_ms: eff,
                    limit: e.limit,
                    remaining: 0,
                    retry_after_ms: 1000,
                    reset_at_ms: eff,
                };
                prop_assert_eq!(&reply, &expected, "{}: outside the bounds {:?}", at, bounds);
                prop_assert_eq!(&value, &stored, "{}: written outside the bounds", at);
                *seen.entry("calendar outside".into()).or_default() += 1;
            }
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
                match &e.new_state {
                    Some(new) => {
                        let bytes =
                            value.ok_or_else(|| fail(format!("{at}: allow wrote nothing")))?;
                        let decoded = decode_state(&bytes).map_err(fail)?;
                        prop_assert_eq!(&decoded, &(revision, new.clone()), "{}", at);
                        // Byte for byte the canonical encoding (compact whenever it fits).
                        let canonical = encode_state(revision, new).map_err(fail)?;
                        prop_assert_eq!(&bytes, &canonical, "{}", at);
                        check_ttl(&at, ttl, &e)?;
                        if e.keeps_expiry {
                            *seen.entry("expiry kept".into()).or_default() += 1;
                        }
                        state = Some(new.clone());
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
        let sent = members.iter().zip(costs.iter().copied()).zip(&states);
        let Some(call) = timed(sent.map(|(((p, _), c), s)| (p, c, s)), now) else {
            return Ok(());
        };
        let mut args = multi_arguments_at(&call, 0);
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
            check_ttl(&format!("{at}: member {j}"), *ttl, e)?;
            states[j] = Some(new.clone());
            stored[j] = Some(canonical);
        }
    }
    Ok(())
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
