//! Test support shared by the acceptance tests: the provider-neutral conformance suite and
//! self-contained Redis topologies (a single server, a cluster, a Sentinel group) with the
//! fault tools to break them (a TCP fault proxy, pausing and killing nodes).

pub mod cluster;
pub mod conformance;
pub mod failover;
pub mod lua;
pub mod probe;
pub mod process;
pub mod proxy;
pub mod redis_server;
pub mod redis_target;
pub mod sentinel;
