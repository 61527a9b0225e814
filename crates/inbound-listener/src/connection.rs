//! One connection's timers: what it has done ([`Activity`], fed by a [`Tracked`] stream and
//! by [`Call`] guards), [`supervise`], which closes it when it stays silent too long, and the
//! [`Stop`] signal it watches for shutdown.

use std::fmt::Display;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// Tells a connection that the server is shutting down: `changed()` resolves then (and when
/// the loop is gone).
pub type Stop = watch::Receiver<()>;

/// What one connection has done, counted with relaxed atomics (one add per I/O call or per
/// call; nothing else per request).
#[derive(Debug, Default)]
pub struct Activity {
    /// Reads and writes that completed.
    io: AtomicU64,
    /// Bytes read.
    read: AtomicU64,
    /// Calls started or finished.
    calls: AtomicU64,
    /// Calls started and not yet finished.
    in_flight: AtomicU64,
}

impl Activity {
    /// Fresh counters for one connection.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A call starts; it counts as in flight until the returned guard is dropped.
    pub fn call(self: &Arc<Self>) -> Call {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Call(self.clone())
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// A number that changes whenever the connection does something that `by` counts (and
    /// stays the same while it does nothing); `None` while a call is in flight (`by` =
    /// [`IdleBy::Calls`]), which is never idle.
    fn mark(&self, by: IdleBy) -> Option<u64> {
        match by {
            IdleBy::Io => Some(self.io.load(Ordering::Relaxed)),
            IdleBy::Calls => (self.in_flight.load(Ordering::Relaxed) == 0)
                .then(|| self.calls.load(Ordering::Relaxed)),
        }
    }
}

/// A call in flight on a connection (see [`Activity::call`]); dropping it ends the call, also
/// when the call was cancelled.
#[derive(Debug)]
pub struct Call(Arc<Activity>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What keeps a connection from being idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleBy {
    /// Any byte read or written (HTTP/1: one request at a time, nothing but requests on the
    /// wire).
    Io,
    /// A call in flight, or one that started or ended within the idle timeout (HTTP/2: the
    /// protocol's own pings and settings move bytes on a connection that carries no call).
    Calls,
}

/// The first bytes a connection must send within a time (an HTTP/2 client's preface and
/// first SETTINGS frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    /// How long after the accept the bytes must have been read.
    pub within: Duration,
    /// How many bytes (HTTP/2: the 24-byte preface and the 9-byte SETTINGS frame header).
    pub bytes: u64,
}

/// The timers [`supervise`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `None`: the protocol has its own (hyper's HTTP/1 header-read timeout).
    pub handshake: Option<Handshake>,
    /// How long a connection may stay idle before it is shut down gracefully.
    pub idle: Duration,
    /// What counts as activity.
    pub idle_by: IdleBy,
}

/// Drives `conn` until it ends, shutdown asks it to (`stop`), or it stays silent too long.
///
/// - A connection that has not read `handshake.bytes` bytes `handshake.within` after it was
///   accepted is dropped (a client that has said nothing is owed no goodbye).
/// - A connection idle (as `timeouts.idle_by` counts) for `timeouts.idle`, checked every
///   quarter of it, is shut down with `graceful` (HTTP/1: after the response in flight;
///   HTTP/2: GOAWAY, calls in flight finish); if it is still open and idle one more
///   `timeouts.idle` later, it is dropped.
/// - On `stop`, `graceful` is called once and the connection is driven until it ends.
pub async fn supervise<C, E>(
    conn: C,
    graceful: impl Fn(Pin<&mut C>),
    peer: SocketAddr,
    activity: &Activity,
    timeouts: Timeouts,
    mut stop: Stop,
) where
    C: Future<Output = Result<(), E>>,
    E: Display,
{
    let mut conn = std::pin::pin!(conn);
    let check = (timeouts.idle / 4).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + check, check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let handshake = timeouts.handshake;
    let deadline = tokio::time::sleep(handshake.map_or(Duration::ZERO, |h| h.within));
    let mut deadline = std::pin::pin!(deadline);
    let mut awaiting_handshake = handshake.is_some();
    let (mut seen, mut quiet) = (None, Duration::ZERO);
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
                graceful(conn.as_mut());
            }
            () = deadline.as_mut(), if awaiting_handshake => {
                awaiting_handshake = false;
                let need = handshake.map_or(0, |h| h.bytes);
                if activity.bytes_read() < need {
                    tracing::debug!(%peer, "no handshake within the timeout; dropped");
                    return;
                }
            }
            _ = tick.tick() => {
                let now = activity.mark(timeouts.idle_by);
                if now.is_none() || now != seen {
                    (seen, quiet) = (now, Duration::ZERO);
                    continue;
                }
                quiet += check;
                if quiet < timeouts.idle {
                    continue;
                }
                if idle_closing {
                    tracing::debug!(%peer, "idle connection did not close; dropped");
                    return;
                }
                idle_closing = true;
                quiet = Duration::ZERO;
                graceful(conn.as_mut());
            }
        }
    }
}

/// A stream that counts its reads, writes and bytes read into an [`Activity`].
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    /// Wraps `inner`, counting into `activity`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }

    fn note<T>(&self, p: &Poll<T>) {
        if p.is_ready() {
            self.activity.io.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let p = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.note(&p);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            this.activity.read.fetch_add(read as u64, Ordering::Relaxed);
        }
        p
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
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
    fn a_call_in_flight_is_never_idle_and_its_end_is_activity() {
        let a = Activity::new();
        let before = a.mark(IdleBy::Calls);
        assert!(before.is_some());
        let call = a.call();
        assert_eq!(a.mark(IdleBy::Calls), None);
        drop(call);
        let after = a.mark(IdleBy::Calls);
        assert!(after.is_some() && after != before);
        // I/O alone is not a call.
        a.io.fetch_add(5, Ordering::Relaxed);
        assert_eq!(a.mark(IdleBy::Calls), after);
        assert_ne!(a.mark(IdleBy::Io), Some(0));
    }
}
