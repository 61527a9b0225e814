//! Accept loops that hold under hostile clients, for any protocol served over TCP.
//!
//! The key design decision: the loop, not the protocol, owns the connection's lifetime. The
//! caller gives [`serve_on`] a function that serves one connection (HTTP/1 with hyper in
//! `inbound-web`, HTTP/2 in `inbound-grpc`); the loop holds a connection permit while that
//! function runs, and [`supervise`] closes what a protocol library would keep open forever (a
//! connection that never sends its first bytes, one that stays idle). So both ports of the
//! reference app meet one set of rules, written once:
//!
//! - [`accept`]: the connection cap (at the cap a connection that has sent nothing is closed
//!   to make room; otherwise further clients wait in the listen backlog, and the loop never
//!   spins), accept failures retried after [`ACCEPT_BACKOFF`] and logged at most once per
//!   [`LOG_INTERVAL`], graceful drain on shutdown.
//! - [`connection`]: [`Activity`] counters fed by a [`Tracked`] stream and by [`Call`]
//!   guards, and [`supervise`], which applies the handshake and idle timeouts to a connection.
//! - [`workers`]: thread per core: each accepted connection is served for its whole life on
//!   one of N single-threaded runtimes (no work stealing, no cross-thread wake-ups).
//! - [`budget`]: one open-file budget shared by several listeners, with descriptors reserved
//!   for everything else the process holds (Redis connections, files).

#![warn(missing_docs)]

pub mod accept;
pub mod budget;
pub mod connection;
pub mod workers;

pub use accept::{ACCEPT_BACKOFF, Admission, LOG_INTERVAL, Throttle, serve_on};
pub use budget::{Budget, open_descriptors, open_file_limit};
pub use connection::{Activity, Call, Handshake, IdleBy, Stop, Timeouts, Tracked, supervise};
pub use workers::{WorkerThreads, Workers};
