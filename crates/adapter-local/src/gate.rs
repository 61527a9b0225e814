//! The in-memory event-gate provider: [`shared_contract::gate::GateState`] per gate, behind a
//! mutex per gate, for a single instance.
//!
//! The key design decision: **like the rate-limit side, this module implements no semantics.**
//! Every operation is the reference model's, applied under the gate's lock at the injected
//! [`Clock`]'s time, so the local provider decides exactly like the model (and so like the
//! Redis programs that mirror it).
//!
//! # Publication without a runtime
//!
//! The provider needs no async runtime and no publisher task. Instead:
//!
//! - **every call publishes lazily**: before it acts, each port method publishes every event
//!   that is due by the clock (in batches of [`LocalGateSettings::publish_batch`], until none is
//!   due), so no answer ever shows an event incubating past its publish time;
//! - **a waiting subscriber publishes too**: [`EventGatePort::updates_after`] sleeps until the
//!   next publish time or its deadline, whichever is first, and then publishes, so a subscriber
//!   sees publications on time even when nothing else calls the gate;
//! - [`EventGatePort::publish_due`] stays available for an application timer that wants
//!   publications on time with no subscriber waiting; with the `publisher` feature,
//!   [`LocalGatePublisher`] is that timer (a Tokio task, the crate's only runtime need).
//!
//! The wake-up at a deadline or publish time needs a timer; without a runtime it is one short
//! sleeping thread per waiting call that is still pending (it only wakes the call's task).
//!
//! # Updates log
//!
//! Every status update is appended to a per-gate ring buffer of at most
//! [`LocalGateSettings::log_capacity`] entries, read by `updates_after`. A cursor older than the
//! oldest kept update answers [`UpdateBatch::Resync`].
//!
//! # Retention
//!
//! Terminal events are removed by [`EventGatePort::sweep`] (the conditional delete); every
//! submission also sweeps a small batch ([`LocalGateSettings::sweep_on_submit`]), so memory
//! stays bounded under a steady event rate without a timer.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shared_contract::gate::{
    EventGatePort, EventId, EventRecord, GateClock, GateError, GateId, GateOutcome,
    GateRequestError, GateSet, GateState, Snapshot, StatusUpdate, SubmitOutcome, SubmitRequest,
    UpdateBatch,
};
use shared_contract::{Clock, Deadline};

#[cfg(feature = "publisher")]
mod publisher;
#[cfg(feature = "publisher")]
pub use publisher::LocalGatePublisher;

/// Tunables of the local gate provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalGateSettings {
    /// Most status updates kept per gate for `updates_after` (default 65 536).
    pub log_capacity: usize,
    /// Events published per model call by the lazy publisher (default 1 024).
    pub publish_batch: usize,
    /// Terminal events past retention removed by each submission (default 16; 0 disables).
    pub sweep_on_submit: usize,
}

impl Default for LocalGateSettings {
    fn default() -> Self {
        Self {
            log_capacity: 65_536,
            publish_batch: 1024,
            sweep_on_submit: 16,
        }
    }
}

/// One gate: the model, its updates log and the tasks waiting for an update.
#[derive(Debug)]
struct Gate {
    state: GateState,
    log: VecDeque<StatusUpdate>,
    /// The greatest clock of an update dropped from the log (0: none dropped).
    dropped_upto: GateClock,
    /// Bumped on every appended update; a waiter compares it to know it missed nothing.
    generation: u64,
    waiters: Vec<Waker>,
}

impl Gate {
    fn append(&mut self, capacity: usize, updates: impl IntoIterator<Item = StatusUpdate>) {
        let mut any = false;
        for u in updates {
            if self.log.len() >= capacity.max(1)
                && let Some(old) = self.log.pop_front()
            {
                self.dropped_upto = old.clock;
            }
            self.log.push_back(u);
            any = true;
        }
        if any {
            self.generation = self.generation.wrapping_add(1);
            for w in self.waiters.drain(..) {
                w.wake();
            }
        }
    }

    /// Publishes everything due at `now`, batch by batch.
    fn publish_all(&mut self, now: u64, settings: &LocalGateSettings) -> Result<usize, GateError> {
        let batch = settings.publish_batch.max(1);
        let mut total = 0;
        loop {
            let updates = self.state.publish_due(now, batch)?;
            let n = updates.len();
            total += n;
            self.append(settings.log_capacity, updates);
            if n < batch {
                return Ok(total);
            }
        }
    }

    fn updates_after(&self, after: GateClock, max: usize) -> UpdateBatch {
        if after > self.state.clock() || self.dropped_upto > after {
            return UpdateBatch::Resync;
        }
        let start = self.log.partition_point(|u| u.clock <= after);
        UpdateBatch::Updates(self.log.iter().skip(start).take(max).cloned().collect())
    }
}

/// The in-memory provider of [`EventGatePort`] for one instance.
pub struct LocalGateProvider {
    gates: GateSet,
    clock: Arc<dyn Clock>,
    settings: LocalGateSettings,
    states: HashMap<GateId, Arc<Mutex<Gate>>>,
}

impl fmt::Debug for LocalGateProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalGateProvider")
            .field("gates", &self.states.len())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LocalGateProvider {
    /// A provider for `gates`, reading time from `clock`, with default settings.
    pub fn new(gates: GateSet, clock: Arc<dyn Clock>) -> Self {
        Self::with_settings(gates, clock, LocalGateSettings::default())
    }

    /// A provider with explicit settings.
    pub fn with_settings(
        gates: GateSet,
        clock: Arc<dyn Clock>,
        settings: LocalGateSettings,
    ) -> Self {
        let states = gates
            .iter()
            .map(|g| {
                (
                    g.id().clone(),
                    Arc::new(Mutex::new(Gate {
                        state: GateState::new(g.clone()),
                        log: VecDeque::new(),
                        dropped_upto: GateClock::ZERO,
                        generation: 0,
                        waiters: Vec::new(),
                    })),
                )
            })
            .collect();
        Self {
            gates,
            clock,
            settings,
            states,
        }
    }

    /// A provider of `gates` over this one's events (a configuration reload): a gate this
    /// provider holds with the same settings keeps its events (both providers share them
    /// under its lock); a new gate, or one whose settings changed, starts empty.
    #[must_use]
    pub fn with_gates(&self, gates: GateSet) -> Self {
        let fresh = Self::with_settings(gates, self.clock.clone(), self.settings);
        let states = fresh
            .states
            .into_iter()
            .map(|(id, state)| {
                let kept = self
                    .states
                    .get(&id)
                    .filter(|_| self.gates.get(&id) == fresh.gates.get(&id));
                (id, kept.cloned().unwrap_or(state))
            })
            .collect();
        Self { states, ..fresh }
    }

    fn gate(&self, id: &GateId) -> Result<&Arc<Mutex<Gate>>, GateRequestError> {
        self.gates.admit(id)?;
        self.states
            .get(id)
            .ok_or_else(|| GateRequestError::UnknownGate(id.clone()))
    }

    /// Runs `f` on the gate after publishing everything due; a model refusal of the lazy
    /// publication (clock unsafe) is the answer.
    fn with_gate<T>(
        &self,
        id: &GateId,
        f: impl FnOnce(&mut Gate, u64) -> GateOutcome<T>,
    ) -> Result<GateOutcome<T>, GateRequestError> {
        let gate = self.gate(id)?;
        let now = self.clock.now_ms();
        let mut g = gate.lock();
        if let Err(e) = g.publish_all(now, &self.settings) {
            return Ok(e.outcome());
        }
        Ok(f(&mut g, now))
    }
}

#[async_trait::async_trait]
impl EventGatePort for LocalGateProvider {
    fn gates(&self) -> &GateSet {
        &self.gates
    }

    async fn submit(
        &self,
        request: SubmitRequest,
    ) -> Result<GateOutcome<SubmitOutcome>, GateRequestError> {
        let settings = self.settings;
        self.with_gate(&request.gate, |g, now| {
            if settings.sweep_on_submit > 0 {
                // Housekeeping only: its refusals are the submission's own (same clock rule).
                let _ = g.state.sweep(now, settings.sweep_on_submit);
            }
            match g.state.submit(request.key, request.id, now) {
                Ok(s) => {
                    g.append(settings.log_capacity, s.update);
                    GateOutcome::Evaluated(s.outcome)
                }
                Err(e) => e.outcome(),
            }
        })
    }

    async fn event(
        &self,
        gate: &GateId,
        id: &EventId,
        _deadline: Deadline,
    ) -> Result<GateOutcome<Option<EventRecord>>, GateRequestError> {
        self.with_gate(gate, |g, _| {
            GateOutcome::Evaluated(g.state.event(id).cloned())
        })
    }

    async fn snapshot(
        &self,
        gate: &GateId,
        _deadline: Deadline,
    ) -> Result<GateOutcome<Snapshot>, GateRequestError> {
        self.with_gate(gate, |g, _| GateOutcome::Evaluated(g.state.snapshot()))
    }

    async fn updates_after(
        &self,
        gate: &GateId,
        after: GateClock,
        max: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<UpdateBatch>, GateRequestError> {
        let shared = self.gate(gate)?.clone();
        loop {
            let now = self.clock.now_ms();
            let (generation, next_due) = {
                let mut g = shared.lock();
                if let Err(e) = g.publish_all(now, &self.settings) {
                    return Ok(e.outcome());
                }
                match g.updates_after(after, max.get()) {
                    UpdateBatch::Updates(u) if u.is_empty() => {}
                    batch => return Ok(GateOutcome::Evaluated(batch)),
                }
                (g.generation, g.state.next_due_ms())
            };
            let left = deadline.remaining_from(Instant::now());
            if left.is_zero() {
                return Ok(GateOutcome::Evaluated(UpdateBatch::Updates(Vec::new())));
            }
            // Wake at the next publish time (by the injected clock) or the deadline.
            let until_due = next_due.map(|t| Duration::from_millis(t.saturating_sub(now).max(1)));
            let sleep = until_due.map_or(left, |d| d.min(left));
            Wait {
                gate: &shared,
                generation,
                sleep,
                armed: false,
            }
            .await;
        }
    }

    async fn publish_due(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        _deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        let shared = self.gate(gate)?;
        let now = self.clock.now_ms();
        let mut g = shared.lock();
        Ok(match g.state.publish_due(now, max_batch.get()) {
            Ok(updates) => {
                let n = updates.len();
                g.append(self.settings.log_capacity, updates);
                GateOutcome::Evaluated(n)
            }
            Err(e) => e.outcome(),
        })
    }

    async fn sweep(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        _deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        self.with_gate(gate, |g, now| match g.state.sweep(now, max_batch.get()) {
            Ok(s) => GateOutcome::Evaluated(s.removed.len()),
            Err(e) => e.outcome(),
        })
    }
}

/// Resolves when the gate appends an update after `generation`, or after `sleep`.
struct Wait<'a> {
    gate: &'a Mutex<Gate>,
    generation: u64,
    sleep: Duration,
    armed: bool,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.armed {
            // Woken by an update or by the timer: the caller looks again either way.
            return Poll::Ready(());
        }
        {
            let mut g = self.gate.lock();
            if g.generation != self.generation {
                return Poll::Ready(());
            }
            // One entry per task: a subscriber that long-polls an idle gate keeps one waker.
            g.waiters.retain(|w| !w.will_wake(cx.waker()));
            g.waiters.push(cx.waker().clone());
        }
        self.armed = true;
        let waker = cx.waker().clone();
        let sleep = self.sleep;
        // No runtime here: a short-lived thread is the timer (see the module docs). If it
        // cannot be started the call simply looks again at once.
        if std::thread::Builder::new()
            .name("gate-wait".into())
            .spawn(move || {
                std::thread::sleep(sleep);
                waker.wake();
            })
            .is_err()
        {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}
