//! The Redis provider of the rate-limiting port: one shared, exact answer across every
//! instance of a service.
//!
//! The key design decision: **each evaluation is one atomic Lua program on one key, and the
//! adapter trusts nothing it cannot verify.** The programs (in `lua/`, embedded here) read the
//! server's `TIME` once and mirror the reference models of `shared-contract`; this crate
//! builds their keys and arguments, parses their seven-field reply strictly, and classifies
//! every failure by what is known about the state:
//!
//! | concern | module |
//! | --- | --- |
//! | physical keys (`<prefix>:{tag}digest`, no raw subject) | [`keys`] |
//! | program manifests, embedded sources, arguments | [`programs`] |
//! | the strict reply parser (pure) | [`reply`] |
//! | failure certainty (`Unavailable` / `Indeterminate` / `Incompatible`) | [`failure`] |
//! | the start-up check of the ACL user's permissions | [`acl`] |
//! | settings, topology, every rule about them (field-named problems) | [`settings`] |
//! | the port | [`provider`] |
//! | supervised connections to one node | `connection` |
//! | the multiplexed RESP2 connection itself (encoding, reply parser, at-most-once calls) | `wire` |
//! | topologies (standalone, Sentinel, Cluster) and running a program | `pool`, `sentinel`, `cluster` |
//! | the crate's error type | [`error`] |
//! | the event-gate provider (second port) | [`gate`] |
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

pub mod acl;
mod cluster;
mod connection;
pub mod error;
pub mod failure;
pub mod gate;
pub mod keys;
mod pool;
pub mod programs;
pub mod provider;
pub mod reply;
mod sentinel;
pub mod settings;
pub mod tls;
mod wire;

pub use error::{Error, SettingsProblem, SettingsProblems};
pub use gate::{RedisGateProvider, RedisGateSettings};
pub use provider::RedisProvider;
pub use settings::{RedisSettings, Topology};
pub use tls::TlsFiles;
