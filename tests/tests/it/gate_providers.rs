//! The event-gate providers through the port, written once and run on both: local with a
//! manual clock, Redis with real time and its background publisher. What only several Redis
//! instances or a Redis fault can show is in `gate_redis.rs`.
//!
//! - The two worked examples of `docs/event-gates.md`, scaled to milliseconds (duration
//!   300 ms, receipts at 100, 200, 300, 400, 700 ms): the answers and the fates. On Redis time
//!   is the server's, so the receipts follow real sleeps from a start; the boundary receipt
//!   (exactly one duration after the previous one) gets a 30 ms margin there, because a sleep
//!   cannot land on an exact millisecond. The exact boundary and the exact clock table are
//!   shown on the local provider here and on the Redis programs in `lua_gate.rs`.
//! - A subscriber that takes a snapshot and applies `updates_after` rebuilds the gate's
//!   incubating set (checked against the snapshot endpoint once the gate is quiet).
//! - Unknown gates are refused by both; so is an id the gate holds, reused with another key.
//! - Local: a property test of random sequences through the port against the model with the
//!   provider's lazy publication; a waiting subscriber is woken by a submission; a cursor
//!   older than the kept log asks for a resync.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::gate::{
    deadline, drain, event_id, gate_id, key, nz, redis_provider, settings, snapshot, status,
    submit, unique,
};
use acceptance_tests::redis_server::RedisServer;
use adapter_local::{LocalGateProvider, LocalGateSettings};
use adapter_redis::{RedisGateProvider, RedisGateSettings};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::gate::{
    EventGatePort, EventStatus, GateClock, GateId, GateMode, GateOutcome, GateRequestError,
    GateSet, GateSettings, GateSpec, GateState, Replica, SubmitOutcome, SubmitRequest, UpdateBatch,
};
use shared_contract::{Deadline, ManualClock};

/// A provider under test and how time moves for it.
enum Target {
    Local {
        port: Arc<LocalGateProvider>,
        clock: ManualClock,
        base: u64,
    },
    Redis {
        port: Arc<RedisGateProvider>,
        start: Instant,
    },
}

impl Target {
    fn port(&self) -> Arc<dyn EventGatePort> {
        match self {
            Target::Local { port, .. } => port.clone(),
            Target::Redis { port, .. } => port.clone(),
        }
    }

    fn is_redis(&self) -> bool {
        matches!(self, Target::Redis { .. })
    }

    /// Moves to `ms` after the start: sets the manual clock, or sleeps in real time.
    async fn at(&self, ms: u64) {
        match self {
            Target::Local { clock, base, .. } => clock.set(base + ms),
            Target::Redis { start, .. } => {
                let when = *start + Duration::from_millis(ms);
                tokio::time::sleep(when.saturating_duration_since(Instant::now())).await;
            }
        }
    }
}

fn local(gates: Vec<GateSettings>) -> Target {
    let clock = ManualClock::new(1_000_000);
    let port = LocalGateProvider::with_settings(
        GateSet::new(gates).expect("distinct gates"),
        Arc::new(clock.clone()),
        LocalGateSettings::default(),
    );
    Target::Local {
        port: Arc::new(port),
        clock,
        base: 1_000_000,
    }
}

async fn redis(gates: Vec<GateSettings>) -> Target {
    let port = redis_provider(
        RedisServer::shared().url(),
        gates,
        RedisGateSettings::default(),
    )
    .await;
    Target::Redis {
        port: Arc::new(port),
        start: Instant::now(),
    }
}

/// Waits (real time, bounded) until `id` is terminal.
async fn until_terminal(target: &Target, gate: &GateId, id: &str, at_ms: u64) -> EventStatus {
    target.at(at_ms).await;
    let port = target.port();
    let what = format!("{id} terminal");
    eventually(
        &what,
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || match status(&*port, gate, id).await {
            Some(s) if s.is_terminal() => Ok(s),
            other => Err(other),
        },
    )
    .await
}

fn kind(o: &SubmitOutcome) -> (&'static str, String) {
    match o {
        SubmitOutcome::Submitted { .. } => ("submitted", String::new()),
        SubmitOutcome::Rejected { conflicts_with, .. } => ("rejected", conflicts_with.to_string()),
        SubmitOutcome::Duplicate(r) => ("duplicate", r.id.to_string()),
        SubmitOutcome::IdReused(r) => ("id_reused", r.key.to_string()),
    }
}

async fn worked_example(target: Target, mode: GateMode, gate: GateId) {
    let port = target.port();
    // The boundary receipt: exact on the manual clock, with a margin in real time.
    let boundary = if target.is_redis() { 730 } else { 700 };
    let receipts = [
        (100, "apple", "e1"),
        (200, "taco", "e2"),
        (300, "taco", "e3"),
        (400, "taco", "e4"),
        (boundary, "taco", "e7"),
    ];
    let mut answers = Vec::new();
    for (t, k, id) in receipts {
        target.at(t).await;
        answers.push(kind(&submit(&*port, &gate, k, id).await));
    }
    let s = |a: &str| a.to_owned();
    let expected_answers = match mode {
        GateMode::OnlyOnce => vec![
            ("submitted", s("")),
            ("submitted", s("")),
            ("rejected", s("e2")),
            ("rejected", s("e2")),
            ("submitted", s("")),
        ],
        GateMode::StrictlyOnce => vec![
            ("submitted", s("")),
            ("submitted", s("")),
            ("rejected", s("e2")),
            ("rejected", s("e3")),
            ("submitted", s("")),
        ],
    };
    assert_eq!(answers, expected_answers, "{mode}");
    assert_eq!(
        until_terminal(&target, &gate, "e7", boundary + 300).await,
        EventStatus::Published
    );
    let fates: Vec<Option<EventStatus>> = {
        let mut v = Vec::new();
        for id in ["e1", "e2", "e3", "e4", "e7"] {
            v.push(status(&*port, &gate, id).await);
        }
        v
    };
    use EventStatus::*;
    let expected_fates = match mode {
        GateMode::OnlyOnce => vec![
            Some(Published),
            Some(Published),
            None,
            None,
            Some(Published),
        ],
        GateMode::StrictlyOnce => vec![
            Some(Published),
            Some(Invalidated),
            None,
            None,
            Some(Published),
        ],
    };
    assert_eq!(fates, expected_fates, "{mode}");
    let updates = drain(&*port, &gate, GateClock::ZERO).await;
    assert!(updates.windows(2).all(|w| w[0].clock < w[1].clock));
    let got: Vec<(String, EventStatus)> = updates
        .iter()
        .map(|u| (u.id.to_string(), u.status))
        .collect();
    let mut expected: Vec<(String, EventStatus)> = match mode {
        GateMode::OnlyOnce => vec![
            (s("e1"), Submitted),
            (s("e2"), Submitted),
            (s("e1"), Published),
            (s("e2"), Published),
            (s("e7"), Submitted),
            (s("e7"), Published),
        ],
        GateMode::StrictlyOnce => vec![
            (s("e1"), Submitted),
            (s("e2"), Submitted),
            (s("e2"), Invalidated),
            (s("e1"), Published),
            (s("e7"), Submitted),
            (s("e7"), Published),
        ],
    };
    if target.is_redis() {
        // The background publisher's timing decides how publications interleave with
        // receipts; the set of changes is fixed.
        let mut g = got.clone();
        g.sort();
        expected.sort();
        assert_eq!(g, expected, "{mode}");
    } else {
        assert_eq!(got, expected, "{mode}");
        // Lazy publication before each receipt gives exactly docs/event-gates.md's clocks.
        let clocks: Vec<u64> = updates.iter().map(|u| u.clock.get()).collect();
        let want = match mode {
            GateMode::OnlyOnce => vec![1, 2, 4, 6, 7, 8],
            GateMode::StrictlyOnce => vec![1, 2, 3, 5, 7, 8],
        };
        assert_eq!(clocks, want, "{mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worked_examples_pass_on_the_local_provider() {
    for mode in GateMode::ALL {
        let g = settings(&unique("example"), mode, 300, 60_000);
        let id = g.id().clone();
        worked_example(local(vec![g]), mode, id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worked_examples_pass_on_the_redis_provider() {
    let a = settings(&unique("example-a"), GateMode::OnlyOnce, 300, 60_000);
    let b = settings(&unique("example-b"), GateMode::StrictlyOnce, 300, 60_000);
    let (ia, ib) = (a.id().clone(), b.id().clone());
    // Both modes at once, on one provider (one publisher per gate).
    let target = redis(vec![a, b]).await;
    let Target::Redis { port, start } = &target else {
        unreachable!()
    };
    let (port, start) = (port.clone(), *start);
    let other = Target::Redis {
        port: port.clone(),
        start,
    };
    tokio::join!(
        worked_example(target, GateMode::OnlyOnce, ia),
        worked_example(other, GateMode::StrictlyOnce, ib)
    );
    port.shutdown().await;
}

/// Random receipts on a few keys over ~1.5 s while a subscriber follows with a [`Replica`];
/// once everything is terminal the replica must equal the gate's snapshot (empty), and while
/// events incubate a snapshot-then-deltas replica must agree with a fresh snapshot.
async fn replica_follows(target: Target, gate: GateId) {
    let port = target.port();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = {
        let (port, gate, stop) = (port.clone(), gate.clone(), stop.clone());
        tokio::spawn(async move {
            let mut replica = Replica::from_snapshot(snapshot(&*port, &gate).await);
            let mut seen = 0usize;
            let from = replica.clock();
            loop {
                let d = Deadline::within(Duration::from_millis(1200)).expect("deadline");
                match port
                    .updates_after(&gate, replica.clock(), nz(64), d)
                    .await
                    .expect("known gate")
                {
                    GateOutcome::Evaluated(UpdateBatch::Updates(u)) => {
                        if u.is_empty() && stop.load(std::sync::atomic::Ordering::SeqCst) {
                            return (replica, seen, from);
                        }
                        for up in &u {
                            replica.apply(up).expect("updates fit the replica");
                        }
                        seen += u.len();
                    }
                    other => panic!("updates: {other:?}"),
                }
            }
        })
    };
    let mut t = 0;
    for i in 0..40u64 {
        t += 10 + (i * 7) % 30;
        target.at(t).await;
        submit(&*port, &gate, &format!("k{}", i % 5), &format!("e{i}")).await;
        if i == 20 {
            // Mid-run: a replica from a snapshot plus deltas agrees with a later snapshot.
            let snap = snapshot(&*port, &gate).await;
            let mut r = Replica::from_snapshot(snap.clone());
            for u in drain(&*port, &gate, snap.clock).await {
                r.apply(&u).expect("deltas fit the snapshot");
            }
            let later = snapshot(&*port, &gate).await;
            if later.clock == r.clock() {
                assert_eq!(r.snapshot(), later);
            }
        }
    }
    target.at(t + 400).await;
    // Everything is due; the local provider publishes on this call, Redis has its publisher.
    let fin = eventually(
        "no event incubating",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            let s = snapshot(&*port, &gate).await;
            if s.incubating.is_empty() {
                Ok(s)
            } else {
                Err(s)
            }
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (replica, seen, from) = follower.await.expect("the follower ends");
    let all = drain(&*port, &gate, GateClock::ZERO).await;
    assert!(all.len() > 40, "{} updates", all.len());
    // The follower saw every update after the snapshot it started from.
    assert_eq!(seen, all.iter().filter(|u| u.clock > from).count());
    assert_eq!(replica.snapshot(), fin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rebuilt_from_updates_matches_the_snapshot_locally() {
    for mode in GateMode::ALL {
        let g = settings(&unique("rep"), mode, 120, 60_000);
        let id = g.id().clone();
        replica_follows(local(vec![g]), id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rebuilt_from_updates_matches_the_snapshot_on_redis() {
    for mode in GateMode::ALL {
        let g = settings(&unique("rep"), mode, 120, 60_000);
        let id = g.id().clone();
        replica_follows(redis(vec![g]).await, id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_gates_are_refused_by_both_providers() {
    let g = settings(&unique("known"), GateMode::OnlyOnce, 100, 1000);
    for target in [local(vec![g.clone()]), redis(vec![g.clone()]).await] {
        let port = target.port();
        let unknown = gate_id("no-such-gate");
        let r = port
            .submit(SubmitRequest {
                gate: unknown.clone(),
                key: key("k"),
                id: event_id("e"),
                deadline: deadline(),
            })
            .await;
        assert_eq!(r, Err(GateRequestError::UnknownGate(unknown.clone())));
        assert!(port.snapshot(&unknown, deadline()).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_with_another_key_is_refused_by_both_providers_and_changes_nothing() {
    let g = settings(&unique("reuse"), GateMode::StrictlyOnce, 60_000, 1000);
    let gate = g.id().clone();
    for target in [local(vec![g.clone()]), redis(vec![g.clone()]).await] {
        let port = target.port();
        let first = submit(&*port, &gate, "alpha", "dup-1").await;
        assert_eq!(kind(&first).0, "submitted");
        let (before, updates) = (
            snapshot(&*port, &gate).await,
            drain(&*port, &gate, GateClock::ZERO).await,
        );
        let reused = submit(&*port, &gate, "beta", "dup-1").await;
        match &reused {
            SubmitOutcome::IdReused(r) => {
                assert_eq!((r.id.as_str(), r.key.as_str()), ("dup-1", "alpha"));
                assert_eq!(r.clock, first.clock());
            }
            other => panic!("expected a reused id, got {other:?}"),
        }
        assert_eq!(snapshot(&*port, &gate).await, before, "nothing changed");
        assert_eq!(drain(&*port, &gate, GateClock::ZERO).await, updates);
        // beta was never received, so beta's first event is submitted, not rejected.
        assert_eq!(
            kind(&submit(&*port, &gate, "beta", "b-1").await).0,
            "submitted"
        );
        assert_eq!(
            kind(&submit(&*port, &gate, "alpha", "dup-1").await).0,
            "duplicate"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_local_subscriber_is_woken_by_a_submission() {
    let g = settings(&unique("wake"), GateMode::OnlyOnce, 100, 1000);
    let id = g.id().clone();
    let target = local(vec![g]);
    let port = target.port();
    let waiter = {
        let (port, id) = (port.clone(), id.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let d = Deadline::within(Duration::from_secs(10)).expect("deadline");
            let r = port.updates_after(&id, GateClock::ZERO, nz(10), d).await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    submit(&*port, &id, "k", "e1").await;
    let (r, waited) = waiter.await.expect("the waiter ends");
    match r {
        Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => assert_eq!(u.len(), 1),
        other => panic!("{other:?}"),
    }
    assert!(waited < Duration::from_secs(3), "woken after {waited:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Submit { key: u8, id: u8, dt: u64 },
    Publish { dt: u64 },
    Sweep { dt: u64 },
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0u8..12, 0u64..25).prop_map(|(key, id, dt)| Op::Submit { key, id, dt }),
        2 => (0u64..40).prop_map(|dt| Op::Publish { dt }),
        1 => (0u64..60).prop_map(|dt| Op::Sweep { dt }),
        1 => Just(Op::Snapshot),
    ]
}

/// The local provider through the port equals the model with its documented lazy
/// publication (everything due is published before each operation).
#[test]
fn the_local_provider_matches_the_model_with_lazy_publication() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop_oneof![Just(GateMode::OnlyOnce), Just(GateMode::StrictlyOnce)],
        1u64..40,
        1u64..60,
        1u64..8,
        proptest::collection::vec(op(), 1..60),
    );
    runner
        .run(&strategy, |(mode, duration, retention, max_events, ops)| {
            rt.block_on(async {
                let mut spec =
                    GateSpec::new(gate_id("prop"), mode, Duration::from_millis(duration));
                spec.retention = Duration::from_millis(retention);
                spec.max_events = max_events;
                let g = GateSettings::new(spec).expect("valid gate");
                let clock = ManualClock::new(1000);
                let port = LocalGateProvider::with_settings(
                    GateSet::new([g.clone()]).expect("one gate"),
                    Arc::new(clock.clone()),
                    LocalGateSettings {
                        sweep_on_submit: 0,
                        ..LocalGateSettings::default()
                    },
                );
                let mut model = GateState::new(g.clone());
                let mut log = Vec::new();
                let gate = g.id().clone();
                let mut now = 1000;
                for op in &ops {
                    let dt = match op {
                        Op::Submit { dt, .. } | Op::Publish { dt } | Op::Sweep { dt } => *dt,
                        Op::Snapshot => 0,
                    };
                    now += dt;
                    clock.set(now);
                    if !matches!(op, Op::Publish { .. }) {
                        log.extend(model.publish_due(now, usize::MAX).expect("in range"));
                    }
                    match op {
                        Op::Submit { key: k, id, .. } => {
                            let (k, id) = (key(&format!("k{k}")), event_id(&format!("e{id}")));
                            let expected = match model.submit(k.clone(), id.clone(), now) {
                                Ok(s) => {
                                    log.extend(s.update);
                                    GateOutcome::Evaluated(s.outcome)
                                }
                                Err(e) => e.outcome(),
                            };
                            let got = port
                                .submit(SubmitRequest {
                                    gate: gate.clone(),
                                    key: k,
                                    id,
                                    deadline: deadline(),
                                })
                                .await
                                .expect("known gate");
                            prop_assert_eq!(got, expected);
                        }
                        Op::Publish { .. } => {
                            let u = model.publish_due(now, 3).expect("in range");
                            let n = u.len();
                            log.extend(u);
                            let got = port.publish_due(&gate, nz(3), deadline()).await;
                            prop_assert_eq!(got, Ok(GateOutcome::Evaluated(n)));
                        }
                        Op::Sweep { .. } => {
                            let n = model.sweep(now, 5).expect("in range").removed.len();
                            let got = port.sweep(&gate, nz(5), deadline()).await;
                            prop_assert_eq!(got, Ok(GateOutcome::Evaluated(n)));
                        }
                        Op::Snapshot => {
                            let got = port.snapshot(&gate, deadline()).await;
                            prop_assert_eq!(got, Ok(GateOutcome::Evaluated(model.snapshot())));
                        }
                    }
                }
                let d = Deadline::within(Duration::from_millis(10)).expect("deadline");
                let got = port
                    .updates_after(&gate, GateClock::ZERO, nz(10_000), d)
                    .await;
                match got {
                    Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => {
                        // The final read published what was due by then, too.
                        log.extend(model.publish_due(now, usize::MAX).expect("in range"));
                        prop_assert_eq!(u, log);
                    }
                    other => return Err(TestCaseError::fail(format!("{other:?}"))),
                }
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cursor_older_than_the_kept_log_asks_for_a_resync() {
    let g = settings(&unique("ring"), GateMode::OnlyOnce, 100, 1000);
    let gate = g.id().clone();
    let clock = ManualClock::new(1000);
    let port = LocalGateProvider::with_settings(
        GateSet::new([g]).expect("one gate"),
        Arc::new(clock.clone()),
        LocalGateSettings {
            log_capacity: 4,
            ..LocalGateSettings::default()
        },
    );
    for i in 0..6 {
        submit(&port, &gate, &format!("k{i}"), &format!("e{i}")).await;
    }
    let short = || Deadline::within(Duration::from_millis(20)).expect("deadline");
    let at = |c| GateClock::new(c).expect("clock");
    let r = port.updates_after(&gate, at(1), nz(10), short()).await;
    assert_eq!(r, Ok(GateOutcome::Evaluated(UpdateBatch::Resync)));
    match port.updates_after(&gate, at(2), nz(10), short()).await {
        Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => {
            assert_eq!(
                u.iter().map(|u| u.clock.get()).collect::<Vec<_>>(),
                [3, 4, 5, 6]
            );
        }
        other => panic!("{other:?}"),
    }
    let r = port.updates_after(&gate, at(7), nz(10), short()).await;
    assert_eq!(
        r,
        Ok(GateOutcome::Evaluated(UpdateBatch::Resync)),
        "cursor above the clock"
    );
}
