//! A subscriber's copy of a gate's incubating events, rebuilt from a snapshot (the key
//! frame) and the status updates after it (the delta frames).
//!
//! The rule: take a snapshot at clock `c`, then apply every update with a clock
//! above `c`, in clock order; updates at or below the replica's clock are already reflected
//! and are ignored. Pure and runtime-free, so the WebSocket test client and any Rust
//! subscriber use the same code the property tests check against [`super::GateState`].

use std::collections::BTreeMap;

use super::ids::{EventId, GateClock};
use super::model::{EventStatus, IncubatingEvent, Snapshot, StatusUpdate};

/// An update that does not fit the replica: the replica missed something (or the stream is
/// not the gate's), and should start again from a fresh snapshot. The replica is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// A `Submitted` update for an event the replica already holds as incubating.
    #[error("update {clock} submits {id}, which the replica already holds as incubating")]
    AlreadyIncubating {
        /// The event the update names.
        id: EventId,
        /// The update's clock.
        clock: GateClock,
    },
    /// A `Published` or `Invalidated` update for an event the replica does not hold.
    #[error("update {clock} ends {id}, which the replica does not hold as incubating")]
    UnknownEvent {
        /// The event the update names.
        id: EventId,
        /// The update's clock.
        clock: GateClock,
    },
}

/// What [`Replica::apply`] did with an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The update changed the replica and advanced its clock.
    Applied,
    /// The update's clock is not above the replica's: already reflected, ignored.
    Stale,
}

/// What [`Replica::apply_snapshot`] did with a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotApplied {
    /// Older than the replica: ignored.
    Stale,
    /// Same clock and the same incubating set: the replica was right.
    Confirmed,
    /// Same clock but another set: the replica had diverged and now holds the snapshot.
    Diverged,
    /// Newer than the replica: the replica now holds the snapshot. (Between two clocks the
    /// gate may have answered rejections, which make no update, so a newer snapshot alone
    /// says nothing about divergence.)
    Replaced,
}

/// The incubating events of one gate as a subscriber knows them, and the clock it knows them at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replica {
    clock: GateClock,
    incubating: BTreeMap<EventId, IncubatingEvent>,
}

impl Replica {
    /// The replica of a gate where nothing has happened (the snapshot at clock 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// A replica holding `snapshot`.
    pub fn from_snapshot(snapshot: Snapshot) -> Self {
        Self {
            clock: snapshot.clock,
            incubating: snapshot
                .incubating
                .into_iter()
                .map(|e| (e.id.clone(), e))
                .collect(),
        }
    }

    /// The clock of the latest snapshot or update applied.
    pub fn clock(&self) -> GateClock {
        self.clock
    }

    /// How many incubating events the replica holds.
    pub fn len(&self) -> usize {
        self.incubating.len()
    }

    /// Whether the replica holds no incubating event.
    pub fn is_empty(&self) -> bool {
        self.incubating.is_empty()
    }

    /// The incubating event of this id; `None` when the replica does not hold it.
    pub fn get(&self, id: &EventId) -> Option<&IncubatingEvent> {
        self.incubating.get(id)
    }

    /// The replica as a snapshot, in the gate's due order `(publish_at_ms, id)`, so it compares
    /// equal to the gate's own snapshot at the same clock.
    pub fn snapshot(&self) -> Snapshot {
        let mut incubating: Vec<IncubatingEvent> = self.incubating.values().cloned().collect();
        incubating.sort_by(|a, b| (a.publish_at_ms, &a.id).cmp(&(b.publish_at_ms, &b.id)));
        Snapshot {
            clock: self.clock,
            incubating,
        }
    }

    /// Applies one update (updates must come in clock order).
    ///
    /// # Errors
    /// [`ReplicaError`] when the update does not fit: a `Submitted` update for an event the
    /// replica holds, or a terminal one for an event it does not hold. Nothing changed.
    pub fn apply(&mut self, update: &StatusUpdate) -> Result<Applied, ReplicaError> {
        if update.clock <= self.clock {
            return Ok(Applied::Stale);
        }
        match update.status {
            EventStatus::Submitted => {
                if self.incubating.contains_key(&update.id) {
                    return Err(ReplicaError::AlreadyIncubating {
                        id: update.id.clone(),
                        clock: update.clock,
                    });
                }
                self.incubating.insert(
                    update.id.clone(),
                    IncubatingEvent {
                        id: update.id.clone(),
                        key: update.key.clone(),
                        submitted_at_ms: update.at_ms,
                        publish_at_ms: update.publish_at_ms,
                    },
                );
            }
            EventStatus::Published | EventStatus::Invalidated => {
                if self.incubating.remove(&update.id).is_none() {
                    return Err(ReplicaError::UnknownEvent {
                        id: update.id.clone(),
                        clock: update.clock,
                    });
                }
            }
        }
        self.clock = update.clock;
        Ok(Applied::Applied)
    }

    /// Applies a periodic snapshot from the stream.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> SnapshotApplied {
        if snapshot.clock < self.clock {
            return SnapshotApplied::Stale;
        }
        let same_clock = snapshot.clock == self.clock;
        let next = Self::from_snapshot(snapshot);
        if !same_clock {
            *self = next;
            SnapshotApplied::Replaced
        } else if next == *self {
            SnapshotApplied::Confirmed
        } else {
            *self = next;
            SnapshotApplied::Diverged
        }
    }
}
