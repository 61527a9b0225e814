//! The provider's own multiplexed Redis connection: RESP2 over TCP or TLS, written for the one
//! call every request makes (a program, then its short array reply).
//!
//! Why not the driver's multiplexed connection: per call it packs the command into a fresh
//! buffer, hands it through a channel to a driver task (a wake-up), and decodes the reply
//! with a general combinator parser; together about a third of the sidecar's evaluation path
//! (docs/performance.md, "Where the gap is"). Here a caller appends its command to the
//! connection's output buffer and writes it itself without waiting (commands that arrive
//! while a write is under way leave with the next one; the eighth queued behind a yielding
//! writer leaves at once), and one reader task parses replies with the RESP2 codec of
//! [`crate::resp`] and hands each to its caller.
//!
//! Failure certainty is what the provider needs: a call on a connection already known to be
//! closed is [`WireError::NotSent`] (nothing reached the server); once a command is in the
//! buffer, losing the connection or an unreadable reply is [`WireError::Lost`] (it may have
//! run). Replies are matched to calls by order, which RESP2 guarantees; a reply with no call
//! waiting for it, or a frame this parser does not know, closes the connection (every call in
//! flight becomes `Lost`), because after it the order can no longer be trusted.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use redis::{Cmd, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{Notify, oneshot};

use crate::resp;

/// A reply larger than this closes the connection (the programs' replies are ~100 bytes; the
/// largest reply any start-up check reads, `INFO server`, a few KiB).
const MAX_BUFFERED_REPLY: usize = 64 << 20;

/// Commands queued behind a yielding writer at which the caller that queues the last of them
/// writes them at once. Under load the one yield gathers every request that is ready (dozens),
/// and Redis answers a batch only after running all of it: the app, Redis and the load
/// generator then take turns, and on two shared cores a fifth of the CPU idled. Writing every
/// eight lets Redis start while the app still parses the rest (docs/performance.md, "Smaller
/// batches to Redis").
const EAGER_WRITE_AT: usize = 8;

/// Why a call got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// The connection was closed before the call: nothing was sent.
    #[error("connection closed ({0}); the command was not sent")]
    NotSent(Arc<str>),
    /// The command was (or may have been) sent, and no reply will come.
    #[error("connection lost after the command was sent ({0})")]
    Lost(Arc<str>),
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// What one reply goes to.
enum Waiter {
    /// A reply nobody reads (`ASKING` before a redirected program).
    Discard,
    Call(oneshot::Sender<Result<Value, WireError>>),
}

struct Queue {
    /// Commands not yet handed to the socket.
    out: Vec<u8>,
    /// One entry per reply still to come, in order.
    waiting: VecDeque<Waiter>,
    /// Someone is writing: new commands only append, the writer takes them next.
    flushing: bool,
    /// Commands in `out`.
    queued: usize,
    /// Why the connection ended, once it has.
    closed: Option<Arc<str>>,
}

/// The bytes being written and the socket's write half.
struct Flight {
    io: Writer,
    buf: Vec<u8>,
    pos: usize,
    /// The socket did not take everything and a task finishes the write. Until it is done
    /// only that task touches the socket: the socket wakes one waiter only, the last to ask.
    stalled: bool,
}

/// Who calls [`Multiplexer::write_out`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteBy {
    /// A caller writing without waiting; it leaves a stalled write to the finisher.
    Caller,
    /// The task that finishes a stalled write.
    Finisher,
}

/// The state every clone of a [`Conn`], its reader task and a write finisher share: the queue
/// of commands and waiters, and the bytes in flight with the socket's write half.
struct Multiplexer {
    queue: Mutex<Queue>,
    flight: Mutex<Flight>,
    /// Tells the reader to stop when a write fails.
    closing: Notify,
}

/// Locks `m`; a panic while holding it leaves plain data, so carry on with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Multiplexer {
    /// Ends the connection: every call in flight gets `Lost`, later calls `NotSent`.
    fn close(&self, why: &str) {
        let waiting = {
            let mut q = lock(&self.queue);
            if q.closed.is_some() {
                return;
            }
            let why: Arc<str> = why.into();
            q.closed = Some(why.clone());
            q.out = Vec::new();
            q.queued = 0;
            std::mem::take(&mut q.waiting)
        };
        let why: Arc<str> = why.into();
        for w in waiting {
            if let Waiter::Call(tx) = w {
                let _ = tx.send(Err(WireError::Lost(why.clone())));
            }
        }
        self.closing.notify_one();
    }

    /// Writes what is queued until nothing is, or until the socket cannot take more now
    /// (`Pending`: the write is stalled, and `cx` is woken when the socket can take more).
    /// `flushing` is released here when the queue is empty. A caller that finds the write
    /// stalled returns at once: the finisher takes what is queued.
    fn write_out(&self, cx: &mut Context<'_>, by: WriteBy) -> Poll<()> {
        let mut flight = lock(&self.flight);
        let flight = &mut *flight;
        if flight.stalled && by == WriteBy::Caller {
            return Poll::Ready(());
        }
        loop {
            if flight.pos == flight.buf.len() {
                flight.buf.clear();
                flight.pos = 0;
                let more = {
                    let mut q = lock(&self.queue);
                    let more = !q.out.is_empty() && q.closed.is_none();
                    if more {
                        q.queued = 0;
                        std::mem::swap(&mut q.out, &mut flight.buf);
                    }
                    more
                };
                if !more {
                    // TLS keeps records until flushed; plain TCP has nothing to flush.
                    match Pin::new(&mut flight.io).poll_flush(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => {
                            self.close(&format!("write failed: {e}"));
                            return Poll::Ready(());
                        }
                        Poll::Pending => {
                            flight.stalled = true;
                            return Poll::Pending;
                        }
                    }
                    let mut q = lock(&self.queue);
                    if q.out.is_empty() || q.closed.is_some() {
                        q.flushing = false;
                        flight.stalled = false;
                        return Poll::Ready(());
                    }
                    // More arrived while flushing: write it too.
                    continue;
                }
            }
            match Pin::new(&mut flight.io).poll_write(cx, &flight.buf[flight.pos..]) {
                Poll::Ready(Ok(0)) => {
                    self.close("the socket accepted no bytes");
                    return Poll::Ready(());
                }
                Poll::Ready(Ok(n)) => flight.pos += n,
                Poll::Ready(Err(e)) => {
                    self.close(&format!("write failed: {e}"));
                    return Poll::Ready(());
                }
                Poll::Pending => {
                    flight.stalled = true;
                    return Poll::Pending;
                }
            }
        }
    }

    /// Hands the next reply to its caller. `false` when no call was waiting for it.
    fn deliver(&self, value: Value) -> bool {
        let waiter = lock(&self.queue).waiting.pop_front();
        match waiter {
            Some(Waiter::Call(tx)) => {
                // The caller may have given up (its timeout): the reply is dropped.
                let _ = tx.send(Ok(value));
                true
            }
            Some(Waiter::Discard) => true,
            None => false,
        }
    }
}

/// Closes the connection when the reader stops for any reason (an error, or its task being
/// aborted by the supervisor): no call waits forever.
struct CloseOnDrop(Arc<Multiplexer>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close("connection closed");
    }
}

/// The duty to write what is queued, taken by the call that found no write under way. It is
/// done on drop, so a caller dropped while it yields (a timeout, a closed client) still
/// writes the commands that waited for it.
struct WriteDuty<'a>(&'a Conn);

impl Drop for WriteDuty<'_> {
    fn drop(&mut self) {
        self.0.write_now();
    }
}

/// A multiplexed connection; clones share it.
#[derive(Clone)]
pub(crate) struct Conn {
    mux: Arc<Multiplexer>,
}

/// The task that reads replies; the connection works only while it is polled, and it ends
/// when the connection does.
pub(crate) type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Conn {
    /// Wraps an established stream (TCP or TLS). Nothing is sent.
    pub(crate) fn new<S>(stream: S) -> (Self, Driver)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        Self::from_halves(Box::new(read), Box::new(write))
    }

    /// A plain TCP connection, split without the lock `tokio::io::split` puts between halves.
    pub(crate) fn tcp(stream: tokio::net::TcpStream) -> (Self, Driver) {
        let (read, write) = stream.into_split();
        Self::from_halves(Box::new(read), Box::new(write))
    }

    fn from_halves(read: Reader, write: Writer) -> (Self, Driver) {
        let mux = Arc::new(Multiplexer {
            queue: Mutex::new(Queue {
                out: Vec::with_capacity(4096),
                waiting: VecDeque::with_capacity(64),
                flushing: false,
                queued: 0,
                closed: None,
            }),
            flight: Mutex::new(Flight {
                io: write,
                buf: Vec::with_capacity(4096),
                pos: 0,
                stalled: false,
            }),
            closing: Notify::new(),
        });
        let driver = Box::pin(read_replies(mux.clone(), read));
        (Self { mux }, driver)
    }

    /// Sends the commands `encode` writes (exactly `skip + 1` of them) and returns the last
    /// one's reply; the first `skip` replies are dropped.
    ///
    /// # Errors
    /// [`WireError::NotSent`] when the connection had already ended; [`WireError::Lost`] when
    /// it ended after the command was queued.
    pub(crate) async fn call(
        &self,
        encode: impl FnOnce(&mut Vec<u8>),
        skip: usize,
    ) -> Result<Value, WireError> {
        let (tx, rx) = oneshot::channel();
        let (duty, eager) = {
            let mut q = lock(&self.mux.queue);
            if let Some(why) = &q.closed {
                return Err(WireError::NotSent(why.clone()));
            }
            encode(&mut q.out);
            for _ in 0..skip {
                q.waiting.push_back(Waiter::Discard);
            }
            q.waiting.push_back(Waiter::Call(tx));
            q.queued += skip + 1;
            let duty = !std::mem::replace(&mut q.flushing, true);
            (duty, !duty && q.queued >= EAGER_WRITE_AT)
        };
        if eager {
            self.write_now();
        }
        if duty {
            // Let the tasks that are ready now run first: their commands join this write.
            // Under load that is several commands per write (Redis then reads and answers
            // them together, at a fraction of the CPU per command; every `EAGER_WRITE_AT`th
            // leaves at once); when idle it costs one yield.
            let write_after_yield = WriteDuty(self);
            tokio::task::yield_now().await;
            drop(write_after_yield);
        }
        match rx.await {
            Ok(reply) => reply,
            // The sender is dropped only with the queue, i.e. with the connection.
            Err(_) => Err(WireError::Lost("connection dropped".into())),
        }
    }

    /// Writes without waiting: whatever the socket does not take now is finished by a task,
    /// so a caller that gives up (a timeout) never leaves half a command behind.
    fn write_now(&self) {
        let mut cx = Context::from_waker(Waker::noop());
        // `Pending` only for the caller that found the write not stalled and stalled it: one
        // finisher per stall.
        if self.mux.write_out(&mut cx, WriteBy::Caller).is_pending() {
            let mux = self.mux.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        poll_fn(|cx| mux.write_out(cx, WriteBy::Finisher)).await;
                    });
                }
                // Dropped outside a runtime (it is shutting down): nobody can finish the write.
                Err(_) => mux.close("runtime gone with a write half done"),
            }
        }
    }

    /// One command built by the driver's `Cmd`. A server error is a reply like any other:
    /// `Ok(Value::ServerError)`.
    ///
    /// # Errors
    /// [`WireError`]: the command got no reply.
    pub(crate) async fn send(&self, cmd: &Cmd) -> Result<Value, WireError> {
        self.call(|out| cmd.write_packed_command(out), 0).await
    }
}

async fn read_replies(mux: Arc<Multiplexer>, mut read: Reader) {
    let _close = CloseOnDrop(mux.clone());
    let closing = mux.closing.notified();
    tokio::pin!(closing);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut start = 0;
    loop {
        loop {
            match resp::parse(&buf[start..]) {
                Ok(Some((value, used))) => {
                    start += used;
                    if !mux.deliver(value) {
                        mux.close("a reply arrived that no command was waiting for");
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    mux.close(&format!("unreadable reply: {e}"));
                    return;
                }
            }
        }
        if start == buf.len() {
            buf.clear();
        } else if start > 0 {
            buf.drain(..start);
        }
        start = 0;
        if buf.len() > MAX_BUFFERED_REPLY {
            mux.close("a reply larger than 64 MiB");
            return;
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        tokio::select! {
            biased;
            () = &mut closing => return,
            read = read.read_buf(&mut buf) => match read {
                Ok(0) => {
                    mux.close("the server closed the connection");
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    mux.close(&format!("read failed: {e}"));
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
