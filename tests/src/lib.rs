//! Test support shared by the acceptance tests: the provider-neutral conformance suite and
//! self-contained Redis topologies (a single server, a cluster, a Sentinel group) on guarded
//! processes that tests may kill, pause and restart.

pub mod cluster;
pub mod conformance;
pub mod lua;
pub mod probe;
pub mod process;
pub mod redis_server;
pub mod sentinel;
