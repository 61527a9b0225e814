//! The event-gate reference model: the seed's two examples verbatim (scaled to milliseconds),
//! the boundaries `docs/event-gates.md` fixes, and property tests of random event sequences
//! checked against an independent statement of both modes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use shared_contract::decision::{IncompatibleCategory, UnavailableCategory};
use shared_contract::gate::{
    Applied, EventId, EventKey, EventStatus, GateClock, GateError, GateId, GateMode, GateOutcome,
    GateSettings, GateSpec, GateState, Replica, ReplicaError, SnapshotApplied, StatusUpdate,
    Submission, SubmitOutcome,
};
use shared_contract::policy::{MAX_DURATION_MS, MAX_TIME_MS};

fn settings(mode: GateMode, duration_ms: u64) -> GateSettings {
    GateSettings::new(GateSpec::new(
        GateId::new("orders").expect("valid gate id"),
        mode,
        Duration::from_millis(duration_ms),
    ))
    .expect("valid settings")
}

fn key(k: &str) -> EventKey {
    EventKey::new(k).expect("valid key")
}

fn id(i: &str) -> EventId {
    EventId::new(i).expect("valid id")
}

fn submit(gate: &mut GateState, k: &str, i: &str, now: u64) -> Submission {
    gate.submit(key(k), id(i), now)
        .expect("gate accepts the submission")
}

fn status(gate: &GateState, i: &str) -> Option<EventStatus> {
    gate.event(&id(i)).map(|r| r.status)
}

/// The seed's input: duration 3, events {1,apple},{2,taco},{3,taco},{4,taco},{7,taco}, with
/// seconds scaled to milliseconds. A timely publisher runs before every receipt.
fn run_seed_example(mode: GateMode) -> (GateState, Vec<(&'static str, SubmitOutcome)>) {
    let mut gate = GateState::new(settings(mode, 3_000));
    let events = [
        (1_000, "apple", "e1"),
        (2_000, "taco", "e2"),
        (3_000, "taco", "e3"),
        (4_000, "taco", "e4"),
        (7_000, "taco", "e7"),
    ];
    let mut answers = Vec::new();
    for (at, k, i) in events {
        gate.publish_due(at, 100).expect("publish");
        answers.push((i, submit(&mut gate, k, i, at).outcome));
    }
    gate.publish_due(100_000, 100).expect("publish");
    (gate, answers)
}

fn submitted_ids(answers: &[(&'static str, SubmitOutcome)]) -> Vec<&'static str> {
    answers
        .iter()
        .filter(|(_, o)| matches!(o, SubmitOutcome::Submitted { .. }))
        .map(|(i, _)| *i)
        .collect()
}

#[test]
fn seed_only_once_example_allows_1_apple_2_taco_7_taco() {
    let (gate, answers) = run_seed_example(GateMode::OnlyOnce);
    assert_eq!(submitted_ids(&answers), vec!["e1", "e2", "e7"]);
    // 3 and 4 fall within 3 s of the last submitted taco (2).
    for (i, o) in &answers {
        if let SubmitOutcome::Rejected { conflicts_with, .. } = o {
            assert_eq!(conflicts_with, &id("e2"), "{i}");
        }
    }
    for i in ["e1", "e2", "e7"] {
        assert_eq!(status(&gate, i), Some(EventStatus::Published), "{i}");
    }
    assert_eq!(
        status(&gate, "e3"),
        None,
        "a rejected event never enters the lifecycle"
    );
    assert_eq!(status(&gate, "e4"), None);
}

#[test]
fn seed_strictly_once_example_publishes_only_1_apple_and_7_taco() {
    let (gate, answers) = run_seed_example(GateMode::StrictlyOnce);
    assert_eq!(submitted_ids(&answers), vec!["e1", "e2", "e7"]);
    let conflicts: BTreeMap<&str, EventId> = answers
        .iter()
        .filter_map(|(i, o)| match o {
            SubmitOutcome::Rejected { conflicts_with, .. } => Some((*i, conflicts_with.clone())),
            _ => None,
        })
        .collect();
    // 3 conflicts with 2 (and invalidates it); 4 with 3, the last received taco.
    assert_eq!(conflicts.get("e3"), Some(&id("e2")));
    assert_eq!(conflicts.get("e4"), Some(&id("e3")));
    assert_eq!(status(&gate, "e1"), Some(EventStatus::Published));
    assert_eq!(status(&gate, "e2"), Some(EventStatus::Invalidated));
    assert_eq!(status(&gate, "e7"), Some(EventStatus::Published));
    let published: Vec<_> = ["e1", "e2", "e3", "e4", "e7"]
        .into_iter()
        .filter(|i| status(&gate, i) == Some(EventStatus::Published))
        .collect();
    assert_eq!(published, vec!["e1", "e7"]);
}

/// The seed's input again, with every clock value the gate hands out, as
/// `docs/event-gates.md` works it: `(clock, id, what)`.
fn seed_clock_sequence(mode: GateMode) -> Vec<(u64, String, &'static str)> {
    let mut gate = GateState::new(settings(mode, 3_000));
    let mut out = Vec::new();
    let record = |u: &StatusUpdate, out: &mut Vec<_>| {
        out.push((u.clock.get(), u.id.to_string(), u.status.as_str()));
    };
    for (at, k, i) in [
        (1_000, "apple", "e1"),
        (2_000, "taco", "e2"),
        (3_000, "taco", "e3"),
        (4_000, "taco", "e4"),
        (7_000, "taco", "e7"),
    ] {
        for u in gate.publish_due(at, 100).expect("publish") {
            record(&u, &mut out);
        }
        let s = submit(&mut gate, k, i, at);
        if let Some(u) = s
            .update
            .as_ref()
            .filter(|u| u.status != EventStatus::Submitted)
        {
            record(u, &mut out);
        }
        let what = match s.outcome {
            SubmitOutcome::Submitted { .. } => "submitted",
            SubmitOutcome::Rejected { .. } => "rejected",
            SubmitOutcome::Duplicate(_) => "duplicate",
        };
        out.push((s.outcome.clock().get(), i.to_string(), what));
    }
    for u in gate.publish_due(10_000, 100).expect("publish") {
        record(&u, &mut out);
    }
    out
}

#[test]
fn seed_examples_hand_out_the_documented_clock_values() {
    let s = |v: &[(u64, &str, &'static str)]| {
        v.iter()
            .map(|(c, i, w)| (*c, i.to_string(), *w))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        seed_clock_sequence(GateMode::OnlyOnce),
        s(&[
            (1, "e1", "submitted"),
            (2, "e2", "submitted"),
            (3, "e3", "rejected"),
            (4, "e1", "published"),
            (5, "e4", "rejected"),
            (6, "e2", "published"),
            (7, "e7", "submitted"),
            (8, "e7", "published"),
        ])
    );
    assert_eq!(
        seed_clock_sequence(GateMode::StrictlyOnce),
        s(&[
            (1, "e1", "submitted"),
            (2, "e2", "submitted"),
            (3, "e2", "invalidated"),
            (4, "e3", "rejected"),
            (5, "e1", "published"),
            (6, "e4", "rejected"),
            (7, "e7", "submitted"),
            (8, "e7", "published"),
        ])
    );
}

#[test]
fn events_exactly_duration_apart_do_not_conflict_one_ms_less_does() {
    for mode in GateMode::ALL {
        let mut gate = GateState::new(settings(mode, 3_000));
        submit(&mut gate, "taco", "a", 1_000);
        let at_boundary = submit(&mut gate, "taco", "b", 4_000).outcome;
        assert!(
            matches!(at_boundary, SubmitOutcome::Submitted { .. }),
            "{mode}"
        );
        let inside = submit(&mut gate, "taco", "c", 6_999).outcome;
        assert!(matches!(inside, SubmitOutcome::Rejected { .. }), "{mode}");
    }
}

#[test]
fn an_event_cannot_be_invalidated_from_its_publish_time_on_even_if_the_publisher_lags() {
    let mut gate = GateState::new(settings(GateMode::StrictlyOnce, 3_000));
    submit(&mut gate, "taco", "a", 1_000);
    // No publisher ran; "b" arrives exactly at a's publish time.
    let b = submit(&mut gate, "taco", "b", 4_000);
    assert!(matches!(b.outcome, SubmitOutcome::Submitted { .. }));
    assert_eq!(status(&gate, "a"), Some(EventStatus::Submitted));
    let published = gate.publish_due(4_000, 10).expect("publish");
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].id, id("a"));
    assert_eq!(status(&gate, "a"), Some(EventStatus::Published));
}

#[test]
fn strictly_once_window_runs_from_the_last_received_event_only_once_from_the_last_submitted() {
    // Receipts every 2 s with duration 3 s: strictly_once rejects all but the first for as
    // long as they keep coming; only_once lets every other one through.
    let times = [0u64, 2_000, 4_000, 6_000, 8_000];
    let fates = |mode| {
        let mut gate = GateState::new(settings(mode, 3_000));
        times
            .iter()
            .enumerate()
            .map(|(n, t)| {
                matches!(
                    submit(&mut gate, "k", &format!("e{n}"), *t).outcome,
                    SubmitOutcome::Submitted { .. }
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        fates(GateMode::OnlyOnce),
        vec![true, false, true, false, true]
    );
    assert_eq!(
        fates(GateMode::StrictlyOnce),
        vec![true, false, false, false, false]
    );
}

#[test]
fn strictly_once_invalidation_takes_its_clock_before_the_rejection_answer() {
    let mut gate = GateState::new(settings(GateMode::StrictlyOnce, 3_000));
    let a = submit(&mut gate, "taco", "a", 1_000);
    assert_eq!(a.outcome.clock().get(), 1);
    let b = submit(&mut gate, "taco", "b", 2_000);
    let update = b.update.expect("the rejection invalidates a");
    assert_eq!(update.id, id("a"));
    assert_eq!(update.status, EventStatus::Invalidated);
    assert_eq!(update.clock.get(), 2);
    assert_eq!(b.outcome.clock().get(), 3);
    assert_eq!(gate.clock().get(), 3);
    assert_eq!(gate.event(&id("a")).map(|r| r.clock.get()), Some(2));
    // The next rejection has nothing incubating to invalidate.
    let c = submit(&mut gate, "taco", "c", 3_000);
    assert_eq!(c.update, None);
    assert_eq!(c.outcome.clock().get(), 4);
}

#[test]
fn an_only_once_rejection_consumes_a_clock_value_and_nothing_else() {
    let mut gate = GateState::new(settings(GateMode::OnlyOnce, 3_000));
    submit(&mut gate, "taco", "a", 1_000);
    let before = gate.snapshot();
    let b = submit(&mut gate, "taco", "b", 2_000);
    assert_eq!(
        b.outcome,
        SubmitOutcome::Rejected {
            clock: GateClock::new(2).expect("clock"),
            conflicts_with: id("a"),
        }
    );
    assert_eq!(b.update, None);
    assert_eq!(gate.snapshot().incubating, before.incubating);
    assert_eq!(gate.clock().get(), 2);
}

#[test]
fn a_known_id_is_a_duplicate_that_changes_nothing_until_its_retention_ends() {
    let mut spec = GateSpec::new(
        GateId::new("orders").expect("id"),
        GateMode::OnlyOnce,
        Duration::from_millis(3_000),
    );
    spec.retention = Duration::from_millis(10_000);
    let mut gate = GateState::new(GateSettings::new(spec).expect("settings"));
    let first = submit(&mut gate, "taco", "a", 1_000);
    let before = gate.clone();
    let retry = submit(&mut gate, "taco", "a", 1_500);
    match &retry.outcome {
        SubmitOutcome::Duplicate(r) => {
            assert_eq!(r.status, EventStatus::Submitted);
            // The retry answers the same clock the first submission got.
            assert_eq!(r.clock, first.outcome.clock());
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert_eq!(retry.update, None);
    assert_eq!(
        gate, before,
        "a duplicate changes nothing, not even the clock"
    );

    gate.publish_due(4_000, 10).expect("publish");
    let after_publish = submit(&mut gate, "pizza", "a", 5_000).outcome;
    assert!(
        matches!(&after_publish, SubmitOutcome::Duplicate(r) if r.status == EventStatus::Published),
        "{after_publish:?}"
    );
    // Published at 4 000, kept for 10 000: still held at 13 999, removed at 14 000.
    assert!(gate.sweep(13_999, 10).expect("sweep").removed.is_empty());
    assert_eq!(
        gate.sweep(14_000, 10).expect("sweep").removed,
        vec![id("a")]
    );
    assert_eq!(gate.event(&id("a")), None);
    let reused = submit(&mut gate, "taco", "a", 14_000).outcome;
    assert!(matches!(reused, SubmitOutcome::Submitted { .. }));
}

#[test]
fn the_conditional_delete_never_removes_an_incubating_event() {
    let mut gate = GateState::new(settings(GateMode::OnlyOnce, 3_000));
    submit(&mut gate, "taco", "a", 1_000);
    submit(&mut gate, "pizza", "b", 1_000);
    gate.publish_due(4_000, 1).expect("publish one");
    assert!(gate.remove_terminal_older_than(u64::MAX, 100).len() == 1);
    assert_eq!(gate.incubating_len(), 1);
    assert_eq!(gate.len(), 1);
}

#[test]
fn publish_due_is_bounded_and_in_due_order() {
    let mut gate = GateState::new(settings(GateMode::OnlyOnce, 1_000));
    for (n, t) in [(3, 30), (1, 10), (2, 20), (4, 20)] {
        submit(&mut gate, &format!("k{n}"), &format!("e{n}"), t);
    }
    // Time is clamped to the latest seen (30); all are due by 1 030.
    assert_eq!(gate.next_due_ms(), Some(1_030));
    let first = gate.publish_due(5_000, 2).expect("publish");
    let second = gate.publish_due(5_000, 2).expect("publish");
    let ids: Vec<_> = first.iter().chain(&second).map(|u| u.id.clone()).collect();
    // All were received at the gate time 30 (clamped), so due order is by id.
    assert_eq!(ids, vec![id("e1"), id("e2"), id("e3"), id("e4")]);
    assert!(
        first
            .iter()
            .chain(&second)
            .all(|u| u.status == EventStatus::Published)
    );
    assert!(gate.publish_due(5_000, 2).expect("publish").is_empty());
}

#[test]
fn clock_regression_within_the_bound_is_clamped_beyond_it_changes_nothing() {
    let mut gate = GateState::new(settings(GateMode::OnlyOnce, 3_000));
    submit(&mut gate, "taco", "a", 10_000);
    // 2 s back (the default bound) is clamped to 10 000.
    let b = submit(&mut gate, "pizza", "b", 8_000);
    assert_eq!(b.now_ms, 10_000);
    let before = gate.clone();
    let err = gate.submit(key("soup"), id("c"), 7_999);
    assert_eq!(
        err,
        Err(GateError::ClockBehind {
            now_ms: 7_999,
            last_ms: 10_000,
            max_ms: 2_000
        })
    );
    assert_eq!(gate, before);
    assert!(gate.publish_due(7_000, 10).is_err());
    assert!(gate.sweep(7_000, 10).is_err());
    assert_eq!(gate, before);
}

#[test]
fn a_full_gate_refuses_new_events_but_still_answers_rejections() {
    let mut spec = GateSpec::new(
        GateId::new("orders").expect("id"),
        GateMode::StrictlyOnce,
        Duration::from_millis(3_000),
    );
    spec.max_events = 2;
    spec.retention = Duration::from_millis(1);
    let mut gate = GateState::new(GateSettings::new(spec).expect("settings"));
    submit(&mut gate, "a", "1", 0);
    submit(&mut gate, "b", "2", 0);
    let before = gate.clone();
    assert_eq!(
        gate.submit(key("c"), id("3"), 0),
        Err(GateError::Full { max: 2 })
    );
    assert_eq!(gate, before, "a refusal changes nothing");
    // A conflicting event needs no room: it is rejected and invalidates "1".
    let r = submit(&mut gate, "a", "4", 1);
    assert!(matches!(r.outcome, SubmitOutcome::Rejected { .. }));
    assert_eq!(status(&gate, "1"), Some(EventStatus::Invalidated));
    // Once "1" is past its retention it is removed, but the two live key windows still fill
    // the bound: a window must outlive its events to keep rejecting.
    let sweep = gate.sweep(2, 10).expect("sweep");
    assert_eq!(sweep.removed, vec![id("1")]);
    assert_eq!(
        gate.submit(key("c"), id("3"), 2),
        Err(GateError::Full { max: 2 })
    );
    // When both windows have lapsed there is room again.
    gate.publish_due(3_001, 10).expect("publish");
    assert!(matches!(
        submit(&mut gate, "c", "3", 3_001).outcome,
        SubmitOutcome::Submitted { .. }
    ));
    assert_eq!(gate.window_count(), 1, "lapsed windows were pruned");
}

#[test]
fn the_whole_time_range_stays_exact() {
    let mut spec = GateSpec::new(
        GateId::new("orders").expect("id"),
        GateMode::StrictlyOnce,
        Duration::from_millis(MAX_DURATION_MS),
    );
    spec.retention = Duration::from_millis(MAX_DURATION_MS);
    let mut gate = GateState::new(GateSettings::new(spec).expect("settings"));
    let s = submit(&mut gate, "k", "a", MAX_TIME_MS);
    assert_eq!(
        s.outcome,
        SubmitOutcome::Submitted {
            clock: GateClock::new(1).expect("clock"),
            publish_at_ms: MAX_TIME_MS + MAX_DURATION_MS
        }
    );
    assert_eq!(
        gate.submit(key("k"), id("b"), MAX_TIME_MS + 1),
        Err(GateError::TimeOutOfRange(MAX_TIME_MS + 1))
    );
    assert!(gate.sweep(MAX_TIME_MS, 10).is_ok());
}

#[test]
fn model_refusals_map_to_honest_outcomes() {
    let behind: GateOutcome<()> = GateError::ClockBehind {
        now_ms: 10,
        last_ms: 25,
        max_ms: 5,
    }
    .outcome();
    assert_eq!(
        behind,
        GateOutcome::Unavailable {
            retry_after_ms: 15,
            category: UnavailableCategory::Clock
        }
    );
    assert_eq!(
        GateError::Full { max: 1 }.outcome::<()>().name(),
        "unavailable"
    );
    assert_eq!(
        GateError::StateIncompatible("x").outcome::<()>(),
        GateOutcome::Incompatible {
            category: IncompatibleCategory::State
        }
    );
}

#[test]
fn a_replica_ignores_updates_already_in_its_snapshot_and_reports_misfits() {
    let mut gate = GateState::new(settings(GateMode::StrictlyOnce, 3_000));
    let mut log: Vec<StatusUpdate> = Vec::new();
    log.extend(submit(&mut gate, "taco", "a", 0).update);
    log.extend(submit(&mut gate, "pizza", "b", 0).update);
    let snap = gate.snapshot();
    log.extend(submit(&mut gate, "taco", "c", 1).update);
    log.extend(gate.publish_due(3_000, 10).expect("publish"));

    let mut replica = Replica::from_snapshot(snap.clone());
    assert_eq!(replica.apply(&log[0]), Ok(Applied::Stale));
    for u in &log {
        replica.apply(u).expect("every update fits");
    }
    assert_eq!(replica.snapshot().incubating, gate.snapshot().incubating);
    assert_eq!(
        replica.clone().apply_snapshot(gate.snapshot()),
        SnapshotApplied::Confirmed
    );
    assert_eq!(replica.apply_snapshot(snap.clone()), SnapshotApplied::Stale);

    // A replica that missed the submission of "a" cannot apply its invalidation.
    let mut lost = Replica::new();
    assert!(matches!(
        lost.apply(&log[2]),
        Err(ReplicaError::UnknownEvent { .. })
    ));
    assert_eq!(lost, Replica::new(), "a misfit changes nothing");
    let mut doubled = Replica::from_snapshot(snap);
    let mut resubmit = log[0].clone();
    resubmit.clock = GateClock::new(99).expect("clock");
    assert!(matches!(
        doubled.apply(&resubmit),
        Err(ReplicaError::AlreadyIncubating { .. })
    ));
    let mut wrong = Replica::new();
    wrong.apply(&log[0]).expect("fits");
    let mut same_clock = gate.snapshot();
    same_clock.clock = wrong.clock();
    assert_eq!(wrong.apply_snapshot(same_clock), SnapshotApplied::Diverged);
}

// ---------------------------------------------------------------------------------------
// Property tests.

/// One step of a random run. Keys and ids come from small pools so that conflicts and
/// duplicate ids are frequent.
#[derive(Debug, Clone)]
enum Op {
    Submit {
        key: u8,
        id: u8,
        dt: u64,
        back: u64,
    },
    Publish {
        dt: u64,
        batch: usize,
    },
    Sweep {
        dt: u64,
        batch: usize,
    },
    /// A new subscriber takes a snapshot now.
    Subscribe,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u8..14, 0u64..25, prop_oneof![9 => Just(0u64), 1 => 1u64..8])
            .prop_map(|(key, id, dt, back)| Op::Submit { key, id, dt, back }),
        2 => (0u64..30, 1usize..4).prop_map(|(dt, batch)| Op::Publish { dt, batch }),
        1 => (0u64..30, 1usize..4).prop_map(|(dt, batch)| Op::Sweep { dt, batch }),
        1 => Just(Op::Subscribe),
    ]
}

/// One accepted receipt (submitted or rejected) at its effective gate time.
#[derive(Debug, Clone)]
struct Receipt {
    key: EventKey,
    id: EventId,
    at: u64,
    submitted: bool,
    /// For submitted receipts: the terminal status, once seen.
    fate: Option<EventStatus>,
}

/// A subscriber: from the start (an empty replica) or from a mid-run snapshot.
struct Subscriber {
    replica: Replica,
}

struct Harness {
    gate: GateState,
    mode: GateMode,
    duration: u64,
    /// Every clock value handed out, in emission order.
    clocks: Vec<GateClock>,
    /// Every status update, in emission order.
    log: Vec<StatusUpdate>,
    /// Ids the gate holds, with their status as the updates tell it.
    held: BTreeMap<EventId, EventStatus>,
    /// Index into `receipts` of the incarnation an id currently names.
    incarnation: BTreeMap<EventId, usize>,
    receipts: Vec<Receipt>,
    subscribers: Vec<Subscriber>,
}

impl Harness {
    fn new(gate: GateState) -> Self {
        let mode = gate.settings().mode();
        let duration = gate.settings().duration_ms();
        Self {
            gate,
            mode,
            duration,
            clocks: Vec::new(),
            log: Vec::new(),
            held: BTreeMap::new(),
            incarnation: BTreeMap::new(),
            receipts: Vec::new(),
            subscribers: vec![Subscriber {
                replica: Replica::new(),
            }],
        }
    }

    fn emit_clock(&mut self, c: GateClock) -> Result<(), TestCaseError> {
        if let Some(last) = self.clocks.last() {
            prop_assert!(c > *last, "clock {c} after {last}");
        }
        self.clocks.push(c);
        Ok(())
    }

    fn apply_update(&mut self, u: &StatusUpdate) -> Result<(), TestCaseError> {
        match u.status {
            EventStatus::Submitted => {
                prop_assert!(!self.held.contains_key(&u.id), "{} submitted twice", u.id);
                self.held.insert(u.id.clone(), EventStatus::Submitted);
            }
            terminal => {
                // Terminal states never change: only an incubating event may end.
                prop_assert_eq!(self.held.get(&u.id), Some(&EventStatus::Submitted));
                self.held.insert(u.id.clone(), terminal);
                let n = self.incarnation[&u.id];
                self.receipts[n].fate = Some(terminal);
                match terminal {
                    EventStatus::Published => prop_assert!(u.at_ms >= u.publish_at_ms),
                    _ => prop_assert!(u.at_ms < u.publish_at_ms),
                }
            }
        }
        for s in &mut self.subscribers {
            prop_assert_eq!(s.replica.apply(u), Ok(Applied::Applied));
        }
        self.log.push(u.clone());
        Ok(())
    }

    /// The last receipt of `key` that counts for the mode's window.
    fn window_receipt(&self, key: &EventKey) -> Option<&Receipt> {
        self.receipts
            .iter()
            .rev()
            .find(|r| &r.key == key && (self.mode == GateMode::StrictlyOnce || r.submitted))
    }

    fn submit(&mut self, key: EventKey, id: EventId, now: u64) -> Result<(), TestCaseError> {
        let before = self.gate.clone();
        let s = match self.gate.submit(key.clone(), id.clone(), now) {
            Ok(s) => s,
            Err(GateError::ClockBehind { last_ms, .. }) => {
                prop_assert!(now + self.gate.settings().max_clock_regression_ms() < last_ms);
                prop_assert_eq!(&self.gate, &before, "a refusal changes nothing");
                return Ok(());
            }
            Err(GateError::Full { max }) => {
                let max = usize::try_from(max).expect("small bound");
                prop_assert!(before.len() >= max || before.window_count() >= max);
                // Only an event that would be submitted needs room.
                let at = before.last_now_ms().map_or(now, |l| l.max(now));
                let conflict = self
                    .window_receipt(&key)
                    .is_some_and(|r| at < r.at + self.duration);
                prop_assert!(!conflict, "a rejection was refused as Full");
                prop_assert!(
                    !self.held.contains_key(&id),
                    "a duplicate was refused as Full"
                );
                prop_assert_eq!(self.gate.snapshot(), before.snapshot());
                prop_assert_eq!(self.gate.len(), before.len());
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("submit failed: {e}"))),
        };
        let at = s.now_ms;
        if let SubmitOutcome::Duplicate(record) = &s.outcome {
            prop_assert!(self.held.contains_key(&id), "duplicate of an unknown id");
            prop_assert_eq!(Some(&record.status), self.held.get(&id));
            prop_assert_eq!(&self.gate, &before, "a duplicate changes nothing");
            return Ok(());
        }
        prop_assert!(
            !self.held.contains_key(&id),
            "a held id was not a duplicate"
        );
        let window = self
            .window_receipt(&key)
            .filter(|r| at < r.at + self.duration)
            .cloned();
        match (&s.outcome, window) {
            (
                SubmitOutcome::Submitted {
                    clock,
                    publish_at_ms,
                },
                None,
            ) => {
                prop_assert_eq!(*publish_at_ms, at + self.duration);
                let u = s.update.clone().expect("a submission has its update");
                prop_assert_eq!(u.clock, *clock);
                prop_assert_eq!(u.status, EventStatus::Submitted);
                self.emit_clock(*clock)?;
                self.incarnation.insert(id.clone(), self.receipts.len());
                self.receipts.push(Receipt {
                    key,
                    id,
                    at,
                    submitted: true,
                    fate: None,
                });
                self.apply_update(&u)?;
            }
            (
                SubmitOutcome::Rejected {
                    clock,
                    conflicts_with,
                },
                Some(w),
            ) => {
                prop_assert_eq!(conflicts_with, &w.id);
                let invalidates = self.mode == GateMode::StrictlyOnce && w.submitted;
                match (&s.update, invalidates) {
                    (Some(u), true) => {
                        prop_assert_eq!(&u.id, &w.id);
                        prop_assert_eq!(u.status, EventStatus::Invalidated);
                        self.emit_clock(u.clock)?;
                        self.apply_update(u)?;
                    }
                    (None, false) => {}
                    (u, _) => {
                        return Err(TestCaseError::fail(format!(
                            "rejection update {u:?}, expected invalidation: {invalidates}"
                        )));
                    }
                }
                self.emit_clock(*clock)?;
                self.receipts.push(Receipt {
                    key,
                    id,
                    at,
                    submitted: false,
                    fate: None,
                });
            }
            (o, w) => {
                return Err(TestCaseError::fail(format!(
                    "answer {o:?} but the window receipt is {w:?}"
                )));
            }
        }
        Ok(())
    }

    fn publish(&mut self, now: u64, batch: usize) -> Result<(), TestCaseError> {
        let due_before = self
            .gate
            .snapshot()
            .incubating
            .iter()
            .filter(|e| e.publish_at_ms <= now.max(self.gate.last_now_ms().unwrap_or(0)))
            .count();
        let before = self.gate.clone();
        match self.gate.publish_due(now, batch) {
            Ok(updates) => {
                prop_assert_eq!(updates.len(), due_before.min(batch));
                for u in &updates {
                    prop_assert_eq!(u.status, EventStatus::Published);
                    self.emit_clock(u.clock)?;
                    self.apply_update(u)?;
                }
            }
            Err(GateError::ClockBehind { .. }) => prop_assert_eq!(&self.gate, &before),
            Err(e) => return Err(TestCaseError::fail(format!("publish failed: {e}"))),
        }
        Ok(())
    }

    fn sweep(&mut self, now: u64, batch: usize) -> Result<(), TestCaseError> {
        match self.gate.sweep(now, batch) {
            Ok(sweep) => {
                let now = self.gate.last_now_ms().unwrap_or(0);
                for removed in &sweep.removed {
                    let held = self.held.remove(removed);
                    prop_assert!(
                        held.is_some_and(EventStatus::is_terminal),
                        "removed {removed} in state {held:?}"
                    );
                }
                // Every terminal event past its retention is gone unless the batch was full.
                if sweep.removed.len() < batch {
                    let retention = self.gate.settings().retention_ms();
                    for (id, st) in &self.held {
                        if st.is_terminal() {
                            let t = self
                                .gate
                                .event(id)
                                .and_then(|r| r.terminal_at_ms)
                                .expect("held terminal events have a terminal time");
                            prop_assert!(t + retention > now, "{id} outlived its retention");
                        }
                    }
                }
            }
            Err(GateError::ClockBehind { .. }) => {}
            Err(e) => return Err(TestCaseError::fail(format!("sweep failed: {e}"))),
        }
        Ok(())
    }

    fn subscribe(&mut self) -> Result<(), TestCaseError> {
        let mut replica = Replica::from_snapshot(self.gate.snapshot());
        // A late subscriber may see updates its snapshot already reflects: all are ignored.
        for u in &self.log {
            prop_assert_eq!(replica.apply(u), Ok(Applied::Stale));
        }
        self.subscribers.push(Subscriber { replica });
        Ok(())
    }

    /// The invariants that hold after every step.
    fn check(&self) -> Result<(), TestCaseError> {
        if let Some(last) = self.clocks.last() {
            prop_assert_eq!(self.gate.clock(), *last);
        }
        prop_assert_eq!(self.gate.len(), self.held.len());
        for (id, st) in &self.held {
            let record = self.gate.event(id);
            prop_assert_eq!(record.map(|r| r.status), Some(*st));
        }
        let snapshot = self.gate.snapshot();
        let incubating: BTreeSet<_> = snapshot.incubating.iter().map(|e| e.id.clone()).collect();
        let expected: BTreeSet<_> = self
            .held
            .iter()
            .filter(|(_, s)| **s == EventStatus::Submitted)
            .map(|(id, _)| id.clone())
            .collect();
        prop_assert_eq!(incubating, expected);
        for s in &self.subscribers {
            let mine = s.replica.snapshot();
            prop_assert_eq!(&mine.incubating, &snapshot.incubating);
            let expected = if mine.clock == snapshot.clock {
                SnapshotApplied::Confirmed
            } else {
                SnapshotApplied::Replaced
            };
            prop_assert_eq!(s.replica.clone().apply_snapshot(snapshot.clone()), expected);
        }
        if self.mode == GateMode::StrictlyOnce {
            // At most one incubating event per key that is not yet due (a lagging publisher
            // may leave due ones beside it).
            let now = self.gate.last_now_ms().unwrap_or(0);
            let pending: Vec<_> = snapshot
                .incubating
                .iter()
                .filter(|e| e.publish_at_ms > now)
                .collect();
            let keys: BTreeSet<_> = pending.iter().map(|e| e.key.clone()).collect();
            prop_assert_eq!(keys.len(), pending.len());
        }
        Ok(())
    }

    /// After the last publication: every submitted event ended, with the fate the mode gives.
    fn check_fates(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.gate.incubating_len(), 0);
        for (n, r) in self.receipts.iter().enumerate() {
            if !r.submitted {
                prop_assert_eq!(r.fate, None);
                continue;
            }
            let later = self.receipts[n + 1..].iter().filter(|l| l.key == r.key);
            let expected = match self.mode {
                // Nothing can conflict with a submitted only_once event.
                GateMode::OnlyOnce => EventStatus::Published,
                // Published iff the next receipt of its key (any fate) is >= duration later.
                GateMode::StrictlyOnce => match later.clone().next() {
                    Some(next) if next.at < r.at + self.duration => EventStatus::Invalidated,
                    _ => EventStatus::Published,
                },
            };
            prop_assert_eq!(r.fate, Some(expected), "receipt {} ({:?})", n, r);
        }
        // Published events of one key are at least duration apart.
        let mut by_key: BTreeMap<&EventKey, Vec<u64>> = BTreeMap::new();
        for r in &self.receipts {
            if r.fate == Some(EventStatus::Published) {
                by_key.entry(&r.key).or_default().push(r.at);
            }
        }
        for times in by_key.values() {
            for pair in times.windows(2) {
                prop_assert!(pair[1] >= pair[0] + self.duration, "{pair:?}");
            }
        }
        if self.mode == GateMode::StrictlyOnce {
            // No published event had a receipt of its key less than duration away.
            for (n, r) in self.receipts.iter().enumerate() {
                if r.fate != Some(EventStatus::Published) {
                    continue;
                }
                for (m, other) in self.receipts.iter().enumerate() {
                    if m != n && other.key == r.key {
                        prop_assert!(
                            r.at.abs_diff(other.at) >= self.duration,
                            "published {:?} has neighbour {:?}",
                            r,
                            other
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

fn gate_settings() -> impl Strategy<Value = GateSettings> {
    (
        prop_oneof![Just(GateMode::OnlyOnce), Just(GateMode::StrictlyOnce)],
        1u64..40,
        1u64..60,
        0u64..6,
        prop_oneof![3 => Just(10_000u64), 1 => 1u64..6],
    )
        .prop_map(|(mode, d, r, reg, max_events)| {
            let mut spec = GateSpec::new(
                GateId::new("g").expect("id"),
                mode,
                Duration::from_millis(d),
            );
            spec.retention = Duration::from_millis(r);
            spec.max_clock_regression = Duration::from_millis(reg);
            spec.max_events = max_events;
            GateSettings::new(spec).expect("valid settings")
        })
}

fn start_time() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        0u64..2_000_000_000_000,
        Just(MAX_TIME_MS - 100_000)
    ]
}

fn run(settings: GateSettings, start: u64, ops: &[Op]) -> Result<Harness, TestCaseError> {
    let mut h = Harness::new(GateState::new(settings));
    let keys = ["apple", "taco", "🌮"];
    let mut now = start;
    for op in ops {
        match op {
            Op::Submit { key, id, dt, back } => {
                now += dt;
                let t = now.saturating_sub(*back);
                h.submit(
                    EventKey::new(keys[usize::from(*key)]).expect("key"),
                    EventId::new(&format!("e{id}")).expect("id"),
                    t,
                )?;
            }
            Op::Publish { dt, batch } => {
                now += dt;
                h.publish(now, *batch)?;
            }
            Op::Sweep { dt, batch } => {
                now += dt;
                h.sweep(now, *batch)?;
            }
            Op::Subscribe => h.subscribe()?,
        }
        h.check()?;
    }
    // Run the publisher past every publish time: every submitted event must end.
    let end = now + h.duration + 10;
    loop {
        let before = h.log.len();
        h.publish(end, 3)?;
        h.check()?;
        if h.log.len() == before {
            break;
        }
    }
    h.check_fates()?;
    Ok(h)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_gate_invariant(
        settings in gate_settings(),
        start in start_time(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(settings, start, &ops)?;
    }
}
