//! The event-gate reference model: the two worked examples of `docs/event-gates.md` verbatim
//! (scaled to milliseconds) and the boundaries the document fixes. Property tests of random
//! event sequences are in `gate_model_properties.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

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

/// The receipts of the worked examples of `docs/event-gates.md`: duration 3, events
/// {1,apple},{2,taco},{3,taco},{4,taco},{7,taco}, with seconds scaled to milliseconds.
const RECEIPTS: [(u64, &str, &str); 5] = [
    (1_000, "apple", "e1"),
    (2_000, "taco", "e2"),
    (3_000, "taco", "e3"),
    (4_000, "taco", "e4"),
    (7_000, "taco", "e7"),
];

/// The worked example in `mode`: a timely publisher runs before every receipt.
fn run_worked_example(mode: GateMode) -> (GateState, Vec<(&'static str, SubmitOutcome)>) {
    let mut gate = GateState::new(settings(mode, 3_000));
    let mut answers = Vec::new();
    for (at, k, i) in RECEIPTS {
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
fn only_once_worked_example_allows_1_apple_2_taco_7_taco() {
    let (gate, answers) = run_worked_example(GateMode::OnlyOnce);
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
fn strictly_once_worked_example_publishes_only_1_apple_and_7_taco() {
    let (gate, answers) = run_worked_example(GateMode::StrictlyOnce);
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

/// The worked example again, with every clock value the gate hands out, as
/// `docs/event-gates.md` works it: `(clock, id, what)`.
fn clock_sequence(mode: GateMode) -> Vec<(u64, String, &'static str)> {
    let mut gate = GateState::new(settings(mode, 3_000));
    let mut out = Vec::new();
    let record = |u: &StatusUpdate, out: &mut Vec<_>| {
        out.push((u.clock.get(), u.id.to_string(), u.status.as_str()));
    };
    for (at, k, i) in RECEIPTS {
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
            SubmitOutcome::IdReused(_) => "id_reused",
        };
        out.push((s.outcome.clock().get(), i.to_string(), what));
    }
    for u in gate.publish_due(10_000, 100).expect("publish") {
        record(&u, &mut out);
    }
    out
}

#[test]
fn worked_examples_hand_out_the_documented_clock_values() {
    let s = |v: &[(u64, &str, &'static str)]| {
        v.iter()
            .map(|(c, i, w)| (*c, i.to_string(), *w))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        clock_sequence(GateMode::OnlyOnce),
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
        clock_sequence(GateMode::StrictlyOnce),
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

/// Gate `orders` in `mode`: duration 3 s, terminal events kept 10 s.
fn orders_kept_10s(mode: GateMode) -> GateState {
    let mut spec = GateSpec::new(
        GateId::new("orders").expect("id"),
        mode,
        Duration::from_millis(3_000),
    );
    spec.retention = Duration::from_millis(10_000);
    GateState::new(GateSettings::new(spec).expect("settings"))
}

#[test]
fn a_known_id_with_another_key_is_refused_and_changes_nothing() {
    let mut gate = orders_kept_10s(GateMode::StrictlyOnce);
    let first = submit(&mut gate, "alpha", "dup-1", 1_000);
    let before = gate.clone();
    let reused = submit(&mut gate, "beta", "dup-1", 1_500);
    match &reused.outcome {
        SubmitOutcome::IdReused(r) => {
            assert_eq!((r.id.as_str(), r.key.as_str()), ("dup-1", "alpha"));
            assert_eq!(r.clock, first.outcome.clock());
        }
        other => panic!("expected a reused id, got {other:?}"),
    }
    assert_eq!(reused.update, None);
    assert_eq!(gate, before, "nothing changed, not even the clock");
    // beta was never received: a first beta event is submitted, not rejected.
    let beta = submit(&mut gate, "beta", "b-1", 1_600).outcome;
    assert!(matches!(beta, SubmitOutcome::Submitted { .. }), "{beta:?}");
    // A terminal event's id is still held: reused with another key is refused too.
    gate.publish_due(4_000, 10).expect("publish");
    let after_publish = submit(&mut gate, "pizza", "dup-1", 5_000).outcome;
    assert!(
        matches!(&after_publish, SubmitOutcome::IdReused(r) if r.status == EventStatus::Published),
        "{after_publish:?}"
    );
}

#[test]
fn a_known_id_is_a_duplicate_that_changes_nothing_until_its_retention_ends() {
    let mut gate = orders_kept_10s(GateMode::OnlyOnce);
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
    let after_publish = submit(&mut gate, "taco", "a", 5_000).outcome;
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
