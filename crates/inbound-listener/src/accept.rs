//! The accept loop: a connection cap that queues in the backlog (making room by closing
//! connections that have sent nothing), accept failures retried with a backoff and logged once
//! per interval, and a graceful drain on shutdown.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::AbortHandle;

use crate::connection::Activity;
pub use crate::connection::Stop;
use crate::workers::{Place, Workers};

/// How long the loop waits after an `accept` that failed for want of resources.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(25);
/// At most one log line per this interval for accept failures, and for reaching the cap.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate-limits a repeated log line: [`Self::record`] says when to write it.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// A throttle that lets one line through per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Records one occurrence at `now`: `Some(n)` when a line is due (`n` occurrences were
    /// not logged since the previous line), `None` when it is suppressed.
    pub fn record(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// What a listener admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The listener's configuration section (`"http"`, `"grpc"`), for log lines.
    pub name: &'static str,
    /// Connections served at once.
    pub max_connections: usize,
    /// Bytes a connection has sent once its handshake is done (HTTP/2: the preface and the
    /// first SETTINGS frame header; HTTP/1: a first byte). At the cap, a connection that has
    /// sent fewer is closed to make room for the next one.
    pub handshake_bytes: u64,
}

/// Accepts connections on `listener` and serves each with `connection` (given the stream, the
/// peer, the [`Activity`] to count into and a [`Stop`]), at most `admission.max_connections`
/// at once, until `shutdown` resolves; then stops accepting, tells every connection to shut
/// down gracefully and returns once all are closed.
///
/// At the cap, the oldest connection that has not finished its handshake is closed and the
/// next client accepted: a flood of connections that send nothing cannot keep the clients that
/// speak waiting (each silent one is closed at once instead of at its handshake timeout).
/// When every connection has spoken, the next client waits, accepted, for a place (so the
/// loop holds at most `max_connections + 1` connections), and further clients wait in the
/// listen backlog until one closes; the loop does not spin on them.
///
/// Each connection is handed round robin to one of `workers` and served there for its whole
/// life ([`Workers::current`]: on the runtime the loop runs on).
///
/// # Errors
/// None today (accept failures are retried); the type leaves room for fatal ones.
pub async fn serve_on<F, C>(
    listener: TcpListener,
    admission: Admission,
    workers: &Workers,
    shutdown: impl Future<Output = ()>,
    connection: F,
) -> std::io::Result<()>
where
    F: Fn(TcpStream, SocketAddr, Arc<Activity>, Stop) -> C + Send + Sync + 'static,
    C: Future<Output = ()> + Send + 'static,
{
    let connection = Arc::new(connection);
    let Admission {
        name,
        max_connections,
        handshake_bytes,
    } = admission;
    let max_connections = max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max_connections));
    let (stop, stopped) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accept_failures = Throttle::new(LOG_INTERVAL);
    let mut at_cap = Throttle::new(LOG_INTERVAL);
    let mut unspoken = Unspoken::new(handshake_bytes, max_connections);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                if let Some(suppressed) = accept_failures.record(Instant::now()) {
                    tracing::error!(
                        listener = name,
                        error = %e,
                        suppressed,
                        "accept failed; retrying, open connections are still served"
                    );
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Accepted before a place is free, so that a place is made only for a client that
        // is there: at most one connection beyond the cap waits here, the rest in the backlog.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let evicted = unspoken.evict_oldest();
                if at_cap.record(Instant::now()).is_some() {
                    tracing::warn!(
                        listener = name,
                        max_connections,
                        "{name}.max_connections reached; connections that have sent nothing \
                         are closed to make room, others wait in the backlog"
                    );
                }
                if evicted {
                    tracing::debug!(listener = name, "closed a connection that had sent nothing");
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                }
            }
        };
        let activity = Activity::new();
        let weak = Arc::downgrade(&activity);
        let stop = stopped.clone();
        let task = match workers.next() {
            Place::Here => tokio::spawn(held(connection(stream, peer, activity, stop), permit)),
            Place::On(runtime) => {
                // The socket leaves this runtime's reactor for the worker's, so that its
                // readiness wakes the worker's thread, not this one.
                let Ok(std) = stream.into_std() else { continue };
                let connection = connection.clone();
                runtime.spawn(async move {
                    match TcpStream::from_std(std) {
                        Ok(stream) => held(connection(stream, peer, activity, stop), permit).await,
                        Err(e) => tracing::debug!(error = %e, "could not register a connection"),
                    }
                })
            }
        };
        unspoken.push(weak, task.abort_handle());
    }
    drop(listener);
    drop(stopped);
    // Every connection sees the change and shuts down gracefully.
    let _ = stop.send(());
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

/// The connections that may not have finished their handshake, oldest first. Entries of
/// connections that ended or have spoken are dropped lazily, and the list is pruned when it
/// grows past twice the cap, so it stays bounded without work per request.
struct Unspoken {
    handshake_bytes: u64,
    bound: usize,
    list: VecDeque<(Weak<Activity>, AbortHandle)>,
}

impl Unspoken {
    fn new(handshake_bytes: u64, max_connections: usize) -> Self {
        Self {
            handshake_bytes,
            bound: max_connections.saturating_mul(2),
            list: VecDeque::new(),
        }
    }

    fn push(&mut self, activity: Weak<Activity>, task: AbortHandle) {
        self.list.push_back((activity, task));
        if self.list.len() > self.bound {
            let handshake_bytes = self.handshake_bytes;
            self.list.retain(|(a, _)| silent(a, handshake_bytes));
        }
    }

    /// Closes the oldest connection still without its handshake; whether there was one.
    fn evict_oldest(&mut self) -> bool {
        while let Some((activity, task)) = self.list.pop_front() {
            if silent(&activity, self.handshake_bytes) {
                // Dropping the task's future closes the socket and frees its permit.
                task.abort();
                return true;
            }
        }
        false
    }
}

/// Whether the connection is open and has sent fewer than `handshake_bytes`.
fn silent(activity: &Weak<Activity>, handshake_bytes: u64) -> bool {
    activity
        .upgrade()
        .is_some_and(|a| a.bytes_read() < handshake_bytes)
}

async fn held(conn: impl Future<Output = ()>, _permit: OwnedSemaphorePermit) {
    conn.await;
}

/// Errors of one connection that the loop skips without a pause (as `axum::serve` does).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_writes_one_line_per_interval_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(10));
        assert_eq!(t.record(t0), Some(0));
        for s in 1..10 {
            assert_eq!(t.record(t0 + Duration::from_secs(s)), None, "second {s}");
        }
        assert_eq!(t.record(t0 + Duration::from_secs(10)), Some(9));
        assert_eq!(t.record(t0 + Duration::from_secs(11)), None);
        assert_eq!(t.record(t0 + Duration::from_secs(25)), Some(1));
    }

    /// Served through the accept loop: each connection answers with the thread serving it
    /// and holds until the drain; the cap counts across the workers; the drain waits for
    /// the connections on every worker.
    #[test]
    fn the_accept_loop_serves_connections_on_the_workers_and_drains_them_all() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let main = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let threads = crate::WorkerThreads::start(2, main.handle().clone()).expect("start");
        let workers = threads.workers();
        let names = main.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let (shutdown, down) = tokio::sync::oneshot::channel::<()>();
            let admission = Admission {
                name: "test",
                max_connections: 4,
                handshake_bytes: 0,
            };
            let server = tokio::spawn(async move {
                serve_on(
                    listener,
                    admission,
                    &workers,
                    async {
                        let _ = down.await;
                    },
                    |mut stream: tokio::net::TcpStream, _, _, mut stop: Stop| async move {
                        let name = std::thread::current().name().unwrap_or("?").to_owned();
                        let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                        let _ = stop.changed().await;
                        let _ = stream.write_all(b"bye\n").await;
                    },
                )
                .await
            });
            let mut clients = Vec::new();
            let mut names = Vec::new();
            for _ in 0..4 {
                let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let mut line = Vec::new();
                while !line.ends_with(b"\n") {
                    let mut b = [0u8; 1];
                    assert_eq!(c.read(&mut b).await.expect("read"), 1, "greeting");
                    line.push(b[0]);
                }
                names.push(String::from_utf8(line).expect("utf-8").trim().to_owned());
                clients.push(c);
            }
            let _ = shutdown.send(());
            server.await.expect("task").expect("served");
            // The server returned after every connection, on both workers, said goodbye.
            for mut c in clients {
                let mut rest = String::new();
                let _ = c.read_to_string(&mut rest).await;
                assert_eq!(rest, "bye\n");
            }
            names
        });
        let here = std::thread::current().name().unwrap_or("?").to_owned();
        assert_eq!(
            names,
            [
                here.clone(),
                "inbound-worker-1".to_owned(),
                here,
                "inbound-worker-1".to_owned()
            ]
        );
        threads.shutdown();
    }
}
