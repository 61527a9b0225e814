//! The lease programs (their test builds, `now` taken from ARGV) against
//! `model::concurrency` on a real redis-server.
//!
//! Random sequences of acquires, releases (of held, released, expired and forged tokens)
//! and clock steps must give exactly the model's answers, leave exactly the model's leases
//! in the sorted set (token -> expiry), and give the key a TTL of its latest expiry. Each step
//! runs `EVALSHA; ZRANGE; PTTL; PERSIST` in one transaction, so model time and real time can
//! differ freely while the TTL the program wrote is still observed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use acceptance_tests::lua::{Loaded, test_build};
use acceptance_tests::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::lease::LeaseToken;
use shared_contract::model::concurrency::{self, Acquire, ConcurrencyState, Release};
use shared_contract::policy::ConcurrencyParams;
use shared_contract::{
    Algorithm, AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
};

const ACQUIRE: &str = include_str!("../../../lua/lease-acquire-v1.lua");
const RELEASE: &str = include_str!("../../../lua/lease-release-v1.lua");
const CASES: u32 = 96;
/// Milliseconds the server may spend inside one `EXEC` between `PEXPIRE` and `PTTL`.
const PTTL_TOLERANCE_MS: i64 = 25;

fn params(limit: u64, ttl_ms: u64) -> ConcurrencyParams {
    let policy = RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("jobs").expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::Concurrency {
            limit,
            lease_ttl: Duration::from_millis(ttl_ms),
        },
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy");
    match policy.algorithm() {
        Algorithm::Concurrency(p) => *p,
        _ => panic!("a concurrency policy"),
    }
}

fn token(n: u64) -> LeaseToken {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    b[8..].copy_from_slice(&n.to_be_bytes());
    LeaseToken::from_bytes(b)
}

struct Programs {
    acquire: Loaded,
    release: Loaded,
}

fn load(con: &mut redis::Connection) -> Programs {
    let build = |name, src| test_build(name, src).expect("a well-formed @time-source block");
    Programs {
        acquire: Loaded::load(con, &build("lease-acquire-v1.lua", ACQUIRE)).expect("compiles"),
        release: Loaded::load(con, &build("lease-release-v1.lua", RELEASE)).expect("compiles"),
    }
}

/// The reply, the leases left (token hex -> expiry) and the key's PTTL after one call.
type Observed = (redis::Value, Vec<(String, u64)>, i64);

fn call(
    con: &mut redis::Connection,
    cmd: redis::Cmd,
    key: &str,
) -> Result<Observed, TestCaseError> {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .add_command(cmd)
        .cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("PTTL")
        .arg(key)
        .cmd("PERSIST")
        .arg(key)
        .ignore();
    let (reply, mut leases, pttl): (redis::Value, Vec<(String, u64)>, i64) = pipe
        .query(con)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    // Compared as sets: the sorted set orders by expiry, the model by acquire.
    leases.sort();
    Ok((reply, leases, pttl))
}

fn fields(v: &redis::Value) -> Result<(String, Vec<i64>), TestCaseError> {
    let redis::Value::Array(f) = v else {
        return Err(TestCaseError::fail(format!("not an array: {v:?}")));
    };
    let status = match f.first() {
        Some(redis::Value::BulkString(s)) => String::from_utf8_lossy(s).into_owned(),
        other => return Err(TestCaseError::fail(format!("status {other:?}"))),
    };
    let mut n = Vec::new();
    for x in &f[1..] {
        match x {
            redis::Value::Int(i) => n.push(*i),
            other => return Err(TestCaseError::fail(format!("field {other:?}"))),
        }
    }
    Ok((status, n))
}

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    Release(u64),
    ReleaseUnknown,
    Advance(u64),
}

fn sorted(state: &ConcurrencyState) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = state.leases.iter().map(|(t, e)| (t.to_hex(), *e)).collect();
    v.sort();
    v
}

#[test]
fn lease_programs_equal_the_model() {
    let server = RedisServer::shared();
    let con = RefCell::new(server.connection());
    let programs = load(&mut con.borrow_mut());
    let counter = RefCell::new(0u64);
    let seen = RefCell::new(BTreeMap::<String, u64>::new());
    let strategy =
        (1u64..=5, 1u64..=5_000, 1u64 << 40..=1u64 << 42).prop_flat_map(|(limit, ttl, start)| {
            let op = prop_oneof![
                4 => Just(Op::Acquire),
                2 => any::<u64>().prop_map(Op::Release),
                1 => Just(Op::ReleaseUnknown),
                2 => (0..=ttl + ttl / 2).prop_map(Op::Advance),
            ];
            (
                Just(limit),
                Just(ttl),
                Just(start),
                prop::collection::vec(op, 1..40),
            )
        });
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |(limit, ttl, start, ops)| {
        *counter.borrow_mut() += 1;
        let key = format!("rl:{{lease}}diff-{}", counter.borrow());
        run_case(
            &mut con.borrow_mut(),
            &programs,
            &key,
            (limit, ttl, start, ops),
            &mut seen.borrow_mut(),
        )
    });
    if let Err(e) = result {
        panic!("lease programs: {e}");
    }
    let seen = seen.into_inner();
    eprintln!("lease programs: statuses {seen:?}");
    for status in ["ACQUIRED", "DENIED", "RELEASED", "EXPIRED", "NOT_HELD"] {
        assert!(
            seen.get(status).is_some_and(|&n| n >= 3),
            "{status} reached too rarely: {seen:?}"
        );
    }
}

/// One random sequence on a fresh key: every step against the model.
fn run_case(
    con: &mut redis::Connection,
    programs: &Programs,
    key: &str,
    (limit, ttl, start, ops): (u64, u64, u64, Vec<Op>),
    seen: &mut BTreeMap<String, u64>,
) -> Result<(), TestCaseError> {
    let p = params(limit, ttl);
    let mut now = start;
    let mut state: Option<ConcurrencyState> = None;
    let mut issued = 0u64;
    for op in ops {
        match op {
            Op::Acquire => {
                issued += 1;
                let t = token(issued);
                let cmd = programs.acquire.command(
                    key,
                    &[
                        t.to_hex(),
                        limit.to_string(),
                        ttl.to_string(),
                        now.to_string(),
                    ],
                );
                let (reply, leases, pttl) = call(con, cmd, key)?;
                let (status, n) = fields(&reply)?;
                *seen.entry(status.clone()).or_default() += 1;
                match concurrency::acquire(&p, state.as_ref(), now, t).expect("in range") {
                    Acquire::Acquired {
                        expires_at_ms,
                        remaining,
                        new_state,
                    } => {
                        let want = vec![
                            now as i64,
                            expires_at_ms as i64,
                            limit as i64,
                            remaining as i64,
                            0,
                        ];
                        prop_assert_eq!((status.as_str(), n), ("ACQUIRED", want));
                        prop_assert_eq!(&leases, &sorted(&new_state));
                        let latest = new_state.latest_expiry_ms().unwrap_or(now);
                        let want = (latest - now) as i64;
                        prop_assert!(
                            pttl <= want && pttl >= want - PTTL_TOLERANCE_MS,
                            "TTL {} of the latest lease, want {}",
                            pttl,
                            want
                        );
                        state = Some(new_state);
                    }
                    Acquire::Denied { retry_after_ms } => {
                        let want = vec![now as i64, 0, limit as i64, 0, retry_after_ms as i64];
                        prop_assert_eq!((status.as_str(), n), ("DENIED", want));
                        let before = state.as_ref().map(sorted).unwrap_or_default();
                        prop_assert_eq!(&leases, &before, "a denial changes nothing");
                    }
                }
            }
            Op::Release(_) | Op::ReleaseUnknown => {
                let t = match op {
                    Op::Release(k) if issued > 0 => token(1 + k % issued),
                    _ => token(u64::MAX),
                };
                let cmd = programs
                    .release
                    .command(key, &[t.to_hex(), now.to_string()]);
                let (reply, leases, _) = call(con, cmd, key)?;
                let (status, n) = fields(&reply)?;
                *seen.entry(status.clone()).or_default() += 1;
                prop_assert_eq!(n, vec![now as i64]);
                let (want, new_state) =
                    concurrency::release(state.as_ref(), now, t).expect("in range");
                let want = match want {
                    Release::Released => "RELEASED",
                    Release::Expired => "EXPIRED",
                    Release::NotHeld => "NOT_HELD",
                };
                prop_assert_eq!(status.as_str(), want);
                if let Some(s) = new_state {
                    state = Some(s);
                }
                let after = state.as_ref().map(sorted).unwrap_or_default();
                prop_assert_eq!(&leases, &after, "only the named lease left");
            }
            Op::Advance(d) => now += d,
        }
    }
    Ok(())
}

#[test]
fn bad_arguments_and_another_type_are_refused_and_change_nothing() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let programs = load(&mut con);
    let key = "rl:{lease}bad";
    let tok = token(1).to_hex();
    let cases: [(&[&str], &str); 6] = [
        (&[&tok, "0", "1000", "5"], "INVALID"),
        (&[&tok, "1000001", "1000", "5"], "INVALID"),
        (&[&tok, "3", "86400001", "5"], "INVALID"),
        (&["ABCD", "3", "1000", "5"], "INVALID"),
        (&[&tok, "3", "-1", "5"], "INVALID"),
        (&[&tok, "3"], "INVALID"),
    ];
    for (args, want) in cases {
        let reply: redis::Value = programs
            .acquire
            .command(key, args)
            .query(&mut con)
            .expect("a reply");
        let (status, _) = fields(&reply).expect("fields");
        assert_eq!(status, want, "{args:?}");
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(key)
        .query(&mut con)
        .expect("EXISTS");
    assert!(!exists, "nothing written");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("x")
        .query(&mut con)
        .expect("SET");
    for cmd in [
        programs
            .acquire
            .command(key, &[tok.as_str(), "3", "1000", "5"]),
        programs.release.command(key, &[tok.as_str(), "5"]),
    ] {
        let reply: redis::Value = cmd.query(&mut con).expect("a reply");
        assert_eq!(fields(&reply).expect("fields").0, "STATE_INCOMPATIBLE");
    }
    let v: String = redis::cmd("GET").arg(key).query(&mut con).expect("GET");
    assert_eq!(v, "x", "another type is left alone");
}

#[test]
fn a_repeated_token_is_refused_while_held_and_reusable_once_expired_like_the_model() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let programs = load(&mut con);
    let key = "rl:{lease}repeat";
    let p = params(3, 1_000);
    let t = token(42);
    let run = |con: &mut redis::Connection, now: u64| {
        let cmd = programs.acquire.command(
            key,
            &[t.to_hex(), "3".into(), "1000".into(), now.to_string()],
        );
        let reply: redis::Value = cmd.query(con).expect("a reply");
        fields(&reply).expect("fields").0
    };
    let first = concurrency::acquire(&p, None, 5_000, t).expect("in range");
    let Acquire::Acquired { new_state, .. } = first else {
        panic!("a free place")
    };
    assert_eq!(run(&mut con, 5_000), "ACQUIRED");
    assert!(concurrency::acquire(&p, Some(&new_state), 5_500, t).is_err());
    assert_eq!(run(&mut con, 5_500), "STATE_INCOMPATIBLE");
    assert!(matches!(
        concurrency::acquire(&p, Some(&new_state), 6_000, t),
        Ok(Acquire::Acquired { .. })
    ));
    assert_eq!(run(&mut con, 6_000), "ACQUIRED");
}
