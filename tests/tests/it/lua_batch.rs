//! The batch program (`lua/rate-batch-v2.lua`) against the reference models on a real
//! redis-server: a batch decides its members in order at one `now`, each exactly as the
//! model (and so the single program) decides it on the state the members before it left,
//! and a member it cannot decide is refused alone.
//!
//! For 1..=3 random valid policies, two subjects each, and random sequences of batches of
//! 1..=8 members (a key may appear several times in one batch, and a few members carry an
//! unknown algorithm code or arguments of the wrong length), every row must be exactly the
//! model's and every key must hold exactly the model's state after each batch. Keys never
//! expire during a case: each batch runs `EVALSHA; GET...; PERSIST...` in one transaction.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use acceptance_tests::lua::Program;
use acceptance_tests::lua::{
    BATCH_SOURCE, Loaded, Reply, arguments_at, effective_time, encode_state, pack, test_build,
};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::Value;
use shared_contract::model::{self, AlgorithmState};
use shared_contract::{Cost, RateLimitPolicy};

use crate::lua_cases::{
    Step, any_policy, fail, last_ms, next_now, pick, start_time, step, unplaced,
};

/// One member of a batch: policy index, subject index, cost selector, and how it is sent.
type Member = (usize, usize, (u8, u64), Sent);

/// How a member's arguments are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Good,
    /// An algorithm code no program has.
    UnknownCode,
    /// Its packed arguments one byte short.
    Short,
}

type BatchCase = (Vec<RateLimitPolicy>, u64, Vec<(Step, Vec<Member>)>);

fn key(case: u64, policy: usize, subject: usize) -> String {
    format!("rl:{{batch}}{case}:{policy}:{subject}")
}

/// The batch's ARGV: the packed header, then each member's code and packed arguments.
/// Each member's time places a calendar window's bounds (its effective time).
fn batch_arguments(
    policies: &[RateLimitPolicy],
    members: &[(usize, u64, Sent, u64)],
) -> Vec<Vec<u8>> {
    let mut args = vec![pack(&[(members.len() as u64, 1)])];
    for &(p, cost, sent, t) in members {
        let policy = &policies[p];
        let code = Program::for_kind(policy.kind())
            .expect("a program")
            .algorithm_code();
        let mut packed = arguments_at(policy, cost, t).remove(0);
        match sent {
            Sent::Good => args.push(code.to_string().into_bytes()),
            Sent::UnknownCode => args.push(b"9".to_vec()),
            Sent::Short => {
                args.push(code.to_string().into_bytes());
                packed.pop();
            }
        }
        args.push(packed);
    }
    args
}

/// A row of the batch reply: one 43-byte string, the status as a code (1 ALLOWED, 2 DENIED,
/// 3 CLOCK_UNSAFE, 4 STATE_INCOMPATIBLE, 5 INVALID), then six 7-byte little-endian numbers.
fn unpack_row(row: &Value) -> Result<Reply, String> {
    let Value::BulkString(b) = row else {
        return Err(format!("row {row:?} is not a string"));
    };
    if b.len() != 43 {
        return Err(format!("row of {} bytes", b.len()));
    }
    let status = match b[0] {
        1 => "ALLOWED",
        2 => "DENIED",
        3 => "CLOCK_UNSAFE",
        4 => "STATE_INCOMPATIBLE",
        5 => "INVALID",
        other => return Err(format!("status code {other}")),
    };
    let n: Vec<u64> = b[1..]
        .chunks_exact(7)
        .map(|c| {
            c.iter()
                .rev()
                .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte))
        })
        .collect();
    Ok(Reply {
        status: status.into(),
        server_now_ms: n[0],
        effective_now_ms: n[1],
        limit: n[2],
        remaining: n[3],
        retry_after_ms: n[4],
        reset_at_ms: n[5],
    })
}

fn invalid(now: u64) -> Reply {
    Reply {
        status: "INVALID".into(),
        server_now_ms: now,
        effective_now_ms: 0,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_at_ms: 0,
    }
}

fn run_batch_case(
    con: &mut redis::Connection,
    script: &Loaded,
    case: u64,
    (policies, start, batches): BatchCase,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let mut states: HashMap<(usize, usize), AlgorithmState> = HashMap::new();
    let mut now = start;
    for (b, (step, members)) in batches.iter().enumerate() {
        now = next_now(step, now, None, &policies[0]);
        let members: Vec<(usize, usize, u64, Sent)> = members
            .iter()
            .map(|&(p, s, sel, sent)| {
                let p = p % policies.len();
                (p, s, pick(sel, policies[p].max_cost().get()), sent)
            })
            .collect();
        let keys: Vec<String> = members.iter().map(|m| key(case, m.0, m.1)).collect();
        let sent: Vec<(usize, u64, Sent, u64)> = members
            .iter()
            .map(|m| {
                let last = states.get(&(m.0, m.1)).map(last_ms);
                (m.0, m.2, m.3, effective_time(last, now))
            })
            .collect();
        if sent.iter().any(|m| unplaced(&policies[m.0], m.3)) {
            return Ok(());
        }
        let mut args = batch_arguments(&policies, &sent);
        args.push(now.to_string().into_bytes());
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        let mut pipe = redis::pipe();
        pipe.atomic().add_command(script.command_keys(&keys, &args));
        for k in &distinct {
            pipe.cmd("GET").arg(k);
        }
        for k in &distinct {
            pipe.cmd("PERSIST").arg(k).ignore();
        }
        let mut out: Vec<Value> = pipe.query(con).map_err(fail)?;
        let reply = out.remove(0);
        let at = format!("batch {b} (now {now}, members {members:?})");
        let Value::Array(fields) = reply else {
            return Err(fail(format!("{at}: reply {reply:?}")));
        };
        prop_assert_eq!(
            fields.first(),
            Some(&Value::BulkString(b"DECIDED".to_vec())),
            "{}",
            at
        );
        prop_assert_eq!(fields.len(), members.len() + 1, "{}", at);
        for (i, &(p, s, cost, how)) in members.iter().enumerate() {
            let row = unpack_row(&fields[i + 1]).map_err(fail)?;
            *seen.entry(row.status.clone()).or_default() += 1;
            let policy = &policies[p];
            let expected = if how == Sent::Good {
                let cost = Cost::new(cost).map_err(fail)?;
                let e = model::evaluate(policy, states.get(&(p, s)), now, cost)
                    .map_err(|e| fail(format!("{at}: model refused member {i}: {e}")))?;
                if let Some(new) = e.new_state.clone() {
                    states.insert((p, s), new);
                }
                Reply::expected(&e)
            } else {
                invalid(now)
            };
            prop_assert_eq!(&row, &expected, "{}: member {}", at, i);
        }
        for (k, value) in distinct.iter().zip(out) {
            let (p, s) = members
                .iter()
                .find(|m| &key(case, m.0, m.1) == k)
                .map(|m| (m.0, m.1))
                .expect("a member's key");
            let want = match states.get(&(p, s)) {
                Some(state) => {
                    Some(encode_state(policies[p].revision().get(), state).map_err(fail)?)
                }
                None => None,
            };
            let got: Option<Vec<u8>> = redis::from_redis_value(value).map_err(fail)?;
            prop_assert_eq!(got, want, "{}: state of {}", at, k);
        }
    }
    Ok(())
}

fn member() -> impl Strategy<Value = Member> {
    let sent = prop_oneof![
        12 => Just(Sent::Good),
        1 => Just(Sent::UnknownCode),
        1 => Just(Sent::Short),
    ];
    (0usize..3, 0usize..2, (0u8..4, any::<u64>()), sent)
}

#[test]
fn batch_program_equals_the_models_in_order() {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let variant = test_build("rate-batch-v2.lua", BATCH_SOURCE).expect("a time block");
    let script = Loaded::load(&mut con.borrow_mut(), &variant).expect("the test build compiles");
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let strategy = (
        prop::collection::vec(any_policy(), 1..=3),
        start_time(),
        prop::collection::vec((step(), prop::collection::vec(member(), 1..=8)), 1..12),
    );
    let mut runner = TestRunner::new(Config {
        cases: 120,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case: BatchCase| {
        *counter.borrow_mut() += 1;
        let n = *counter.borrow();
        run_batch_case(
            &mut con.borrow_mut(),
            &script,
            n,
            case,
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("rate-batch-v2.lua: {e}");
    }
    let seen = seen.into_inner();
    eprintln!("rate-batch-v2.lua: statuses {seen:?}");
    for status in ["ALLOWED", "DENIED", "CLOCK_UNSAFE", "INVALID"] {
        assert!(
            seen.get(status).is_some_and(|&n| n >= 3),
            "rate-batch-v2.lua: {status} reached too rarely: {seen:?}"
        );
    }
}

#[test]
fn a_bad_header_or_a_short_batch_is_refused_whole_and_writes_nothing() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, BATCH_SOURCE).expect("compiles");
    let policy = acceptance_tests::rate::TestPolicy::new(
        "batch",
        acceptance_tests::rate::algorithm(
            shared_contract::AlgorithmKind::FixedWindow,
            5,
            std::time::Duration::from_secs(60),
        ),
    )
    .build();
    let good = batch_arguments(std::slice::from_ref(&policy), &[(0, 1, Sent::Good, 0)]);
    let key = "rl:{batch}bad";
    let header = |n: u64| pack(&[(n, 1)]);
    let mut two_keys = good.clone();
    two_keys[0] = header(2);
    let cases: Vec<(Vec<Vec<u8>>, Vec<&str>)> = vec![
        (vec![], vec![key]),
        (vec![header(0)], vec![]),
        (vec![header(65)], vec![key]),
        (
            vec![b"1".to_vec(), good[1].clone(), good[2].clone()],
            vec![key],
        ),
        (
            vec![pack(&[(1, 2)]), good[1].clone(), good[2].clone()],
            vec![key],
        ),
        (good.clone(), vec![key, "rl:{batch}other"]),
        (good[..2].to_vec(), vec![key]),
        (two_keys, vec![key, key]),
    ];
    for (args, keys) in cases {
        let reply: Value = script
            .command_keys(&keys, &args)
            .query(&mut con)
            .expect("the program answers");
        assert_eq!(
            reply,
            Value::Array(vec![Value::BulkString(b"INVALID".to_vec())]),
            "{args:?} {keys:?}"
        );
        let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(&mut con).expect("GET");
        assert_eq!(value, None, "{args:?}");
    }
    // The good batch decides.
    let reply: Value = script
        .command_keys(&[key], &good)
        .query(&mut con)
        .expect("the program answers");
    let Value::Array(fields) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(unpack_row(&fields[1]).expect("a row").status, "ALLOWED");
}

#[test]
fn a_member_on_a_key_of_another_type_is_refused_alone_and_its_key_untouched() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, BATCH_SOURCE).expect("compiles");
    let policy = acceptance_tests::rate::TestPolicy::new(
        "batch-types",
        acceptance_tests::rate::algorithm(
            shared_contract::AlgorithmKind::TokenBucket,
            5,
            std::time::Duration::from_secs(60),
        ),
    )
    .build();
    let good = "rl:{batch}types:good";
    let others = [
        (
            "rl:{batch}types:hash",
            redis::cmd("HSET")
                .arg("rl:{batch}types:hash")
                .arg("f")
                .arg(1)
                .clone(),
        ),
        (
            "rl:{batch}types:list",
            redis::cmd("RPUSH")
                .arg("rl:{batch}types:list")
                .arg("x")
                .clone(),
        ),
        (
            "rl:{batch}types:set",
            redis::cmd("SADD")
                .arg("rl:{batch}types:set")
                .arg("x")
                .clone(),
        ),
    ];
    let mut before = Vec::new();
    for (key, setup) in &others {
        let _: i64 = setup.query(&mut con).expect("setup");
        before.push(acceptance_tests::lua::dump(&mut con, key).expect("DUMP"));
    }
    // The good key around and between the others (one of them twice): all members share one
    // argument string, so the refused ones share their neighbours' unpacked arguments.
    let keys = [
        good,
        others[0].0,
        good,
        others[1].0,
        others[0].0,
        others[2].0,
        good,
    ];
    let members: Vec<(usize, u64, Sent, u64)> =
        keys.iter().map(|_| (0, 1, Sent::Good, 0)).collect();
    let args = batch_arguments(std::slice::from_ref(&policy), &members);
    let reply: Value = script
        .command_keys(&keys, &args)
        .query(&mut con)
        .expect("the program answers");
    let Value::Array(fields) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(fields.len(), keys.len() + 1, "{fields:?}");
    let mut remaining = 5;
    for (i, key) in keys.iter().enumerate() {
        let row = unpack_row(&fields[i + 1]).expect("a row");
        if *key == good {
            remaining -= 1;
            assert_eq!(
                (row.status.as_str(), row.remaining),
                ("ALLOWED", remaining),
                "member {i}"
            );
        } else {
            assert_eq!(
                (
                    row.status.as_str(),
                    row.effective_now_ms,
                    row.limit,
                    row.remaining
                ),
                ("STATE_INCOMPATIBLE", 0, 0, 0),
                "member {i} on {key}"
            );
            assert_eq!((row.retry_after_ms, row.reset_at_ms), (0, 0), "member {i}");
        }
    }
    for ((key, _), dumped) in others.iter().zip(before) {
        assert_eq!(
            acceptance_tests::lua::dump(&mut con, key).expect("DUMP"),
            dumped,
            "{key}"
        );
        assert_eq!(
            acceptance_tests::lua::pttl(&mut con, key).expect("PTTL"),
            -1,
            "{key}"
        );
    }
}
