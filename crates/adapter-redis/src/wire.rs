//! The provider's own multiplexed Redis connection: RESP2 over TCP or TLS, written for the one
//! call every request makes (a program, then its short array reply).
//!
//! Why not the driver's multiplexed connection: per call it packs the command into a fresh
//! buffer, hands it through a channel to a driver task (a wake-up), and decodes the reply
//! with a general combinator parser; together about a third of the sidecar's evaluation path
//! (docs/performance.md, "Where the gap is"). Here a caller appends its command to the
//! connection's output buffer and writes it itself without waiting (commands that arrive
//! while a write is under way leave with the next one; the eighth queued behind a yielding
//! writer leaves at once), and one reader task parses replies with a parser for exactly the
//! RESP2 frames and hands each to its caller.
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

use redis::{Cmd, ErrorKind, RedisConnectionInfo, RedisError, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{Notify, oneshot};

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

/// Nesting beyond this is refused (the deepest reply read here, `CLUSTER SLOTS`, has 3).
const MAX_DEPTH: usize = 16;

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

impl From<WireError> for RedisError {
    fn from(e: WireError) -> Self {
        let kind = match e {
            WireError::NotSent(_) => std::io::ErrorKind::NotConnected,
            WireError::Lost(_) => std::io::ErrorKind::ConnectionAborted,
        };
        RedisError::from(std::io::Error::new(kind, e.to_string()))
    }
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

/// Who calls [`Shared::write_out`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteBy {
    /// A caller writing without waiting; it leaves a stalled write to the finisher.
    Caller,
    /// The task that finishes a stalled write.
    Finisher,
}

struct Shared {
    queue: Mutex<Queue>,
    flight: Mutex<Flight>,
    /// Tells the reader to stop when a write fails.
    closing: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding either lock leaves plain data; carry on with it.
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Shared {
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
struct CloseOnDrop(Arc<Shared>);

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
    shared: Arc<Shared>,
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
        let shared = Arc::new(Shared {
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
        let driver = Box::pin(read_replies(shared.clone(), read));
        (Self { shared }, driver)
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
            let mut q = lock(&self.shared.queue);
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
        if self.shared.write_out(&mut cx, WriteBy::Caller).is_pending() {
            let shared = self.shared.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        poll_fn(|cx| shared.write_out(cx, WriteBy::Finisher)).await;
                    });
                }
                // Dropped outside a runtime (it is shutting down): nobody can finish the write.
                Err(_) => shared.close("runtime gone with a write half done"),
            }
        }
    }

    /// One command built by the driver's `Cmd`; server errors come back as
    /// `Ok(Value::ServerError)`.
    ///
    /// # Errors
    /// The transport failure, as the driver's error type (I/O kind).
    pub(crate) async fn send_packed_command(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        Ok(self.call(|out| cmd.write_packed_command(out), 0).await?)
    }

    /// `AUTH` and `SELECT` as the connection info asks (RESP2).
    ///
    /// # Errors
    /// The refusal or the transport failure.
    pub(crate) async fn handshake(&self, info: &RedisConnectionInfo) -> redis::RedisResult<()> {
        if let Some(password) = info.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = info.username() {
                auth.arg(user);
            }
            auth.arg(password);
            expect_ok(self.send_packed_command(&auth).await?, "AUTH")?;
        }
        if info.db() != 0 {
            let select = redis::cmd("SELECT").arg(info.db()).to_owned();
            expect_ok(self.send_packed_command(&select).await?, "SELECT")?;
        }
        Ok(())
    }
}

fn expect_ok(value: Value, what: &'static str) -> redis::RedisResult<()> {
    match value {
        Value::Okay => Ok(()),
        Value::ServerError(e) => Err(e.into()),
        other => Err(RedisError::from((
            ErrorKind::Parse,
            what,
            format!("unexpected reply {other:?}"),
        ))),
    }
}

async fn read_replies(shared: Arc<Shared>, mut read: Reader) {
    let _close = CloseOnDrop(shared.clone());
    let closing = shared.closing.notified();
    tokio::pin!(closing);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut start = 0;
    loop {
        loop {
            match parse(&buf[start..]) {
                Ok(Some((value, used))) => {
                    start += used;
                    if !shared.deliver(value) {
                        shared.close("a reply arrived that no command was waiting for");
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.close(&format!("unreadable reply: {e}"));
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
            shared.close("a reply larger than 64 MiB");
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
                    shared.close("the server closed the connection");
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    shared.close(&format!("read failed: {e}"));
                    return;
                }
            },
        }
    }
}

/// Appends a RESP array header.
pub(crate) fn write_array(out: &mut Vec<u8>, len: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a RESP bulk string.
pub(crate) fn write_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends an integer as a RESP bulk string (how Redis takes every argument).
pub(crate) fn write_bulk_u64(out: &mut Vec<u8>, n: u64) {
    write_bulk(out, itoa::Buffer::new().format(n).as_bytes());
}

/// Why bytes are not a RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    #[error("unknown frame type {0:?}")]
    Type(char),
    #[error("bad length or integer {0:?}")]
    Number(String),
    #[error("line or bulk string not terminated by CRLF")]
    Terminator,
    #[error("nested deeper than {MAX_DEPTH}")]
    Depth,
    #[error("error reply: {0}")]
    Error(String),
}

/// One complete reply at the start of `bytes` and how many bytes it took, or `None` when more
/// bytes are needed.
///
/// # Errors
/// [`ParseError`] when the bytes are not RESP2.
pub(crate) fn parse(bytes: &[u8]) -> Result<Option<(Value, usize)>, ParseError> {
    parse_at(bytes, 0)
}

fn parse_at(bytes: &[u8], depth: usize) -> Result<Option<(Value, usize)>, ParseError> {
    if depth > MAX_DEPTH {
        return Err(ParseError::Depth);
    }
    let Some((&kind, rest)) = bytes.split_first() else {
        return Ok(None);
    };
    // RESP lines hold no CR: the first one ends the line.
    let Some(eol) = rest.iter().position(|&b| b == b'\r') else {
        return Ok(None);
    };
    match rest.get(eol + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(ParseError::Terminator),
    }
    let line = &rest[..eol];
    let after_line = 1 + eol + 2;
    match kind {
        b'+' => {
            let value = if line == b"OK" {
                Value::Okay
            } else {
                Value::SimpleString(String::from_utf8_lossy(line).into_owned())
            };
            Ok(Some((value, after_line)))
        }
        b'-' => {
            // Rare: the driver's own parser builds its error type (codes, details).
            let value = redis::parse_redis_value(&bytes[..after_line])
                .map_err(|e| ParseError::Error(e.to_string()))?;
            Ok(Some((value, after_line)))
        }
        b':' => Ok(Some((Value::Int(integer(line)?), after_line))),
        b'$' => {
            let len = integer(line)?;
            if len == -1 {
                return Ok(Some((Value::Nil, after_line)));
            }
            let len = usize::try_from(len).map_err(|_| number(line))?;
            let end = after_line + len;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(ParseError::Terminator);
            }
            Ok(Some((
                Value::BulkString(bytes[after_line..end].to_vec()),
                end + 2,
            )))
        }
        b'*' => {
            let len = integer(line)?;
            if len == -1 {
                return Ok(Some((Value::Nil, after_line)));
            }
            let len = usize::try_from(len).map_err(|_| number(line))?;
            // Every element takes at least 3 bytes: no allocation beyond what arrived.
            let mut items = Vec::with_capacity(len.min((bytes.len() - after_line) / 3));
            let mut at = after_line;
            for _ in 0..len {
                match parse_at(&bytes[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(items), at)))
        }
        other => Err(ParseError::Type(char::from(other))),
    }
}

fn number(line: &[u8]) -> ParseError {
    ParseError::Number(String::from_utf8_lossy(line).into_owned())
}

/// A RESP integer line: an optional `-`, then 1 to 19 digits, within `i64`.
fn integer(line: &[u8]) -> Result<i64, ParseError> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(number(line));
    }
    let mut magnitude: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(number(line));
        }
        magnitude = magnitude * 10 + u64::from(d - b'0');
    }
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
    .ok_or_else(|| number(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        match parse(bytes) {
            Ok(Some((v, used))) => {
                assert_eq!(used, bytes.len(), "{bytes:?}");
                v
            }
            other => panic!("{bytes:?}: {other:?}"),
        }
    }

    #[test]
    fn parses_every_resp2_frame() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".to_owned()));
        assert_eq!(whole(b":-42\r\n"), Value::Int(-42));
        assert_eq!(whole(b":0\r\n"), Value::Int(0));
        assert_eq!(whole(b":9223372036854775807\r\n"), Value::Int(i64::MAX));
        assert_eq!(whole(b":-9223372036854775808\r\n"), Value::Int(i64::MIN));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(Vec::new()));
        assert_eq!(
            whole(b"$4\r\na\r\nb\r\n"),
            Value::BulkString(b"a\r\nb".to_vec())
        );
        assert_eq!(
            whole(b"*2\r\n*1\r\n:1\r\n$2\r\nhi\r\n"),
            Value::Array(vec![
                Value::Array(vec![Value::Int(1)]),
                Value::BulkString(b"hi".to_vec())
            ])
        );
    }

    #[test]
    fn error_replies_keep_their_code_and_details() {
        match whole(b"-MOVED 3999 127.0.0.1:6381\r\n") {
            Value::ServerError(e) => {
                assert_eq!(e.code(), "MOVED");
                assert_eq!(e.details(), Some("3999 127.0.0.1:6381"));
            }
            other => panic!("{other:?}"),
        }
        match whole(b"-NOSCRIPT No matching script.\r\n") {
            Value::ServerError(e) => assert_eq!(e.code(), "NOSCRIPT"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_cut_anywhere_needs_more_bytes() {
        let reply = b"*7\r\n$7\r\nALLOWED\r\n$13\r\n1700000000000\r\n$13\r\n1700000000000\r\n$2\r\n10\r\n$1\r\n9\r\n$1\r\n0\r\n$13\r\n1700000001000\r\n";
        for cut in 0..reply.len() {
            assert_eq!(parse(&reply[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = reply.to_vec();
        two.extend_from_slice(b":1\r\n");
        let (first, used) = parse(&two).ok().flatten().expect("a whole reply");
        assert_eq!(used, reply.len());
        assert!(matches!(first, Value::Array(ref items) if items.len() == 7));
        assert_eq!(parse(&two[used..]), Ok(Some((Value::Int(1), 4))));
    }

    #[test]
    fn malformed_replies_are_refused() {
        assert_eq!(parse(b"%1\r\n"), Err(ParseError::Type('%')));
        assert!(matches!(parse(b":12a\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b"$-2\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b"*x\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":-\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":+1\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(
            parse(b":9223372036854775808\r\n"),
            Err(ParseError::Number(_))
        ));
        assert!(matches!(
            parse(b":99999999999999999999\r\n"),
            Err(ParseError::Number(_))
        ));
        assert_eq!(parse(b"$2\r\nabcd\r\n"), Err(ParseError::Terminator));
        assert_eq!(parse(b"+a\rb\r\n"), Err(ParseError::Terminator));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert_eq!(parse(deep.as_bytes()), Err(ParseError::Depth));
    }

    #[test]
    fn a_huge_announced_array_allocates_only_for_what_arrived() {
        assert_eq!(parse(b"*9223372036854775807\r\n:1\r\n"), Ok(None));
    }

    #[test]
    fn commands_encode_as_resp_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        write_array(&mut out, 3);
        write_bulk(&mut out, b"EVALSHA");
        write_bulk_u64(&mut out, 1234);
        write_bulk(&mut out, b"");
        assert_eq!(out, b"*3\r\n$7\r\nEVALSHA\r\n$4\r\n1234\r\n$0\r\n\r\n");
        let mut packed = Vec::new();
        redis::cmd("EVALSHA")
            .arg(1234)
            .arg("")
            .write_packed_command(&mut packed);
        assert_eq!(out, packed, "same bytes as the driver's encoder");
    }

    /// A fake server: reads whatever comes, answers with `script` chunks after each read.
    async fn serve(
        script: Vec<&'static [u8]>,
    ) -> (tokio::net::TcpStream, tokio::task::JoinHandle<Vec<u8>>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            for chunk in script {
                let n = s.read(&mut buf).await.unwrap_or(0);
                got.extend_from_slice(&buf[..n]);
                s.write_all(chunk).await.expect("write");
            }
            got
        });
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        (client, server)
    }

    /// A connection to a fake server playing `script`, its reader running: the connection,
    /// the server (what it read) and the reader task.
    async fn fake(
        script: Vec<&'static [u8]>,
    ) -> (
        Conn,
        tokio::task::JoinHandle<Vec<u8>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stream, server) = serve(script).await;
        let (conn, driver) = Conn::tcp(stream);
        (conn, server, tokio::spawn(driver))
    }

    #[tokio::test]
    async fn replies_reach_their_callers_across_split_reads() {
        let (conn, server, _reader) = fake(vec![b"+PONG\r\n*2\r\n:1\r", b"\n$1\r\nx\r\n"]).await;
        let ping = redis::cmd("PING");
        assert_eq!(
            conn.send_packed_command(&ping).await.ok(),
            Some(Value::SimpleString("PONG".to_owned()))
        );
        let second = conn.call(|out| ping.write_packed_command(out), 0).await;
        assert_eq!(
            second,
            Ok(Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"x".to_vec())
            ]))
        );
        let sent = server.await.expect("server");
        assert_eq!(sent, b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n");
    }

    /// Counts the writes handed to the socket.
    struct CountingWriter<W> {
        inner: W,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calls_made_while_others_run_leave_in_one_write() {
        use tokio::io::AsyncWriteExt;
        let (conn, mut server, writes) = piped(4096);
        let calls: Vec<_> = (0..3).map(|i| spawn_get(&conn, i)).collect();
        let mut sent = vec![0u8; 4096];
        let n = server.read(&mut sent).await.expect("read");
        server
            .write_all(b":1\r\n:2\r\n:3\r\n")
            .await
            .expect("write");
        let mut replies = Vec::new();
        for call in calls {
            replies.push(call.await.expect("call task"));
        }
        assert_eq!(
            replies,
            vec![Ok(Value::Int(1)), Ok(Value::Int(2)), Ok(Value::Int(3))]
        );
        assert_eq!(
            &sent[..n],
            b"*2\r\n$3\r\nGET\r\n$1\r\n0\r\n*2\r\n$3\r\nGET\r\n$1\r\n1\r\n*2\r\n$3\r\nGET\r\n$1\r\n2\r\n"
        );
        assert_eq!(
            writes.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "three calls, one write"
        );
    }

    /// A connection over an in-memory pipe of `capacity` bytes: the connection, the server's
    /// end and the count of writes handed to the pipe.
    fn piped(
        capacity: usize,
    ) -> (
        Conn,
        tokio::io::DuplexStream,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let (client, server) = tokio::io::duplex(capacity);
        let (read, write) = tokio::io::split(client);
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (conn, driver) = Conn::from_halves(
            Box::new(read),
            Box::new(CountingWriter {
                inner: write,
                writes: writes.clone(),
            }),
        );
        tokio::spawn(driver);
        (conn, server, writes)
    }

    /// `GET i` on `conn` in a task of its own.
    fn spawn_get(conn: &Conn, i: usize) -> tokio::task::JoinHandle<Result<Value, WireError>> {
        let conn = conn.clone();
        tokio::spawn(async move {
            let get = redis::cmd("GET").arg(i).to_owned();
            conn.call(|out| get.write_packed_command(out), 0).await
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_eighth_call_queued_behind_a_yield_leaves_at_once() {
        use tokio::io::AsyncWriteExt;
        let (conn, mut server, writes) = piped(1 << 16);
        let calls: Vec<_> = (0..20).map(|i| spawn_get(&conn, i)).collect();
        let mut expected = Vec::new();
        for i in 0..20 {
            redis::cmd("GET").arg(i).write_packed_command(&mut expected);
        }
        let mut sent = Vec::new();
        while sent.len() < expected.len() {
            let mut buf = [0u8; 4096];
            let n = server.read(&mut buf).await.expect("read");
            assert!(n > 0, "the connection ended");
            sent.extend_from_slice(&buf[..n]);
        }
        assert_eq!(sent, expected, "every command, in the order of the calls");
        let replies: Vec<u8> = (0..20)
            .flat_map(|i| format!(":{i}\r\n").into_bytes())
            .collect();
        server.write_all(&replies).await.expect("write");
        for (i, call) in calls.into_iter().enumerate() {
            let i = i64::try_from(i).expect("small");
            assert_eq!(call.await.expect("call task"), Ok(Value::Int(i)));
        }
        assert_eq!(
            writes.load(std::sync::atomic::Ordering::Relaxed),
            3,
            "the 8th and the 16th call write at once, the first call the last four after its yield"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_write_is_finished_while_more_calls_queue_and_write() {
        use tokio::io::AsyncWriteExt;
        // The pipe takes 16 bytes at a time: writes stall again and again while calls on two
        // threads keep queueing (and every eighth tries to write). The server answers each
        // `GET i` with `i`, so a lost, repeated, cut or reordered command shows.
        let (conn, mut server, _writes) = piped(16);
        let shared = Arc::downgrade(&conn.shared);
        let calls: Vec<_> = (0..300).map(|i| spawn_get(&conn, i)).collect();
        drop(conn);
        let serve = async {
            let mut got = Vec::new();
            let mut answered = 0;
            while answered < 300 {
                let mut buf = [0u8; 64];
                let n = server.read(&mut buf).await.expect("read");
                assert!(n > 0, "the connection ended");
                got.extend_from_slice(&buf[..n]);
                while let Some((command, used)) = parse(&got).expect("a well-formed command") {
                    got.drain(..used);
                    let Value::Array(parts) = command else {
                        panic!("not a command: {command:?}")
                    };
                    let Some(Value::BulkString(key)) = parts.get(1) else {
                        panic!("no key: {parts:?}")
                    };
                    let reply = format!(":{}\r\n", String::from_utf8_lossy(key));
                    server.write_all(reply.as_bytes()).await.expect("write");
                    answered += 1;
                }
            }
        };
        let checked = async {
            serve.await;
            for (i, call) in calls.into_iter().enumerate() {
                let i = i64::try_from(i).expect("small");
                assert_eq!(call.await.expect("call task"), Ok(Value::Int(i)));
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), checked)
            .await
            .expect("every call answered: a stalled write was not left without its finisher");
        // Closing the server's end ends the reader. Then nothing may hold the connection: a
        // second writer waiting on the socket would have been left there, never woken.
        drop(server);
        let released = async {
            while shared.upgrade().is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), released)
            .await
            .expect("no task is left holding the connection");
    }

    #[tokio::test]
    async fn a_caller_dropped_before_its_write_still_writes_the_queue() {
        let (conn, server, _reader) = fake(vec![b":1\r\n"]).await;
        let ping = redis::cmd("PING");
        {
            // Polled once: queued, then dropped at its yield, before writing.
            let call = conn.call(|out| ping.write_packed_command(out), 0);
            tokio::pin!(call);
            let polled = futures_poll_once(call.as_mut()).await;
            assert!(polled.is_none(), "the call waits for its reply");
        }
        let sent = server.await.expect("server");
        assert_eq!(sent, b"*1\r\n$4\r\nPING\r\n");
    }

    /// Polls `f` once.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
        poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut f).poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn a_lost_connection_is_lost_for_calls_in_flight_and_not_sent_after() {
        // The server reads one command and closes without answering.
        let (conn, _server, driver) = fake(vec![b""]).await;
        let ping = redis::cmd("PING");
        let first = conn.call(|out| ping.write_packed_command(out), 0).await;
        assert!(matches!(first, Err(WireError::Lost(_))), "{first:?}");
        driver.await.expect("the reader ends with the connection");
        let next = conn.call(|out| ping.write_packed_command(out), 0).await;
        assert!(matches!(next, Err(WireError::NotSent(_))), "{next:?}");
    }

    #[tokio::test]
    async fn an_unexpected_or_unreadable_reply_closes_the_connection() {
        let (conn, _server, driver) = fake(vec![b":1\r\n:2\r\n"]).await;
        let ping = redis::cmd("PING");
        // The first reply answers the call; the second has no caller: the order is lost.
        assert_eq!(
            conn.call(|out| ping.write_packed_command(out), 0).await,
            Ok(Value::Int(1))
        );
        driver.await.expect("reader ends");
        let after = conn.call(|out| ping.write_packed_command(out), 0).await;
        assert!(
            matches!(after, Err(WireError::NotSent(ref why)) if why.contains("no command was waiting")),
            "{after:?}"
        );

        let (conn, _server, _reader) = fake(vec![b"%1\r\n"]).await;
        let garbled = conn.call(|out| ping.write_packed_command(out), 0).await;
        assert!(
            matches!(garbled, Err(WireError::Lost(ref why)) if why.contains("unreadable")),
            "{garbled:?}"
        );
    }

    #[tokio::test]
    async fn a_skipped_reply_is_dropped_and_the_next_one_returned() {
        let (conn, _server, _reader) = fake(vec![b"+OK\r\n:7\r\n"]).await;
        let asking = redis::cmd("ASKING");
        let get = redis::cmd("GET").arg("k").to_owned();
        let reply = conn
            .call(
                |out| {
                    asking.write_packed_command(out);
                    get.write_packed_command(out);
                },
                1,
            )
            .await;
        assert_eq!(reply, Ok(Value::Int(7)));
    }

    #[tokio::test]
    async fn aborting_the_reader_fails_the_calls_in_flight() {
        // The server never answers.
        let (conn, _server, driver) = fake(vec![]).await;
        let ping = redis::cmd("PING");
        let call = tokio::spawn({
            let conn = conn.clone();
            async move { conn.call(|out| ping.write_packed_command(out), 0).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        driver.abort();
        let result = call.await.expect("call task");
        assert!(matches!(result, Err(WireError::Lost(_))), "{result:?}");
    }
}
