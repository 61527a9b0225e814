//! What every Lua program must guarantee on its own, each a named test run on a real
//! redis-server for all five programs: the exact boundary after a denial that consumed
//! nothing, clock regression (refused beyond the threshold with the state byte for byte
//! unchanged, clamped within it), state of the wrong type or malformed left untouched, both
//! state layouts read and the compact one written, token refill remainders carried,
//! malformed arguments refused, the time prelude and the test build, and the programs'
//! headers and key discipline. Production programs (real `TIME`) unless a test needs a
//! chosen clock, which takes the test build (`now` from ARGV).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use acceptance_tests::lua::{
    Layout, Loaded, Program, Reply, TEST_TIME_SOURCE, argument_fields, arguments, decode_state,
    dump, encode_state, encode_state_as, get_raw, layout_of, pack, pttl, server_time_ms,
};
use acceptance_tests::rate::{TestPolicy, algorithm};
use acceptance_tests::redis_server::RedisServer;
use shared_contract::model::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use shared_contract::{Algorithm, AlgorithmSpec, RateLimitPolicy};

const HOUR: Duration = Duration::from_secs(3600);
/// Slack between two clock reads around one program call. Generous because the test process
/// can be descheduled between them on two shared cores (50 ms once failed a PTTL check under
/// a parallel build); what these checks guard against is an hour away (a rewritten expiry,
/// a clock other than `TIME`), so a second keeps their meaning.
const CLOCK_SLACK_MS: u64 = 1_000;

fn spec(program: Program, limit: u64, span: Duration) -> AlgorithmSpec {
    algorithm(program.kind(), limit, span)
}

fn policy_with(algorithm: AlgorithmSpec, max_cost: u64, revision: u32) -> RateLimitPolicy {
    TestPolicy::new("evidence", algorithm)
        .revision(revision)
        .max_cost(max_cost)
        .build()
}

/// Limit 5 recovering over an hour: nothing refills or rolls over while a test runs.
fn policy(program: Program) -> RateLimitPolicy {
    policy_with(spec(program, 5, HOUR), 5, 7)
}

struct Fixture {
    con: redis::Connection,
    production: Loaded,
    test_build: Loaded,
}

fn fixture(program: Program) -> Fixture {
    let mut con = RedisServer::shared().connection();
    let production = Loaded::load(&mut con, program.source()).expect("program compiles");
    let variant = program.test_variant().expect("a @time-source block");
    let test_build = Loaded::load(&mut con, &variant).expect("test build compiles");
    Fixture {
        con,
        production,
        test_build,
    }
}

/// The fixture of `program`, its [`policy`], and the key of `test`.
fn setup(program: Program, test: &str) -> (Fixture, RateLimitPolicy, String) {
    (fixture(program), policy(program), key(program, test))
}

fn key(program: Program, test: &str) -> String {
    format!("rl:{{ev}}{}:{test}", program.file_name())
}

fn with_now(mut args: Vec<Vec<u8>>, now: u64) -> Vec<Vec<u8>> {
    args.push(now.to_string().into_bytes());
    args
}

/// A valid state of `program` for `policy` at `last_ms`, with something consumed.
fn some_state(policy: &RateLimitPolicy, last_ms: u64) -> AlgorithmState {
    match policy.algorithm() {
        Algorithm::FixedWindow(_) => AlgorithmState::FixedWindow(FixedWindowState {
            last_ms,
            count: 2,
            overdraft: 0,
        }),
        Algorithm::SlidingWindow(_) => AlgorithmState::SlidingWindow(SlidingWindowState {
            last_ms,
            previous: 0,
            current: 2,
            overdraft: 0,
        }),
        Algorithm::TokenBucket(p) => AlgorithmState::TokenBucket(TokenBucketState {
            last_ms,
            tokens: p.capacity_units() - 2 * p.scale(),
            overdraft: 0,
        }),
        Algorithm::Gcra(p) => AlgorithmState::Gcra(GcraState {
            last_ms,
            debt: 2 * p.interval_units(),
            overdraft: 0,
        }),
        Algorithm::SlidingLog(_) => AlgorithmState::SlidingLog(SlidingLogState {
            last_ms,
            entries: vec![(last_ms - 10, 1), (last_ms, 1)],
        }),
        Algorithm::Concurrency(_) => panic!("no rate program holds leases"),
    }
}

fn plant(con: &mut redis::Connection, key: &str, value: &[u8], px: Option<u64>) {
    let mut c = redis::cmd("SET");
    c.arg(key).arg(value);
    if let Some(px) = px {
        c.arg("PX").arg(px);
    }
    let _: () = c.query(con).expect("SET");
}

fn assert_zero_fields(reply: &Reply, status: &str, context: &str) {
    assert_eq!(reply.status, status, "{context}: {reply:?}");
    assert_eq!(
        (
            reply.effective_now_ms,
            reply.limit,
            reply.remaining,
            reply.retry_after_ms,
            reply.reset_at_ms
        ),
        (0, 0, 0, 0, 0),
        "{context}: {reply:?}"
    );
}

#[test]
fn exact_boundary_admission_after_a_denied_non_consuming_request() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "boundary");
        let _: () = redis::cmd("DEL").arg(&k).query(&mut f.con).expect("DEL");
        let now = 1_800_000_000_000;
        let run = |f: &mut Fixture, cost: u64| {
            f.test_build
                .run(&mut f.con, &k, &with_now(arguments(&p, cost), now))
                .expect("a reply")
        };
        let first = run(&mut f, 3);
        assert_eq!((first.status.as_str(), first.remaining), ("ALLOWED", 2));
        let before = get_raw(&mut f.con, &k).expect("GET");
        let ttl_before = pttl(&mut f.con, &k).expect("PTTL");
        // 3 > 2 left: denied, and the denial consumes nothing.
        let denied = run(&mut f, 3);
        assert_eq!(
            (denied.status.as_str(), denied.remaining),
            ("DENIED", 2),
            "{}",
            program.file_name()
        );
        assert_eq!(get_raw(&mut f.con, &k).expect("GET"), before);
        assert!(pttl(&mut f.con, &k).expect("PTTL") <= ttl_before);
        // Exactly what is left is admitted, and then nothing more.
        let exact = run(&mut f, 2);
        assert_eq!(
            (exact.status.as_str(), exact.remaining),
            ("ALLOWED", 0),
            "{}",
            program.file_name()
        );
        assert_eq!(run(&mut f, 1).status, "DENIED", "{}", program.file_name());
    }
}

#[test]
fn clock_regression_beyond_threshold_leaves_state_byte_for_byte_unchanged() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "regression");
        // last_ms a minute ahead of the server: far beyond the 1 s regression allowed.
        let last_ms = server_time_ms(&mut f.con).expect("TIME") + 60_000;
        let value = encode_state(p.revision().get(), &some_state(&p, last_ms)).expect("encode");
        plant(&mut f.con, &k, &value, Some(500_000));
        let dump_before = dump(&mut f.con, &k).expect("DUMP");
        let ttl_before = pttl(&mut f.con, &k).expect("PTTL");
        let t0 = server_time_ms(&mut f.con).expect("TIME");
        let reply = f
            .production
            .run(&mut f.con, &k, &arguments(&p, 1))
            .expect("a reply");
        assert_eq!(reply.status, "CLOCK_UNSAFE", "{}", program.file_name());
        assert_eq!(reply.effective_now_ms, last_ms);
        assert_eq!(reply.reset_at_ms, last_ms);
        assert_eq!(reply.remaining, 0);
        assert_eq!(reply.limit, 5);
        assert_eq!(reply.retry_after_ms, last_ms - reply.server_now_ms);
        assert!(reply.server_now_ms >= t0 && reply.server_now_ms <= t0 + CLOCK_SLACK_MS);
        assert_eq!(dump(&mut f.con, &k).expect("DUMP"), dump_before);
        assert_eq!(get_raw(&mut f.con, &k).expect("GET"), Some(value));
        // The expiry was not rewritten: PTTL only went down by the time that passed.
        let ttl_after = pttl(&mut f.con, &k).expect("PTTL");
        assert!(
            ttl_after <= ttl_before && ttl_after + CLOCK_SLACK_MS as i64 >= ttl_before,
            "{}: PTTL {ttl_before} -> {ttl_after}",
            program.file_name()
        );
    }
}

#[test]
fn small_clock_regression_clamps_to_the_stored_last_ms() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "clamp");
        // 300 ms ahead of the server: within the 1 s allowed.
        let last_ms = server_time_ms(&mut f.con).expect("TIME") + 300;
        let state = some_state(&p, last_ms);
        let value = encode_state(p.revision().get(), &state).expect("encode");
        plant(&mut f.con, &k, &value, None);
        let reply = f
            .production
            .run(&mut f.con, &k, &arguments(&p, 1))
            .expect("a reply");
        assert_eq!(reply.status, "ALLOWED", "{}", program.file_name());
        assert!(reply.server_now_ms < last_ms);
        assert_eq!(reply.effective_now_ms, last_ms, "{}", program.file_name());
        assert_eq!(
            reply.remaining,
            2,
            "{}: 2 consumed + 1",
            program.file_name()
        );
        let stored = get_raw(&mut f.con, &k).expect("GET").expect("state");
        let (_, new) = decode_state(&stored).expect("decodes");
        let new_last = match new {
            AlgorithmState::FixedWindow(s) => s.last_ms,
            AlgorithmState::SlidingWindow(s) => s.last_ms,
            AlgorithmState::TokenBucket(s) => s.last_ms,
            AlgorithmState::Gcra(s) => s.last_ms,
            AlgorithmState::SlidingLog(s) => s.last_ms,
            AlgorithmState::Concurrency(_) => panic!("no rate program holds leases"),
        };
        assert_eq!(new_last, last_ms, "{}", program.file_name());
    }
}

#[test]
fn wrong_key_type_is_state_incompatible_and_untouched() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "wrongtype");
        for (kind, setup) in [
            (
                "hash",
                redis::cmd("HSET").arg(&k).arg("tokens").arg(5).clone(),
            ),
            ("list", redis::cmd("RPUSH").arg(&k).arg("x").clone()),
            ("set", redis::cmd("SADD").arg(&k).arg("x").clone()),
        ] {
            let _: () = redis::cmd("DEL").arg(&k).query(&mut f.con).expect("DEL");
            let _: i64 = setup.query(&mut f.con).expect("setup");
            let before = dump(&mut f.con, &k).expect("DUMP");
            let reply = f
                .production
                .run(&mut f.con, &k, &arguments(&p, 1))
                .expect("a reply, not a Redis error");
            assert_zero_fields(
                &reply,
                "STATE_INCOMPATIBLE",
                &format!("{} on a {kind}", program.file_name()),
            );
            assert_eq!(dump(&mut f.con, &k).expect("DUMP"), before);
            assert_eq!(pttl(&mut f.con, &k).expect("PTTL"), -1);
        }
    }
}

/// Values that are not a state of `program` for `policy` (revision 7).
fn malformed_values(program: Program, p: &RateLimitPolicy) -> Vec<(String, Vec<u8>)> {
    let good = encode_state(7, &some_state(p, 1_800_000_000_000)).expect("encode");
    let mut v: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("text".into(), b"tokens=5;last=1".to_vec()),
        ("a decimal".into(), b"12345".to_vec()),
        ("truncated".into(), good[..good.len() - 1].to_vec()),
        ("trailing byte".into(), [good.clone(), vec![0]].concat()),
        ("header only".into(), good[..7].to_vec()),
    ];
    let layout = layout_of(&good).expect("a tag");
    let mut wrong = good.clone();
    wrong[0] = (good[0] & 0x80) | (2 << 4) | program.algorithm_code();
    v.push(("schema version 2".into(), wrong));
    for other in Program::ALL.into_iter().filter(|o| *o != program) {
        let mut w = good.clone();
        w[0] = other.tag(layout);
        v.push((format!("tag of {}", other.file_name()), w));
    }
    // The layout bit must match the length.
    let mut flipped = good.clone();
    flipped[0] = program.tag(Layout::Wide);
    v.push(("wide tag on a compact value".into(), flipped));
    let mut wide =
        encode_state_as(Layout::Wide, 7, &some_state(p, 1_800_000_000_000)).expect("encode wide");
    wide[0] = program.tag(Layout::Compact);
    v.push(("compact tag on a wide value".into(), wide));
    let other_revision = encode_state(8, &some_state(p, 1_800_000_000_000)).expect("encode");
    v.push(("another revision".into(), other_revision));
    let over = match p.algorithm() {
        Algorithm::FixedWindow(q) => AlgorithmState::FixedWindow(FixedWindowState {
            last_ms: 1,
            count: q.limit() + 1,
            overdraft: 0,
        }),
        Algorithm::SlidingWindow(q) => AlgorithmState::SlidingWindow(SlidingWindowState {
            last_ms: 1,
            previous: q.limit() + 1,
            current: 0,
            overdraft: 0,
        }),
        Algorithm::TokenBucket(q) => AlgorithmState::TokenBucket(TokenBucketState {
            last_ms: 1,
            tokens: q.capacity_units() + 1,
            overdraft: 0,
        }),
        Algorithm::Gcra(q) => AlgorithmState::Gcra(GcraState {
            last_ms: 1,
            debt: q.tolerance_units() + 1,
            overdraft: 0,
        }),
        Algorithm::SlidingLog(q) => AlgorithmState::SlidingLog(SlidingLogState {
            last_ms: 1,
            entries: vec![(1, q.limit() + 1)],
        }),
        Algorithm::Concurrency(_) => panic!("no rate program holds leases"),
    };
    v.push((
        "field above its bound".into(),
        encode_state(7, &over).expect("encode"),
    ));
    if program == Program::SlidingLog {
        let log = |entries: Vec<(u64, u64)>| {
            encode_state(
                7,
                &AlgorithmState::SlidingLog(SlidingLogState {
                    last_ms: 100,
                    entries,
                }),
            )
            .expect("encode")
        };
        v.push(("entry of cost 0".into(), log(vec![(90, 0)])));
        v.push(("entries out of order".into(), log(vec![(95, 1), (90, 1)])));
        v.push((
            "entries at the same time".into(),
            log(vec![(90, 1), (90, 1)]),
        ));
        // An age beyond last_ms would put the entry before the epoch.
        let mut before_epoch = vec![program.tag(Layout::Compact)];
        before_epoch.extend_from_slice(&100u64.to_le_bytes()[..6]);
        before_epoch.extend_from_slice(&[7, 101, 0, 0, 1]);
        v.push(("entry before the epoch".into(), before_epoch));
    }
    v
}

#[test]
fn malformed_state_is_state_incompatible_and_untouched() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "malformed");
        for (what, value) in malformed_values(program, &p) {
            plant(&mut f.con, &k, &value, Some(400_000));
            let ttl_before = pttl(&mut f.con, &k).expect("PTTL");
            let reply = f
                .production
                .run(&mut f.con, &k, &arguments(&p, 1))
                .expect("a reply, not a Redis error");
            let context = format!("{}: {what} {value:02x?}", program.file_name());
            assert_zero_fields(&reply, "STATE_INCOMPATIBLE", &context);
            assert_eq!(
                get_raw(&mut f.con, &k).expect("GET"),
                Some(value),
                "{context}"
            );
            let ttl_after = pttl(&mut f.con, &k).expect("PTTL");
            assert!(
                ttl_after <= ttl_before && ttl_after + CLOCK_SLACK_MS as i64 >= ttl_before,
                "{context}: PTTL {ttl_before} -> {ttl_after}"
            );
        }
        // The same key with valid state is evaluated (the checks above are not blanket).
        let good = encode_state(7, &some_state(&p, 1_800_000_000_000)).expect("encode");
        plant(&mut f.con, &k, &good, None);
        let reply = f
            .test_build
            .run(
                &mut f.con,
                &k,
                &with_now(arguments(&p, 1), 1_800_000_000_000),
            )
            .expect("a reply");
        assert_eq!(reply.status, "ALLOWED", "{}", program.file_name());
    }
}

#[test]
fn both_layouts_are_read_and_the_compact_one_is_written() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "layouts");
        let now = 1_800_000_000_000;
        let state = some_state(&p, now);
        for layout in [Layout::Compact, Layout::Wide] {
            let planted = encode_state_as(layout, 7, &state).expect("encode");
            plant(&mut f.con, &k, &planted, None);
            let reply = f
                .test_build
                .run(&mut f.con, &k, &with_now(arguments(&p, 1), now))
                .expect("a reply");
            let context = format!("{} from {layout:?}", program.file_name());
            assert_eq!(
                (reply.status.as_str(), reply.remaining),
                ("ALLOWED", 2),
                "{context}"
            );
            let stored = get_raw(&mut f.con, &k).expect("GET").expect("state");
            assert_eq!(layout_of(&stored), Some(Layout::Compact), "{context}");
            // Counters fit 12 bytes; a sliding log holds 4 bytes per entry after 8.
            let max = if program == Program::SlidingLog {
                16
            } else {
                12
            };
            assert!(stored.len() <= max, "{context}: {} bytes", stored.len());
        }
        // A revision above 255 does not fit the compact layout: the wide one is written.
        let wide_policy = policy_with(spec(program, 5, HOUR), 5, 300);
        let _: () = redis::cmd("DEL").arg(&k).query(&mut f.con).expect("DEL");
        let reply = f
            .test_build
            .run(&mut f.con, &k, &with_now(arguments(&wide_policy, 1), now))
            .expect("a reply");
        assert_eq!(reply.status, "ALLOWED");
        let stored = get_raw(&mut f.con, &k).expect("GET").expect("state");
        assert_eq!(
            layout_of(&stored),
            Some(Layout::Wide),
            "{}",
            program.file_name()
        );
        assert_eq!(decode_state(&stored).expect("decodes").0, 300);
    }
}

#[test]
fn token_refill_remainder_carries() {
    // 2 tokens per 3 ms: one ms adds 2/3 token, so every refill leaves a sub-token remainder.
    let p = policy_with(
        AlgorithmSpec::TokenBucket {
            capacity: 10,
            refill_amount: 2,
            refill_interval: Duration::from_millis(3),
        },
        10,
        1,
    );
    let mut f = fixture(Program::TokenBucket);
    let t0 = 1_800_000_000_000u64;
    let run = |f: &mut Fixture, k: &str, cost: u64, now: u64| {
        f.test_build
            .run(&mut f.con, k, &with_now(arguments(&p, cost), now))
            .expect("a reply")
    };
    let (many, one) = ("rl:{ev}refill:many", "rl:{ev}refill:one");
    for k in [many, one] {
        let _: () = redis::cmd("DEL").arg(k).query(&mut f.con).expect("DEL");
        assert_eq!(run(&mut f, k, 10, t0).status, "ALLOWED");
    }
    // Many small allows at 2, 4, 5 and 7 ms (each storing 1/3 or 2/3 token of remainder) ...
    for (dt, cost) in [(2, 1), (4, 1), (5, 1), (7, 1)] {
        assert_eq!(run(&mut f, many, cost, t0 + dt).status, "ALLOWED");
    }
    // ... equal one allow of the same total at the end.
    assert_eq!(run(&mut f, one, 4, t0 + 7).status, "ALLOWED");
    let state = |f: &mut Fixture, k: &str| {
        decode_state(&get_raw(&mut f.con, k).expect("GET").expect("state")).expect("decodes")
    };
    assert_eq!(state(&mut f, many), state(&mut f, one));
    // 7 ms refilled 14/3 tokens: 4 spent leaves 2/3 token, i.e. 2 units of 1/3.
    assert_eq!(
        state(&mut f, one).1,
        AlgorithmState::TokenBucket(TokenBucketState {
            last_ms: t0 + 7,
            tokens: 2,
            overdraft: 0,
        })
    );
    // The remainder counts: at 8 ms there are 4/3 tokens, so one more is admitted.
    for k in [many, one] {
        let r = run(&mut f, k, 1, t0 + 8);
        assert_eq!((r.status.as_str(), r.remaining), ("ALLOWED", 0), "{k}");
    }
}

/// Arguments that are missing, not of the packed length, or hold a field out of range for
/// `program`.
fn malformed_arguments(program: Program) -> Vec<(String, Vec<Vec<u8>>)> {
    let good = argument_fields(&policy(program), 1);
    let packed = pack(&good);
    let mut v: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    let mut with = |what: &str, changes: &[(usize, u64)]| {
        let mut f = good.clone();
        for &(i, value) in changes {
            f[i].0 = value;
        }
        v.push((format!("{what} ({changes:?})"), vec![pack(&f)]));
    };
    with("cost 0", &[(0, 0)]);
    with("cost above the limit", &[(0, 6)]);
    with("revision 0", &[(1, 0)]);
    with("limit 0", &[(4, 0)]);
    with("second parameter 0", &[(5, 0)]);
    match program {
        Program::FixedWindow => with("limit above 2^53-1", &[(4, 1 << 53)]),
        Program::SlidingLog => with("sliding-log limit above 1000", &[(4, 1001)]),
        Program::SlidingCounter => {
            with("limit above (2^53-1)/10^6", &[(4, 9_007_199_255)]);
            with("window above (2^53-1)/10^6", &[(5, 9_007_199_255)]);
        }
        Program::TokenBucket | Program::Gcra => {
            with("limit above 2^53-1", &[(4, 1 << 53)]);
            with("third parameter 0", &[(6, 0)]);
            with("third parameter above 2^53-1", &[(6, 1 << 53)]);
            // 2^52 * 3 > 2^53-1.
            with("product above 2^53-1", &[(4, 1 << 52), (5, 3)]);
            // 5 * 2^39 units at 1 per ms take longer than 2^40-1 ms.
            with(
                "full recovery longer than 2^40-1 ms",
                &[(5, 1 << 39), (6, 1)],
            );
        }
    }
    // Every field at the largest value its width holds, one at a time: refused where the
    // width is wider than the field's range (cost, limit, a count above 2^53-1).
    for (i, &(_, width)) in good.iter().enumerate() {
        let max = if width == 8 {
            u64::MAX
        } else {
            (1 << (8 * width)) - 1
        };
        let mut f = good.clone();
        f[i].0 = max;
        let valid = match (program, i) {
            // revision 2^32-1, regression and grace 2^40-1 are in range; so is a window
            // of 2^40-1 ms and a scale or interval of 2^40-1 (the product check refuses
            // those here, as it must: capacity 5 times 2^40-1 units recovers too slowly).
            (_, 1..=3) => true,
            (Program::FixedWindow | Program::SlidingLog, 5) => true,
            _ => false,
        };
        if !valid {
            v.push((format!("field {i} at {max}"), vec![pack(&f)]));
        }
    }
    let mut short = packed.clone();
    short.pop();
    let mut long = packed.clone();
    long.push(0);
    v.push(("one byte short".into(), vec![short]));
    v.push(("one byte long".into(), vec![long]));
    v.push(("empty".into(), vec![Vec::new()]));
    // The decimal arguments of the first version of the programs.
    let decimal: Vec<Vec<u8>> = good
        .iter()
        .map(|(x, _)| x.to_string().into_bytes())
        .collect();
    v.push(("decimal arguments".into(), decimal));
    v.push(("no argument".into(), Vec::new()));
    v
}

#[test]
fn malformed_arguments_are_invalid() {
    for program in Program::ALL {
        let mut f = fixture(program);
        let k = key(program, "invalid");
        let _: () = redis::cmd("DEL").arg(&k).query(&mut f.con).expect("DEL");
        for (what, args) in malformed_arguments(program) {
            let t0 = server_time_ms(&mut f.con).expect("TIME");
            let reply = f
                .production
                .run(&mut f.con, &k, &args)
                .expect("a reply, not a Redis error");
            let context = format!("{}: {what}", program.file_name());
            assert_zero_fields(&reply, "INVALID", &context);
            assert!(
                reply.server_now_ms >= t0 && reply.server_now_ms <= t0 + CLOCK_SLACK_MS,
                "{context}: server_now_ms {} vs TIME {t0}",
                reply.server_now_ms
            );
            assert_eq!(get_raw(&mut f.con, &k).expect("GET"), None, "{context}");
        }
        // Not exactly one key.
        let args = arguments(&policy(program), 1);
        for keys in [vec![], vec![k.clone(), format!("{k}:other")]] {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&f.production.sha1)
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
            let v: redis::Value = c.query(&mut f.con).expect("a reply");
            let reply = Reply::parse(&v).expect("seven fields");
            assert_zero_fields(&reply, "INVALID", &format!("{} keys", keys.len()));
        }
        assert_eq!(get_raw(&mut f.con, &k).expect("GET"), None);
        // And the well-formed arguments are accepted.
        let reply = f.production.run(&mut f.con, &k, &args).expect("a reply");
        assert_eq!(reply.status, "ALLOWED", "{}", program.file_name());
    }
}

#[test]
fn production_time_prelude_returns_server_time() {
    for program in Program::ALL {
        let (mut f, p, k) = setup(program, "prelude");
        let _: () = redis::cmd("DEL").arg(&k).query(&mut f.con).expect("DEL");
        let before = server_time_ms(&mut f.con).expect("TIME");
        let reply = f
            .production
            .run(&mut f.con, &k, &arguments(&p, 1))
            .expect("a reply");
        let after = server_time_ms(&mut f.con).expect("TIME");
        assert_eq!(reply.status, "ALLOWED");
        assert!(
            before <= reply.server_now_ms && reply.server_now_ms <= after,
            "{}: {before} <= {} <= {after}",
            program.file_name(),
            reply.server_now_ms
        );
        assert!(after - before <= CLOCK_SLACK_MS);
        assert_eq!(reply.effective_now_ms, reply.server_now_ms);
        // An extra trailing argument (the test build's `now`) does not move the clock.
        let mut args = arguments(&p, 1);
        args.push(b"1".to_vec());
        let reply = f.production.run(&mut f.con, &k, &args).expect("a reply");
        assert!(reply.server_now_ms >= after, "{}", program.file_name());
    }
}

#[test]
fn test_build_differs_only_in_the_time_source_block() {
    let documented = "-- @time-source begin\n\
                      local t = redis.call('TIME')\n\
                      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n\
                      -- @time-source end";
    for program in Program::ALL {
        let block = program.time_source_block().expect("a time block");
        assert_eq!(block, documented, "{}", program.file_name());
        let variant = program.test_variant().expect("a test build");
        assert_eq!(
            variant,
            program.source().replacen(documented, TEST_TIME_SOURCE, 1),
            "{}",
            program.file_name()
        );
    }
}

#[test]
fn programs_are_headed_by_their_interface() {
    for program in Program::ALL {
        let src = program.source();
        let header: String = src
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for needle in [
            program.file_name(),
            "KEYS[1]",
            "ARGV",
            "Reply",
            "ALLOWED",
            "DENIED",
            "CLOCK_UNSAFE",
            "STATE_INCOMPATIBLE",
            "INVALID",
            "State:",
            &format!("tag {:#04x}", program.tag(Layout::Compact)),
            &format!("tag {:#04x}", program.tag(Layout::Wide)),
        ] {
            assert!(
                header.contains(needle),
                "{}: header lacks {needle:?}",
                program.file_name()
            );
        }
    }
}

/// The Redis calls a program makes, by text: exactly one `TIME`, inside the marked block,
/// and every other call names `KEYS[1]` and no other key.
#[test]
fn programs_call_time_once_and_name_only_their_key() {
    for program in Program::ALL {
        let src = program.source();
        let code: Vec<&str> = src
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect();
        let code = code.join("\n");
        assert_eq!(
            code.matches("redis.call('TIME')").count(),
            1,
            "{}",
            program.file_name()
        );
        let block = program.time_source_block().expect("a time block");
        assert!(block.contains("redis.call('TIME')"));
        for call in code.split("redis.").skip(1) {
            let call = call.split(')').next().unwrap_or("");
            if call.starts_with("call('TIME'") {
                continue;
            }
            assert!(
                call.contains("KEYS[1]"),
                "{}: a Redis call without KEYS[1]: redis.{call}",
                program.file_name()
            );
        }
        let other_keys = code.matches("KEYS[").count() - code.matches("KEYS[1]").count();
        assert_eq!(other_keys, 0, "{}: names another key", program.file_name());
    }
}

/// The same, observed: `MONITOR` sees one `TIME`, one `GET` of the key and, on an allow, one
/// `SET` of the key; on a denial no write at all.
#[test]
fn programs_run_time_once_and_touch_only_their_key() {
    let server = RedisServer::start();
    for program in Program::ALL {
        let mut con = server.connection();
        let production = Loaded::load(&mut con, program.source()).expect("program compiles");
        let p = policy(program);
        let k = key(program, "monitor");
        let mut monitor = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        monitor
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        monitor.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut lines = BufReader::new(monitor.try_clone().expect("clone"));
        let mut ok = String::new();
        lines.read_line(&mut ok).expect("+OK");
        assert!(ok.starts_with("+OK"), "{ok}");
        let allow = production
            .run(&mut con, &k, &arguments(&p, 5))
            .expect("a reply");
        let deny = production
            .run(&mut con, &k, &arguments(&p, 1))
            .expect("a reply");
        assert_eq!(
            (allow.status.as_str(), deny.status.as_str()),
            ("ALLOWED", "DENIED")
        );
        let _: String = redis::cmd("ECHO")
            .arg("end-of-test")
            .query(&mut con)
            .expect("ECHO");
        let mut seen = Vec::new();
        loop {
            let mut line = String::new();
            lines.read_line(&mut line).expect("a MONITOR line");
            if line.contains("end-of-test") {
                break;
            }
            if line.contains(" lua] ") {
                seen.push(line.split(" lua] ").nth(1).unwrap_or("").trim().to_string());
            }
        }
        let quoted = format!("\"{k}\"");
        let set_prefix = format!("\"SET\" {quoted} ");
        assert_eq!(seen.len(), 5, "{}: {seen:?}", program.file_name());
        assert_eq!(seen[0], "\"TIME\"");
        assert_eq!(seen[1], format!("\"GET\" {quoted}"));
        assert!(seen[2].starts_with(&set_prefix), "{}", seen[2]);
        assert!(seen[2].contains("\"PX\""), "{}", seen[2]);
        assert_eq!(seen[3], "\"TIME\"");
        assert_eq!(seen[4], format!("\"GET\" {quoted}"));
    }
}
