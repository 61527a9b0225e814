//! The acceptance tests, one binary (one link of the dependency tree, not one per file): a
//! module per boundary, named `<boundary>_<topic>` by the prefix table in tests/README.md.
//!
//! Modules share this process: the shared `redis-server` of `RedisServer::shared`, and the
//! machine's two test threads. Tests that load the machine or measure time under load take
//! [`heavy`] (or [`heavy_blocking`]), so that no two of them run at once, as when each had a
//! binary of its own.

mod cluster_keys;
mod cluster_provider;
mod config_examples;
mod config_grpc;
mod config_routes;
mod config_validation;
mod deploy_examples;
mod deploy_image;
mod embed_fresh_crate;
mod fault_failover;
mod fault_partition;
mod gate_providers;
mod gate_redis;
mod gate_stream;
mod harness_proxy;
mod harness_redis_server;
mod harness_sentinel;
mod local_concurrency;
mod local_conformance;
mod lua_batch;
mod lua_cases;
mod lua_differential;
mod lua_gate;
mod lua_guarantees;
mod lua_leases;
mod lua_multi;
mod lua_reservations;
mod lua_settle;
mod redis_batch;
mod redis_calendar;
mod redis_conformance;
mod redis_deny_cache;
mod redis_faults;
mod redis_fleet;
mod redis_leases;
mod redis_multi;
mod redis_placement;
mod redis_provider;
mod redis_tls_acl;
mod sentinel_provider;
mod tidy;

use tokio::sync::{Mutex, MutexGuard};

static HEAVY: Mutex<()> = Mutex::const_new(());

/// Held by a heavy test (topologies killed under load, a partition timed against its bound, a
/// crate, a release binary or an image built) for as long as it runs: one such test at a time.
async fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().await
}

/// [`heavy`] for a test outside an async runtime.
fn heavy_blocking() -> MutexGuard<'static, ()> {
    HEAVY.blocking_lock()
}
