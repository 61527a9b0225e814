//! Property tests of the event-gate reference model: random event sequences (submissions with
//! time going forward and sometimes back, publications, sweeps, new subscribers) checked
//! after every step against an independent statement of both modes, and at the end the fate
//! of every submitted event. The worked examples and the fixed boundaries are in
//! `gate_model.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use shared_contract::gate::{
    Applied, EventId, EventKey, EventStatus, GateClock, GateError, GateId, GateMode, GateSettings,
    GateSpec, GateState, Replica, SnapshotApplied, StatusUpdate, SubmitOutcome,
};
use shared_contract::policy::MAX_TIME_MS;

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
        if let SubmitOutcome::Duplicate(record) | SubmitOutcome::IdReused(record) = &s.outcome {
            prop_assert!(self.held.contains_key(&id), "duplicate of an unknown id");
            prop_assert_eq!(Some(&record.status), self.held.get(&id));
            prop_assert_eq!(&record.id, &id);
            // Same key: a retry. Another key: a reused id, never answered as a retry.
            let reused = matches!(s.outcome, SubmitOutcome::IdReused(_));
            prop_assert_eq!(reused, record.key != key, "{:?} for key {}", s.outcome, key);
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
