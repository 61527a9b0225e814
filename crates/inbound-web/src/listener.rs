//! The HTTP/1.1 listener: its own accept loop on hyper, with the `[http]` limits.
//!
//! - **Header-read timeout**: a connection that has not sent a complete request head
//!   `header_read_timeout` after it was accepted, or after its previous response, is closed
//!   (hyper's HTTP/1 timer; slowloris clients hold a descriptor for that long at most).
//! - **Idle timeout**: a connection with no byte read or written for `idle_timeout` (checked
//!   every quarter of it) is shut down gracefully: at once when no request is in flight, after
//!   its response otherwise; if it is still open and silent one more `idle_timeout` later, it
//!   is dropped.
//! - **Connection cap**: at most `max_connections` connections are served at once; the loop
//!   accepts the next one only when one has closed, so further clients wait in the kernel's
//!   listen backlog (queued, not refused) and the loop never spins on them.
//! - **Out of descriptors**: an `accept` that fails (EMFILE and the like) is retried after
//!   [`ACCEPT_BACKOFF`]; the connections already open keep being served; the failure is
//!   logged at most once per [`LOG_INTERVAL`], with the count of failures since the last line.
//!
//! WebSocket upgrades work as with `axum::serve`: an upgraded connection leaves the
//! listener (and its cap and timers) once the upgrade is done. On shutdown the loop stops
//! accepting, every connection is shut down gracefully (in-flight requests finish), and
//! [`serve`] returns once all are closed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::reload::CurrentRouter;
use app_bootstrap::HttpSettings;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::{Layer as _, Service as _};

use crate::hygiene::HygieneLayer;

/// How long the loop waits after an `accept` that failed for want of resources.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(25);
/// At most one log line per this interval for accept failures, and for reaching the cap.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The listener limits of `[http]` (timeouts and the connection cap; the body limit is the
/// router's, applied by [`crate::app::serve`]).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_body_bytes: usize,
}

impl From<&HttpSettings> for Limits {
    fn from(s: &HttpSettings) -> Self {
        Self {
            header_read_timeout: s.header_read_timeout,
            idle_timeout: s.idle_timeout,
            max_connections: s.max_connections,
            max_body_bytes: s.max_body_bytes,
        }
    }
}

/// Rate-limits a repeated log line: [`Self::record`] says when to write it.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
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

/// Serves `router` on `listener` with `limits` until `shutdown` resolves, then drains.
///
/// # Errors
/// None today (accept failures are retried); the type leaves room for fatal ones.
pub async fn serve(
    listener: TcpListener,
    router: CurrentRouter,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopped) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accept_failures = Throttle::new(LOG_INTERVAL);
    let mut at_cap = Throttle::new(LOG_INTERVAL);
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if at_cap.record(Instant::now()).is_some() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "http.max_connections reached; new connections wait in the backlog"
                    );
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
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let conn = connection(stream, peer, router.clone(), limits, stopped.clone());
                tokio::spawn(held(conn, permit));
            }
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                if let Some(suppressed) = accept_failures.record(Instant::now()) {
                    tracing::error!(
                        error = %e,
                        suppressed,
                        "accept failed; retrying, open connections are still served"
                    );
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    drop(listener);
    drop(stopped);
    // Every connection sees the change and shuts down gracefully.
    let _ = stop.send(());
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
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

/// Serves one connection until it ends, shutdown asks it to, or it stays silent too long.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: CurrentRouter,
    limits: Limits,
    mut stop: watch::Receiver<()>,
) {
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    // Wrapped once per connection, not per request: a `Router::layer` would box and clone
    // each route's service on every request.
    let app = HygieneLayer::new(limits.max_body_bytes, limits.header_read_timeout).layer(router);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        // The router boxes the body the same way on its own; done here once instead.
        app.clone().call(req.map(Body::new))
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(io, service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let check = (limits.idle_timeout / 4).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + check, check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seen, mut quiet) = (0, Duration::ZERO);
    let (mut stopping, mut idle_closing) = (false, false);
    loop {
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick() => {
                let now = activity.load(Ordering::Relaxed);
                if now != seen {
                    (seen, quiet) = (now, Duration::ZERO);
                    continue;
                }
                quiet += check;
                if quiet < limits.idle_timeout {
                    continue;
                }
                if idle_closing {
                    tracing::debug!(%peer, "idle connection did not close; dropped");
                    return;
                }
                idle_closing = true;
                quiet = Duration::ZERO;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A stream that counts its reads and writes, for the idle timer (one relaxed add per
/// I/O call; nothing per request).
struct Tracked {
    inner: TcpStream,
    activity: Arc<AtomicU64>,
}

impl Tracked {
    fn note<T>(&self, p: &Poll<T>) {
        if p.is_ready() {
            self.activity.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.note(&p);
        p
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note(&p);
        p
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note(&p);
        p
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
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
}
