//! Event gates: "this event only once per period", the second port of the hexagon beside
//! request limiting (semantics in `docs/event-gates.md`).
//!
//! - [`ids`]: validated gate ids, event keys, event ids and the gate clock;
//! - [`settings`]: the mode (`only_once` | `strictly_once`), duration and memory bounds;
//! - [`model`]: the reference state machine, [`GateState`], the single source of truth that
//!   the local provider runs and the Redis Lua programs mirror;
//! - [`replica`]: a subscriber's snapshot-plus-deltas copy, [`Replica`];
//! - [`feed`]: the lossless cursor of one subscriber, [`Feed`] (which frames to send next);
//! - [`port`]: the async [`EventGatePort`] and its honest [`GateOutcome`].

pub mod feed;
pub mod ids;
pub mod model;
pub mod port;
pub mod replica;
pub mod settings;

pub use feed::{Feed, FeedError, FeedTiming, Frame, Step};
pub use ids::{EventId, EventKey, GateClock, GateId, GateValueError};
pub use model::{
    EventRecord, EventStatus, GateError, GateState, IncubatingEvent, Snapshot, StatusUpdate,
    Submission, SubmitOutcome, Sweep,
};
pub use port::{EventGatePort, GateOutcome, GateRequestError, SubmitRequest, UpdateBatch};
pub use replica::{Applied, Replica, ReplicaError, SnapshotApplied};
pub use settings::{GateMode, GateSet, GateSetError, GateSettings, GateSpec, MAX_EVENTS_LIMIT};
