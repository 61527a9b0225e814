//! The Redis provider against a real, healthy server: script cache recovery, key privacy and
//! rolling, exactness across instances under contention, state it cannot use (wrong type,
//! clock regression, and the clock metrics it moves), a server out of memory, settings
//! refused by name, and `min_replicas_ack`. Faults (a server killed, frozen, restarted, slow;
//! the admission bound; the caller's deadline) are in `redis_faults.rs`, ACL users in `redis_tls_acl.rs`.
//!
//! Every test starts its own server, so they run in parallel.

use std::sync::Arc;
use std::time::Duration;

use acceptance_tests::eventually::eventually_blocking;
use acceptance_tests::rate::{allowed, outcome, policy_set, request, subject};
use acceptance_tests::redis_provider::{OnePolicy, connect, daily_policy, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::programs;
use adapter_redis::{RedisProvider, RedisSettings};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use shared_contract::{
    AlgorithmKind, EdgeRateLimitPort, EvaluationId, IncompatibleCategory, RateLimitOutcome,
    SubjectDigest, UnavailableCategory,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_recovers() {
    let f = OnePolicy::start("flush", AlgorithmKind::TokenBucket, 10, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    let s = subject(1);
    assert!(allowed(provider, p, s).await);
    let sha = programs::program(AlgorithmKind::TokenBucket)
        .script
        .sha1()
        .to_owned();
    let _: () = f.query(redis::cmd("SCRIPT").arg("FLUSH"));
    let exists: Vec<i64> = f.query(redis::cmd("SCRIPT").arg("EXISTS").arg(&sha));
    assert_eq!(exists, vec![0], "the flush must have removed the program");
    // The next evaluation meets NOSCRIPT, sends the exact source, and keeps the state.
    match outcome(provider, p, s).await {
        RateLimitOutcome::Evaluated(d) => assert!(d.allowed && d.remaining == 8, "{d:?}"),
        other => panic!("expected a decision after NOSCRIPT, got {other:?}"),
    }
    let exists: Vec<i64> = f.query(redis::cmd("SCRIPT").arg("EXISTS").arg(&sha));
    assert_eq!(exists, vec![1], "EVAL must have cached the program again");
    assert!(allowed(provider, p, s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_policy_revision_rolls_to_a_fresh_key() {
    let server = RedisServer::start();
    let v1 = daily_policy("rolling", AlgorithmKind::FixedWindow, 1, 2);
    let v2 = daily_policy("rolling", AlgorithmKind::FixedWindow, 2, 2);
    let old = connect(settings(&server), vec![v1.clone()]).await;
    let new = connect(settings(&server), vec![v2.clone()]).await;
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
async fn a_reload_keeps_unchanged_policies_and_rolls_new_revisions_on_the_same_connections() {
    let server = RedisServer::start();
    let kept = daily_policy("kept", AlgorithmKind::FixedWindow, 1, 2);
    let v1 = daily_policy("bumped", AlgorithmKind::TokenBucket, 1, 2);
    let v2 = daily_policy("bumped", AlgorithmKind::TokenBucket, 2, 2);
    let added = daily_policy("added", AlgorithmKind::Gcra, 1, 2);
    let old = connect(settings(&server), vec![kept.clone(), v1.clone()]).await;
    let s = subject(7);
    assert!(allowed(&old, &kept, s).await);
    assert!(allowed(&old, &v1, s).await && allowed(&old, &v1, s).await);
    let clients = |server: &RedisServer| -> i64 {
        let list: String = query(server, redis::cmd("CLIENT").arg("LIST"));
        i64::try_from(list.lines().count()).expect("a count")
    };
    let before = clients(&server);
    let new = old
        .with_policies(policy_set(vec![kept.clone(), v2.clone(), added.clone()]))
        .expect("the new policies are accepted");
    assert!(
        allowed(&new, &kept, s).await,
        "kept: 2 of 2, its charge kept"
    );
    assert!(!allowed(&new, &kept, s).await);
    assert!(
        !allowed(&old, &kept, s).await,
        "the old provider shares the state"
    );
    assert!(allowed(&new, &v2, s).await, "revision 2 starts empty");
    assert!(allowed(&new, &added, s).await);
    assert!(matches!(
        new.evaluate(request(&v1, s, 1)).await,
        Ok(RateLimitOutcome::Evaluated(d)) if d.revision == v2.revision()
    ));
    assert_eq!(clients(&server), before, "no new connection");
}

/// A policy id for `kind` under `tag`: `tag-fixed-window`, ...
fn per_kind(tag: &str, kind: AlgorithmKind) -> String {
    format!("{tag}-{}", kind.as_str().replace('_', "-"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_contain_no_raw_subject_and_always_expire() {
    let server = RedisServer::start();
    let raw = *b"user-42@example.com|10.1.2.3|k3y";
    let policies: Vec<_> = AlgorithmKind::RATE
        .iter()
        .map(|&k| daily_policy(&per_kind("private", k), k, 1, 5))
        .collect();
    let provider = connect(settings(&server), policies.clone()).await;
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
    for kind in AlgorithmKind::RATE {
        let limit = 100;
        let p = daily_policy(&per_kind("contended", kind), kind, 1, limit);
        // Two independent providers: two connections, as two service instances.
        let a = Arc::new(connect(settings(&server), vec![p.clone()]).await);
        let b = Arc::new(connect(settings(&server), vec![p.clone()]).await);
        let s = subject(4);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let port = if i % 2 == 0 { a.clone() } else { b.clone() };
                let p = p.clone();
                tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..5 {
                        if allowed(&*port, &p, s).await {
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
    let f = OnePolicy::start("wrongtype", AlgorithmKind::Gcra, 5, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    let s = subject(5);
    let key = provider.state_key(p.id(), &s).expect("a key");
    let _: i64 = f.query(redis::cmd("LPUSH").arg(&key).arg("x"));
    assert_eq!(
        outcome(provider, p, s).await,
        RateLimitOutcome::Incompatible {
            policy_id: p.id().clone(),
            category: IncompatibleCategory::State,
        }
    );
    let len: i64 = f.query(redis::cmd("LLEN").arg(&key));
    assert_eq!(len, 1, "incompatible state is left as it was");
}

#[tokio::test]
async fn bad_settings_are_refused_by_name() {
    let p = daily_policy("settings", AlgorithmKind::FixedWindow, 1, 5);
    let unreachable = || RedisSettings::new("redis://127.0.0.1:1/0");
    let cases: Vec<(RedisSettings, &str)> = vec![
        (RedisSettings::new("http://x"), "url"),
        (RedisSettings::new("redis://[::1"), "url"),
        (
            RedisSettings {
                max_in_flight: 0,
                ..unreachable()
            },
            "max_in_flight",
        ),
        (
            RedisSettings {
                command_timeout: Duration::ZERO,
                ..unreachable()
            },
            "command_timeout",
        ),
        (
            RedisSettings {
                key_prefix: "a{b}".to_owned(),
                ..unreachable()
            },
            "key_prefix",
        ),
    ];
    for (s, field) in cases {
        let err = RedisProvider::connect(s, policy_set(vec![p.clone()]))
            .await
            .expect_err(field);
        assert!(err.to_string().contains(field), "{err}");
    }
}

/// `CONFIG SET name value` on `f`'s server.
fn config_set(f: &OnePolicy, name: &str, value: &str) {
    let _: () = f.query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_with_noeviction_is_unavailable_server_and_writes_nothing() {
    let f = OnePolicy::start("oom", AlgorithmKind::TokenBucket, 5, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    config_set(&f, "maxmemory-policy", "noeviction");
    config_set(&f, "maxmemory", "1");
    assert!(matches!(
        outcome(provider, p, subject(14)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Server,
            ..
        }
    ));
    let key = provider.state_key(p.id(), &subject(14)).expect("a key");
    let n: i64 = f.query(redis::cmd("EXISTS").arg(&key));
    assert_eq!(n, 0, "the refused write must not exist");
    config_set(&f, "maxmemory", "0");
    assert!(allowed(provider, p, subject(14)).await);
}

/// Plants GCRA state at `key` (of a `daily_policy(_, Gcra, 1, 5)`: 2 of 5 burst units in
/// debt) whose last observed time is `ahead_ms` past the server's clock, and returns the
/// stored bytes.
fn plant_future_state(server: &RedisServer, key: &str, ahead_ms: u64) -> Vec<u8> {
    use shared_contract::model::{AlgorithmState, GcraState};
    let mut c = server.connection();
    let now = acceptance_tests::lua::server_time_ms(&mut c).expect("TIME");
    // 5 per day: interval_units = 86_400_000 / gcd(5, 86_400_000) = 17_280_000.
    let state = AlgorithmState::Gcra(GcraState {
        last_ms: now + ahead_ms,
        debt: 2 * 17_280_000,
        overdraft: 0,
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
    // max_clock_regression is 2 s; the stored state is 60 s ahead of the server clock.
    let f = OnePolicy::start("clock", AlgorithmKind::Gcra, 5, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    let key = provider.state_key(p.id(), &subject(18)).expect("a key");
    let planted = plant_future_state(&f.server, &key, 60_000);
    match outcome(provider, p, subject(18)).await {
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
    let stored: Vec<u8> = f.query(redis::cmd("GET").arg(&key));
    assert_eq!(stored, planted, "state must be byte-for-byte unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_clock_regression_is_clamped_and_decided() {
    let f = OnePolicy::start("clamp", AlgorithmKind::Gcra, 5, |_| {}).await;
    let (provider, p) = (&f.provider, &f.policy);
    let key = provider.state_key(p.id(), &subject(19)).expect("a key");
    let _ = plant_future_state(&f.server, &key, 500);
    match outcome(provider, p, subject(19)).await {
        // 2 units of debt, nothing repaid at the clamped time: this one leaves 2 of 5.
        RateLimitOutcome::Evaluated(d) => assert!(d.allowed && d.remaining == 2, "{d:?}"),
        other => panic!("expected a decision at the clamped time, got {other:?}"),
    }
}

/// The value of the `/metrics` series `series` (its labels in registration order).
fn metric(handle: &PrometheusHandle, series: &str) -> Option<f64> {
    let text = handle.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clamped_and_unsafe_clocks_are_counted_per_policy_and_the_skew_is_sampled() {
    let f = OnePolicy::start("clockm", AlgorithmKind::Gcra, 5, |_| {}).await;
    let p = &f.policy;
    // The same provider over again, its metrics registered with a recorder of the test's own.
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let provider = metrics::with_local_recorder(&recorder, || {
        f.provider.with_policies(policy_set(vec![p.clone()]))
    })
    .expect("the same policies");
    let events = |kind: &str| {
        let series = format!("rate_limit_clock_events_total{{policy=\"clockm\",kind=\"{kind}\"}}");
        metric(&handle, &series)
    };
    assert_eq!(
        (events("clamped"), events("unsafe")),
        (Some(0.0), Some(0.0))
    );
    // The single program, then the multi-limit one (an evaluation id): each member's state
    // 500 ms ahead (clamped), then 60 s ahead (beyond max_clock_regression: unsafe).
    for (tag, ahead_ms) in [(30, 500), (31, 60_000)] {
        let key = provider.state_key(p.id(), &subject(tag)).expect("a key");
        let _ = plant_future_state(&f.server, &key, ahead_ms);
        let _ = outcome(&provider, p, subject(tag)).await;
    }
    for (tag, ahead_ms) in [(32, 500), (33, 60_000)] {
        let key = provider.state_key(p.id(), &subject(tag)).expect("a key");
        let _ = plant_future_state(&f.server, &key, ahead_ms);
        let mut r = request(p, subject(tag), 1);
        r.evaluation_id = Some(EvaluationId::new(&format!("clock-{tag}")).expect("an id"));
        let _ = provider.evaluate(r).await.expect("an acceptable request");
    }
    // A fresh subject: neither.
    assert!(allowed(&provider, p, subject(34)).await);
    assert_eq!(
        (events("clamped"), events("unsafe")),
        (Some(2.0), Some(2.0))
    );
    // The server runs on this host: its clock and ours agree within a round trip.
    let skew = metric(&handle, "rate_limit_redis_clock_skew_seconds").expect("a gauge");
    assert!(skew.abs() < 2.0, "{skew}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_ack_reports_unacknowledged_allows_as_indeterminate_and_keeps_denials() {
    let master = RedisServer::start();
    let p = daily_policy("acked", AlgorithmKind::FixedWindow, 1, 2);
    let mut s = settings(&master);
    s.command_timeout = Duration::from_millis(200);
    s.min_replicas_ack = 1;
    // No replica yet: an allow cannot be acknowledged, so it is not reported as one (it did
    // consume quota on the master); the denial that follows consumed nothing and stands.
    let provider = connect(s.clone(), vec![p.clone()]).await;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(outcome(&provider, &p, subject(91)).await);
    }
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
    eventually_blocking(
        "the replica streaming",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            acceptance_tests::probe::replicas_streaming(
                master.url(),
                "harness:replication-probe",
                1,
            )
        },
    );
    let wide = daily_policy("acked-wide", AlgorithmKind::FixedWindow, 1, 100);
    let provider = Arc::new(connect(s, vec![wide.clone()]).await);
    let tasks: Vec<_> = (0..50u8)
        .map(|i| {
            let (provider, wide) = (provider.clone(), wide.clone());
            tokio::spawn(async move {
                provider
                    .evaluate(request(&wide, subject(100 + i % 5), 1))
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
