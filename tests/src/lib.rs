//! Test support shared by the acceptance tests: the provider-neutral conformance suite and a
//! self-contained `redis-server` harness.

pub mod cluster;
pub mod conformance;
pub mod failover;
pub mod lua;
pub mod redis_server;
pub mod redis_target;
