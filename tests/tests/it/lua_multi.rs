//! What the multi-limit program (`lua/rate-multi-v2.lua`) guarantees on its own, run directly
//! on a real redis-server with its production source: malformed headers and member
//! arguments refused with `INVALID` and nothing written, a state key written by a single
//! program read by it and the other way round, and an evaluation id's reply stored once and
//! answered again. Equality with the model, step for step, is `lua_differential.rs`.

use std::time::Duration;

use acceptance_tests::lua::{
    Loaded, MULTI_SOURCE, MultiReply, Program, arguments, get_raw, multi_arguments, pack,
};
use acceptance_tests::rate::{TestPolicy, algorithm};
use acceptance_tests::redis_server::RedisServer;
use redis::Value;
use shared_contract::{AlgorithmKind, RateLimitPolicy};

const HOUR: Duration = Duration::from_secs(3600);

fn policy(kind: AlgorithmKind, limit: u64) -> RateLimitPolicy {
    TestPolicy::new("multi", algorithm(kind, limit, HOUR))
        .max_cost(limit)
        .build()
}

fn call(con: &mut redis::Connection, script: &Loaded, keys: &[&str], args: &[Vec<u8>]) -> Value {
    script
        .command_keys(keys, args)
        .query(con)
        .expect("the program answers")
}

#[test]
fn malformed_headers_and_member_arguments_are_invalid_and_write_nothing() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let script = Loaded::load(&mut con, MULTI_SOURCE).expect("compiles");
    let p = policy(AlgorithmKind::FixedWindow, 5);
    let good = multi_arguments(&[(&p, 1)], 0);
    let key = "rl:{mlti}invalid";
    let mut bad: Vec<(Vec<Vec<u8>>, Vec<&str>)> = vec![
        (vec![], vec![key]),
        (good.clone(), vec![key, "rl:{mlti}extra"]),
        (good.clone(), vec![]),
    ];
    let header = |n: u64, window: u64| pack(&[(n, 1), (window, 4)]);
    let mut short_header = good[0].clone();
    short_header.pop();
    let mut long_header = good[0].clone();
    long_header.push(0);
    for (at, value) in [
        (0, header(0, 0)),
        (0, header(9, 0)),
        (0, header(1, 86_400_001)),
        (0, short_header),
        (0, long_header),
        (0, b"1".to_vec()),
        (1, b"0".to_vec()),
        (1, b"6".to_vec()),
        (1, b"03".to_vec()),
        (1, b"x".to_vec()),
        (1, Vec::new()),
        // Token-bucket arguments are 40 bytes; these are a fixed window's 33.
        (1, b"3".to_vec()),
        (2, Vec::new()),
        (2, b"1".to_vec()),
    ] {
        let mut args = good.clone();
        args[at] = value;
        bad.push((args, vec![key]));
    }
    // A member's arguments missing.
    bad.push((good[..2].to_vec(), vec![key]));
    // Two members announced, one sent.
    let mut two = good.clone();
    two[0] = header(2, 0);
    bad.push((two, vec![key, "rl:{mlti}second"]));
    for (args, keys) in bad {
        let reply = call(&mut con, &script, &keys, &args);
        let reply = MultiReply::parse(&reply).expect("a well-formed reply");
        assert_eq!(reply.status, "INVALID", "{args:?} {keys:?}");
        assert!(!reply.replayed);
        assert_eq!(get_raw(&mut con, key).expect("GET"), None, "{args:?}");
    }
}

#[test]
fn state_written_by_a_single_program_is_read_by_the_multi_program_and_back() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let multi = Loaded::load(&mut con, MULTI_SOURCE).expect("compiles");
    for program in Program::ALL {
        let single = Loaded::load(&mut con, program.source()).expect("compiles");
        let p = policy(program.kind(), 10);
        let key = format!("rl:{{mlti}}shared-{}", program.file_name());
        let first = single
            .run(&mut con, &key, &arguments(&p, 3))
            .expect("a reply");
        assert_eq!((first.status.as_str(), first.remaining), ("ALLOWED", 7));
        let reply = call(&mut con, &multi, &[&key], &multi_arguments(&[(&p, 2)], 0));
        let reply = MultiReply::parse(&reply).expect("a well-formed reply");
        assert_eq!(reply.status, "ALLOWED", "{}", program.file_name());
        assert_eq!(reply.rows[0].remaining, 5, "{}", program.file_name());
        let after = single
            .run(&mut con, &key, &arguments(&p, 5))
            .expect("a reply");
        assert_eq!(
            (after.status.as_str(), after.remaining),
            ("ALLOWED", 0),
            "{}",
            program.file_name()
        );
    }
}

#[test]
fn an_evaluation_ids_reply_is_stored_once_and_answered_again() {
    let server = RedisServer::shared();
    let mut con = server.connection();
    let multi = Loaded::load(&mut con, MULTI_SOURCE).expect("compiles");
    let (a, b) = (
        policy(AlgorithmKind::TokenBucket, 3),
        policy(AlgorithmKind::SlidingLog, 3),
    );
    let keys = ["rl:{mlti}id-a", "rl:{mlti}id-b", "rl:{mlti}e:id"];
    let args = multi_arguments(&[(&a, 1), (&b, 1)], 60_000);
    let first = MultiReply::parse(&call(&mut con, &multi, &keys, &args)).expect("a reply");
    assert_eq!((first.status.as_str(), first.replayed), ("ALLOWED", false));
    let stored = get_raw(&mut con, keys[2])
        .expect("GET")
        .expect("a stored reply");
    assert!(stored.starts_with(b"ALLOWED,ALLOWED,"), "{stored:?}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(keys[2])
        .query(&mut con)
        .expect("PTTL");
    assert!((1..=60_000).contains(&ttl), "{ttl}");
    let state_a = get_raw(&mut con, keys[0]).expect("GET");
    for _ in 0..3 {
        let again = MultiReply::parse(&call(&mut con, &multi, &keys, &args)).expect("a reply");
        assert!(again.replayed);
        assert_eq!((&again.status, &again.rows), (&first.status, &first.rows));
    }
    assert_eq!(
        get_raw(&mut con, keys[0]).expect("GET"),
        state_a,
        "nothing charged"
    );
    // Without the id the same limits are evaluated (and charged) again.
    let plain = multi_arguments(&[(&a, 1), (&b, 1)], 0);
    let fresh = MultiReply::parse(&call(&mut con, &multi, &keys[..2], &plain)).expect("a reply");
    assert!(!fresh.replayed);
    assert_eq!(fresh.rows[0].remaining, 1);
}
