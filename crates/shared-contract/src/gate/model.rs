//! The reference semantics of one event gate: a pure state machine, [`GateState`].
//!
//! It is the oracle for every provider: the local provider runs it directly, and the Redis
//! Lua programs (submit, publish-due, conditional delete) mirror its three mutating
//! operations step for step. `docs/event-gates.md` explains the semantics with worked
//! examples; this module states them exactly.
//!
//! - **Conflict.** A *key window* remembers, per key, the last event that counts (the last
//!   submitted one in `only_once`, the last received one in `strictly_once`) and its time
//!   `last_at`. An event of that key received at `now` conflicts iff
//!   `now < last_at + duration`: events exactly `duration` apart do not conflict.
//! - **Fate.** Without a conflict an event is submitted and incubates until
//!   `publish_at = now + duration`. With one it is rejected (it never enters the lifecycle);
//!   in `strictly_once` the rejected event becomes the window's last event, and the
//!   conflicting event, if it is incubating, is invalidated.
//! - **Publication.** [`GateState::publish_due`] publishes every incubating event with
//!   `publish_at <= now`, in due order `(publish_at, id)`. Because a conflict needs a gap
//!   below `duration`, an event can no longer be invalidated from its `publish_at` on: how
//!   late the publisher runs never changes a fate.
//! - **Clock.** One counter per gate; every submission, rejection answer, invalidation and
//!   publication takes the next value. In `strictly_once` the invalidation takes its value
//!   before the rejection answer, so the clock of any answer is the gate's clock after the
//!   operation took effect.
//! - **Time.** `now_ms` is the provider's clock (Redis `TIME`). The gate remembers the latest
//!   time it acted on; a clock behind it by at most `max_clock_regression` is clamped to it,
//!   further behind is [`GateError::ClockBehind`] and nothing changes. Time inside a gate
//!   therefore never goes back, which is what keeps terminal states terminal.
//! - **Duplicates.** An id the gate still holds (incubating or retained) is answered with
//!   [`SubmitOutcome::Duplicate`] and changes nothing, not even the clock: a retried submission
//!   is safe. Rejected events are not held, so a retried rejected event is a new receipt.
//!   An id the gate holds for *another* key is answered with [`SubmitOutcome::IdReused`]
//!   (the held record) and changes nothing either: the submission is a client error, never
//!   a success.
//! - **Bounds.** At most `max_events` events and `max_events` live key windows; a submission
//!   that would exceed either is refused with [`GateError::Full`] (nothing changes; a
//!   submission that is rejected needs no room and is still answered). Terminal events are
//!   kept for `retention`, then removed by [`GateState::sweep`]; removal is no status change
//!   and takes no clock value.
//!
//! Every operation either fails before it mutates anything or succeeds completely (a `Full`
//! refusal may first prune lapsed key windows, which is invisible).

use std::collections::{BTreeSet, HashMap};

use super::ids::{EventId, EventKey, GateClock};
use super::settings::{GateMode, GateSettings};
use crate::exact::{self, MAX_SAFE_INTEGER, OutOfRange};
use crate::policy::MAX_TIME_MS;

/// Where an event is in its lifecycle. `Submitted` is the entry point; `Published` and
/// `Invalidated` are terminal. "Rejected" is an answer to a submission, never a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventStatus {
    /// Received without conflict and incubating until its publish time.
    Submitted,
    /// No conflict arrived during the whole duration. Terminal.
    Published,
    /// A later conflicting event arrived while it incubated (`strictly_once`). Terminal.
    Invalidated,
}

impl EventStatus {
    /// The wire name (`"submitted"`, `"published"`, `"invalidated"`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Submitted => "submitted",
            EventStatus::Published => "published",
            EventStatus::Invalidated => "invalidated",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Submitted, Self::Published, Self::Invalidated]
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    /// Whether the status is final (`Published` or `Invalidated`).
    pub fn is_terminal(self) -> bool {
        self != EventStatus::Submitted
    }
}

/// Everything a gate holds about one event, as the event lookup answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// Names the event within its gate.
    pub id: EventId,
    /// The key that decides which events conflict with it.
    pub key: EventKey,
    /// Where the event is in its lifecycle.
    pub status: EventStatus,
    /// The clock value of the event's latest status change.
    pub clock: GateClock,
    /// Gate time of the submission.
    pub submitted_at_ms: u64,
    /// `submitted_at_ms + duration`: from then on the event can only be published.
    pub publish_at_ms: u64,
    /// Gate time of the terminal change; `None` while incubating.
    pub terminal_at_ms: Option<u64>,
}

/// One status change: the delta a subscriber applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUpdate {
    /// The clock value this change took; updates are applied in clock order.
    pub clock: GateClock,
    /// The event that changed.
    pub id: EventId,
    /// The event's key.
    pub key: EventKey,
    /// The new status: `Submitted` for a new incubating event, or a terminal one.
    pub status: EventStatus,
    /// Gate time of the change (the submission time for `Submitted`).
    pub at_ms: u64,
    /// The event's publish time. With `at_ms` of the `Submitted` update it lets a replica
    /// rebuild the snapshot entry exactly.
    pub publish_at_ms: u64,
}

/// One incubating event, as a snapshot lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncubatingEvent {
    /// Names the event within its gate.
    pub id: EventId,
    /// The key that decides which events conflict with it.
    pub key: EventKey,
    /// Gate time (Unix ms) of the submission.
    pub submitted_at_ms: u64,
    /// Gate time (Unix ms) from which the event is published: `submitted_at_ms + duration`.
    pub publish_at_ms: u64,
}

/// The incubating events at one clock value: the key frame.
///
/// Applying every [`StatusUpdate`] with a clock above `clock` to it gives the incubating set
/// of any later moment (see [`super::Replica`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The gate's clock the snapshot was read at: updates above it are not reflected.
    pub clock: GateClock,
    /// In due order: `(publish_at_ms, id)` ascending, the order of publication.
    pub incubating: Vec<IncubatingEvent>,
}

/// The answer to one submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The event entered the lifecycle and incubates until `publish_at_ms`.
    Submitted {
        /// The clock value of the submission.
        clock: GateClock,
        /// Gate time (Unix ms) when the event is published unless invalidated first.
        publish_at_ms: u64,
    },
    /// The event conflicts with `conflicts_with` (the last submitted event of the key in
    /// `only_once`, the last received one in `strictly_once`, which may itself have been
    /// rejected) and never enters the lifecycle.
    Rejected {
        /// The clock value of the rejection answer.
        clock: GateClock,
        /// The event the submission conflicts with.
        conflicts_with: EventId,
    },
    /// The gate already holds an event with this id: nothing changed, and this is what the
    /// gate knows about it now. A retried submission whose event still incubates thus gets
    /// the same clock it got the first time.
    Duplicate(EventRecord),
    /// The gate holds an event with this id but another key: the submission is a client
    /// error, not a retry. Nothing changed (not even the clock) and the event of this key was
    /// not received; this is the held event, whose key names the conflict.
    IdReused(EventRecord),
}

impl SubmitOutcome {
    /// The clock value of the answer (for a duplicate or a reused id, of the held event's
    /// latest change).
    pub fn clock(&self) -> GateClock {
        match self {
            SubmitOutcome::Submitted { clock, .. } | SubmitOutcome::Rejected { clock, .. } => {
                *clock
            }
            SubmitOutcome::Duplicate(record) | SubmitOutcome::IdReused(record) => record.clock,
        }
    }
}

/// A submission's answer and the one status update it caused, if any: the `Submitted` update
/// of a submitted event, or the invalidation a `strictly_once` rejection caused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// What the submitter is told.
    pub outcome: SubmitOutcome,
    /// The status change a subscriber sees, if the submission caused one.
    pub update: Option<StatusUpdate>,
    /// The gate time the submission was decided at (after clamping).
    pub now_ms: u64,
}

/// What one sweep removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sweep {
    /// Terminal events past their retention, removed in `(terminal_at, id)` order.
    pub removed: Vec<EventId>,
    /// Key windows that had lapsed and could no longer cause a conflict.
    pub windows_pruned: usize,
}

/// Why a gate refused to act. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The provider's clock reading (Unix ms) is above `MAX_TIME_MS`; carries the reading.
    #[error("clock {0} ms is beyond the supported range")]
    TimeOutOfRange(u64),
    #[error(
        "clock {now_ms} ms is behind the gate's time {last_ms} ms by more than max_clock_regression {max_ms} ms"
    )]
    /// The provider's clock went back further than `max_clock_regression` allows.
    ClockBehind {
        /// The provider's clock reading (Unix ms).
        now_ms: u64,
        /// The latest time (Unix ms) the gate acted on.
        last_ms: u64,
        /// The gate's `max_clock_regression` in ms.
        max_ms: u64,
    },
    /// Admitting the event would exceed `max_events` events or live key windows.
    #[error("the gate already holds max_events = {max} events or live key windows")]
    Full {
        /// The gate's `max_events`.
        max: u64,
    },
    /// Every clock value up to 2^53-1 has been handed out.
    #[error("the gate clock reached 2^53-1")]
    ClockExhausted,
    /// An intermediate value left `0..=2^53-1` (a model bug, or settings validation should have
    /// refused).
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    /// Stored state the gate could not have written; carries what does not fit.
    #[error("gate state is inconsistent: {0}")]
    StateIncompatible(&'static str),
}

/// The window of one key: the last event that counts for conflicts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyWindow {
    last_at_ms: u64,
    last_id: EventId,
    /// Whether `last_id` was submitted (then, while the window is live, it is incubating).
    last_submitted: bool,
    /// `last_at_ms + duration`: from then on the window can cause no conflict.
    end_ms: u64,
}

/// The state of one gate. See the module docs for the semantics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateState {
    settings: GateSettings,
    clock: GateClock,
    last_now_ms: Option<u64>,
    events: HashMap<EventId, EventRecord>,
    /// Incubating events in due order.
    due: BTreeSet<(u64, EventId)>,
    /// Terminal events by `(terminal_at, id)`, for the conditional delete.
    retained: BTreeSet<(u64, EventId)>,
    windows: HashMap<EventKey, KeyWindow>,
    window_ends: BTreeSet<(u64, EventKey)>,
}

impl GateState {
    /// A gate where nothing has happened: clock 0, no events.
    pub fn new(settings: GateSettings) -> Self {
        Self {
            settings,
            clock: GateClock::ZERO,
            last_now_ms: None,
            events: HashMap::new(),
            due: BTreeSet::new(),
            retained: BTreeSet::new(),
            windows: HashMap::new(),
            window_ends: BTreeSet::new(),
        }
    }

    /// The gate's validated settings.
    pub fn settings(&self) -> &GateSettings {
        &self.settings
    }

    /// The last clock value handed out (0 when nothing happened).
    pub fn clock(&self) -> GateClock {
        self.clock
    }

    /// The latest time the gate acted on, if any.
    pub fn last_now_ms(&self) -> Option<u64> {
        self.last_now_ms
    }

    /// The event with `id`, while the gate holds it (incubating, or terminal within retention).
    pub fn event(&self, id: &EventId) -> Option<&EventRecord> {
        self.events.get(id)
    }

    /// Events held: incubating plus retained terminal ones.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the gate holds no event (incubating or retained).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// How many events incubate (submitted, not yet published or invalidated).
    pub fn incubating_len(&self) -> usize {
        self.due.len()
    }

    /// Key windows held (live or lapsed but not yet pruned).
    pub fn window_count(&self) -> usize {
        self.windows.len()
    }

    /// The earliest publish time among incubating events: when a publisher should next run.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.due.first().map(|(t, _)| *t)
    }

    /// The incubating events and the clock, in due order.
    pub fn snapshot(&self) -> Snapshot {
        let incubating = self
            .due
            .iter()
            .filter_map(|(_, id)| self.events.get(id))
            .map(|r| IncubatingEvent {
                id: r.id.clone(),
                key: r.key.clone(),
                submitted_at_ms: r.submitted_at_ms,
                publish_at_ms: r.publish_at_ms,
            })
            .collect();
        Snapshot {
            clock: self.clock,
            incubating,
        }
    }

    /// The time to act on: `now_ms`, or the gate's latest time when the clock went back by at
    /// most `max_clock_regression`.
    fn effective_now(&self, now_ms: u64) -> Result<u64, GateError> {
        if now_ms > MAX_TIME_MS {
            return Err(GateError::TimeOutOfRange(now_ms));
        }
        match self.last_now_ms {
            Some(last) if now_ms < last => {
                let max_ms = self.settings.max_clock_regression_ms();
                if exact::sub(last, now_ms)? > max_ms {
                    Err(GateError::ClockBehind {
                        now_ms,
                        last_ms: last,
                        max_ms,
                    })
                } else {
                    Ok(last)
                }
            }
            _ => Ok(now_ms),
        }
    }

    fn next_clock(clock: GateClock) -> Result<GateClock, GateError> {
        clock.next().ok_or(GateError::ClockExhausted)
    }

    /// The usize form of `max_events` (at most 10^8, so it fits every supported target).
    fn max_events(&self) -> usize {
        usize::try_from(self.settings.max_events()).unwrap_or(usize::MAX)
    }

    /// Receives one event at `now_ms`. See the module docs for the semantics.
    ///
    /// # Errors
    /// [`GateError::TimeOutOfRange`], [`GateError::ClockBehind`], [`GateError::Full`] (only
    /// for an event that would be submitted), [`GateError::ClockExhausted`]; nothing changed.
    /// [`GateError::StateIncompatible`] only if the state was corrupted.
    pub fn submit(
        &mut self,
        key: EventKey,
        id: EventId,
        now_ms: u64,
    ) -> Result<Submission, GateError> {
        let now = self.effective_now(now_ms)?;
        if let Some(existing) = self.events.get(&id) {
            let outcome = if existing.key == key {
                SubmitOutcome::Duplicate(existing.clone())
            } else {
                SubmitOutcome::IdReused(existing.clone())
            };
            return Ok(Submission {
                outcome,
                update: None,
                now_ms: now,
            });
        }
        let conflict = match self.windows.get(&key) {
            Some(w) if now < w.end_ms => Some(w.clone()),
            _ => None,
        };
        match conflict {
            None => self.accept(key, id, now),
            Some(w) => self.reject(key, id, now, w),
        }
    }

    fn accept(&mut self, key: EventKey, id: EventId, now: u64) -> Result<Submission, GateError> {
        let max = self.max_events();
        if self.events.len() >= max {
            return Err(GateError::Full {
                max: self.settings.max_events(),
            });
        }
        if !self.windows.contains_key(&key) && self.windows.len() >= max {
            // Lapsed windows are indistinguishable from absent ones, so pruning them here is
            // invisible; only live windows count against the bound.
            self.prune_windows(now, usize::MAX);
            if self.windows.len() >= max {
                return Err(GateError::Full {
                    max: self.settings.max_events(),
                });
            }
        }
        let clock = Self::next_clock(self.clock)?;
        let publish_at_ms = exact::add(now, self.settings.duration_ms())?;
        self.due.insert((publish_at_ms, id.clone()));
        self.replace_window(
            key.clone(),
            KeyWindow {
                last_at_ms: now,
                last_id: id.clone(),
                last_submitted: true,
                end_ms: publish_at_ms,
            },
        );
        self.events.insert(
            id.clone(),
            EventRecord {
                id: id.clone(),
                key: key.clone(),
                status: EventStatus::Submitted,
                clock,
                submitted_at_ms: now,
                publish_at_ms,
                terminal_at_ms: None,
            },
        );
        self.clock = clock;
        self.last_now_ms = Some(now);
        Ok(Submission {
            outcome: SubmitOutcome::Submitted {
                clock,
                publish_at_ms,
            },
            update: Some(StatusUpdate {
                clock,
                id,
                key,
                status: EventStatus::Submitted,
                at_ms: now,
                publish_at_ms,
            }),
            now_ms: now,
        })
    }

    fn reject(
        &mut self,
        key: EventKey,
        id: EventId,
        now: u64,
        window: KeyWindow,
    ) -> Result<Submission, GateError> {
        if self.settings.mode() == GateMode::OnlyOnce {
            // The window keeps running from the last submitted event: a rejection changes
            // nothing but the clock.
            let clock = Self::next_clock(self.clock)?;
            self.clock = clock;
            self.last_now_ms = Some(now);
            return Ok(Submission {
                outcome: SubmitOutcome::Rejected {
                    clock,
                    conflicts_with: window.last_id,
                },
                update: None,
                now_ms: now,
            });
        }
        // strictly_once: every check and every value first, then the mutations.
        let end_ms = exact::add(now, self.settings.duration_ms())?;
        let first = Self::next_clock(self.clock)?;
        let (invalidation_clock, answer_clock) = if window.last_submitted {
            (Some(first), Self::next_clock(first)?)
        } else {
            (None, first)
        };
        let mut update = None;
        if let Some(inv_clock) = invalidation_clock {
            // While a window is live its submitted last event is incubating: only a later
            // receipt (which would have replaced the window) or its publish time (which ends
            // the window) could have changed it.
            let record = match self.events.get_mut(&window.last_id) {
                Some(r) if r.status == EventStatus::Submitted && r.key == key => r,
                _ => {
                    return Err(GateError::StateIncompatible(
                        "a live window's submitted event is not incubating",
                    ));
                }
            };
            record.status = EventStatus::Invalidated;
            record.clock = inv_clock;
            record.terminal_at_ms = Some(now);
            let publish_at_ms = record.publish_at_ms;
            self.due.remove(&(publish_at_ms, window.last_id.clone()));
            self.retained.insert((now, window.last_id.clone()));
            update = Some(StatusUpdate {
                clock: inv_clock,
                id: window.last_id.clone(),
                key: key.clone(),
                status: EventStatus::Invalidated,
                at_ms: now,
                publish_at_ms,
            });
        }
        self.replace_window(
            key,
            KeyWindow {
                last_at_ms: now,
                last_id: id,
                last_submitted: false,
                end_ms,
            },
        );
        self.clock = answer_clock;
        self.last_now_ms = Some(now);
        Ok(Submission {
            outcome: SubmitOutcome::Rejected {
                clock: answer_clock,
                conflicts_with: window.last_id,
            },
            update,
            now_ms: now,
        })
    }

    /// Puts `window` for `key`, keeping the end index in step.
    fn replace_window(&mut self, key: EventKey, window: KeyWindow) {
        if let Some(old) = self.windows.get(&key) {
            self.window_ends.remove(&(old.end_ms, key.clone()));
        }
        self.window_ends.insert((window.end_ms, key.clone()));
        self.windows.insert(key, window);
    }

    /// Publishes up to `max_batch` incubating events whose publish time is at or before
    /// `now_ms`, in due order; returns their updates in clock order. Call again while it
    /// returns a full batch.
    ///
    /// # Errors
    /// [`GateError::TimeOutOfRange`], [`GateError::ClockBehind`],
    /// [`GateError::ClockExhausted`]; nothing changed. [`GateError::StateIncompatible`] only if
    /// the state was corrupted.
    pub fn publish_due(
        &mut self,
        now_ms: u64,
        max_batch: usize,
    ) -> Result<Vec<StatusUpdate>, GateError> {
        let now = self.effective_now(now_ms)?;
        let due: Vec<(u64, EventId)> = self
            .due
            .iter()
            .take_while(|(t, _)| *t <= now)
            .take(max_batch)
            .cloned()
            .collect();
        let room = MAX_SAFE_INTEGER - self.clock.get();
        if (due.len() as u64) > room {
            return Err(GateError::ClockExhausted);
        }
        if due.iter().any(|(_, id)| !self.events.contains_key(id)) {
            return Err(GateError::StateIncompatible(
                "an incubating entry has no event",
            ));
        }
        let mut clock = self.clock;
        let mut updates = Vec::with_capacity(due.len());
        for (publish_at_ms, id) in due {
            clock = Self::next_clock(clock)?;
            if let Some(record) = self.events.get_mut(&id) {
                record.status = EventStatus::Published;
                record.clock = clock;
                record.terminal_at_ms = Some(now);
                updates.push(StatusUpdate {
                    clock,
                    id: id.clone(),
                    key: record.key.clone(),
                    status: EventStatus::Published,
                    at_ms: now,
                    publish_at_ms,
                });
            }
            self.due.remove(&(publish_at_ms, id.clone()));
            self.retained.insert((now, id));
        }
        self.clock = clock;
        self.last_now_ms = Some(now);
        Ok(updates)
    }

    /// The conditional delete: removes up to `max_batch` terminal events that became
    /// terminal before `cutoff_ms`, oldest first (`(terminal_at, id)` order), and returns their
    /// ids. Incubating events are never removed: an event cannot expire unhandled.
    pub fn remove_terminal_older_than(&mut self, cutoff_ms: u64, max_batch: usize) -> Vec<EventId> {
        let old: Vec<(u64, EventId)> = self
            .retained
            .iter()
            .take_while(|(t, _)| *t < cutoff_ms)
            .take(max_batch)
            .cloned()
            .collect();
        old.into_iter()
            .map(|entry| {
                self.retained.remove(&entry);
                self.events.remove(&entry.1);
                entry.1
            })
            .collect()
    }

    /// Drops up to `max_batch` key windows that lapsed by `now` (`end <= now`); returns how
    /// many. Semantically invisible: a lapsed window causes no conflict.
    fn prune_windows(&mut self, now: u64, max_batch: usize) -> usize {
        let lapsed: Vec<(u64, EventKey)> = self
            .window_ends
            .iter()
            .take_while(|(end, _)| *end <= now)
            .take(max_batch)
            .cloned()
            .collect();
        let n = lapsed.len();
        for entry in lapsed {
            self.window_ends.remove(&entry);
            self.windows.remove(&entry.1);
        }
        n
    }

    /// Housekeeping at `now_ms`: removes up to `max_batch` terminal events whose retention has
    /// passed (terminal at `t`, removed once `now >= t + retention`) and prunes up to
    /// `max_batch` lapsed key windows. No status change, no clock value.
    ///
    /// # Errors
    /// [`GateError::TimeOutOfRange`], [`GateError::ClockBehind`]; nothing changed.
    pub fn sweep(&mut self, now_ms: u64, max_batch: usize) -> Result<Sweep, GateError> {
        let now = self.effective_now(now_ms)?;
        let retention = self.settings.retention_ms();
        let cutoff = if now >= retention {
            exact::add(exact::sub(now, retention)?, 1)?
        } else {
            0
        };
        let removed = self.remove_terminal_older_than(cutoff, max_batch);
        let windows_pruned = self.prune_windows(now, max_batch);
        self.last_now_ms = Some(now);
        Ok(Sweep {
            removed,
            windows_pruned,
        })
    }
}
