//! The fleet-bounded fallback, end to end: three instances of the binary on one Redis, one
//! subject, a limit of L under steady load on all three; Redis killed (SIGKILL) and restarted.
//! While it is down the three together admit at most L (each its share, `L / 3`), where each
//! admitting the whole limit would admit 3L; the decisions say `local_fallback` with their
//! `fleet_share` and `fleet_size`. Each starts from what Redis last answered it: a fleet that
//! saw the limit spent admits nothing more, one that saw part of it left admits at most that
//! part. The heartbeat: a killed instance leaves the count within its ttl, and an instance
//! started during the outage uses `size_when_unknown`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use common::{App, evaluate};

/// The limit: a share of 10 for each of three instances.
const L: u64 = 30;
const BODY: &str = r#"{"subject":"user-42"}"#;

fn config(url: &str, policy: &str, size_when_unknown: u64) -> String {
    let rate_limit = common::redis_rate_limit(url, "fallback_local", "");
    format!(
        r#"{rate_limit}
[rate_limit.fleet]
name = "web"
heartbeat = "100ms"
ttl = "300ms"
size_when_unknown = {size_when_unknown}

[rate_limit.policies.api]
{policy}
# Denials from Redis would be answered from the denial cache, also during the outage.
deny_cache = false
"#
    )
}

/// `rate_limit_fleet_size` of `app` reaches `size` within `within`.
async fn fleet_size_becomes(c: &reqwest::Client, app: &App, size: u64, within: Duration) {
    eventually(
        &format!("rate_limit_fleet_size {size}"),
        within,
        Duration::from_millis(50),
        async || {
            let metrics = common::metrics(c, app).await;
            match common::sample(&metrics, "rate_limit_fleet_size") as u64 {
                n if n == size => Ok(()),
                n => Err(format!("size {n}")),
            }
        },
    )
    .await;
}

/// What one instance answered under load: allows per source, and the fallback's decisions.
#[derive(Debug, Default)]
struct Tally {
    global_allowed: u64,
    fallback_allowed: u64,
    fallback_decisions: u64,
    /// Any answer that was not a decision (the fallback must always decide).
    other: Vec<String>,
}

/// Sends `/v1/evaluate` to `app` one request after another until `stop`.
async fn load(app_url: String, stop: Arc<AtomicBool>) -> Tally {
    let c = reqwest::Client::new();
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let r = c
            .post(&app_url)
            .header("content-type", "application/json")
            .body(BODY)
            .send()
            .await
            .expect("POST /v1/evaluate");
        let status = r.status().as_u16();
        let v: serde_json::Value = r.json().await.expect("JSON");
        let allowed = v["allowed"] == true;
        match v["source"].as_str() {
            Some("global_redis") => tally.global_allowed += u64::from(allowed),
            Some("local_fallback") => {
                tally.fallback_decisions += 1;
                tally.fallback_allowed += u64::from(allowed);
                assert_eq!(v["fleet_size"], 3, "{v}");
                assert_eq!(v["fleet_share"], L / 3, "{v}");
                assert_eq!(v["limit"], L / 3, "{v}");
            }
            _ => tally.other.push(format!("{status} {v}")),
        }
    }
    tally
}

async fn outage_admits_at_most_the_limit(policy: &str) {
    let mut server = RedisServer::start();
    let config = config(server.url(), policy, 1);
    let apps: Vec<App> = (0..3).map(|_| App::start(&config, &[])).collect();
    let c = reqwest::Client::new();
    for app in &apps {
        fleet_size_becomes(&c, app, 3, Duration::from_secs(5)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = apps
        .iter()
        .map(|a| tokio::spawn(load(a.url("/v1/evaluate"), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart();
    for app in &apps {
        eventually(
            "a global_redis decision after Redis returned",
            Duration::from_secs(5),
            Duration::from_millis(20),
            async || match evaluate(&c, app, BODY).await {
                (_, _, v) if v["source"] == "global_redis" => Ok(()),
                (status, _, v) => Err(format!("{status} {v}")),
            },
        )
        .await;
    }
    eprintln!("Redis down for {:?}", down.elapsed());
    stop.store(true, Ordering::Relaxed);
    let (mut fallback_allowed, mut global_allowed) = (0, 0);
    for t in tasks {
        let tally = t.await.expect("load task");
        eprintln!("{tally:?}");
        assert!(tally.other.is_empty(), "not decisions: {:?}", tally.other);
        assert!(
            tally.fallback_decisions > 0,
            "the fallback decided: {tally:?}"
        );
        global_allowed += tally.global_allowed;
        fallback_allowed += tally.fallback_allowed;
    }
    // Redis admits L before the kill and, restarted empty, L again (any instance may take
    // most of either).
    assert!(global_allowed <= 2 * L, "{global_allowed}");
    // Each instance admits its share (10 of 30) at most: 3L without the fleet share. (Less
    // when Redis had admitted part of the limit: each starts from what Redis last left it,
    // which under this load is often nothing; `a_fleet_admits_what_redis_last_left` below
    // shows the start.)
    assert!(
        fallback_allowed <= L,
        "the fleet admitted {fallback_allowed} while Redis was down, beyond L = {L}"
    );
}

#[tokio::test]
async fn a_fixed_window_fleet_admits_at_most_the_limit_while_redis_is_down() {
    outage_admits_at_most_the_limit(&format!(
        "algorithm = \"fixed_window\"\nlimit = {L}\nwindow = \"1h\""
    ))
    .await;
}

#[tokio::test]
async fn a_token_bucket_fleet_admits_at_most_the_limit_while_redis_is_down() {
    outage_admits_at_most_the_limit(&format!(
        "algorithm = \"token_bucket\"\ncapacity = {L}\nrefill_amount = 1\nrefill_interval = \"1h\""
    ))
    .await;
}

#[tokio::test]
async fn the_count_follows_instances_that_stop_and_start() {
    let mut server = RedisServer::start();
    let policy = format!("algorithm = \"fixed_window\"\nlimit = {L}\nwindow = \"1h\"");
    let config = config(server.url(), &policy, 5);
    let a = App::start(&config, &[]);
    let mut b = App::start(&config, &[]);
    let c = reqwest::Client::new();
    fleet_size_becomes(&c, &a, 2, Duration::from_secs(5)).await;
    // Killed: no goodbye, its announcement just stops being renewed.
    b.kill();
    let killed = Instant::now();
    fleet_size_becomes(&c, &a, 1, Duration::from_secs(3)).await;
    eprintln!(
        "the count dropped {:?} after the kill (ttl 300 ms)",
        killed.elapsed()
    );
    // The fallback divides by the largest count of the last ttl: 1 once the 2 is older.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Started during an outage: no count yet, so `size_when_unknown` (5) divides the limit.
    server.stop();
    let late = App::start(&config, &[]);
    let (status, _, v) = evaluate(&c, &late, BODY).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["source"], "local_fallback", "{v}");
    assert_eq!(
        (v["fleet_size"].clone(), v["fleet_share"].clone()),
        (5.into(), 6.into())
    );
    // The instance that counted keeps its last count (1: alone) through the outage.
    let (_, _, v) = evaluate(&c, &a, BODY).await;
    assert_eq!(
        (v["fleet_size"].clone(), v["fleet_share"].clone()),
        (1.into(), L.into())
    );
    let metrics = common::metrics(&c, &late).await;
    assert_eq!(
        common::sample(&metrics, "rate_limit_fallback_share{policy=\"api\"}"),
        6.0,
        "{metrics}"
    );
}

/// What the docs state for the window that spans an outage. Redis admits `before` of the
/// limit, the three instances taking turns; then it is frozen (SIGSTOP, so it keeps what it
/// admitted) and the three decide under load with the fallback, each starting from what Redis
/// last answered it (`remaining / 3` of that); then Redis resumes. Returns what Redis admitted
/// before, what the fallback admitted, and what Redis admitted after it resumed (it never
/// learns of the fallback's admissions).
async fn a_window_spanning_an_outage(algorithm: &str, before: u64) -> (u64, u64, u64) {
    let server = RedisServer::start();
    let policy = format!("algorithm = \"{algorithm}\"\nlimit = {L}\nwindow = \"1h\"");
    let config = config(server.url(), &policy, 1);
    let apps: Vec<App> = (0..3).map(|_| App::start(&config, &[])).collect();
    let c = reqwest::Client::new();
    for app in &apps {
        fleet_size_becomes(&c, app, 3, Duration::from_secs(5)).await;
    }
    let mut global_before = 0;
    for i in 0..before {
        let (_, _, v) = evaluate(&c, &apps[i as usize % 3], BODY).await;
        assert_eq!(v["source"], "global_redis", "{v}");
        global_before += u64::from(v["allowed"] == true);
    }

    server.pause();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = apps
        .iter()
        .map(|a| tokio::spawn(load(a.url("/v1/evaluate"), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.resume();
    for app in &apps {
        eventually(
            "a global_redis decision after Redis resumed",
            Duration::from_secs(5),
            Duration::from_millis(20),
            async || match evaluate(&c, app, BODY).await {
                (_, _, v) if v["source"] == "global_redis" => Ok(()),
                (status, _, v) => Err(format!("{status} {v}")),
            },
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut after, mut fallback) = (0, 0);
    for t in tasks {
        let tally = t.await.expect("load task");
        eprintln!("{tally:?}");
        assert!(tally.other.is_empty(), "not decisions: {:?}", tally.other);
        assert!(tally.fallback_decisions > 0, "{tally:?}");
        after += tally.global_allowed;
        fallback += tally.fallback_allowed;
    }
    eprintln!(
        "the window admitted {global_before} in Redis before, {fallback} in the fallback, \
         {after} in Redis after (L = {L})"
    );
    (global_before, fallback, after)
}

/// Redis admitted the whole limit before the outage, and every instance saw it spent: the
/// fallback admits nothing more (the plain shares would admit L again).
#[tokio::test]
async fn a_fleet_that_saw_the_limit_spent_admits_nothing_while_redis_is_down() {
    let (before, fallback, after) = a_window_spanning_an_outage("fixed_window", L + 10).await;
    assert_eq!(before, L);
    assert_eq!((fallback, after), (0, 0), "the window admitted exactly L");
}

/// Redis admitted half the limit before the outage: the instances last saw 17, 16 and 15
/// left, and admit 5 each (`remaining / 3`), so the window's total before and during the
/// outage is at most L. Redis, which never learns of those 15, admits its remaining 15 after
/// it resumes: the whole window at most 2L, as documented.
#[tokio::test]
async fn a_fleet_admits_what_redis_last_left_while_it_is_down() {
    // The sliding log too: its start is an entry of what fits, not a charge past the limit.
    for algorithm in ["fixed_window", "sliding_log"] {
        let (before, fallback, after) = a_window_spanning_an_outage(algorithm, L / 2).await;
        assert_eq!(before, L / 2, "{algorithm}");
        assert_eq!(fallback, 15, "{algorithm}: 17 / 3 + 16 / 3 + 15 / 3");
        assert!(before + fallback <= L);
        assert!(after <= L - before, "{algorithm}: {after}");
        assert!(before + fallback + after <= 2 * L);
    }
}
