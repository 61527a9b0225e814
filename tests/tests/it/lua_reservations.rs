//! The settlement program's reservations (`lua/rate-settle-v1.lua`, operations reserve,
//! settle and cancel), on a real redis-server with its production source.
//!
//! - Differential: 1..=3 members of every algorithm that takes reservations, planted states
//!   (overdrafts included), a reservation of random estimates held to
//!   `model::multi::reserve_all`, then, at a later (or earlier) time, a settle of random
//!   actual costs or a cancel held to `model::multi::settle_all` with the record's holds, or
//!   `EXPIRED` once its ttl has passed; every row, every state byte for byte with its TTL, the
//!   record's bytes and TTL; a second settle or cancel answers how the first ended and
//!   writes nothing.
//! - The record's refusals: unknown, of another size, not this program's, a reservation
//!   onto an existing key, bad ttl and blob: each named, nothing written.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use acceptance_tests::lua::{
    Loaded, MultiReply, Reply, SETTLE_SOURCE, arguments, encode_state, end_arguments,
    end_arguments_at, get_raw, pack, reserve_arguments, reserve_arguments_at, test_build,
};
use acceptance_tests::rate::{TestPolicy, algorithm};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::model::multi::{self, Member, MultiVerdict, Settle};
use shared_contract::model::reserve::{Hold, Settlement};
use shared_contract::model::{AlgorithmState, Evaluation, ModelError, Verdict};
use shared_contract::{AlgorithmKind, Cost, RateLimitPolicy};

use crate::lua_cases::{
    CASES, Plant, Step, check_ttl, fail, last_ms, multi_step, next_now, pick, plant, plant_at,
    reservable_policy, start_time, step, timed,
};

const BLOB: &[u8] = b"limits of the caller";

/// Members; reserve time; estimates, ttl choice; the step to the settlement, whether it
/// cancels, actual selectors.
type Case = (
    Vec<(RateLimitPolicy, Plant)>,
    u64,
    (Vec<(u8, u64)>, u8),
    (Step, bool, Vec<(u8, u64)>),
);

#[test]
fn reserve_then_settle_or_cancel_equals_the_models() {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let variant = test_build("rate-settle-v1.lua", SETTLE_SOURCE).expect("a time block");
    let script = Loaded::load(&mut con.borrow_mut(), &variant).expect("the test build compiles");
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let sels = || prop::collection::vec((0u8..4, any::<u64>()), 3..=3);
    let strategy = (
        prop::collection::vec((reservable_policy(), plant()), 1..=3),
        start_time(),
        (sels(), 0u8..3),
        (step(), any::<bool>(), sels()),
    );
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case: Case| {
        *counter.borrow_mut() += 1;
        let n = *counter.borrow();
        run_case(
            &mut con.borrow_mut(),
            &script,
            n,
            case,
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("rate-settle-v1.lua reservations: {e}");
    }
    let seen = seen.into_inner();
    eprintln!("rate-settle-v1.lua reservations: {seen:?}");
    for what in [
        "reserve ALLOWED",
        "reserve DENIED",
        "reserve STATE_INCOMPATIBLE",
        "settle ALLOWED",
        "cancel ALLOWED",
        "end EXPIRED",
        "end CLOCK_UNSAFE",
    ] {
        assert!(
            seen.get(what).is_some_and(|&n| n >= 3),
            "{what} reached too rarely: {seen:?}"
        );
    }
}

fn incompatible(now: u64) -> Reply {
    Reply {
        status: "STATE_INCOMPATIBLE".into(),
        server_now_ms: now,
        effective_now_ms: 0,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_at_ms: 0,
    }
}

/// Checks a step's written keys against the models' evaluations: a state written byte for
/// byte with its TTL where `writes`, untouched elsewhere.
fn check_writes(
    at: &str,
    after: &[(Option<Vec<u8>>, i64)],
    evaluations: &[&Evaluation<AlgorithmState>],
    policies: &[&RateLimitPolicy],
    writes: bool,
    stored: &mut [Option<Vec<u8>>],
    states: &mut [Option<AlgorithmState>],
) -> Result<(), TestCaseError> {
    for (j, e) in evaluations.iter().enumerate() {
        let (value, ttl) = &after[j];
        let Some(new) = e.new_state.as_ref().filter(|_| writes) else {
            prop_assert_eq!(value, &stored[j], "{}: member {} changed", at, j);
            let expected_ttl = if stored[j].is_some() { -1 } else { -2 };
            prop_assert_eq!(*ttl, expected_ttl, "{}: member {} TTL touched", at, j);
            continue;
        };
        let canonical = encode_state(policies[j].revision().get(), new).map_err(fail)?;
        prop_assert_eq!(value.as_ref(), Some(&canonical), "{}: member {}", at, j);
        check_ttl(&format!("{at}: member {j}"), *ttl, e)?;
        states[j] = Some(new.clone());
        stored[j] = Some(canonical);
    }
    Ok(())
}

fn run_case(
    con: &mut redis::Connection,
    script: &Loaded,
    case_no: u64,
    (members, start, (estimate_sels, ttl_sel), (step, cancel, actual_sels)): Case,
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let n = members.len();
    let mut keys: Vec<String> = (0..n)
        .map(|i| format!("rl:{{diffr}}{case_no}-{i}"))
        .collect();
    keys.push(format!("rl:{{diffr}}r:{case_no}"));
    let mut states = Vec::new();
    let mut stored = Vec::new();
    for ((policy, plant), key) in members.iter().zip(&keys) {
        let (state, bytes) = plant_at(con, key, policy, plant, start)?;
        states.push(state);
        stored.push(bytes);
    }
    let policies: Vec<&RateLimitPolicy> = members.iter().map(|(p, _)| p).collect();
    let estimates: Vec<u64> = policies
        .iter()
        .zip(&estimate_sels)
        .map(|(p, sel)| pick(*sel, p.max_cost().get()))
        .collect();
    let ttl = [1, 1000, 86_400_000][usize::from(ttl_sel)];
    let sent = policies.iter().zip(estimates.iter().copied()).zip(&states);
    let Some(call) = timed(sent.map(|((p, c), s)| (*p, c, s)), start) else {
        return Ok(());
    };
    let mut args = reserve_arguments_at(&call, ttl, BLOB);
    args.push(start.to_string().into_bytes());
    let (reply, after) = multi_step(con, script, &keys, &args)?;
    *seen.entry(format!("reserve {}", reply.status)).or_default() += 1;
    let at = format!("reserve (now {start}, estimates {estimates:?}, states {states:?})");
    let model_members: Vec<Member<'_>> = policies
        .iter()
        .zip(&states)
        .zip(&estimates)
        .map(|((policy, state), &cost)| {
            Cost::new(cost).map(|cost| Member {
                policy,
                state: state.as_ref(),
                cost,
            })
        })
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    let (evaluation, holds) = match multi::reserve_all(&model_members, start) {
        Err(e) => {
            let ModelError::StateIncompatible(_) = e.error else {
                return Err(fail(format!("{at}: model refused: {e}")));
            };
            prop_assert_eq!(
                (reply.status.as_str(), reply.index),
                ("STATE_INCOMPATIBLE", e.index as u64 + 1),
                "{}",
                at
            );
            prop_assert_eq!(&reply.rows[e.index], &incompatible(start), "{}", at);
            prop_assert_eq!(&after[n].0, &None, "{}: a record written", at);
            return Ok(());
        }
        Ok(reserved) => reserved,
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
    }
    let evaluations: Vec<&Evaluation<AlgorithmState>> = evaluation.members.iter().collect();
    let admitted = holds.is_some();
    check_writes(
        &at,
        &after,
        &evaluations,
        &policies,
        admitted,
        &mut stored,
        &mut states,
    )?;
    let Some(holds) = holds else {
        prop_assert_eq!(&after[n].0, &None, "{}: a record written", at);
        return Ok(());
    };
    let record = record_of(start, ttl, &holds);
    prop_assert_eq!(after[n].0.as_ref(), Some(&record), "{}: the record", at);
    prop_assert!(
        (1..=2 * ttl as i64).contains(&after[n].1),
        "{}: record PTTL",
        at
    );

    let mut keyed = Keyed {
        keys,
        states,
        stored,
    };
    let ended = (step, cancel, actual_sels);
    end_case(
        con,
        script,
        &mut keyed,
        &policies,
        (&holds, record),
        (start, ttl),
        ended,
        seen,
    )
}

/// The record of a reservation of `holds` made at `start` for `ttl`: header, holds, blob;
/// forgotten one ttl after its expiry.
fn record_of(start: u64, ttl: u64, holds: &[Hold]) -> Vec<u8> {
    let n = holds.len() as u64;
    let mut record = pack(&[(0x52, 1), (0, 1), (start + ttl, 6), (ttl, 4), (n, 1)]);
    for h in holds {
        record.extend(pack(&[(h.estimate, 7), (h.at_ms, 6)]));
    }
    record.extend(pack(&[(BLOB.len() as u64, 2)]));
    record.extend_from_slice(BLOB);
    record
}

/// The members' keys (the record's last), their states and stored values as the models
/// have them.
struct Keyed {
    keys: Vec<String>,
    states: Vec<Option<AlgorithmState>>,
    stored: Vec<Option<Vec<u8>>>,
}

/// Settles or cancels the reservation of `holds` (its `record`, made at `start` for `ttl`)
/// and checks everything against the models.
#[allow(clippy::too_many_arguments)]
fn end_case(
    con: &mut redis::Connection,
    script: &Loaded,
    m: &mut Keyed,
    policies: &[&RateLimitPolicy],
    (holds, mut record): (&[Hold], Vec<u8>),
    (start, ttl): (u64, u64),
    (step, cancel, actual_sels): (Step, bool, Vec<(u8, u64)>),
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let n = policies.len();
    let (keys, states, stored) = (&m.keys, &mut m.states, &mut m.stored);
    let now = next_now(&step, start, states[0].as_ref().map(last_ms), policies[0]);
    let actuals: Vec<u64> = if cancel {
        vec![0; n]
    } else {
        policies
            .iter()
            .zip(&actual_sels)
            .map(|(p, sel)| {
                if sel.0 == 3 {
                    0
                } else {
                    pick(*sel, p.max_cost().get())
                }
            })
            .collect()
    };
    let op = if cancel { "cancel" } else { "settle" };
    let sent = policies
        .iter()
        .zip(actuals.iter().copied())
        .zip(states.iter());
    let Some(call) = timed(sent.map(|((p, c), s)| (*p, c, s)), now) else {
        return Ok(());
    };
    let mut args = end_arguments_at(&call, cancel);
    args.push(now.to_string().into_bytes());
    let (reply, after) = multi_step(con, script, keys, &args)?;
    *seen.entry(format!("{op} {}", reply.status)).or_default() += 1;
    *seen.entry(format!("end {}", reply.status)).or_default() += 1;
    let at = format!("{op} (now {now}, actuals {actuals:?}, holds {holds:?}, states {states:?})");
    if now >= start + ttl {
        prop_assert_eq!(
            (reply.status.as_str(), reply.rows.len()),
            ("EXPIRED", 0),
            "{}",
            at
        );
        let none: Vec<&Evaluation<AlgorithmState>> = Vec::new();
        check_writes(&at, &after, &none, policies, false, stored, states)?;
        prop_assert_eq!(
            after[n].0.as_ref(),
            Some(&record),
            "{}: the record changed",
            at
        );
        return Ok(());
    }
    let settles: Vec<Settle<'_>> = policies
        .iter()
        .zip(states.iter())
        .zip(holds.iter().zip(&actuals))
        .map(|((policy, state), (hold, &actual))| Settle {
            policy,
            state: state.as_ref(),
            hold,
            actual,
        })
        .collect();
    let settlements = multi::settle_all(&settles, now).map_err(fail)?;
    let unsafe_at = settlements
        .iter()
        .position(|s| s.evaluation.verdict == Verdict::ClockUnsafe);
    let (status, index) = match unsafe_at {
        Some(j) => ("CLOCK_UNSAFE", j as u64 + 1),
        None => ("ALLOWED", 0),
    };
    prop_assert_eq!(
        (reply.status.as_str(), reply.index),
        (status, index),
        "{}",
        at
    );
    for (j, s) in settlements.iter().enumerate() {
        prop_assert_eq!(
            &reply.rows[j],
            &Reply::expected(&s.evaluation),
            "{}: member {}",
            at,
            j
        );
    }
    let evaluations: Vec<&Evaluation<AlgorithmState>> =
        settlements.iter().map(|s| &s.evaluation).collect();
    let settled = unsafe_at.is_none();
    check_writes(&at, &after, &evaluations, policies, settled, stored, states)?;
    if !settled {
        prop_assert_eq!(
            after[n].0.as_ref(),
            Some(&record),
            "{}: the record changed",
            at
        );
        return Ok(());
    }
    record[1] = if cancel { 2 } else { 1 };
    if !cancel {
        record.extend(results(&settlements, &actuals));
    }
    prop_assert_eq!(
        after[n].0.as_ref(),
        Some(&record),
        "{}: the ended record",
        at
    );
    let ended = if cancel { "CANCELLED" } else { "SETTLED" };
    ended_once(con, script, m, (&call, now), (ended, &record), &at)
}

/// What a settled record keeps per member: the actual cost and the settlement's row.
fn results(settlements: &[Settlement<AlgorithmState>], actuals: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    for (s, &actual) in settlements.iter().zip(actuals) {
        let e = &s.evaluation;
        let fields = [
            actual,
            e.server_now_ms,
            e.effective_now_ms,
            e.limit,
            e.remaining,
            e.retry_after_ms,
            e.reset_at_ms,
        ];
        out.extend(pack(&fields.map(|f| (f, 7))));
    }
    out
}

/// A second settle or cancel of an ended reservation names how it `ended`, and writes
/// nothing.
fn ended_once(
    con: &mut redis::Connection,
    script: &Loaded,
    m: &Keyed,
    (call, now): (&[(&RateLimitPolicy, u64, u64)], u64),
    (ended, record): (&str, &[u8]),
    at: &str,
) -> Result<(), TestCaseError> {
    let n = call.len();
    for cancel in [false, true] {
        let mut args = end_arguments_at(call, cancel);
        args.push(now.to_string().into_bytes());
        let (reply, later) = multi_step(con, script, &m.keys, &args)?;
        prop_assert_eq!(
            (reply.status.as_str(), reply.rows.len()),
            (ended, 0),
            "{}: again",
            at
        );
        for (j, (value, _)) in later.iter().enumerate().take(n) {
            prop_assert_eq!(value, &m.stored[j], "{}: again wrote member {}", at, j);
        }
        prop_assert_eq!(
            later[n].0.as_deref(),
            Some(record),
            "{}: again, the record",
            at
        );
    }
    Ok(())
}

const HOUR: Duration = Duration::from_secs(3600);

fn policy(kind: AlgorithmKind, limit: u64) -> RateLimitPolicy {
    TestPolicy::new("record", algorithm(kind, limit, HOUR))
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
fn records_that_are_not_this_reservations_are_named_and_nothing_is_written() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, SETTLE_SOURCE).expect("compiles");
    let p = policy(AlgorithmKind::TokenBucket, 10);
    let (state, record) = ("rl:{rcrd}state", "rl:{rcrd}r:1");
    let keys = [state, record];
    let settle = end_arguments(&[(&p, 1)], false);
    let status = |con: &mut redis::Connection, args: &[Vec<u8>]| {
        let reply = call(con, &script, &keys, args);
        (reply.status, reply.index, reply.rows.len())
    };
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut con).expect("DEL");
    assert_eq!(status(&mut con, &settle), ("UNKNOWN".into(), 0, 0));
    assert_eq!(
        status(&mut con, &end_arguments(&[(&p, 0)], true)),
        ("UNKNOWN".into(), 0, 0)
    );
    for garbage in [&b"x"[..], &[0x52; 40][..], &[0u8; 40][..]] {
        let _: () = redis::cmd("SET")
            .arg(record)
            .arg(garbage)
            .query(&mut con)
            .expect("SET");
        assert_eq!(
            status(&mut con, &settle),
            ("STATE_INCOMPATIBLE".into(), 2, 0)
        );
        let reserve = reserve_arguments(&[(&p, 1)], 1000, BLOB);
        assert_eq!(
            status(&mut con, &reserve),
            ("STATE_INCOMPATIBLE".into(), 2, 0)
        );
        assert_eq!(
            get_raw(&mut con, state).expect("GET"),
            None,
            "nothing charged"
        );
    }
    let _: () = redis::cmd("DEL").arg(record).query(&mut con).expect("DEL");
    // A record of one member named with two: not this reservation's.
    let reserve = reserve_arguments(&[(&p, 1)], 1000, BLOB);
    assert_eq!(status(&mut con, &reserve), ("ALLOWED".into(), 0, 1));
    let other = "rl:{rcrd}other";
    let two = end_arguments(&[(&p, 1), (&p, 1)], false);
    let reply = call(&mut con, &script, &[state, other, record], &two);
    assert_eq!(
        (reply.status.as_str(), reply.index),
        ("STATE_INCOMPATIBLE", 3)
    );
    let before = get_raw(&mut con, state).expect("GET");
    let bad: Vec<Vec<Vec<u8>>> = vec![
        reserve_arguments(&[(&p, 1)], 0, BLOB),
        reserve_arguments(&[(&p, 1)], 86_400_001, BLOB),
        reserve_arguments(&[(&p, 1)], 1000, &vec![0; 65_536]),
        reserve_arguments(&[(&policy(AlgorithmKind::SlidingLog, 10), 1)], 1000, BLOB),
        // A settlement's member arguments carry no hold: the record's is appended.
        {
            let mut a = settle.clone();
            a[2] = arguments(&p, 1).remove(0)[..39].to_vec();
            a
        },
    ];
    let fresh = "rl:{rcrd}r:2";
    for args in bad {
        // A reservation names a fresh record; a settlement the one that exists.
        let at = if args[0][1] == 1 { fresh } else { record };
        let reply = call(&mut con, &script, &[state, at], &args);
        assert_eq!(reply.status, "INVALID", "{args:?}");
        assert_eq!(get_raw(&mut con, state).expect("GET"), before, "{args:?}");
        assert_eq!(get_raw(&mut con, fresh).expect("GET"), None, "{args:?}");
    }
    // The good one still settles, once.
    assert_eq!(status(&mut con, &settle), ("ALLOWED".into(), 0, 1));
    assert_eq!(status(&mut con, &settle), ("SETTLED".into(), 0, 0));
    assert_eq!(
        status(&mut con, &end_arguments(&[(&p, 0)], true)),
        ("SETTLED".into(), 0, 0)
    );
}
