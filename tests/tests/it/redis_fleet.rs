//! Fleet membership on a real server: providers of one fleet count each other, a dropped one
//! leaves the count within its TTL, another fleet counts apart, the count stays frozen while
//! Redis is down, no fleet settings means no heartbeat at all, bad fleet settings are refused
//! by name; and the heartbeat program's own replies (`FLEET`, expiry, `INVALID`,
//! `STATE_INCOMPATIBLE`), with `now` from its arguments.
//!
//! Every test starts its own server, so they run in parallel. Timings are short (a heartbeat
//! every 100 ms, counted for 300 ms), and every wait is bounded.

use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::lua::{Loaded, pttl, test_build};
use acceptance_tests::rate::policy_set;
use acceptance_tests::redis_provider::{connect, daily_policy, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::fleet::HEARTBEAT;
use adapter_redis::keys::fleet_key;
use adapter_redis::{FleetSettings, RedisProvider, RedisSettings};
use redis::Value;
use shared_contract::{AlgorithmKind, EdgeRateLimitPort};

const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);
const TTL: Duration = Duration::from_millis(300);
/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(10);
/// The longest wait for a count the fleet settle on: the design bound is a few heartbeats,
/// the rest is slack for a shared machine.
const SETTLE: Duration = Duration::from_secs(3);

fn fleet(name: &str) -> FleetSettings {
    FleetSettings {
        name: name.to_owned(),
        heartbeat: HEARTBEAT_EVERY,
        ttl: TTL,
    }
}

/// A provider of one daily policy on `server`, in fleet `name`.
async fn member(server: &RedisServer, name: &str) -> RedisProvider {
    let s = RedisSettings {
        fleet: Some(fleet(name)),
        ..settings(server)
    };
    connect(
        s,
        vec![daily_policy("fleet", AlgorithmKind::FixedWindow, 1, 5)],
    )
    .await
}

/// Waits until `provider`'s fleet size is `want`.
async fn size_becomes(what: &str, within: Duration, provider: &RedisProvider, want: u64) {
    let view = provider.fleet().expect("a fleet view");
    eventually(what, within, POLL, async || match view.size() {
        Some(n) if n == want => Ok(()),
        other => Err(other),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_of_one_fleet_count_each_other_and_another_fleet_counts_apart() {
    let server = RedisServer::start();
    let a = member(&server, "api").await;
    let b = member(&server, "api").await;
    size_becomes("a sees both", SETTLE, &a, 2).await;
    size_becomes("b sees both", SETTLE, &b, 2).await;
    let (va, vb) = (a.fleet().expect("a view"), b.fleet().expect("a view"));
    assert_eq!((va.name(), vb.name()), ("api", "api"));
    assert_ne!(va.instance_id(), vb.instance_id());
    for id in [va.instance_id(), vb.instance_id()] {
        assert_eq!(id.len(), 32);
        assert!(
            id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{id}"
        );
    }
    // The members are the instance ids, in the documented key.
    let key = fleet_key("rl", "api");
    let mut members: Vec<String> = query(&server, redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1));
    members.sort();
    let mut ids = vec![va.instance_id().to_owned(), vb.instance_id().to_owned()];
    ids.sort();
    assert_eq!(members, ids);
    let left: i64 = query(&server, redis::cmd("PTTL").arg(&key));
    assert!(left > 0 && left <= TTL.as_millis() as i64, "{left}");

    let other = member(&server, "batch").await;
    size_becomes("another fleet counts alone", SETTLE, &other, 1).await;
    // Several heartbeats later, the first fleet still counts two, the other one.
    tokio::time::sleep(3 * HEARTBEAT_EVERY).await;
    assert_eq!(va.size(), Some(2));
    assert_eq!(other.fleet().and_then(|v| v.size()), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_provider_leaves_the_count_within_its_ttl() {
    let server = RedisServer::start();
    let a = member(&server, "api").await;
    let b = member(&server, "api").await;
    size_becomes("both counted", SETTLE, &a, 2).await;
    // A reload's provider shares the heartbeat: dropping the original keeps it running.
    let reloaded = b
        .with_policies(b.policies().clone())
        .expect("the same policies");
    drop(b);
    tokio::time::sleep(TTL + 3 * HEARTBEAT_EVERY).await;
    assert_eq!(
        a.fleet().and_then(|v| v.size()),
        Some(2),
        "the reload still beats"
    );
    drop(reloaded);
    let dropped = Instant::now();
    // The last announcement expires within `TTL`, and the next heartbeat after that drops
    // it: ttl + 2 heartbeats by design, plus slack for a shared machine.
    size_becomes("the dropped provider leaves", SETTLE, &a, 1).await;
    let took = dropped.elapsed();
    assert!(took >= TTL / 2, "left too early ({took:?}): not by expiry");
    eprintln!("the count fell to 1 {took:?} after the drop (design bound ~500 ms)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_the_last_known_size_stays() {
    let mut server = RedisServer::start();
    let a = member(&server, "api").await;
    let b = member(&server, "api").await;
    size_becomes("both counted", SETTLE, &a, 2).await;
    size_becomes("both counted", SETTLE, &b, 2).await;
    server.stop();
    // Long past the TTL: every heartbeat now fails, and the count stays as last known.
    tokio::time::sleep(TTL * 4).await;
    assert_eq!(a.fleet().and_then(|v| v.size()), Some(2));
    assert_eq!(b.fleet().and_then(|v| v.size()), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fleet_settings_there_is_no_view_and_no_fleet_key() {
    let server = RedisServer::start();
    let p = connect(
        settings(&server),
        vec![daily_policy("plain", AlgorithmKind::FixedWindow, 1, 5)],
    )
    .await;
    assert!(p.fleet().is_none());
    assert_eq!(p.settings().fleet, None);
    tokio::time::sleep(3 * HEARTBEAT_EVERY).await;
    let keys: Vec<String> = query(&server, redis::cmd("KEYS").arg("*fleet*"));
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn bad_fleet_settings_are_refused_by_name() {
    let p = daily_policy("settings", AlgorithmKind::FixedWindow, 1, 5);
    let with = |f: FleetSettings| RedisSettings {
        fleet: Some(f),
        ..RedisSettings::new("redis://127.0.0.1:1/0")
    };
    let cases = [
        (
            with(FleetSettings {
                ttl: HEARTBEAT_EVERY,
                ..fleet("api")
            }),
            "fleet.ttl",
        ),
        (with(fleet("api gateway")), "fleet.name"),
        (with(fleet("{api}")), "fleet.name"),
        (
            with(FleetSettings {
                heartbeat: Duration::from_millis(10),
                ..fleet("api")
            }),
            "fleet.heartbeat",
        ),
    ];
    for (s, field) in cases {
        let err = RedisProvider::connect(s, policy_set(vec![p.clone()]))
            .await
            .expect_err(field);
        assert!(err.to_string().contains(field), "{err}");
    }
}

/// `{status, integers...}` of a program reply.
fn fields(v: &Value) -> (String, Vec<i64>) {
    let Value::Array(f) = v else {
        panic!("not an array: {v:?}")
    };
    let status = match &f[0] {
        Value::BulkString(s) => String::from_utf8(s.clone()).expect("utf-8"),
        other => panic!("status {other:?}"),
    };
    let n = f[1..]
        .iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            other => panic!("field {other:?}"),
        })
        .collect();
    (status, n)
}

#[test]
fn the_heartbeat_program_counts_live_members_and_refuses_what_it_cannot_use() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let build = test_build(HEARTBEAT.name, HEARTBEAT.source).expect("a @time-source block");
    let prog = Loaded::load(&mut con, &build).expect("compiles");
    let key = "rl:fleet:{lua}";
    let (a, b) = ("a".repeat(32), "b".repeat(32));
    let mut beat = |id: &str, ttl: &str, now: u64| -> (String, Vec<i64>) {
        let v: Value = prog
            .command(key, &[id, ttl, &now.to_string()])
            .query(&mut con)
            .expect("EVALSHA");
        fields(&v)
    };
    // `now` comes from the last argument: a expires at 11000, b at 15000.
    assert_eq!(beat(&a, "10000", 1000), ("FLEET".to_owned(), vec![1, 1000]));
    assert_eq!(beat(&b, "10000", 5000), ("FLEET".to_owned(), vec![2, 5000]));
    // At 11000 a's announcement has expired (expires_at <= now): b alone.
    assert_eq!(
        beat(&b, "10000", 11000),
        ("FLEET".to_owned(), vec![1, 11000])
    );
    let mut con = server.connection();
    let score: f64 = query(&server, redis::cmd("ZSCORE").arg(key).arg(&b));
    assert_eq!(score, 21000.0);
    let left = pttl(&mut con, key).expect("PTTL");
    assert!(left > 0 && left <= 10_000, "{left}");

    // Bad arguments: nothing written.
    let before: Vec<(String, f64)> = query(
        &server,
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    let mut beat = |id: &str, ttl: &str| -> String {
        let v: Value = prog
            .command(key, &[id, ttl, "12000"])
            .query(&mut con)
            .expect("EVALSHA");
        fields(&v).0
    };
    for (id, ttl) in [
        (a.to_uppercase().as_str(), "1000"),
        (&a[..31], "1000"),
        (a.as_str(), "0"),
        (a.as_str(), "86400001"),
        (a.as_str(), "1e3"),
        (a.as_str(), ""),
    ] {
        assert_eq!(beat(id, ttl), "INVALID", "{id} {ttl}");
    }
    let no_key: Value = prog
        .command_keys::<&str, &str>(&[], &[&a, "1000", "12000"])
        .query(&mut con)
        .expect("EVALSHA");
    assert_eq!(fields(&no_key).0, "INVALID");
    let two_keys: Value = prog
        .command_keys(&[key, "rl:fleet:{other}"], &[&a, "1000", "12000"])
        .query(&mut con)
        .expect("EVALSHA");
    assert_eq!(fields(&two_keys).0, "INVALID");
    let after: Vec<(String, f64)> = query(
        &server,
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(before, after);

    // A key of another type: STATE_INCOMPATIBLE, left as it was.
    let wrong = "rl:fleet:{wrong}";
    let _: () = query(&server, redis::cmd("SET").arg(wrong).arg("x"));
    let v: Value = prog
        .command(wrong, &[a.as_str(), "1000", "12000"])
        .query(&mut con)
        .expect("EVALSHA");
    assert_eq!(fields(&v), ("STATE_INCOMPATIBLE".to_owned(), vec![12000]));
    let kept: String = query(&server, redis::cmd("GET").arg(wrong));
    assert_eq!(kept, "x");
    assert_eq!(pttl(&mut con, wrong).expect("PTTL"), -1);
}

#[test]
fn the_production_heartbeat_reads_the_server_clock() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let prog = Loaded::load(&mut con, HEARTBEAT.source).expect("compiles");
    let before = acceptance_tests::lua::server_time_ms(&mut con).expect("TIME");
    let v: Value = prog
        .command("rl:fleet:{clock}", &["c".repeat(32).as_str(), "5000"])
        .query(&mut con)
        .expect("EVALSHA");
    let after = acceptance_tests::lua::server_time_ms(&mut con).expect("TIME");
    let (status, n) = fields(&v);
    assert_eq!((status.as_str(), n[0]), ("FLEET", 1));
    let now = n[1] as u64;
    assert!(
        before <= now && now <= after,
        "{before} <= {now} <= {after}"
    );
    let score: f64 = query(
        &server,
        redis::cmd("ZSCORE")
            .arg("rl:fleet:{clock}")
            .arg("c".repeat(32)),
    );
    assert_eq!(score as u64, now + 5000);
}
