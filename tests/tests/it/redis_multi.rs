//! Multi-limit evaluations (`evaluate_all`) on the Redis provider against a real server:
//! exactness of all-or-nothing charging across two instances under contention, evaluation
//! ids retried concurrently, denials and refused members that charge nothing, clock
//! regression, `min_replicas_ack`, and the program reloaded after a script flush.
//!
//! The same behaviour on every topology is the conformance suite's (`conformance_multi`).
//! Every test starts its own server, so they run in parallel.

use std::sync::Arc;
use std::time::Duration;

use acceptance_tests::conformance_multi::{decide_all, limit, multi_request};
use acceptance_tests::rate::{outcome, subject};
use acceptance_tests::redis_provider::{connect, daily_policy, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::programs;
use shared_contract::model::{AlgorithmState, GcraState};
use shared_contract::{
    AlgorithmKind, EdgeRateLimitPort, IncompatibleCategory, MultiOutcome, RateLimitOutcome,
    UnavailableCategory,
};

/// Every key of the server (for "nothing was written").
fn keys(server: &RedisServer) -> Vec<String> {
    let mut k: Vec<String> = query(server, redis::cmd("KEYS").arg("*"));
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_contention_charge_every_limit_exactly() {
    let server = RedisServer::start();
    let a = daily_policy("multi-a", AlgorithmKind::FixedWindow, 1, 100);
    let b = daily_policy("multi-b", AlgorithmKind::TokenBucket, 1, 1_000);
    let policies = vec![a.clone(), b.clone()];
    // Two independent providers: two connections, as two service instances.
    let one = Arc::new(connect(settings(&server), policies.clone()).await);
    let two = Arc::new(connect(settings(&server), policies).await);
    let s = subject(7);
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let port = if i % 2 == 0 { one.clone() } else { two.clone() };
            let (a, b) = (a.clone(), b.clone());
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..10 {
                    let r = multi_request(vec![limit(&a, s, 1), limit(&b, s, 1)], None);
                    if decide_all(&*port, r).await.allowed {
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
        admitted, 100,
        "3000 evaluations from 300 tasks on two instances"
    );
    // B was charged exactly by the 100 admitted evaluations: 900 left, 899 after one more.
    match outcome(&*one, &b, s).await {
        RateLimitOutcome::Evaluated(d) => assert!(d.allowed && d.remaining == 899, "{d:?}"),
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_evaluation_id_retried_concurrently_charges_once() {
    let server = RedisServer::start();
    let a = daily_policy("idem-a", AlgorithmKind::Gcra, 1, 10);
    let b = daily_policy("idem-b", AlgorithmKind::SlidingLog, 1, 10);
    let one = Arc::new(connect(settings(&server), vec![a.clone(), b.clone()]).await);
    let two = Arc::new(connect(settings(&server), vec![a.clone(), b.clone()]).await);
    let s = subject(8);
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let port = if i % 2 == 0 { one.clone() } else { two.clone() };
            let (a, b) = (a.clone(), b.clone());
            tokio::spawn(async move {
                let r = multi_request(
                    vec![limit(&a, s, 1), limit(&b, s, 1)],
                    Some("order-4711-attempt"),
                );
                decide_all(&*port, r).await
            })
        })
        .collect();
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.push(t.await.expect("a task"));
    }
    let fresh: Vec<_> = decisions.iter().filter(|d| !d.replayed).collect();
    assert_eq!(fresh.len(), 1, "exactly one evaluation ran: {decisions:?}");
    for d in &decisions {
        assert!(d.allowed);
        assert_eq!(
            d.decisions, fresh[0].decisions,
            "every retry answers the first"
        );
    }
    for p in [&a, &b] {
        match outcome(&*one, p, s).await {
            RateLimitOutcome::Evaluated(d) => {
                assert_eq!(d.remaining, 8, "{}: charged once", p.id())
            }
            other => panic!("expected a decision, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_of_one_member_charges_none() {
    let server = RedisServer::start();
    // Redis decides every time (not the denial cache): the figures below are its own.
    let small =
        daily_policy("deny-small", AlgorithmKind::SlidingWindow, 1, 1).with_deny_cache(false);
    let big = daily_policy("deny-big", AlgorithmKind::FixedWindow, 1, 50);
    let port = connect(settings(&server), vec![small.clone(), big.clone()]).await;
    let s = subject(9);
    // Use up `small` alone, then every evaluation of both is denied by `small`.
    assert!(matches!(outcome(&port, &small, s).await, RateLimitOutcome::Evaluated(d) if d.allowed));
    let before = keys(&server);
    let big_key = port.state_key(big.id(), &s).expect("a key");
    for _ in 0..5 {
        let d = decide_all(
            &port,
            multi_request(vec![limit(&big, s, 1), limit(&small, s, 1)], None),
        )
        .await;
        assert!(
            !d.allowed && d.decisions[0].allowed && !d.decisions[1].allowed,
            "{d:?}"
        );
        assert_eq!(
            d.decisions[0].remaining, 49,
            "figures after a charge that did not happen"
        );
    }
    assert_eq!(keys(&server), before, "no key written");
    assert!(!before.contains(&big_key));
    match outcome(&port, &big, s).await {
        RateLimitOutcome::Evaluated(d) => assert_eq!(d.remaining, 49, "{d:?}"),
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_key_in_one_member_is_incompatible_state_and_nothing_is_written() {
    let server = RedisServer::start();
    let a = daily_policy("wt-a", AlgorithmKind::TokenBucket, 1, 5);
    let b = daily_policy("wt-b", AlgorithmKind::Gcra, 1, 5);
    let port = connect(settings(&server), vec![a.clone(), b.clone()]).await;
    let s = subject(10);
    let key_b = port.state_key(b.id(), &s).expect("a key");
    let _: i64 = query(&server, redis::cmd("LPUSH").arg(&key_b).arg("x"));
    let before = keys(&server);
    for id in [None, Some("wt-eval")] {
        let r = multi_request(vec![limit(&a, s, 1), limit(&b, s, 1)], id);
        assert_eq!(
            port.evaluate_all(r).await,
            Ok(MultiOutcome::Incompatible {
                policy_id: b.id().clone(),
                category: IncompatibleCategory::State,
            }),
            "{id:?}"
        );
    }
    assert_eq!(keys(&server), before, "nothing written, no replay stored");
    let len: i64 = query(&server, redis::cmd("LLEN").arg(&key_b));
    assert_eq!(len, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_regression_of_one_member_is_unavailable_clock_and_writes_nothing() {
    let server = RedisServer::start();
    let a = daily_policy("clock-a", AlgorithmKind::FixedWindow, 1, 5);
    // GCRA 5 per day, as the planted state below expects.
    let b = daily_policy("clock-b", AlgorithmKind::Gcra, 1, 5);
    let port = connect(settings(&server), vec![a.clone(), b.clone()]).await;
    let s = subject(11);
    let key_b = port.state_key(b.id(), &s).expect("a key");
    let mut c = server.connection();
    let now = acceptance_tests::lua::server_time_ms(&mut c).expect("TIME");
    let state = AlgorithmState::Gcra(GcraState {
        last_ms: now + 60_000,
        debt: 2 * 17_280_000,
        overdraft: 0,
    });
    let planted = acceptance_tests::lua::encode_state(1, &state).expect("encodable state");
    let _: () = query(
        &server,
        redis::cmd("SET").arg(&key_b).arg(planted.as_slice()),
    );
    let before = keys(&server);
    match port
        .evaluate_all(multi_request(vec![limit(&a, s, 1), limit(&b, s, 1)], None))
        .await
    {
        Ok(MultiOutcome::Unavailable {
            policy_id,
            retry_after_ms,
            category: UnavailableCategory::Clock,
        }) => {
            assert_eq!(policy_id, *b.id());
            assert!(
                (55_000..=60_000).contains(&retry_after_ms),
                "{retry_after_ms}"
            );
        }
        other => panic!("expected Unavailable(clock), got {other:?}"),
    }
    assert_eq!(keys(&server), before, "nothing written");
    let stored: Vec<u8> = query(&server, redis::cmd("GET").arg(&key_b));
    assert_eq!(stored, planted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_ack_reports_an_unacknowledged_multi_allow_as_indeterminate() {
    let master = RedisServer::start();
    let a = daily_policy("ack-a", AlgorithmKind::FixedWindow, 1, 1);
    let b = daily_policy("ack-b", AlgorithmKind::SlidingLog, 1, 5);
    let mut s = settings(&master);
    s.command_timeout = Duration::from_millis(200);
    s.min_replicas_ack = 1;
    // No replica: the allow cannot be acknowledged; the denial after it consumed nothing.
    let port = connect(s, vec![a.clone(), b.clone()]).await;
    let both = || {
        multi_request(
            vec![limit(&a, subject(12), 1), limit(&b, subject(12), 1)],
            None,
        )
    };
    let first = port.evaluate_all(both()).await;
    assert!(
        matches!(first, Ok(MultiOutcome::Indeterminate { .. })),
        "{first:?}"
    );
    let second = port.evaluate_all(both()).await;
    assert!(
        matches!(&second, Ok(MultiOutcome::Evaluated(d)) if !d.allowed),
        "{second:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_program_is_reloaded_after_a_script_flush() {
    let server = RedisServer::start();
    let a = daily_policy("flush-a", AlgorithmKind::TokenBucket, 1, 10);
    let b = daily_policy("flush-b", AlgorithmKind::SlidingWindow, 1, 10);
    let port = connect(settings(&server), vec![a.clone(), b.clone()]).await;
    let s = subject(13);
    let both = || multi_request(vec![limit(&a, s, 1), limit(&b, s, 1)], None);
    assert!(decide_all(&port, both()).await.allowed);
    let _: () = query(&server, redis::cmd("SCRIPT").arg("FLUSH"));
    let d = decide_all(&port, both()).await;
    assert!(d.allowed && d.decisions[1].remaining == 8, "{d:?}");
    let exists: Vec<i64> = query(
        &server,
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(programs::MULTI.sha1()),
    );
    assert_eq!(
        exists,
        vec![1],
        "EVAL after NOSCRIPT cached the program again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_key_holding_something_else_is_incompatible_state() {
    let server = RedisServer::start();
    let a = daily_policy("rk-a", AlgorithmKind::FixedWindow, 1, 10);
    let port = connect(settings(&server), vec![a.clone()]).await;
    let s = subject(14);
    let r = || multi_request(vec![limit(&a, s, 1)], Some("rk-1"));
    assert!(!decide_all(&port, r()).await.replayed);
    assert!(decide_all(&port, r()).await.replayed);
    let state_key = port.state_key(a.id(), &s).expect("a key");
    let replay: Vec<String> = keys(&server)
        .into_iter()
        .filter(|k| *k != state_key)
        .collect();
    assert_eq!(replay.len(), 1, "one replay key: {replay:?}");
    let ttl: i64 = query(&server, redis::cmd("PTTL").arg(&replay[0]));
    assert!(ttl > 0, "the replay key expires ({ttl})");
    let _: () = query(
        &server,
        redis::cmd("SET").arg(&replay[0]).arg("ALLOWED,garbage"),
    );
    assert_eq!(
        port.evaluate_all(r()).await,
        Ok(MultiOutcome::Incompatible {
            policy_id: a.id().clone(),
            category: IncompatibleCategory::State,
        })
    );
}
