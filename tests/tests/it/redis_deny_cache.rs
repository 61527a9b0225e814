//! The exact denial cache of the Redis provider against a real server: a repeated denial costs
//! no program call and ends with its bound; a smaller cost, a shadow policy, an evaluation id
//! and a policy without `deny_cache` always ask Redis; a multi-limit evaluation is denied whole
//! by one cached member; a reload drops the entries of a new revision; state lost by Redis
//! (flushed, or a restart without persistence, the cache answering while Redis is down) leaves
//! the cache stricter, never looser; a differential check over 20,000 decisions
//! that every local answer is a denial the model gives at that server time.
//!
//! Every test starts its own server, so they run in parallel.

use std::time::{Duration, Instant};

use acceptance_tests::conformance_multi::{limit, multi_request};
use acceptance_tests::lua::decode_state;
use acceptance_tests::rate::{TestPolicy, policy_set, request, subject};
use acceptance_tests::redis_provider::{connect, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::RedisProvider;
use shared_contract::model::{self, Verdict};
use shared_contract::{
    AlgorithmKind, Cost, EdgeRateLimitPort, EvaluationId, MultiOutcome, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, Source, SubjectDigest,
};

/// Program calls the server has run (`EVALSHA` and `EVAL`).
fn program_calls(server: &RedisServer) -> u64 {
    let stats: String = query(server, redis::cmd("INFO").arg("commandstats"));
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `kind` admitting `limit` per `span`, costs up to `limit`, its denials cached.
fn cached_policy(id: &str, kind: AlgorithmKind, limit: u64, span: Duration) -> RateLimitPolicy {
    TestPolicy::of(id, kind, limit, span)
        .max_cost(limit)
        .build()
        .with_deny_cache(true)
}

async fn decide(
    port: &RedisProvider,
    p: &RateLimitPolicy,
    s: SubjectDigest,
    cost: u64,
) -> RateLimitDecision {
    match port
        .evaluate(request(p, s, cost))
        .await
        .expect("an acceptable request")
    {
        RateLimitOutcome::Evaluated(d) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_denial_costs_no_call_until_its_bound_ends() {
    let server = RedisServer::start();
    let policies: Vec<_> = AlgorithmKind::RATE
        .iter()
        .map(|&k| {
            cached_policy(
                &format!("hot-{}", k.as_str().replace('_', "-")),
                k,
                2,
                Duration::from_millis(1_500),
            )
        })
        .collect();
    let provider = connect(settings(&server), policies.clone()).await;
    for p in &policies {
        let s = subject(1);
        assert!(decide(&provider, p, s, 2).await.allowed, "{}", p.id());
        let first = decide(&provider, p, s, 2).await;
        assert!(
            !first.allowed && first.source == Source::GlobalRedis,
            "{}: {first:?}",
            p.id()
        );
        let calls = program_calls(&server);
        for cost in [2, 2, 2] {
            let d = decide(&provider, p, s, cost).await;
            assert!(!d.allowed, "{}", p.id());
            assert_eq!(d.source, Source::LocalCache, "{}", p.id());
            assert!(d.retry_after_ms < first.retry_after_ms, "{}: {d:?}", p.id());
            assert_eq!(
                (d.limit, d.reset_at_ms),
                (first.limit, first.reset_at_ms),
                "{}",
                p.id()
            );
        }
        assert_eq!(
            program_calls(&server),
            calls,
            "{}: a cached denial made a call",
            p.id()
        );
        // The bound ends no later than Redis's: then Redis answers, and admits.
        tokio::time::sleep(Duration::from_millis(first.retry_after_ms)).await;
        let after = decide(&provider, p, s, 2).await;
        assert_eq!(after.source, Source::GlobalRedis, "{}", p.id());
        assert!(after.allowed, "{}: {after:?}", p.id());
        assert_eq!(program_calls(&server), calls + 1, "{}", p.id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_cost_a_shadow_policy_an_id_and_an_uncached_policy_ask_redis() {
    let server = RedisServer::start();
    let day = Duration::from_secs(86_400);
    let cached = cached_policy("cached", AlgorithmKind::FixedWindow, 3, day);
    let shadow = cached_policy("shadow", AlgorithmKind::FixedWindow, 3, day).with_shadow(true);
    let plain = TestPolicy::of("plain", AlgorithmKind::FixedWindow, 3, day)
        .max_cost(3)
        .build()
        .with_deny_cache(false);
    let provider = connect(
        settings(&server),
        vec![cached.clone(), shadow.clone(), plain.clone()],
    )
    .await;
    let s = subject(2);
    for p in [&cached, &shadow, &plain] {
        assert!(decide(&provider, p, s, 2).await.allowed);
        assert!(
            !decide(&provider, p, s, 2).await.allowed,
            "one left, cost 2 denied"
        );
    }
    assert_eq!(
        decide(&provider, &cached, s, 3).await.source,
        Source::LocalCache
    );
    assert_eq!(
        decide(&provider, &shadow, s, 2).await.source,
        Source::GlobalRedis
    );
    assert_eq!(
        decide(&provider, &plain, s, 2).await.source,
        Source::GlobalRedis
    );
    // A cost below the cached one may fit: Redis decides, and admits it.
    let one = decide(&provider, &cached, s, 1).await;
    assert!(one.allowed && one.source == Source::GlobalRedis, "{one:?}");
    // A retried evaluation id must answer its stored first decision, not the cache.
    let id = EvaluationId::new("retry-1").expect("an id");
    let mut first = request(&cached, subject(3), 3);
    first.evaluation_id = Some(id.clone());
    let admitted = provider.evaluate(first.clone()).await.expect("accepted");
    assert!(matches!(&admitted, RateLimitOutcome::Evaluated(d) if d.allowed));
    let d = decide(&provider, &cached, subject(3), 1).await;
    assert!(!d.allowed && d.source == Source::GlobalRedis);
    assert_eq!(
        decide(&provider, &cached, subject(3), 1).await.source,
        Source::LocalCache
    );
    let replayed = provider.evaluate(first).await.expect("accepted");
    assert_eq!(
        replayed, admitted,
        "the id's first decision, not the cached denial"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cached_member_denies_a_multi_limit_evaluation_without_a_call() {
    let server = RedisServer::start();
    let day = Duration::from_secs(86_400);
    let tight = cached_policy("tight", AlgorithmKind::TokenBucket, 1, day);
    let loose = cached_policy("loose", AlgorithmKind::SlidingLog, 100, day);
    let provider = connect(settings(&server), vec![tight.clone(), loose.clone()]).await;
    let s = subject(4);
    let both = || multi_request(vec![limit(&loose, s, 1), limit(&tight, s, 1)], None);
    let first = provider.evaluate_all(both()).await.expect("accepted");
    assert!(matches!(&first, MultiOutcome::Evaluated(d) if d.allowed));
    let denied = provider.evaluate_all(both()).await.expect("accepted");
    let MultiOutcome::Evaluated(d) = &denied else {
        panic!("{denied:?}")
    };
    assert!(!d.allowed && d.decisions[1].source == Source::GlobalRedis);
    let calls = program_calls(&server);
    let cached = provider.evaluate_all(both()).await.expect("accepted");
    let MultiOutcome::Evaluated(c) = &cached else {
        panic!("{cached:?}")
    };
    assert!(!c.allowed);
    assert_eq!(c.decisions.len(), 2);
    assert!(c.decisions[0].allowed && c.decisions[0].source == Source::LocalCache);
    assert_eq!((c.decisions[0].limit, c.decisions[0].remaining), (100, 0));
    assert!(!c.decisions[1].allowed && c.decisions[1].source == Source::LocalCache);
    assert_eq!(program_calls(&server), calls, "answered without a call");
    // Nothing was charged to the member that did not decide: 99 of 100 are left.
    let alone = decide(&provider, &loose, s, 1).await;
    assert_eq!((alone.allowed, alone.remaining), (true, 98));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_drops_entries_it_changed_and_state_lost_by_redis_stays_denied() {
    let server = RedisServer::start();
    let day = Duration::from_secs(86_400);
    let v1 = cached_policy("rolling", AlgorithmKind::FixedWindow, 1, day);
    let provider = connect(settings(&server), vec![v1.clone()]).await;
    let s = subject(5);
    assert!(decide(&provider, &v1, s, 1).await.allowed);
    assert!(!decide(&provider, &v1, s, 1).await.allowed);
    assert_eq!(provider.deny_cache().len(), 1);
    // Redis loses the state: it would admit again, the cache still denies (stricter, not
    // looser) until its bound ends.
    let _: () = query(&server, &mut redis::cmd("FLUSHALL"));
    assert_eq!(
        decide(&provider, &v1, s, 1).await.source,
        Source::LocalCache
    );
    // `deny_cache` turned off on the same revision: its entries go.
    let off = provider
        .with_policies(policy_set(vec![v1.clone().with_deny_cache(false)]))
        .expect("accepted");
    assert_eq!(provider.deny_cache().len(), 0);
    let d = decide(&off, &v1, s, 1).await;
    assert!(d.allowed && d.source == Source::GlobalRedis, "{d:?}");
    // A new revision: the old revision's entries go, the new one starts empty.
    assert!(!decide(&provider, &v1, s, 1).await.allowed);
    assert_eq!(provider.deny_cache().len(), 1);
    let v2 = TestPolicy::of("rolling", AlgorithmKind::FixedWindow, 1, day)
        .revision(2)
        .build()
        .with_deny_cache(true);
    let next = provider
        .with_policies(policy_set(vec![v2.clone()]))
        .expect("accepted");
    assert_eq!(provider.deny_cache().len(), 0);
    assert!(decide(&next, &v2, s, 1).await.allowed);
}

/// Redis's clock and the raw state under `key`, read together.
fn snapshot(server: &RedisServer, key: &str) -> (u64, Option<Vec<u8>>) {
    let (time, state): (Vec<u64>, Option<Vec<u8>>) = query(
        server,
        redis::cmd("EVAL")
            .arg("return {redis.call('TIME'), redis.call('GET', KEYS[1])}")
            .arg(1)
            .arg(key),
    );
    (time[0] * 1_000 + time[1] / 1_000, state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_local_answer_is_a_denial_the_model_gives_at_that_server_time() {
    const DECISIONS: usize = 4_000;
    let server = RedisServer::start();
    let span = Duration::from_millis(300);
    let cached: Vec<_> = AlgorithmKind::RATE
        .iter()
        .map(|&k| {
            cached_policy(
                &format!("diff-{}", k.as_str().replace('_', "-")),
                k,
                6,
                span,
            )
        })
        .collect();
    let plain: Vec<_> = cached
        .iter()
        .map(|p| p.clone().with_deny_cache(false))
        .collect();
    // Two instances on one Redis, the same policies: the cache on in one, off in the other.
    let on = connect(settings(&server), cached.clone()).await;
    let off = connect(settings(&server), plain.clone()).await;
    let s = subject(6);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut draw = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut local_total, mut unchecked) = (0, 0);
    for (p, q) in cached.iter().zip(&plain) {
        let key = on.state_key(p.id(), &s).expect("a key");
        let mut local = 0;
        for _ in 0..DECISIONS {
            let cost = 1 + draw(6);
            if draw(3) == 0 {
                decide(&off, q, s, cost).await;
                continue;
            }
            let asked = Instant::now();
            let d = decide(&on, p, s, cost).await;
            if d.source != Source::LocalCache {
                continue;
            }
            local += 1;
            assert!(!d.allowed);
            // Nothing ran in between, so the state read now is the one the local answer stood
            // for. The answer claims a denial for `retry_after` from `asked`; a read within
            // that time must find the model denying too (and never admitting sooner).
            let (now_ms, raw) = snapshot(&server, &key);
            let since = u64::try_from(asked.elapsed().as_millis()).expect("ms") + 1;
            if since >= d.retry_after_ms {
                unchecked += 1;
                continue;
            }
            let state = raw.map(|b| decode_state(&b).expect("a state").1);
            let ev = model::evaluate(p, state.as_ref(), now_ms, Cost::new(cost).expect("cost"))
                .expect("in range");
            assert_ne!(
                ev.verdict,
                Verdict::Allowed,
                "{}: the cache denied cost {cost} for {} ms, the model admits it {since} ms later",
                p.id(),
                d.retry_after_ms
            );
            assert!(
                d.retry_after_ms <= ev.retry_after_ms + since,
                "{}: {d:?} vs {ev:?} {since} ms later",
                p.id()
            );
        }
        assert!(
            local > DECISIONS / 10,
            "{}: only {local} local answers",
            p.id()
        );
        local_total += local;
    }
    assert!(
        local_total - unchecked >= 10_000,
        "{local_total} local, {unchecked} unchecked"
    );
    eprintln!(
        "{local_total} of {} decisions answered locally; checked against the model: all but {unchecked} read when their bound had less than the read's time left",
        5 * DECISIONS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_looping_on_cached_denials_do_not_starve_the_connection() {
    let server = RedisServer::start();
    let day = Duration::from_secs(86_400);
    let p = cached_policy("loop", AlgorithmKind::FixedWindow, 1, day);
    let provider = std::sync::Arc::new(connect(settings(&server), vec![p.clone()]).await);
    assert!(decide(&provider, &p, subject(8), 1).await.allowed);
    assert!(!decide(&provider, &p, subject(8), 1).await.allowed);
    // More callers than worker threads, each looping on hits that await nothing.
    let stop = Instant::now() + Duration::from_millis(1_500);
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (provider, p) = (provider.clone(), p.clone());
            tokio::spawn(async move {
                let mut hits = 0u64;
                while Instant::now() < stop {
                    let d = decide(&provider, &p, subject(8), 1).await;
                    hits += u64::from(d.source == Source::LocalCache);
                }
                hits
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Meanwhile a request that needs Redis gets its answer, in time.
    for n in 0..20 {
        let d = decide(&provider, &p, subject(100 + n), 1).await;
        assert!(d.allowed && d.source == Source::GlobalRedis, "{d:?}");
    }
    for l in loops {
        assert!(l.await.expect("a loop") > 1_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_that_loses_state_is_never_an_extra_admission() {
    let mut server = RedisServer::start();
    let p = cached_policy(
        "restart",
        AlgorithmKind::SlidingLog,
        1,
        Duration::from_secs(2),
    );
    let provider = connect(settings(&server), vec![p.clone()]).await;
    let s = subject(9);
    assert!(decide(&provider, &p, s, 1).await.allowed);
    let denied = decide(&provider, &p, s, 1).await;
    assert!(!denied.allowed && denied.source == Source::GlobalRedis);
    let ends = Instant::now() + Duration::from_millis(denied.retry_after_ms);
    // Down and back without its state: the cached denial still holds (it is true of every
    // admission Redis could have made before it ended), Redis alone would now admit.
    server.restart();
    let during = decide(&provider, &p, s, 1).await;
    assert!(
        !during.allowed && during.source == Source::LocalCache,
        "{during:?}"
    );
    acceptance_tests::eventually::eventually(
        "the provider reconnects",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || match provider.evaluate(request(&p, subject(10), 1)).await {
            Ok(RateLimitOutcome::Evaluated(d)) => Ok(d),
            other => Err(other),
        },
    )
    .await;
    if Instant::now() + Duration::from_millis(50) < ends {
        let after = decide(&provider, &p, s, 1).await;
        assert!(
            !after.allowed && after.source == Source::LocalCache,
            "{after:?}"
        );
    }
    tokio::time::sleep(ends.saturating_duration_since(Instant::now())).await;
    let later = decide(&provider, &p, s, 1).await;
    assert!(
        later.allowed && later.source == Source::GlobalRedis,
        "{later:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_makes_this_instance_forget_its_cached_denial() {
    let server = RedisServer::start();
    let p = cached_policy(
        "refunded",
        AlgorithmKind::FixedWindow,
        10,
        Duration::from_secs(3600),
    );
    let provider = connect(settings(&server), vec![p.clone()]).await;
    let s = subject(7);
    let limits =
        |cost| shared_contract::multi::Limits::new(vec![limit(&p, s, cost)]).expect("valid limits");
    let reserved = provider
        .reserve(shared_contract::ReserveRequest {
            limits: limits(10),
            ttl: shared_contract::reservation::ReservationTtl::from_millis(60_000).expect("ttl"),
            deadline: acceptance_tests::conformance_leases::deadline(),
        })
        .await
        .expect("valid");
    let shared_contract::Outcome::Evaluated(shared_contract::Reserved { id: Some(id), .. }) =
        reserved
    else {
        panic!("expected a reservation, got {reserved:?}");
    };
    assert!(
        !decide(&provider, &p, s, 1).await.allowed,
        "all 10 reserved"
    );
    let calls = program_calls(&server);
    let cached = decide(&provider, &p, s, 1).await;
    assert_eq!((cached.allowed, cached.source), (false, Source::LocalCache));
    assert_eq!(program_calls(&server), calls);
    let settled = provider
        .settle(shared_contract::SettleRequest {
            id,
            actual: vec![4],
            deadline: acceptance_tests::conformance_leases::deadline(),
        })
        .await
        .expect("valid");
    assert!(
        matches!(settled, shared_contract::Outcome::Evaluated(Ok(_))),
        "{settled:?}"
    );
    let after = decide(&provider, &p, s, 1).await;
    assert!(after.allowed, "6 came back: {after:?}");
    assert_eq!(after.remaining, 5);
}
