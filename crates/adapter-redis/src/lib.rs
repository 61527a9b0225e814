//! The Redis provider of the rate-limiting port: one shared, exact answer across every
//! instance of a service.
//!
//! The key design decision: **each evaluation is one atomic Lua program on one key, and the
//! adapter trusts nothing it cannot verify.** The programs (in `lua/`, embedded here) read the
//! server's `TIME` once and mirror the reference models of `shared-contract`; this crate
//! builds their keys and arguments, parses their seven-field reply strictly, and classifies
//! every failure by what is known about the state:
//!
//! The modules form layers that read bottom-up: each imports only from the layers below it
//! (a tidy test of the workspace computes the imports and fails on a cycle).
//!
//! | layer | concern | module |
//! | --- | --- | --- |
//! | leaves | the crate's error type, field-named settings problems | [`error`] |
//! | | the command catalogue (every command sent, as ACL rules name it) | [`commands`] |
//! | | the RESP2 codec: encoding commands, parsing replies (pure) | `resp` |
//! | | the strict reply parser of the rate-limit programs (pure) | [`reply`] |
//! | | the RESP2 parser as the fuzz targets in `tests/` call it (hidden, not API) | `fuzzing` |
//! | | what the background tasks share (handles, the last error) | `background` |
//! | programs | one [`script::Script`] type for every embedded Lua program | [`script`] |
//! | | the rate-limit programs and their arguments | [`programs`] |
//! | | physical keys (`<prefix>:{tag}digest`, no raw subject) | [`keys`] |
//! | | the clock metrics sampled from the programs' replies (skew, clamped, unsafe) | [`telemetry`] |
//! | one connection | the multiplexed connection: buffer, writer, reader, at-most-once calls | `wire` |
//! | | failure certainty (`Unavailable` / `Indeterminate` / `Incompatible`) | [`failure`] |
//! | | TLS for `rediss://` | [`tls`] |
//! | | dialing one node (TCP, TLS, handshake) within a timeout | `dial` |
//! | settings | settings, topology, fleet settings, every rule about them, URL resolution | [`settings`] |
//! | checks | a new connection's server checks (version, role, eviction, preload) | `checks` |
//! | | the ACL user's permissions, for the program lists it is given | [`acl`] |
//! | topology | Sentinel: which node is the master now | `sentinel` |
//! | | supervised connections to one node | `connection` |
//! | | Redis Cluster: the slot map and a node set per master | `cluster` |
//! | | the connections of one provider, and running a program on them | `pool` |
//! | fleet | fleet membership: the heartbeat program, its task, the last known size | [`fleet`] |
//! | ports | the rate-limit provider | [`provider`] |
//! | | the event-gate provider (second port) | [`gate`] |
//!
//! The provider connects in the background (an unreachable server is `Unavailable(connect)`
//! until it answers, never a start-up failure), multiplexes every request on one pipelined
//! connection, dispatches each command at most once, and never answers an allow it does not
//! know to be one.
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | `redis://` and `rediss://` (TLS, mutual TLS); standalone, Sentinel and Cluster topologies |

#![warn(missing_docs)]

pub mod acl;
mod background;
mod batch;
mod charges;
mod checks;
mod cluster;
pub mod commands;
mod connection;
pub mod deny_cache;
mod dial;
pub mod error;
pub mod failure;
pub mod fleet;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod keys;
pub mod leases;
pub mod placement;
mod plan;
mod pool;
pub mod programs;
pub mod provider;
pub mod reply;
pub mod reply_multi;
mod reservations;
mod resp;
pub mod script;
mod sentinel;
pub mod settings;
pub mod telemetry;
pub mod tls;
mod wire;

pub use batch::BatchStats;
pub use error::{Error, SettingsProblem, SettingsProblems};
pub use fleet::FleetView;
pub use gate::{RedisGateProvider, RedisGateSettings};
pub use placement::Placement;
pub use provider::RedisProvider;
pub use settings::{FleetSettings, RedisSettings, Topology};
pub use tls::TlsFiles;
