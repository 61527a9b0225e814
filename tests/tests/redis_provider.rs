//! The Redis provider against real servers: script cache recovery, key privacy and rolling,
//! exactness across instances under contention, and honest outcomes under faults (server
//! killed, frozen with SIGSTOP, restarted; admission bound; caller deadline).
//!
//! Tests that kill, pause or inspect a server start their own, so they run in parallel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::redis_server::RedisServer;
use adapter_redis::programs;
use adapter_redis::{RedisProvider, RedisSettings};
use shared_contract::{
    AlgorithmKind, AlgorithmSpec, Cost, Deadline, EdgeRateLimitPort, FailurePolicy,
    IncompatibleCategory, PolicyId, PolicyRevision, PolicySet, PolicySpec, RateLimitOutcome,
    RateLimitPolicy, RateLimitRequest, Readiness, SubjectDigest, UnavailableCategory,
};

const DAY: Duration = Duration::from_secs(86_400);

/// A policy of `kind` admitting `limit` at once and recovering over a day, so nothing refills
/// or rolls over while a test runs.
fn policy(id: &str, kind: AlgorithmKind, revision: u32, limit: u64) -> RateLimitPolicy {
    let algorithm = match kind {
        AlgorithmKind::FixedWindow => AlgorithmSpec::FixedWindow { limit, window: DAY },
        AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow { limit, window: DAY },
        AlgorithmKind::TokenBucket => AlgorithmSpec::TokenBucket {
            capacity: limit,
            refill_amount: limit,
            refill_interval: DAY,
        },
        AlgorithmKind::Gcra => AlgorithmSpec::Gcra {
            limit,
            period: DAY,
            burst: limit,
        },
        AlgorithmKind::SlidingLog => AlgorithmSpec::SlidingLog { limit, window: DAY },
        other => panic!("unknown algorithm {other}"),
    };
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("a valid policy id"),
        revision: PolicyRevision::new(revision).expect("a valid revision"),
        algorithm,
        max_cost: 1,
        cleanup_grace: Duration::from_secs(60),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("a valid policy")
}

fn set(policies: Vec<RateLimitPolicy>) -> PolicySet {
    let default = policies[0].id().clone();
    PolicySet::new(policies, default).expect("a valid policy set")
}

fn subject(tag: u8) -> SubjectDigest {
    SubjectDigest::from_bytes([tag; 32])
}

fn request(policy: &RateLimitPolicy, subject: SubjectDigest) -> RateLimitRequest {
    RateLimitRequest {
        policy_id: policy.id().clone(),
        subject,
        cost: Cost::ONE,
        evaluation_id: None,
        deadline: Deadline::within(Duration::from_secs(10)).expect("a valid deadline"),
    }
}

fn settings(server: &RedisServer) -> RedisSettings {
    let mut s = RedisSettings::new(server.url());
    s.command_timeout = Duration::from_secs(2);
    s
}

async fn connect(s: RedisSettings, policies: PolicySet) -> RedisProvider {
    RedisProvider::connect(s, policies)
        .await
        .expect("valid settings")
}

async fn outcome(
    p: &RedisProvider,
    policy: &RateLimitPolicy,
    s: SubjectDigest,
) -> RateLimitOutcome {
    p.evaluate(request(policy, s))
        .await
        .expect("an acceptable request")
}

async fn allowed(p: &RedisProvider, policy: &RateLimitPolicy, s: SubjectDigest) -> bool {
    match outcome(p, policy, s).await {
        RateLimitOutcome::Evaluated(d) => d.allowed,
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn query<T: redis::FromRedisValue>(server: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut server.connection())
        .expect("a Redis command")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_recovers() {
    let server = RedisServer::start();
    let p = policy("flush", AlgorithmKind::TokenBucket, 1, 10);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    let s = subject(1);
    assert!(allowed(&provider, &p, s).await);
    let sha = programs::program(AlgorithmKind::TokenBucket)
        .script
        .sha1()
        .to_owned();
    let _: () = query(&server, redis::cmd("SCRIPT").arg("FLUSH"));
    let exists: Vec<i64> = query(&server, redis::cmd("SCRIPT").arg("EXISTS").arg(&sha));
    assert_eq!(exists, vec![0], "the flush must have removed the program");
    // The next evaluation meets NOSCRIPT, sends the exact source, and keeps the state.
    match outcome(&provider, &p, s).await {
        RateLimitOutcome::Evaluated(d) => assert!(d.allowed && d.remaining == 8, "{d:?}"),
        other => panic!("expected a decision after NOSCRIPT, got {other:?}"),
    }
    let exists: Vec<i64> = query(&server, redis::cmd("SCRIPT").arg("EXISTS").arg(&sha));
    assert_eq!(exists, vec![1], "EVAL must have cached the program again");
    assert!(allowed(&provider, &p, s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_policy_revision_rolls_to_a_fresh_key() {
    let server = RedisServer::start();
    let v1 = policy("rolling", AlgorithmKind::FixedWindow, 1, 2);
    let v2 = policy("rolling", AlgorithmKind::FixedWindow, 2, 2);
    let old = connect(settings(&server), set(vec![v1.clone()])).await;
    let new = connect(settings(&server), set(vec![v2.clone()])).await;
    let s = subject(2);
    assert!(allowed(&old, &v1, s).await && allowed(&old, &v1, s).await);
    assert!(!allowed(&old, &v1, s).await, "revision 1 is exhausted");
    assert!(
        allowed(&new, &v2, s).await,
        "revision 2 starts from empty state"
    );
    let k1 = old.state_key(v1.id(), &s).expect("a key");
    let k2 = new.state_key(v2.id(), &s).expect("a key");
    assert_ne!(k1, k2);
    let n: i64 = query(&server, redis::cmd("EXISTS").arg(&k1).arg(&k2));
    assert_eq!(n, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_contain_no_raw_subject_and_always_expire() {
    let server = RedisServer::start();
    let raw = *b"user-42@example.com|10.1.2.3|k3y";
    let policies: Vec<_> = AlgorithmKind::ALL
        .iter()
        .map(|&k| {
            policy(
                &format!("private-{}", k.as_str().replace('_', "-")),
                k,
                1,
                5,
            )
        })
        .collect();
    let provider = connect(settings(&server), set(policies.clone())).await;
    for p in &policies {
        for s in [SubjectDigest::from_bytes(raw), subject(3)] {
            assert!(allowed(&provider, p, s).await, "{}", p.id());
        }
    }
    // Each program stores the Redis type its manifest declares.
    for p in &policies {
        let key = provider.state_key(p.id(), &subject(3)).expect("a key");
        let t: String = query(&server, redis::cmd("TYPE").arg(&key));
        assert_eq!(
            t,
            programs::program(p.kind()).key_type.as_str(),
            "{}",
            p.id()
        );
    }
    let keys: Vec<Vec<u8>> = query(&server, redis::cmd("KEYS").arg("*"));
    assert_eq!(
        keys.len(),
        2 * policies.len(),
        "one key per (policy, subject)"
    );
    for key in &keys {
        let text = String::from_utf8_lossy(key);
        assert!(text.starts_with("rl:{") && key.len() == 25, "{text}");
        for w in raw.windows(4) {
            assert!(
                !key.windows(4).any(|k| k == w),
                "{text} holds subject bytes"
            );
        }
        for p in &policies {
            assert!(!text.contains(p.id().as_str()), "{text} names a policy");
        }
        let ttl: i64 = query(&server, redis::cmd("PTTL").arg(key.as_slice()));
        assert!(ttl > 0, "{text} has no finite TTL ({ttl})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_contention_admit_exactly_the_limit() {
    let server = RedisServer::start();
    for kind in AlgorithmKind::ALL {
        let limit = 100;
        let p = policy(
            &format!("contended-{}", kind.as_str().replace('_', "-")),
            kind,
            1,
            limit,
        );
        // Two independent providers: two connections, as two service instances.
        let a = Arc::new(connect(settings(&server), set(vec![p.clone()])).await);
        let b = Arc::new(connect(settings(&server), set(vec![p.clone()])).await);
        let s = subject(4);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let port = if i % 2 == 0 { a.clone() } else { b.clone() };
                let p = p.clone();
                tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..5 {
                        if allowed(&port, &p, s).await {
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.expect("a task");
        }
        assert_eq!(
            admitted, limit,
            "{kind}: 1000 requests from 200 tasks on two instances"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_redis_type_is_incompatible_state() {
    let server = RedisServer::start();
    let p = policy("wrongtype", AlgorithmKind::Gcra, 1, 5);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    let s = subject(5);
    let key = provider.state_key(p.id(), &s).expect("a key");
    let _: i64 = query(&server, redis::cmd("LPUSH").arg(&key).arg("x"));
    assert_eq!(
        outcome(&provider, &p, s).await,
        RateLimitOutcome::Incompatible {
            policy_id: p.id().clone(),
            category: IncompatibleCategory::State,
        }
    );
    let len: i64 = query(&server, redis::cmd("LLEN").arg(&key));
    assert_eq!(len, 1, "incompatible state is left as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_before_a_request_is_unavailable_connect() {
    let mut server = RedisServer::start();
    let p = policy("killed", AlgorithmKind::FixedWindow, 1, 5);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    assert!(allowed(&provider, &p, subject(6)).await);
    assert_eq!(provider.readiness().await, Readiness::Ready);
    server.stop();
    // The connection's end is noticed as soon as the socket closes; give the driver a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    match outcome(&provider, &p, subject(6)).await {
        RateLimitOutcome::Unavailable {
            category,
            retry_after_ms,
            ..
        } => {
            assert_eq!(category, UnavailableCategory::Connect);
            assert!(retry_after_ms > 0);
        }
        other => panic!("expected Unavailable(connect), got {other:?}"),
    }
    assert!(matches!(provider.readiness().await, Readiness::NotReady(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_started_before_its_server_connects_when_it_comes_up() {
    let mut server = RedisServer::start();
    server.stop();
    let p = policy("late", AlgorithmKind::TokenBucket, 1, 5);
    let mut s = settings(&server);
    s.connect_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let provider = connect(s, set(vec![p.clone()])).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connect must not wait for the server"
    );
    assert!(matches!(
        outcome(&provider, &p, subject(7)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));
    match provider.readiness().await {
        Readiness::NotReady(why) => assert!(why.contains("redis"), "{why}"),
        Readiness::Ready => panic!("ready without a server"),
    }
    server.restart();
    let up = Instant::now();
    while !matches!(
        outcome(&provider, &p, subject(7)).await,
        RateLimitOutcome::Evaluated(_)
    ) {
        assert!(
            up.elapsed() < Duration::from_secs(1),
            "no decision 1 s after the server came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_frozen_during_a_request_is_indeterminate_within_the_command_timeout() {
    let server = RedisServer::start();
    let p = policy("frozen", AlgorithmKind::SlidingWindow, 1, 5);
    let mut s = settings(&server);
    let timeout = Duration::from_millis(200);
    s.command_timeout = timeout;
    let provider = connect(s, set(vec![p.clone()])).await;
    assert!(allowed(&provider, &p, subject(8)).await);
    server.pause();
    let started = Instant::now();
    let got = outcome(&provider, &p, subject(8)).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(got, RateLimitOutcome::Indeterminate { retry_after_ms, .. } if retry_after_ms > 0),
        "expected Indeterminate, got {got:?}"
    );
    assert!(took >= timeout, "answered before the timeout: {took:?}");
    assert!(took < timeout + Duration::from_millis(150), "took {took:?}");
    // Thawed, the same connection serves again (the late reply was discarded).
    let again = Instant::now();
    while !matches!(
        outcome(&provider, &p, subject(8)).await,
        RateLimitOutcome::Evaluated(_)
    ) {
        assert!(again.elapsed() < Duration::from_secs(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_stuck_for_three_timeouts_is_replaced_and_then_unavailable() {
    let server = RedisServer::start();
    let p = policy("stuck", AlgorithmKind::FixedWindow, 1, 50);
    let mut s = settings(&server);
    s.command_timeout = Duration::from_millis(100);
    s.connect_timeout = Duration::from_millis(300);
    let provider = connect(s, set(vec![p.clone()])).await;
    assert!(allowed(&provider, &p, subject(13)).await);
    server.pause();
    for i in 0..3 {
        let got = outcome(&provider, &p, subject(13)).await;
        assert!(
            matches!(got, RateLimitOutcome::Indeterminate { .. }),
            "timeout {i}: {got:?}"
        );
    }
    // Presumed stuck: nothing more is sent on it, and a new connection cannot complete its
    // handshake with a frozen server, so the honest answer is now "not connected".
    let started = Instant::now();
    let got = outcome(&provider, &p, subject(13)).await;
    assert!(
        matches!(
            got,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::Connect,
                ..
            }
        ),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(50));
    server.resume();
    let thawed = Instant::now();
    while !matches!(
        outcome(&provider, &p, subject(13)).await,
        RateLimitOutcome::Evaluated(_)
    ) {
        assert!(
            thawed.elapsed() < Duration::from_secs(2),
            "no decision 2 s after the thaw"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restarted_evaluations_succeed_again_within_a_second() {
    let mut server = RedisServer::start();
    let p = policy("restarted", AlgorithmKind::Gcra, 1, 50);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    assert!(allowed(&provider, &p, subject(9)).await);
    server.restart();
    let up = Instant::now();
    loop {
        match outcome(&provider, &p, subject(9)).await {
            RateLimitOutcome::Evaluated(d) => {
                // The restarted server is empty: a fresh bucket.
                assert!(d.allowed && d.remaining == 49, "{d:?}");
                break;
            }
            RateLimitOutcome::Unavailable { .. } | RateLimitOutcome::Indeterminate { .. } => {}
            other => panic!("unexpected outcome while reconnecting: {other:?}"),
        }
        assert!(
            up.elapsed() < Duration::from_secs(1),
            "still failing 1 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(provider.readiness().await, Readiness::Ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_bound_reached_is_unavailable_admission_and_sends_nothing() {
    let server = RedisServer::start();
    let p = policy("admission", AlgorithmKind::FixedWindow, 1, 5);
    let mut s = settings(&server);
    s.max_in_flight = 1;
    let provider = Arc::new(connect(s, set(vec![p.clone()])).await);
    assert!(allowed(&provider, &p, subject(10)).await);
    server.pause();
    let first = tokio::spawn({
        let (provider, p) = (provider.clone(), p.clone());
        async move { outcome(&provider, &p, subject(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let second = outcome(&provider, &p, subject(11)).await;
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "admission must not wait"
    );
    server.resume();
    assert!(
        matches!(
            second,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::Admission,
                ..
            }
        ),
        "{second:?}"
    );
    assert!(matches!(
        first.await.expect("a task"),
        RateLimitOutcome::Evaluated(_)
    ));
    let key = provider.state_key(p.id(), &subject(11)).expect("a key");
    let n: i64 = query(&server, redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "the refused request reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_command_timeout_is_unavailable_deadline() {
    let server = RedisServer::start();
    let p = policy("deadline", AlgorithmKind::TokenBucket, 1, 5);
    let mut s = settings(&server);
    s.command_timeout = Duration::from_millis(100);
    let provider = connect(s, set(vec![p.clone()])).await;
    let mut r = request(&p, subject(12));
    r.deadline = Deadline::within(Duration::from_millis(20)).expect("a valid deadline");
    assert!(matches!(
        provider.evaluate(r).await,
        Ok(RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Deadline,
            ..
        })
    ));
    let key = provider.state_key(p.id(), &subject(12)).expect("a key");
    let n: i64 = query(&server, redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "nothing may be sent");
}

#[tokio::test]
async fn bad_settings_are_refused_by_name() {
    let p = policy("settings", AlgorithmKind::FixedWindow, 1, 5);
    let cases: Vec<(RedisSettings, &str)> = vec![
        (RedisSettings::new("http://x"), "url"),
        (RedisSettings::new("redis://[::1"), "url"),
        (
            RedisSettings {
                max_in_flight: 0,
                ..RedisSettings::new("redis://127.0.0.1:1/0")
            },
            "max_in_flight",
        ),
        (
            RedisSettings {
                command_timeout: Duration::ZERO,
                ..RedisSettings::new("redis://127.0.0.1:1/0")
            },
            "command_timeout",
        ),
        (
            RedisSettings {
                key_prefix: "a{b}".to_owned(),
                ..RedisSettings::new("redis://127.0.0.1:1/0")
            },
            "key_prefix",
        ),
    ];
    for (s, field) in cases {
        let err = RedisProvider::connect(s, set(vec![p.clone()]))
            .await
            .expect_err(field);
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_with_noeviction_is_unavailable_server_and_writes_nothing() {
    let server = RedisServer::start();
    let p = policy("oom", AlgorithmKind::TokenBucket, 1, 5);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    let mut c = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut c)
        .expect("CONFIG SET");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut c)
        .expect("CONFIG SET");
    assert!(matches!(
        outcome(&provider, &p, subject(14)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Server,
            ..
        }
    ));
    let key = provider.state_key(p.id(), &subject(14)).expect("a key");
    let n: i64 = query(&server, redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "the refused write must not exist");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut c)
        .expect("CONFIG SET");
    assert!(allowed(&provider, &p, subject(14)).await);
}

/// `ACL SETUSER name on >pw <rules...>` on `server`.
fn acl_user(server: &RedisServer, name: &str, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name).arg("on").arg(">s3cret-pw");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = query(server, &mut cmd);
}

fn url_as(server: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/0", server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_evaluates_and_missing_rights_are_incompatible_program() {
    let server = RedisServer::start();
    let p = policy("acl", AlgorithmKind::FixedWindow, 1, 5);
    // Exactly what the provider and the programs use: no INFO, no CLIENT, no other keys.
    let needed = [
        "~rl:*",
        "+evalsha",
        "+eval",
        "+script|load",
        "+ping",
        "+time",
        "+get",
        "+set",
    ];
    acl_user(&server, "limiter", &needed);
    acl_user(&server, "notime", &needed[..needed.len() - 3]);
    acl_user(
        &server,
        "otherkeys",
        &[
            "~app:*",
            "+evalsha",
            "+eval",
            "+script|load",
            "+ping",
            "+time",
            "+get",
            "+set",
        ],
    );
    let as_user = |user: &str, pw: &str| RedisSettings {
        url: url_as(&server, user, pw),
        ..settings(&server)
    };

    let limiter = connect(as_user("limiter", "s3cret-pw"), set(vec![p.clone()])).await;
    assert!(
        allowed(&limiter, &p, subject(15)).await,
        "least privilege suffices"
    );
    assert_eq!(limiter.readiness().await, Readiness::Ready);

    for user in ["notime", "otherkeys"] {
        let provider = connect(as_user(user, "s3cret-pw"), set(vec![p.clone()])).await;
        assert_eq!(
            outcome(&provider, &p, subject(16)).await,
            RateLimitOutcome::Incompatible {
                policy_id: p.id().clone(),
                category: IncompatibleCategory::Program,
            },
            "{user}"
        );
    }

    let mut wrong = as_user("limiter", "wrong-password");
    wrong.connect_timeout = Duration::from_millis(300);
    let provider = connect(wrong, set(vec![p.clone()])).await;
    assert!(matches!(
        outcome(&provider, &p, subject(17)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));
    match provider.readiness().await {
        Readiness::NotReady(why) => assert!(!why.contains("wrong-password"), "{why}"),
        Readiness::Ready => panic!("ready with a wrong password"),
    }
}

/// Plants GCRA state at `key` (of a `policy(_, Gcra, 1, 5)`: 2 of 5 burst units in debt) whose
/// last observed time is `ahead_ms` past the server's clock, and returns the stored bytes.
fn plant_future_state(server: &RedisServer, key: &str, ahead_ms: u64) -> Vec<u8> {
    use shared_contract::model::{AlgorithmState, GcraState};
    let mut c = server.connection();
    let now = acceptance_tests::lua::server_time_ms(&mut c).expect("TIME");
    // 5 per day: interval_units = 86_400_000 / gcd(5, 86_400_000) = 17_280_000.
    let state = AlgorithmState::Gcra(GcraState {
        last_ms: now + ahead_ms,
        debt: 2 * 17_280_000,
    });
    let bytes = acceptance_tests::lua::encode_state(1, &state).expect("encodable state");
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(bytes.as_slice())
        .query(&mut c)
        .expect("SET");
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_regression_beyond_the_threshold_is_unavailable_clock_and_leaves_state_unchanged() {
    let server = RedisServer::start();
    // max_clock_regression is 2 s; the stored state is 60 s ahead of the server clock.
    let p = policy("clock", AlgorithmKind::Gcra, 1, 5);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    let key = provider.state_key(p.id(), &subject(18)).expect("a key");
    let planted = plant_future_state(&server, &key, 60_000);
    match outcome(&provider, &p, subject(18)).await {
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Clock,
            retry_after_ms,
            ..
        } => assert!(
            (55_000..=60_000).contains(&retry_after_ms),
            "{retry_after_ms}"
        ),
        other => panic!("expected Unavailable(clock), got {other:?}"),
    }
    let stored: Vec<u8> = query(&server, redis::cmd("GET").arg(&key));
    assert_eq!(stored, planted, "state must be byte-for-byte unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_clock_regression_is_clamped_and_decided() {
    let server = RedisServer::start();
    let p = policy("clamp", AlgorithmKind::Gcra, 1, 5);
    let provider = connect(settings(&server), set(vec![p.clone()])).await;
    let key = provider.state_key(p.id(), &subject(19)).expect("a key");
    let _ = plant_future_state(&server, &key, 500);
    match outcome(&provider, &p, subject(19)).await {
        // 2 units of debt, nothing repaid at the clamped time: this one leaves 2 of 5.
        RateLimitOutcome::Evaluated(d) => assert!(d.allowed && d.remaining == 2, "{d:?}"),
        other => panic!("expected a decision at the clamped time, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_ack_reports_unacknowledged_allows_as_indeterminate_and_keeps_denials() {
    let master = RedisServer::start();
    let p = policy("acked", AlgorithmKind::FixedWindow, 1, 2);
    let mut s = settings(&master);
    s.command_timeout = Duration::from_millis(200);
    s.min_replicas_ack = 1;
    // No replica yet: an allow cannot be acknowledged, so it is not reported as one (it did
    // consume quota on the master); the denial that follows consumed nothing and stands.
    let provider = connect(s.clone(), set(vec![p.clone()])).await;
    let outcomes = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(
                provider
                    .evaluate(request(&p, subject(91)))
                    .await
                    .expect("valid"),
            );
        }
        v
    };
    assert!(
        matches!(outcomes[0], RateLimitOutcome::Indeterminate { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], RateLimitOutcome::Indeterminate { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[2], RateLimitOutcome::Evaluated(d) if !d.allowed),
        "{outcomes:?}"
    );
    // With a replica, allows are acknowledged and reported, under load from many tasks
    // sharing one connection (one WAIT covers each group of calls).
    let _replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    // Linked is not enough: after a diskless sync the master streams to the replica only
    // after its first acknowledgement (probe::replicas_streaming).
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(why) =
        acceptance_tests::probe::replicas_streaming(master.url(), "harness:replication-probe", 1)
    {
        assert!(Instant::now() < deadline, "replica never streaming: {why}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let wide = policy("acked-wide", AlgorithmKind::FixedWindow, 1, 100);
    let provider = Arc::new(connect(s, set(vec![wide.clone()])).await);
    let tasks: Vec<_> = (0..50u8)
        .map(|i| {
            let (provider, wide) = (provider.clone(), wide.clone());
            tokio::spawn(async move {
                provider
                    .evaluate(request(&wide, subject(100 + i % 5)))
                    .await
                    .expect("valid")
            })
        })
        .collect();
    for t in tasks {
        let outcome = t.await.expect("task");
        assert!(
            matches!(&outcome, RateLimitOutcome::Evaluated(d) if d.allowed),
            "{outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reply_within_the_command_timeout_is_a_decision() {
    // The driver has a response timeout of its own (500 ms by default); only the provider's
    // command_timeout may decide when a reply is too late.
    let mut server = RedisServer::start();
    let p = policy("slow", AlgorithmKind::TokenBucket, 1, 5);
    let mut s = settings(&server);
    s.command_timeout = Duration::from_secs(3);
    let provider = connect(s, set(vec![p.clone()])).await;
    assert_eq!(provider.readiness().await, Readiness::Ready);
    server.pause();
    let started = Instant::now();
    let pending = tokio::spawn({
        let p = p.clone();
        async move { provider.evaluate(request(&p, subject(77))).await }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    server.resume();
    let outcome = pending.await.expect("task").expect("valid request");
    assert!(
        matches!(&outcome, RateLimitOutcome::Evaluated(d) if d.allowed),
        "{outcome:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_millis(850));
    server.stop();
}
