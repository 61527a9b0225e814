//! The lossless gate stream ([`Feed`]) on both providers: a subscriber never misses the
//! terminal status of an event it was told was submitted.
//!
//! - Deterministic: a port that publishes due events inside `snapshot` (so the snapshot's
//!   clock is above updates the subscriber has not pulled, the moment the periodic snapshot
//!   used to skip) still hands out every `published` update before the snapshot.
//! - Property: random submissions, clock moves, publications and feed steps, with a small
//!   update log (a slow subscriber: the log overflows between its steps, forcing resyncs);
//!   a model subscriber applies every frame to a [`Replica`]. Once the gate is quiet the
//!   replica equals the gate's snapshot and every event seen as submitted was seen to end.
//!   Local with a manual clock; Redis with real time (fewer cases).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use acceptance_tests::gate::{deadline, nz, redis_provider, settings, snapshot, unique};
use acceptance_tests::redis_server::RedisServer;
use adapter_local::{LocalGateProvider, LocalGateSettings};
use adapter_redis::RedisGateSettings;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared_contract::gate::{
    EventGatePort, EventId, EventKey, EventRecord, EventStatus, Feed, FeedTiming, Frame, GateClock,
    GateId, GateMode, GateOutcome, GateRequestError, GateSet, GateSettings, Replica, Snapshot,
    Step, SubmitOutcome, SubmitRequest, UpdateBatch,
};
use shared_contract::{Deadline, ManualClock};

const INTERVAL_MS: u64 = 1000;

/// Local reads answer at once; Redis needs a deadline above its command timeout (1 s here).
const LOCAL_BUDGET: Duration = Duration::from_millis(100);
const REDIS_BUDGET: Duration = Duration::from_millis(1100);

fn timing(budget: Duration) -> FeedTiming {
    FeedTiming {
        snapshot_interval: Duration::from_millis(INTERVAL_MS),
        budget,
        pull_wait: Duration::from_millis(20),
    }
}

/// A port whose `snapshot` first publishes every due event: the updates it makes are never
/// pulled before the snapshot is read.
#[derive(Debug)]
struct PublishingSnapshot(Arc<dyn EventGatePort>);

#[async_trait::async_trait]
impl EventGatePort for PublishingSnapshot {
    fn gates(&self) -> &GateSet {
        self.0.gates()
    }
    async fn submit(
        &self,
        r: SubmitRequest,
    ) -> Result<GateOutcome<SubmitOutcome>, GateRequestError> {
        self.0.submit(r).await
    }
    async fn event(
        &self,
        g: &GateId,
        id: &EventId,
        d: Deadline,
    ) -> Result<GateOutcome<Option<EventRecord>>, GateRequestError> {
        self.0.event(g, id, d).await
    }
    async fn snapshot(
        &self,
        g: &GateId,
        d: Deadline,
    ) -> Result<GateOutcome<Snapshot>, GateRequestError> {
        self.0.publish_due(g, nz(1000), deadline()).await?;
        self.0.snapshot(g, d).await
    }
    async fn updates_after(
        &self,
        g: &GateId,
        after: GateClock,
        max: NonZeroUsize,
        d: Deadline,
    ) -> Result<GateOutcome<UpdateBatch>, GateRequestError> {
        self.0.updates_after(g, after, max, d).await
    }
    async fn publish_due(
        &self,
        g: &GateId,
        max: NonZeroUsize,
        d: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        self.0.publish_due(g, max, d).await
    }
    async fn sweep(
        &self,
        g: &GateId,
        max: NonZeroUsize,
        d: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        self.0.sweep(g, max, d).await
    }
}

/// The model subscriber: a replica of the frames, and which events it saw begin and end.
#[derive(Default)]
struct Subscriber {
    replica: Replica,
    submitted: HashSet<String>,
    ended: HashSet<String>,
    snapshots: usize,
}

impl Subscriber {
    fn take(&mut self, frames: Vec<Frame>) -> Result<(), String> {
        for f in frames {
            match f {
                Frame::Snapshot(s) => {
                    for e in &s.incubating {
                        self.submitted.insert(e.id.as_str().to_owned());
                    }
                    self.snapshots += 1;
                    self.replica.apply_snapshot(s);
                }
                Frame::Status(u) => {
                    let id = u.id.as_str().to_owned();
                    self.replica.apply(&u).map_err(|e| e.to_string())?;
                    if u.status == EventStatus::Submitted {
                        self.submitted.insert(id);
                    } else {
                        self.ended.insert(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Events seen as submitted and never seen to end.
    fn missed(&self) -> Vec<&String> {
        let mut m: Vec<_> = self.submitted.difference(&self.ended).collect();
        m.sort();
        m
    }
}

/// One step of the feed, waiting out (bounded) a provider that asks for it.
async fn step(
    feed: &mut Feed,
    port: &dyn EventGatePort,
    now_ms: u64,
    sub: &mut Subscriber,
) -> Result<(), String> {
    for _ in 0..50 {
        match feed.step(port, now_ms).await.map_err(|e| e.to_string())? {
            Step::Send(frames) => return sub.take(frames),
            Step::Wait(w) => tokio::time::sleep(w).await,
        }
    }
    Err("the provider kept asking to wait".to_owned())
}

async fn submit(port: &dyn EventGatePort, gate: &GateId, k: &str, id: &str) -> bool {
    let r = port
        .submit(SubmitRequest {
            gate: gate.clone(),
            key: EventKey::new(k).expect("key"),
            id: EventId::new(id).expect("id"),
            deadline: deadline(),
        })
        .await;
    matches!(
        r,
        Ok(GateOutcome::Evaluated(SubmitOutcome::Submitted { .. }))
    )
}

/// Submits five events, lets them become due, then steps the feed at the snapshot tick:
/// every `published` update comes before the snapshot whose clock includes it.
async fn the_tick_does_not_skip(
    port: Arc<dyn EventGatePort>,
    gate: GateId,
    budget: Duration,
    due: impl AsyncFn(),
) {
    let port = PublishingSnapshot(port);
    let mut feed = Feed::new(gate.clone(), nz(256), timing(budget));
    let mut sub = Subscriber::default();
    for i in 0..5 {
        assert!(submit(&port, &gate, &format!("k{i}"), &format!("e{i}")).await);
    }
    step(&mut feed, &port, 0, &mut sub)
        .await
        .expect("first snapshot");
    assert_eq!(sub.submitted.len(), 5, "the first snapshot lists the five");
    due().await;
    step(&mut feed, &port, INTERVAL_MS, &mut sub)
        .await
        .expect("the tick");
    assert_eq!(sub.snapshots, 2, "the periodic snapshot was sent");
    assert!(sub.missed().is_empty(), "missed: {:?}", sub.missed());
    assert!(sub.replica.is_empty());
    assert_eq!(sub.replica.snapshot(), snapshot(&port, &gate).await);
}

#[tokio::test]
async fn the_periodic_snapshot_comes_after_the_updates_up_to_its_clock_locally() {
    let g = settings(&unique("tick"), GateMode::OnlyOnce, 100, 60_000);
    let gate = g.id().clone();
    let clock = ManualClock::new(1_000_000);
    let port = LocalGateProvider::new(
        GateSet::new([g]).expect("one gate"),
        Arc::new(clock.clone()),
    );
    the_tick_does_not_skip(Arc::new(port), gate, LOCAL_BUDGET, async || {
        clock.advance(200);
    })
    .await;
}

#[tokio::test]
async fn the_periodic_snapshot_comes_after_the_updates_up_to_its_clock_on_redis() {
    let g = settings(&unique("tick"), GateMode::OnlyOnce, 100, 60_000);
    let gate = g.id().clone();
    let gs = RedisGateSettings {
        run_publisher: false,
        ..RedisGateSettings::default()
    };
    let port = redis_provider(RedisServer::shared().url(), vec![g], gs).await;
    let due = async || tokio::time::sleep(Duration::from_millis(250)).await;
    the_tick_does_not_skip(Arc::new(port), gate, REDIS_BUDGET, due).await;
}

/// A server whose streams are trimmed to the entry: `XADD MAXLEN ~` trims whole nodes only,
/// and a default node holds 100 entries, so a stream bound of 1 alone would keep them all.
fn trimming_server() -> &'static RedisServer {
    static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start_with(&["--stream-node-max-entries", "1"]))
}

/// The Redis resync path: the stream keeps one update, so after five publications the
/// provider no longer holds the updates after the subscriber's cursor and answers `Resync`;
/// the feed then recovers the terminal status of every event the subscriber held (read with
/// the event lookup) before the fresh snapshot.
#[tokio::test]
async fn a_redis_resync_recovers_every_terminal_status() {
    let g = settings(&unique("resync"), GateMode::OnlyOnce, 100, 60_000);
    let gate = g.id().clone();
    let gs = RedisGateSettings {
        run_publisher: false,
        stream_max_len: 1,
        ..RedisGateSettings::default()
    };
    let port = redis_provider(trimming_server().url(), vec![g], gs).await;
    let mut feed = Feed::new(gate.clone(), nz(256), timing(REDIS_BUDGET));
    let mut sub = Subscriber::default();
    for i in 0..5 {
        assert!(submit(&port, &gate, &format!("k{i}"), &format!("e{i}")).await);
    }
    step(&mut feed, &port, 0, &mut sub)
        .await
        .expect("first snapshot");
    assert_eq!(sub.submitted.len(), 5, "the first snapshot lists the five");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let published = port
        .publish_due(&gate, nz(100), deadline())
        .await
        .expect("known gate");
    assert_eq!(published, GateOutcome::Evaluated(5));
    let cursor = feed.cursor().expect("a snapshot was handed out");
    assert_eq!(
        port.updates_after(&gate, cursor, nz(256), deadline())
            .await
            .expect("known gate"),
        GateOutcome::Evaluated(UpdateBatch::Resync),
        "the precondition: the provider lost the updates after the cursor"
    );
    // The step that meets `Resync` hands out nothing and drops the cursor; the next one
    // resyncs.
    for now in 1..=3 {
        step(&mut feed, &port, now, &mut sub).await.expect("resync");
        if sub.snapshots == 2 {
            break;
        }
    }
    assert!(sub.missed().is_empty(), "missed: {:?}", sub.missed());
    assert_eq!(sub.ended.len(), 5);
    assert_eq!(
        sub.snapshots, 2,
        "a fresh snapshot follows the recovered statuses"
    );
    assert!(sub.replica.is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Submit(u8),
    Advance(u16),
    Publish,
    Step(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6).prop_map(Op::Submit),
        2 => (1u16..150).prop_map(Op::Advance),
        1 => Just(Op::Publish),
        2 => (0u16..1500).prop_map(Op::Step),
    ]
}

/// How a run moves time: the local manual clock, or real sleeps on Redis.
enum Time {
    Manual(ManualClock),
    Real,
}

impl Time {
    async fn advance(&self, ms: u64) {
        match self {
            Time::Manual(c) => c.advance(ms),
            Time::Real => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }
}

/// One random run: ops, then quiet (everything due, published), then the feed catches up.
async fn run(
    port: &dyn EventGatePort,
    gate: &GateId,
    time: &Time,
    budget: Duration,
    ops: &[Op],
) -> Result<(), String> {
    let mut feed = Feed::new(gate.clone(), nz(3), timing(budget));
    let mut sub = Subscriber::default();
    let mut now = 0u64;
    for (n, o) in ops.iter().enumerate() {
        match o {
            Op::Submit(k) => {
                submit(port, gate, &format!("k{k}"), &format!("e{n}")).await;
            }
            Op::Advance(ms) => time.advance(u64::from(*ms)).await,
            Op::Publish => {
                port.publish_due(gate, nz(100), deadline())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Op::Step(ms) => {
                now += u64::from(*ms);
                step(&mut feed, port, now, &mut sub).await?;
            }
        }
    }
    time.advance(200).await;
    while port
        .publish_due(gate, nz(100), deadline())
        .await
        .map_err(|e| e.to_string())?
        != GateOutcome::Evaluated(0)
    {}
    let end = snapshot(port, gate).await;
    for _ in 0..200 {
        now += INTERVAL_MS;
        step(&mut feed, port, now, &mut sub).await?;
        if feed.cursor() >= Some(end.clock) && sub.replica.clock() >= end.clock {
            break;
        }
    }
    if sub.replica.snapshot() != end {
        return Err(format!(
            "replica {:?} != gate {end:?}",
            sub.replica.snapshot()
        ));
    }
    if !sub.missed().is_empty() {
        return Err(format!("never saw the end of {:?}", sub.missed()));
    }
    Ok(())
}

fn gate_settings() -> GateSettings {
    settings(&unique("prop"), GateMode::StrictlyOnce, 100, 600_000)
}

#[test]
fn a_slow_local_subscriber_misses_no_terminal_status() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut runner = TestRunner::new(Config::with_cases(64));
    let strategy = prop::collection::vec(op(), 1..60);
    runner
        .run(&strategy, |ops| {
            let g = gate_settings();
            let gate = g.id().clone();
            let clock = ManualClock::new(1_000_000);
            let port = LocalGateProvider::with_settings(
                GateSet::new([g]).expect("one gate"),
                Arc::new(clock.clone()),
                LocalGateSettings {
                    log_capacity: 4,
                    ..LocalGateSettings::default()
                },
            );
            rt.block_on(run(&port, &gate, &Time::Manual(clock), LOCAL_BUDGET, &ops))
                .map_err(TestCaseError::fail)
        })
        .expect("lossless");
}

#[test]
fn a_slow_redis_subscriber_misses_no_terminal_status() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut runner = TestRunner::new(Config::with_cases(6));
    let strategy = prop::collection::vec(op(), 1..20);
    runner
        .run(&strategy, |ops| {
            rt.block_on(async {
                let g = gate_settings();
                let gate = g.id().clone();
                let gs = RedisGateSettings {
                    run_publisher: false,
                    stream_max_len: 1,
                    ..RedisGateSettings::default()
                };
                // Trimmed to the entry, so the slow subscriber really meets resyncs.
                let port = redis_provider(trimming_server().url(), vec![g], gs).await;
                run(&port, &gate, &Time::Real, REDIS_BUDGET, &ops).await
            })
            .map_err(TestCaseError::fail)
        })
        .expect("lossless");
}
