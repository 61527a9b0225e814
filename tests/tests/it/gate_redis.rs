//! What only Redis can show about event gates, through the Redis gate provider's port: two
//! instances on one server see the same updates in the same clock order, and every submitted
//! event ends published or invalidated exactly once after one instance is killed mid-stream;
//! memory stays bounded under a steady rate with retention; a stopped server gives honest
//! outcomes and a restart recovers; `updates_after` waits for the next update; a flushed
//! script cache is reloaded. The cases both providers share are in `gate_providers.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::gate::{
    deadline, event_id, key, nz, redis_provider, settings, snapshot, status, submit, unique,
};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{RedisGateProvider, RedisGateSettings};
use shared_contract::Deadline;
use shared_contract::gate::{
    EventGatePort, EventStatus, GateClock, GateId, GateMode, GateOutcome, StatusUpdate,
    SubmitOutcome, SubmitRequest, UpdateBatch,
};

/// Follows a gate's updates from clock 0 until `stop` (once nothing is new, or at once when
/// `hard`) and returns them.
fn subscribe(
    port: Arc<RedisGateProvider>,
    gate: GateId,
    stop: Arc<std::sync::atomic::AtomicBool>,
    hard: bool,
) -> tokio::task::JoinHandle<Vec<StatusUpdate>> {
    tokio::spawn(async move {
        let mut out: Vec<StatusUpdate> = Vec::new();
        loop {
            let cursor = out.last().map_or(GateClock::ZERO, |u| u.clock);
            let d = Deadline::within(Duration::from_millis(1200)).expect("deadline");
            match port.updates_after(&gate, cursor, nz(256), d).await {
                Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => {
                    let stopping = stop.load(std::sync::atomic::Ordering::SeqCst);
                    if stopping && (hard || u.is_empty()) {
                        return out;
                    }
                    out.extend(u);
                }
                other => panic!("updates after {cursor}: {other:?}"),
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_see_the_same_updates_and_lose_nothing_when_one_is_killed() {
    let server = RedisServer::start();
    for mode in GateMode::ALL {
        let g = settings(&unique("pair"), mode, 150, 60_000);
        let gate = g.id().clone();
        let a = Arc::new(
            redis_provider(server.url(), vec![g.clone()], RedisGateSettings::default()).await,
        );
        let b = Arc::new(
            redis_provider(server.url(), vec![g.clone()], RedisGateSettings::default()).await,
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kill_a = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut sub_a = Some(subscribe(a.clone(), gate.clone(), kill_a.clone(), true));
        let sub_b = subscribe(b.clone(), gate.clone(), stop.clone(), false);
        let mut submitted = BTreeSet::new();
        let mut a = Some(a);
        let mut seen_a = Vec::new();
        for i in 0..120u64 {
            let o = match (&a, i % 2) {
                (Some(a), 0) => submit(&**a, &gate, &format!("k{}", i % 7), &format!("e{i}")).await,
                _ => submit(&*b, &gate, &format!("k{}", i % 7), &format!("e{i}")).await,
            };
            if matches!(o, SubmitOutcome::Submitted { .. }) {
                submitted.insert(format!("e{i}"));
            }
            if i == 60 {
                // Kill instance A mid-stream: its subscriber stops, and dropping the last
                // handle aborts its publisher and connections wherever they are.
                kill_a.store(true, std::sync::atomic::Ordering::SeqCst);
                if let Some(h) = sub_a.take() {
                    seen_a = h.await.expect("subscriber A ends");
                }
                a = None;
            }
            tokio::time::sleep(Duration::from_millis(8)).await;
        }
        assert!(a.is_none());
        // Everything comes due; only B publishes now.
        eventually(
            "no event incubating after A was killed",
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || {
                let s = snapshot(&*b, &gate).await;
                if s.incubating.is_empty() {
                    Ok(())
                } else {
                    Err(s)
                }
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let seen_b = sub_b.await.expect("subscriber B ends");
        // The same updates in the same clock order on both instances, as far as A lived.
        assert!(!seen_a.is_empty(), "{mode}: A saw nothing");
        assert_eq!(seen_a[..], seen_b[..seen_a.len()], "{mode}");
        assert!(seen_b.windows(2).all(|w| w[0].clock < w[1].clock));
        // Every submitted event: one Submitted update and exactly one terminal one.
        let mut fates: BTreeMap<String, Vec<EventStatus>> = BTreeMap::new();
        for u in &seen_b {
            fates.entry(u.id.to_string()).or_default().push(u.status);
        }
        assert_eq!(
            fates.keys().cloned().collect::<BTreeSet<_>>(),
            submitted,
            "{mode}"
        );
        for (id, f) in &fates {
            assert_eq!(f.len(), 2, "{mode} {id}: {f:?}");
            assert_eq!(f[0], EventStatus::Submitted, "{id}");
            assert!(f[1].is_terminal(), "{id}");
            assert_eq!(status(&*b, &gate, id).await, Some(f[1]), "{id}");
        }
        if mode == GateMode::OnlyOnce {
            assert!(fates.values().all(|f| f[1] == EventStatus::Published));
        } else {
            assert!(fates.values().any(|f| f[1] == EventStatus::Invalidated));
        }
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_a_steady_rate_with_retention() {
    let server = RedisServer::start();
    let g = settings(&unique("mem"), GateMode::OnlyOnce, 50, 200);
    let gate = g.id().clone();
    let gs = RedisGateSettings {
        sweep_interval: Duration::from_millis(50),
        stream_max_len: 500,
        ..RedisGateSettings::default()
    };
    let port = redis_provider(server.url(), vec![g], gs).await;
    let keys = port.keys(&gate).expect("known gate").clone();
    let mut con = server.connection();
    let mut peak_events = 0i64;
    let mut peak_stream = 0i64;
    let started = Instant::now();
    let mut i = 0u64;
    // A fixed 1,000 events, at most 500/s (5 per 10 ms): at that rate ~ 500 * (50 + 200 +
    // sweep 50) ms = 150 held at a time. A count, not a duration, so a slow machine runs
    // longer instead of submitting too few for the bound to mean anything.
    while i < 1000 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "submitted only {i} in 60 s"
        );
        for _ in 0..5 {
            submit(&port, &gate, &format!("k{i}"), &format!("e{i}")).await;
            i += 1;
        }
        let n: i64 = redis::cmd("HLEN")
            .arg(&keys[2])
            .query(&mut con)
            .expect("HLEN");
        let s: i64 = redis::cmd("XLEN")
            .arg(&keys[7])
            .query(&mut con)
            .expect("XLEN");
        peak_events = peak_events.max(n);
        peak_stream = peak_stream.max(s);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        peak_events < 400,
        "peak {peak_events} events held for {i} submitted"
    );
    // MAXLEN ~ trims whole nodes (100 entries by default), so allow one node of slack.
    assert!(peak_stream <= 700, "stream grew to {peak_stream}");
    // After the last retention passes, the conditional delete leaves nothing but windows.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let n: i64 = redis::cmd("HLEN")
        .arg(&keys[2])
        .query(&mut con)
        .expect("HLEN");
    let w: i64 = redis::cmd("HLEN")
        .arg(&keys[5])
        .query(&mut con)
        .expect("HLEN");
    assert_eq!((n, w), (0, 0), "events and windows left after retention");
    // No gate key has a TTL: nothing can expire unhandled.
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut con).expect("PTTL");
        assert!(ttl == -1 || ttl == -2, "{k} has a TTL {ttl}");
    }
    port.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_gives_honest_outcomes_and_a_restart_recovers() {
    let mut server = RedisServer::start();
    let g = settings(&unique("down"), GateMode::StrictlyOnce, 100, 1000);
    let gate = g.id().clone();
    let port = redis_provider(server.url(), vec![g], RedisGateSettings::default()).await;
    assert!(matches!(
        submit(&port, &gate, "k", "e1").await,
        SubmitOutcome::Submitted { .. }
    ));
    server.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = port
        .submit(SubmitRequest {
            gate: gate.clone(),
            key: key("k"),
            id: event_id("e2"),
            deadline: deadline(),
        })
        .await
        .expect("known gate");
    assert!(
        matches!(
            r,
            GateOutcome::Unavailable { .. } | GateOutcome::Indeterminate { .. }
        ),
        "{r:?}"
    );
    let s = port.snapshot(&gate, deadline()).await.expect("known gate");
    assert!(
        matches!(s, GateOutcome::Unavailable { .. }),
        "a read is never indeterminate: {s:?}"
    );
    server.restart();
    eventually(
        "a snapshot after the restart",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || match port.snapshot(&gate, deadline()).await {
            Ok(GateOutcome::Evaluated(_)) => Ok(()),
            other => Err(other),
        },
    )
    .await;
    port.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_updates_after_waits_for_the_next_update_then_answers_it() {
    let g = settings(&unique("wait"), GateMode::OnlyOnce, 5000, 60_000);
    let gate = g.id().clone();
    let port = Arc::new(
        redis_provider(
            RedisServer::shared().url(),
            vec![g],
            RedisGateSettings::default(),
        )
        .await,
    );
    // Nothing happens: an empty batch close to the deadline, not before.
    let started = Instant::now();
    let d = Deadline::within(Duration::from_millis(1500)).expect("deadline");
    let r = port.updates_after(&gate, GateClock::ZERO, nz(10), d).await;
    assert_eq!(
        r,
        Ok(GateOutcome::Evaluated(UpdateBatch::Updates(Vec::new())))
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    let waiter = {
        let (port, gate) = (port.clone(), gate.clone());
        tokio::spawn(async move {
            let d = Deadline::within(Duration::from_secs(5)).expect("deadline");
            port.updates_after(&gate, GateClock::ZERO, nz(10), d).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    submit(&*port, &gate, "k", "e1").await;
    match waiter.await.expect("the waiter ends") {
        Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => {
            assert_eq!(u.len(), 1);
            assert_eq!(u[0].status, EventStatus::Submitted);
        }
        other => panic!("{other:?}"),
    }
    port.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded_and_a_retried_submission_is_a_duplicate() {
    let server = RedisServer::start();
    let g = settings(&unique("flush"), GateMode::StrictlyOnce, 5000, 60_000);
    let gate = g.id().clone();
    let port = redis_provider(server.url(), vec![g], RedisGateSettings::default()).await;
    let first = submit(&port, &gate, "k", "e1").await;
    let mut con = server.connection();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut con)
        .expect("SCRIPT FLUSH");
    // NOSCRIPT -> EVAL of the same source; the retried id answers what the gate holds.
    match submit(&port, &gate, "k", "e1").await {
        SubmitOutcome::Duplicate(r) => {
            assert_eq!(r.status, EventStatus::Submitted);
            assert_eq!(r.clock, first.clock(), "the same clock as the first answer");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(snapshot(&port, &gate).await.incubating.len(), 1);
    port.shutdown().await;
}
