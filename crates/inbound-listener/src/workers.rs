//! Where accepted connections are served: thread per core.
//!
//! A work-stealing runtime with several workers wakes, parks and steals across threads on
//! every request burst; on a loaded machine that costs more CPU per request than the
//! requests themselves save by running in parallel (measured: 1.2-1.3x the CPU of one worker
//! for the same HTTP decisions). So the app serves on N single-threaded runtimes instead, and
//! each accepted connection is handed, round robin, to one of them for its whole life: its
//! socket, timers and requests stay on one thread, and threads meet only at `accept`.
//!
//! [`WorkerThreads::start`] takes the runtime the caller is on (the main thread's, which
//! also accepts and runs the background tasks) as the first worker and starts the others;
//! [`Workers`] is the cheap handle the accept loops take. [`Workers::current`] serves every
//! connection on the runtime the accept loop runs on (what tests and embedders get).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The runtimes connections are handed to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workers(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Empty: the runtime the accept loop runs on.
    handles: Vec<Handle>,
    next: AtomicUsize,
}

/// Where one connection is served.
pub(crate) enum Place<'a> {
    /// On the runtime the accept loop runs on (the socket stays registered there).
    Here,
    /// On another runtime: the socket moves to that runtime's reactor.
    On(&'a Handle),
}

impl Workers {
    /// Every connection on the runtime the accept loop runs on.
    pub fn current() -> Self {
        Self(Arc::new(Inner {
            handles: Vec::new(),
            next: AtomicUsize::new(0),
        }))
    }

    /// The serving runtimes, the caller's first (empty for [`Self::current`]): where a
    /// provider places its connections, one per thread.
    pub fn runtimes(&self) -> &[Handle] {
        &self.0.handles
    }

    /// How many runtimes serve connections (1 for [`Self::current`]).
    pub fn count(&self) -> usize {
        self.0.handles.len().max(1)
    }

    /// The runtime for the next connection, round robin.
    pub(crate) fn next(&self) -> Place<'_> {
        let handles = &self.0.handles;
        if handles.len() <= 1 {
            return Place::Here;
        }
        let i = self.0.next.fetch_add(1, Ordering::Relaxed) % handles.len();
        Place::On(&handles[i])
    }
}

/// The serving threads beyond the caller's own: each runs a single-threaded runtime until
/// [`Self::shutdown`].
#[derive(Debug)]
pub struct WorkerThreads {
    workers: Workers,
    threads: Vec<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl WorkerThreads {
    /// `total` serving runtimes: `first` (the caller's; it must drive its spawned tasks, as
    /// a runtime's `block_on` does) and `total - 1` new threads named `inbound-worker-N`.
    /// `total` of 0 counts as 1.
    ///
    /// # Errors
    /// The I/O error of a runtime or thread that could not be started (those started are
    /// stopped again).
    pub fn start(total: usize, first: Handle) -> std::io::Result<Self> {
        let mut started = Self {
            workers: Workers::current(),
            threads: Vec::new(),
        };
        let mut handles = vec![first];
        for n in 1..total.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("inbound-worker-{n}"))
                .spawn(move || {
                    let _ = runtime.block_on(stopped);
                    // A connection still open at exit is dropped, not waited for.
                    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
                });
            match thread {
                Ok(t) => started.threads.push((stop, t)),
                Err(e) => {
                    started.shutdown();
                    return Err(e);
                }
            }
        }
        started.workers = Workers(Arc::new(Inner {
            handles,
            next: AtomicUsize::new(0),
        }));
        Ok(started)
    }

    /// The handle the accept loops take.
    pub fn workers(&self) -> Workers {
        self.workers.clone()
    }

    /// Stops the threads and waits for them (call it after the servers drained, outside of
    /// an async context: it blocks).
    pub fn shutdown(self) {
        for (stop, thread) in self.threads {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_round_robin_over_every_runtime_and_one_runtime_is_here() {
        let main = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let threads = WorkerThreads::start(3, main.handle().clone()).expect("start");
        let w = threads.workers();
        assert_eq!(w.count(), 3);
        // Each pick runs a task that says which thread it ran on.
        let tasks: Vec<_> = (0..6)
            .map(|_| match w.next() {
                Place::On(h) => h.spawn(async { std::thread::current().name().map(str::to_owned) }),
                Place::Here => panic!("three runtimes: each connection goes to one of them"),
            })
            .collect();
        let ran: Vec<Option<String>> = main.block_on(async {
            let mut ran = Vec::new();
            for t in tasks {
                ran.push(t.await.expect("task"));
            }
            ran
        });
        let here = std::thread::current().name().map(str::to_owned);
        let w1 = Some("inbound-worker-1".to_owned());
        let w2 = Some("inbound-worker-2".to_owned());
        assert_eq!(ran, [here.clone(), w1.clone(), w2.clone(), here, w1, w2]);
        threads.shutdown();

        let one = WorkerThreads::start(1, main.handle().clone()).expect("start");
        assert_eq!(one.workers().count(), 1);
        assert!(matches!(one.workers().next(), Place::Here));
        assert!(matches!(Workers::current().next(), Place::Here));
        one.shutdown();
    }
}
