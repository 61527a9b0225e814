//! The connection's behaviour against fake servers: replies matched to calls across split
//! reads, writes gathered and written early, stalled writes finished by one task, and every
//! way a connection ends.

use std::time::Duration;

use super::*;
use crate::resp::{self, parse};

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
        conn.send(&ping).await.ok(),
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
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
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
    let mux = Arc::downgrade(&conn.mux);
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
        while mux.upgrade().is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), released)
        .await
        .expect("no task is left holding the connection");
}

/// Tasks and calls per task of the stress tests; one call in seven is given up after its
/// first poll.
const STRESS_TASKS: usize = 64;
const STRESS_CALLS: usize = 25;

/// A fake server that works in rounds: it leaves its end alone for a millisecond (the
/// client's writes fill the buffers and stall), reads until the client sends nothing more
/// for 2 ms (every caller then waits for its reply, so the writer's queue has drained), and
/// answers each command with its second element (the key), so a lost, repeated, cut or
/// reordered command shows in the reply its caller gets. Returns once it has answered
/// `expected` commands, dropping (closing) its end.
async fn key_echo<S>(mut s: S, expected: usize) -> usize
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let mut got = Vec::new();
    let mut answered = 0;
    let mut buf = vec![0u8; 1 << 16];
    while answered < expected {
        tokio::time::sleep(Duration::from_millis(1)).await;
        while let Ok(read) = tokio::time::timeout(Duration::from_millis(2), s.read(&mut buf)).await
        {
            let n = read.expect("read");
            assert!(
                n > 0,
                "the client closed with {answered} of {expected} answered"
            );
            got.extend_from_slice(&buf[..n]);
        }
        let mut used_all = 0;
        let mut replies = Vec::new();
        while let Some((command, used)) = parse(&got[used_all..]).expect("a well-formed command") {
            used_all += used;
            let Value::Array(parts) = command else {
                panic!("not a command: {command:?}")
            };
            let Some(Value::BulkString(key)) = parts.get(1) else {
                panic!("no key: {parts:?}")
            };
            resp::write_bulk(&mut replies, key);
            answered += 1;
        }
        got.drain(..used_all);
        s.write_all(&replies).await.expect("write");
    }
    answered
}

/// Many tasks calling at once on `conn` (commands padded with `pad` bytes) against
/// [`key_echo`] on the other end, `server`: every call gets its own reply, every command
/// reaches the server once (those of calls given up too), and once the server has closed no
/// task holds the connection.
async fn stress<S>(conn: Conn, server: S, pad: usize)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let expected = STRESS_TASKS * STRESS_CALLS;
    let server = tokio::spawn(key_echo(server, expected));
    let mux = Arc::downgrade(&conn.mux);
    let pad = vec![b'p'; pad];
    let tasks: Vec<_> = (0..STRESS_TASKS)
        .map(|t| {
            let conn = conn.clone();
            let pad = pad.clone();
            tokio::spawn(async move {
                let mut given_up = 0;
                for i in 0..STRESS_CALLS {
                    let key = format!("t{t}-c{i}");
                    let set = redis::cmd("SET").arg(&key).arg(&pad[..]).to_owned();
                    let call = conn.call(|out| set.write_packed_command(out), 0);
                    if i % 7 == 3 {
                        // Given up after one poll (a caller's timeout): the command still
                        // leaves, and its reply goes to nobody, never to the next call.
                        tokio::pin!(call);
                        let polled = futures_poll_once(call.as_mut()).await;
                        assert!(polled.is_none(), "{key}: answered at once: {polled:?}");
                        given_up += 1;
                        continue;
                    }
                    let reply = call.await;
                    assert_eq!(
                        reply,
                        Ok(Value::BulkString(key.clone().into_bytes())),
                        "{key} got another call's reply"
                    );
                }
                given_up
            })
        })
        .collect();
    drop(conn);
    let checked = async {
        let mut given_up = 0;
        for task in tasks {
            given_up += task.await.expect("a calling task");
        }
        (given_up, server.await.expect("the server"))
    };
    let (given_up, answered) = tokio::time::timeout(Duration::from_secs(30), checked)
        .await
        .expect("every call answered: no write left stalled without its finisher");
    assert!(given_up > 0);
    assert_eq!(answered, expected, "every command reached the server once");
    // The server has closed its end: the reader ends, and nothing may hold the connection.
    let released = async {
        while mux.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), released)
        .await
        .expect("no task is left holding the connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_a_seven_byte_pipe_each_get_their_own_reply() {
    let (client, server) = tokio::io::duplex(7);
    let (read, write) = tokio::io::split(client);
    let (conn, driver) = Conn::from_halves(Box::new(read), Box::new(write));
    tokio::spawn(driver);
    stress(conn, server, 32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_a_socket_with_tiny_buffers_each_get_their_own_reply() {
    // Both buffers as small as the kernel allows (a few KiB). The server also announces a
    // small segment size: on loopback (a 64 KiB MSS) a receive buffer smaller than a segment
    // never reopens its window as it is read, and the sender would wait for TCP's persist
    // timer (200 ms and more) instead of for the server.
    let listener = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .expect("socket");
    listener.set_recv_buffer_size(1).expect("SO_RCVBUF");
    listener.set_tcp_mss(536).expect("TCP_MAXSEG");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
    listener.bind(&any.into()).expect("bind");
    listener.listen(1).expect("listen");
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener.into()).expect("a tokio listener");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_send_buffer_size(1).expect("SO_SNDBUF");
    let addr = listener.local_addr().expect("addr");
    let (client, accepted) = tokio::join!(socket.connect(addr), listener.accept());
    let client = client.expect("connect");
    let (server, _) = accepted.expect("accept");
    // As the provider dials: small commands leave at once.
    client.set_nodelay(true).expect("TCP_NODELAY");
    server.set_nodelay(true).expect("TCP_NODELAY");
    let (conn, driver) = Conn::tcp(client);
    tokio::spawn(driver);
    stress(conn, server, 256).await;
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
