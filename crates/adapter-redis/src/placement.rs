//! Thread per core for the provider's connections.
//!
//! An app that serves on N single-threaded runtimes (one per core) gives the provider those
//! runtimes: each node then gets at least one connection per runtime, connection `k` is
//! supervised and driven on runtime `k mod N`, and a request picks the connection of the
//! thread it runs on while that connection is up. A request's Redis call then starts and ends
//! on its own thread: no wake-up crosses to another thread. Without a placement the
//! connections run on the runtime that built the provider, as before.

use std::thread::ThreadId;

use tokio::runtime::Handle;

thread_local! {
    static THIS_THREAD: ThreadId = std::thread::current().id();
}

/// The calling thread's id, read once per thread: a connection pick asks on every decision,
/// and `thread::current()` would clone and drop a shared handle each time.
pub(crate) fn this_thread() -> ThreadId {
    THIS_THREAD.with(|id| *id)
}

/// The runtimes a provider's connections are spread over; empty: the caller's runtime.
#[derive(Clone, Default)]
pub struct Placement {
    runtimes: Vec<Handle>,
}

impl Placement {
    /// Connections spread over `runtimes`, each of which must be a single-threaded runtime
    /// driven by one thread for the provider's life (`inbound_listener::WorkerThreads`'s).
    pub fn new(runtimes: Vec<Handle>) -> Self {
        Self { runtimes }
    }

    /// How many runtimes.
    pub fn len(&self) -> usize {
        self.runtimes.len()
    }

    /// Whether the connections stay on the caller's runtime.
    pub fn is_empty(&self) -> bool {
        self.runtimes.is_empty()
    }

    /// The runtime of connection `k`.
    pub(crate) fn runtime(&self, k: usize) -> Option<&Handle> {
        match self.runtimes.len() {
            0 => None,
            n => self.runtimes.get(k % n),
        }
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("runtimes", &self.runtimes.len())
            .finish()
    }
}
