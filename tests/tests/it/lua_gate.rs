//! The event-gate Lua programs (their test build: `now` from the last ARGV) against the
//! reference model `GateState`, on a real redis-server.
//!
//! - The two worked examples of `docs/event-gates.md`, scaled to milliseconds (duration
//!   300 ms, receipts at 100, 200, 300, 400 and 700 ms), give exactly its clock table, with
//!   exact times: the boundary receipt at 700 ms is exactly one duration after the one at 400.
//! - A differential property test: random gates (both modes, small `max_events` so `Full`
//!   happens, zero or small clock regression, short retention) and random sequences of
//!   submissions (few keys and ids, so conflicts, duplicates and ids reused with another key
//!   are common), publications and
//!   sweeps, with time going forward and sometimes back. Every answer must be the model's;
//!   after every step the snapshot must be the model's; at the end every event record and the
//!   whole stream of status updates must be the model's.

use std::cell::Cell;
use std::time::Duration;

use acceptance_tests::gate::{event_id, key};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::gate::keys::GateKeys;
use adapter_redis::gate::programs;
use adapter_redis::gate::reply;
use adapter_redis::script::Script;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::Value;
use shared_contract::gate::{
    EventId, EventKey, EventRecord, EventStatus, GateClock, GateId, GateMode, GateOutcome,
    GateSettings, GateSpec, GateState, Snapshot, StatusUpdate, SubmitOutcome, UpdateBatch,
};

/// One gate driven through the test build of the programs.
struct Lua {
    con: redis::Connection,
    keys: GateKeys,
    gate: GateSettings,
    shas: Vec<String>,
    stream_max_len: u64,
}

const SUBMIT: usize = 0;
const PUBLISH: usize = 1;
const SWEEP: usize = 2;

impl Lua {
    fn new(gate: GateSettings) -> Self {
        let mut con = RedisServer::shared().connection();
        let shas = [&programs::SUBMIT, &programs::PUBLISH, &programs::SWEEP]
            .iter()
            .map(|p: &&Script| {
                let src = p.test_variant().expect("a time block");
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(src)
                    .query::<String>(&mut con)
                    .expect("the test build compiles")
            })
            .collect();
        let keys = GateKeys::new("gt", gate.id()).expect("valid prefix");
        // A gate id is reused across test runs of a shared server: start clean.
        let mut del = redis::cmd("DEL");
        for k in keys.all() {
            del.arg(k);
        }
        del.query::<i64>(&mut con).expect("DEL");
        Self {
            con,
            keys,
            gate,
            shas,
            stream_max_len: 1_000_000,
        }
    }

    fn eval(&mut self, sha: &str, args: &[String]) -> Value {
        let mut c = redis::cmd("EVALSHA");
        c.arg(sha).arg(8);
        for k in self.keys.all() {
            c.arg(k);
        }
        for a in args {
            c.arg(a);
        }
        c.query::<Value>(&mut self.con).expect("the program runs")
    }

    fn common(&self) -> Vec<String> {
        vec![
            self.gate.mode().as_str().to_owned(),
            self.gate.duration_ms().to_string(),
            self.gate.max_clock_regression_ms().to_string(),
        ]
    }

    fn submit(&mut self, now: u64, key: &EventKey, id: &EventId) -> GateOutcome<SubmitOutcome> {
        let mut args = self.common();
        args.extend([
            self.gate.max_events().to_string(),
            self.stream_max_len.to_string(),
            key.as_str().to_owned(),
            id.as_str().to_owned(),
            now.to_string(),
        ]);
        let sha = self.shas[SUBMIT].clone();
        let v = self.eval(&sha, &args);
        reply::submit_of(&v, &self.gate, id, key).expect("a well-formed submit reply")
    }

    fn publish(&mut self, now: u64, batch: usize) -> GateOutcome<usize> {
        let mut args = self.common();
        args.extend([
            batch.to_string(),
            self.stream_max_len.to_string(),
            now.to_string(),
        ]);
        let sha = self.shas[PUBLISH].clone();
        let v = self.eval(&sha, &args);
        reply::publish(&v, batch)
            .expect("a well-formed publish reply")
            .map(|p| p.count)
    }

    fn sweep(&mut self, now: u64, batch: usize) -> GateOutcome<usize> {
        let mut args = self.common();
        args.extend([
            self.gate.retention_ms().to_string(),
            batch.to_string(),
            now.to_string(),
        ]);
        let sha = self.shas[SWEEP].clone();
        let v = self.eval(&sha, &args);
        reply::sweep(&v, batch).expect("a well-formed sweep reply")
    }

    fn snapshot(&mut self) -> Snapshot {
        let mut c = redis::cmd("EVAL");
        c.arg(programs::SNAPSHOT.source).arg(8);
        for k in self.keys.all() {
            c.arg(k);
        }
        c.arg(self.gate.mode().as_str())
            .arg(self.gate.duration_ms().to_string());
        let v: Value = c.query(&mut self.con).expect("snapshot runs");
        match reply::snapshot(&v).expect("a well-formed snapshot") {
            GateOutcome::Evaluated(s) => s,
            other => panic!("snapshot: {other:?}"),
        }
    }

    fn updates(&mut self, after: u64, max: usize) -> UpdateBatch {
        let mut c = redis::cmd("EVAL");
        c.arg(programs::UPDATES.source).arg(8);
        for k in self.keys.all() {
            c.arg(k);
        }
        c.arg(after.to_string()).arg(max.to_string());
        let v: Value = c.query(&mut self.con).expect("updates runs");
        let after = GateClock::new(after).expect("clock");
        match reply::updates(&v, after, max).expect("well-formed updates") {
            GateOutcome::Evaluated(b) => b,
            other => panic!("updates: {other:?}"),
        }
    }

    fn all_updates(&mut self) -> Vec<StatusUpdate> {
        let mut out: Vec<StatusUpdate> = Vec::new();
        loop {
            let after = out.last().map_or(0, |u| u.clock.get());
            match self.updates(after, 100) {
                UpdateBatch::Updates(u) if u.is_empty() => return out,
                UpdateBatch::Updates(u) => out.extend(u),
                UpdateBatch::Resync => panic!("unexpected resync after {after}"),
            }
        }
    }

    fn record(&mut self, id: &EventId) -> Option<EventRecord> {
        let raw: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys.events())
            .arg(id.as_str())
            .query(&mut self.con)
            .expect("HGET");
        raw.map(|r| reply::record(id, &r).expect("a well-formed record"))
    }
}

fn gate(id: &str, mode: GateMode, duration_ms: u64) -> GateSettings {
    GateSettings::new(GateSpec::new(
        GateId::new(id).expect("valid id"),
        mode,
        Duration::from_millis(duration_ms),
    ))
    .expect("valid gate")
}

/// One answer of a worked-example run: clock, kind, and the event it names.
type Answer = (u64, &'static str, String);

/// The receipts of the worked examples of `docs/event-gates.md`, scaled to ms, with a
/// publisher run just before each receipt and at the end, as the document does. Returns the
/// answers and the stream.
fn worked_example(mode: GateMode) -> (Vec<Answer>, Vec<StatusUpdate>, Lua) {
    let mut lua = Lua::new(gate(&format!("example-{}", mode.as_str()), mode, 300));
    let receipts = [
        (100, "apple", "e1"),
        (200, "taco", "e2"),
        (300, "taco", "e3"),
        (400, "taco", "e4"),
        (700, "taco", "e7"),
    ];
    let mut answers = Vec::new();
    for (t, k, i) in receipts {
        assert!(matches!(lua.publish(t, 100), GateOutcome::Evaluated(_)));
        match lua.submit(t, &key(k), &event_id(i)) {
            GateOutcome::Evaluated(SubmitOutcome::Submitted { clock, .. }) => {
                answers.push((clock.get(), "submitted", i.to_owned()));
            }
            GateOutcome::Evaluated(SubmitOutcome::Rejected {
                clock,
                conflicts_with,
            }) => answers.push((clock.get(), "rejected", conflicts_with.to_string())),
            other => panic!("{i}: {other:?}"),
        }
    }
    assert_eq!(lua.publish(1000, 100), GateOutcome::Evaluated(1));
    let updates = lua.all_updates();
    (answers, updates, lua)
}

/// Runs the worked example in `mode` and checks its answers and its stream of updates, each
/// with its clock; returns the gate for the records.
fn worked_example_gives(
    mode: GateMode,
    answers: [(u64, &'static str, &str); 5],
    updates: [(u64, &str, EventStatus); 6],
) -> Lua {
    let (got_answers, got_updates, lua) = worked_example(mode);
    let answers: Vec<Answer> = answers
        .iter()
        .map(|&(c, kind, id)| (c, kind, id.to_owned()))
        .collect();
    assert_eq!(got_answers, answers);
    let updates: Vec<(u64, String, EventStatus)> = updates
        .iter()
        .map(|&(c, id, status)| (c, id.to_owned(), status))
        .collect();
    let got: Vec<(u64, String, EventStatus)> = got_updates
        .iter()
        .map(|u| (u.clock.get(), u.id.to_string(), u.status))
        .collect();
    assert_eq!(got, updates);
    lua
}

#[test]
fn only_once_worked_example_submits_e1_e2_e7_with_the_documented_clocks() {
    use EventStatus::*;
    let mut lua = worked_example_gives(
        GateMode::OnlyOnce,
        [
            (1, "submitted", "e1"),
            (2, "submitted", "e2"),
            (3, "rejected", "e2"),
            (5, "rejected", "e2"),
            (7, "submitted", "e7"),
        ],
        [
            (1, "e1", Submitted),
            (2, "e2", Submitted),
            (4, "e1", Published),
            (6, "e2", Published),
            (7, "e7", Submitted),
            (8, "e7", Published),
        ],
    );
    for id in ["e1", "e2", "e7"] {
        assert_eq!(lua.record(&event_id(id)).map(|r| r.status), Some(Published));
    }
    for id in ["e3", "e4"] {
        assert_eq!(
            lua.record(&event_id(id)),
            None,
            "a rejected event is not held"
        );
    }
}

#[test]
fn strictly_once_worked_example_publishes_only_e1_and_e7() {
    use EventStatus::*;
    let mut lua = worked_example_gives(
        GateMode::StrictlyOnce,
        [
            (1, "submitted", "e1"),
            (2, "submitted", "e2"),
            (4, "rejected", "e2"),
            (6, "rejected", "e3"),
            (7, "submitted", "e7"),
        ],
        [
            (1, "e1", Submitted),
            (2, "e2", Submitted),
            (3, "e2", Invalidated),
            (5, "e1", Published),
            (7, "e7", Submitted),
            (8, "e7", Published),
        ],
    );
    assert_eq!(
        lua.record(&event_id("e2")).map(|r| r.status),
        Some(Invalidated)
    );
    assert_eq!(
        lua.record(&event_id("e7")).map(|r| r.status),
        Some(Published)
    );
}

#[test]
fn state_of_another_mode_or_duration_is_incompatible_and_untouched() {
    let mut lua = Lua::new(gate("mode-switch", GateMode::OnlyOnce, 300));
    assert!(matches!(
        lua.submit(100, &key("k"), &event_id("a")),
        GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
    ));
    let before = lua.snapshot();
    lua.gate = gate("mode-switch", GateMode::StrictlyOnce, 300);
    assert_eq!(
        lua.submit(150, &key("k"), &event_id("b")),
        GateOutcome::Incompatible {
            category: shared_contract::IncompatibleCategory::State
        }
    );
    lua.gate = gate("mode-switch", GateMode::OnlyOnce, 301);
    assert!(matches!(
        lua.publish(1000, 10),
        GateOutcome::Incompatible { .. }
    ));
    lua.gate = gate("mode-switch", GateMode::OnlyOnce, 300);
    assert_eq!(lua.snapshot(), before);
}

#[test]
fn a_held_id_with_another_key_is_id_reused_and_changes_nothing_as_in_the_model() {
    let settings = gate("id-reuse", GateMode::StrictlyOnce, 300);
    let mut model = GateState::new(settings.clone());
    let mut lua = Lua::new(settings);
    let (alpha, beta, dup) = (key("alpha"), key("beta"), event_id("dup-1"));
    let first = lua.submit(100, &alpha, &dup);
    assert!(matches!(
        first,
        GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
    ));
    model
        .submit(alpha.clone(), dup.clone(), 100)
        .expect("model submits");
    let (before, stream) = (lua.snapshot(), lua.all_updates());
    let expected = model
        .submit(beta.clone(), dup.clone(), 150)
        .expect("model answers");
    let got = lua.submit(150, &beta, &dup);
    assert_eq!(got, GateOutcome::Evaluated(expected.outcome.clone()));
    match got {
        GateOutcome::Evaluated(SubmitOutcome::IdReused(r)) => assert_eq!(r.key, alpha),
        other => panic!("expected a reused id, got {other:?}"),
    }
    assert_eq!((lua.snapshot(), lua.all_updates()), (before, stream));
    // The same id and key is still a retry.
    assert!(matches!(
        lua.submit(160, &alpha, &dup),
        GateOutcome::Evaluated(SubmitOutcome::Duplicate(_))
    ));
}

#[test]
fn a_stream_trimmed_past_the_cursor_asks_for_a_resync() {
    let mut lua = Lua::new(gate("trimmed", GateMode::OnlyOnce, 10));
    lua.stream_max_len = 1;
    for i in 0..300u64 {
        let id = event_id(&format!("e{i}"));
        assert!(matches!(
            lua.submit(1000 + i * 20, &key(&format!("k{i}")), &id),
            GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
        ));
    }
    assert_eq!(lua.updates(0, 10), UpdateBatch::Resync);
    // From the tip there is nothing to miss.
    assert_eq!(lua.updates(300, 10), UpdateBatch::Updates(Vec::new()));
    assert_eq!(
        lua.updates(301, 10),
        UpdateBatch::Resync,
        "cursor above the clock"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Submit { key: u8, id: u8, dt: u64 },
    Publish { dt: u64, batch: usize },
    Sweep { dt: u64, batch: usize },
    Back { by: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0u8..12, 0u64..25).prop_map(|(key, id, dt)| Op::Submit { key, id, dt }),
        2 => (0u64..40, 1usize..4).prop_map(|(dt, batch)| Op::Publish { dt, batch }),
        1 => (0u64..60, 1usize..4).prop_map(|(dt, batch)| Op::Sweep { dt, batch }),
        1 => (0u64..12).prop_map(|by| Op::Back { by }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    mode: GateMode,
    duration_ms: u64,
    retention_ms: u64,
    max_events: u64,
    max_regression_ms: u64,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(GateMode::OnlyOnce), Just(GateMode::StrictlyOnce)],
        1u64..40,
        1u64..60,
        1u64..8,
        prop_oneof![Just(0u64), 0u64..10],
        proptest::collection::vec(op(), 1..60),
    )
        .prop_map(
            |(mode, duration_ms, retention_ms, max_events, max_regression_ms, ops)| Case {
                mode,
                duration_ms,
                retention_ms,
                max_events,
                max_regression_ms,
                ops,
            },
        )
}

fn run_case(n: u64, case: &Case, reused: &Cell<u64>) -> Result<(), TestCaseError> {
    let mut spec = GateSpec::new(
        GateId::new(&format!("diff-{n}")).expect("valid id"),
        case.mode,
        Duration::from_millis(case.duration_ms),
    );
    spec.retention = Duration::from_millis(case.retention_ms);
    spec.max_events = case.max_events;
    spec.max_clock_regression = Duration::from_millis(case.max_regression_ms);
    let settings = GateSettings::new(spec).expect("valid gate");
    let mut model = GateState::new(settings.clone());
    let mut lua = Lua::new(settings);
    let mut log: Vec<StatusUpdate> = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    let mut now = 1_000u64;
    for (step, op) in case.ops.iter().enumerate() {
        match *op {
            Op::Submit { key: k, id, dt } => {
                now += dt;
                let (k, id) = (key(&format!("k{k}")), event_id(&format!("e{id}")));
                ids.insert(id.clone());
                let expected = match model.submit(k.clone(), id.clone(), now) {
                    Ok(s) => {
                        log.extend(s.update);
                        GateOutcome::Evaluated(s.outcome)
                    }
                    Err(e) => e.outcome(),
                };
                if matches!(expected, GateOutcome::Evaluated(SubmitOutcome::IdReused(_))) {
                    reused.set(reused.get() + 1);
                }
                let got = lua.submit(now, &k, &id);
                prop_assert_eq!(got, expected, "step {} {:?} at {}", step, op, now);
            }
            Op::Publish { dt, batch } => {
                now += dt;
                let expected = match model.publish_due(now, batch) {
                    Ok(u) => {
                        let n = u.len();
                        log.extend(u);
                        GateOutcome::Evaluated(n)
                    }
                    Err(e) => e.outcome(),
                };
                prop_assert_eq!(lua.publish(now, batch), expected, "step {} {:?}", step, op);
            }
            Op::Sweep { dt, batch } => {
                now += dt;
                let expected = match model.sweep(now, batch) {
                    Ok(s) => GateOutcome::Evaluated(s.removed.len()),
                    Err(e) => e.outcome(),
                };
                prop_assert_eq!(lua.sweep(now, batch), expected, "step {} {:?}", step, op);
            }
            Op::Back { by } => now = now.saturating_sub(by),
        }
        prop_assert_eq!(
            lua.snapshot(),
            model.snapshot(),
            "snapshot after step {}",
            step
        );
    }
    for id in &ids {
        prop_assert_eq!(lua.record(id), model.event(id).cloned(), "record {}", id);
    }
    prop_assert_eq!(lua.all_updates(), log, "stream");
    prop_assert_eq!(lua.snapshot().clock, model.clock());
    Ok(())
}

#[test]
fn programs_match_the_model_on_random_sequences() {
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let counter = Cell::new(0u64);
    let reused = Cell::new(0u64);
    runner
        .run(&case(), |case| {
            counter.set(counter.get() + 1);
            run_case(counter.get(), &case, &reused)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Few keys and ids: the sequences reuse held ids with other keys, and both agree on it.
    assert!(
        reused.get() > 0,
        "no sequence reused an id with another key"
    );
}
