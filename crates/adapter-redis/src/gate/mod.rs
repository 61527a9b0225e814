//! The Redis provider of the event-gate port: one shared gate across every instance of a
//! service.
//!
//! The key design decision is the rate-limit side's: **each mutation is one atomic Lua
//! program over the gate's keys, and the adapter trusts nothing it cannot verify.** Submit,
//! publish-due and the conditional delete (`lua/gate-*-v1.lua`) read `TIME` once and mirror
//! `shared_contract::gate::GateState`; every status change takes its clock with `INCR` and
//! appends its update to the gate's Redis Stream inside the same program, so every instance
//! sees the same updates in the same clock order. The connection supervision, the
//! `EVALSHA`/`NOSCRIPT` discipline and the failure certainty are the rate-limit provider's
//! ([`crate::provider`], [`crate::failure`]).
//!
//! | concern | module |
//! | --- | --- |
//! | the eight keys of a gate, one hash tag `{gate}` | [`keys`] |
//! | program manifests, embedded sources, arguments | [`programs`] |
//! | the strict reply, record and stream-entry parsers (pure) | [`reply`] |
//! | settings, the background publisher, the port | [`provider`] |
//! | the stored-settings check of the readiness (pure) | [`stored`] |

pub mod keys;
pub mod programs;
pub mod provider;
pub mod reply;
pub mod stored;

pub use provider::{RedisGateProvider, RedisGateSettings};
