//! Test support shared by the acceptance tests (and the end-to-end tests of `inbound-web`):
//!
//! - [`rate`] and [`gate`]: what a test sends and asks, built in one place (policies of every
//!   algorithm, requests, subjects, evaluations; gate settings, events, port calls);
//! - [`config`]: a configuration's settings or its problems by key path;
//! - [`eventually`]: the one bounded wait for something that becomes true in real time;
//! - [`requires`]: skipping a test whose tool is missing, unless CI requires it;
//! - [`conformance`] (and its multi-limit cases, [`conformance_multi`]): the provider-neutral
//!   conformance suite, run on every provider;
//! - [`lua`]: the Lua programs as the tests drive them;
//! - self-contained Redis topologies (a single server, a cluster, a Sentinel group) with the
//!   fault tools to break them (a TCP fault proxy, pausing and killing nodes).

pub mod cargo;
pub mod cluster;
pub mod config;
pub mod conformance;
pub mod conformance_charges;
pub mod conformance_leases;
pub mod conformance_multi;
pub mod conformance_reservations;
pub mod eventually;
pub mod failover;
pub mod gate;
pub mod lua;
pub mod probe;
pub mod process;
pub mod proxy;
pub mod rate;
pub mod redis_provider;
pub mod redis_server;
pub mod redis_target;
pub mod requires;
pub mod sentinel;
