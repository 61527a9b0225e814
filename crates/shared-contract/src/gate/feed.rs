//! The lossless cursor of one gate subscriber: which frames to send next, so that a subscriber
//! never misses the terminal status of an event it was told was submitted.
//!
//! A [`Feed`] turns the port's two reads (`snapshot`, `updates_after`) into frames, in clock
//! order. Its invariant: **the cursor only moves over frames the feed has handed out.**
//!
//! - A periodic snapshot read at clock `S` is preceded by every update in `(cursor, S]`,
//!   pulled first; the updates above `S` that the same pull returned follow it. So the
//!   snapshot never skips an update: the subscriber has seen every status change up to `S`.
//! - After a resync (the provider no longer keeps the updates after the cursor) the fresh
//!   snapshot is preceded by the terminal status of each event the subscriber holds as
//!   incubating and the snapshot no longer lists, read with the event lookup. Only an event
//!   removed after its retention before the resync cannot be recovered this way: the
//!   provider has forgotten it (documented in `docs/event-gates.md`).
//!
//! The feed keeps a [`Replica`] of what it handed out (the subscriber's copy, bounded by the
//! gate's `max_events`). It is runtime-free: time comes in as `now_ms` of a monotonic clock,
//! and a wait the provider asks for comes back as [`Step::Wait`].

use std::num::NonZeroUsize;
use std::time::Duration;

use super::ids::{GateClock, GateId};
use super::model::{EventStatus, Snapshot, StatusUpdate};
use super::port::{EventGatePort, GateOutcome, GateRequestError, UpdateBatch};
use super::replica::Replica;
use crate::decision::IncompatibleCategory;
use crate::ids::Deadline;

/// One frame of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The incubating events at a clock (the key frame).
    Snapshot(Snapshot),
    /// One status change (a delta frame).
    Status(StatusUpdate),
}

impl Frame {
    /// The clock of the frame.
    pub fn clock(&self) -> GateClock {
        match self {
            Frame::Snapshot(s) => s.clock,
            Frame::Status(u) => u.clock,
        }
    }
}

/// What to do after one [`Feed::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send these frames in this order (possibly none), then step again.
    Send(Vec<Frame>),
    /// The provider could not answer (nothing changed): wait this long, then step again.
    Wait(Duration),
}

/// Why a feed cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FeedError {
    /// The gate's state, program or reply is not what this build expects; the feed cannot go on.
    #[error("gate state incompatible ({})", .0.as_str())]
    Incompatible(IncompatibleCategory),
    /// A gate call was refused (the gate is not configured).
    #[error(transparent)]
    Request(#[from] GateRequestError),
    /// A step's time budget could not be made into a deadline (zero or above 60 s); carries why.
    #[error("deadline: {0}")]
    Deadline(String),
}

/// How long operations of one step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedTiming {
    /// Every snapshot is at most this far apart (the periodic key frame).
    pub snapshot_interval: Duration,
    /// The deadline budget of one provider read.
    pub budget: Duration,
    /// The longest wait of one pull for new updates.
    pub pull_wait: Duration,
}

/// The cursor logic of one subscriber (see the module documentation).
#[derive(Debug, Clone)]
pub struct Feed {
    gate: GateId,
    max: NonZeroUsize,
    timing: FeedTiming,
    /// `None`: no snapshot handed out yet, or a resync is due.
    cursor: Option<GateClock>,
    /// What the subscriber holds, as the frames handed out built it.
    sent: Replica,
    next_snapshot_ms: u64,
}

fn deadline(budget: Duration) -> Result<Deadline, FeedError> {
    Deadline::within(budget).map_err(|e| FeedError::Deadline(e.to_string()))
}

/// The wait after a read that was not answered (bounded: the stream stays responsive).
fn wait_for<T>(outcome: &GateOutcome<T>) -> Result<Step, FeedError> {
    let ms = match outcome {
        GateOutcome::Incompatible { category } => return Err(FeedError::Incompatible(*category)),
        GateOutcome::Unavailable { retry_after_ms, .. }
        | GateOutcome::Indeterminate { retry_after_ms } => *retry_after_ms,
        GateOutcome::Evaluated(_) => 100,
    };
    Ok(Step::Wait(Duration::from_millis(ms.clamp(10, 1000))))
}

impl Feed {
    /// A feed of `gate` pulling at most `max` updates per read.
    pub fn new(gate: GateId, max: NonZeroUsize, timing: FeedTiming) -> Self {
        Self {
            gate,
            max,
            timing,
            cursor: None,
            sent: Replica::new(),
            next_snapshot_ms: 0,
        }
    }

    /// The clock of the last frame handed out (`None` before the first snapshot).
    pub fn cursor(&self) -> Option<GateClock> {
        self.cursor
    }

    /// The subscriber's copy as the frames handed out built it.
    pub fn replica(&self) -> &Replica {
        &self.sent
    }

    /// The next frames at monotonic time `now_ms` (a snapshot when none was sent, one is
    /// due or the provider asked for a resync; else the updates after the cursor).
    ///
    /// # Errors
    /// [`FeedError`]: the gate is unknown or incompatible; the stream should end.
    pub async fn step(&mut self, port: &dyn EventGatePort, now_ms: u64) -> Result<Step, FeedError> {
        let Some(after) = self.cursor else {
            return self.resync(port, now_ms).await;
        };
        if now_ms >= self.next_snapshot_ms {
            return self.periodic(port, after, now_ms).await;
        }
        let budget = self.timing.pull_wait.max(self.timing.budget);
        let outcome = port
            .updates_after(&self.gate, after, self.max, deadline(budget)?)
            .await?;
        match outcome {
            GateOutcome::Evaluated(UpdateBatch::Updates(updates)) => {
                Ok(self.hand_out(updates.into_iter().map(Frame::Status).collect()))
            }
            GateOutcome::Evaluated(UpdateBatch::Resync) => {
                self.cursor = None;
                Ok(Step::Send(Vec::new()))
            }
            other => wait_for(&other),
        }
    }

    /// Records `frames` as handed out and answers them.
    fn hand_out(&mut self, frames: Vec<Frame>) -> Step {
        for f in &frames {
            match f {
                // A frame that does not fit the copy (the provider's stream disagrees with
                // itself) is still sent: the subscriber decides; the copy stays as it was.
                Frame::Status(u) => {
                    let _ = self.sent.apply(u);
                }
                Frame::Snapshot(s) => {
                    self.sent.apply_snapshot(s.clone());
                }
            }
            self.cursor = Some(self.cursor.map_or(f.clock(), |c| c.max(f.clock())));
        }
        Step::Send(frames)
    }

    fn schedule(&mut self, now_ms: u64) {
        let every = u64::try_from(self.timing.snapshot_interval.as_millis()).unwrap_or(u64::MAX);
        self.next_snapshot_ms = now_ms.saturating_add(every);
    }

    async fn read_snapshot(
        &self,
        port: &dyn EventGatePort,
    ) -> Result<Result<Snapshot, Step>, FeedError> {
        match port
            .snapshot(&self.gate, deadline(self.timing.budget)?)
            .await?
        {
            GateOutcome::Evaluated(s) => Ok(Ok(s)),
            other => Ok(Err(wait_for(&other)?)),
        }
    }

    /// The periodic snapshot: first every update up to its clock, then the snapshot, then
    /// the updates above it that the same pulls returned.
    async fn periodic(
        &mut self,
        port: &dyn EventGatePort,
        after: GateClock,
        now_ms: u64,
    ) -> Result<Step, FeedError> {
        let snapshot = match self.read_snapshot(port).await? {
            Ok(s) => s,
            Err(wait) => return Ok(wait),
        };
        self.schedule(now_ms);
        if snapshot.clock < after {
            // Read before an update already handed out (another replica lagging): skip it.
            return Ok(Step::Send(Vec::new()));
        }
        let mut before = Vec::new();
        let mut later = Vec::new();
        let mut cursor = after;
        while cursor < snapshot.clock && later.is_empty() {
            let outcome = port
                .updates_after(&self.gate, cursor, self.max, deadline(self.timing.budget)?)
                .await?;
            match outcome {
                GateOutcome::Evaluated(UpdateBatch::Updates(updates)) => {
                    if updates.is_empty() {
                        break; // no update up to the snapshot's clock is left (rejections)
                    }
                    for u in updates {
                        cursor = u.clock;
                        if u.clock <= snapshot.clock {
                            before.push(Frame::Status(u));
                        } else {
                            later.push(Frame::Status(u));
                        }
                    }
                }
                GateOutcome::Evaluated(UpdateBatch::Resync) => {
                    // The updates up to the snapshot are gone: hand out what was pulled and
                    // recover the rest with a resync.
                    let step = self.hand_out(before);
                    self.cursor = None;
                    return Ok(step);
                }
                other => {
                    // Not answered: hand out what was pulled; the snapshot is due again.
                    self.next_snapshot_ms = now_ms;
                    if before.is_empty() {
                        return wait_for(&other);
                    }
                    return Ok(self.hand_out(before));
                }
            }
        }
        before.push(Frame::Snapshot(snapshot));
        before.extend(later);
        Ok(self.hand_out(before))
    }

    /// A fresh snapshot after none or a resync, preceded by the terminal status of every
    /// event the subscriber holds and the snapshot no longer lists.
    async fn resync(&mut self, port: &dyn EventGatePort, now_ms: u64) -> Result<Step, FeedError> {
        let snapshot = match self.read_snapshot(port).await? {
            Ok(s) => s,
            Err(wait) => return Ok(wait),
        };
        let mut ended = Vec::new();
        let held = self.sent.snapshot().incubating;
        for e in held {
            if snapshot.incubating.iter().any(|s| s.id == e.id) {
                continue;
            }
            let record = match port
                .event(&self.gate, &e.id, deadline(self.timing.budget)?)
                .await?
            {
                GateOutcome::Evaluated(r) => r,
                other => return wait_for(&other),
            };
            let Some(r) = record else { continue }; // removed after its retention
            if r.status != EventStatus::Submitted
                && r.clock > self.sent.clock()
                && r.clock <= snapshot.clock
            {
                ended.push(Frame::Status(StatusUpdate {
                    clock: r.clock,
                    id: r.id,
                    key: r.key,
                    status: r.status,
                    at_ms: r.terminal_at_ms.unwrap_or(r.publish_at_ms),
                    publish_at_ms: r.publish_at_ms,
                }));
            }
        }
        ended.sort_by_key(Frame::clock);
        ended.push(Frame::Snapshot(snapshot));
        self.schedule(now_ms);
        self.cursor = None;
        Ok(self.hand_out(ended))
    }
}
