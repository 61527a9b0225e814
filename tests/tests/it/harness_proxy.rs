//! The TCP fault proxy itself, in front of a harness redis-server: it forwards, partitions
//! silently (blackhole), resets, heals, retargets, counts its connections and cleans up.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually_blocking;
use acceptance_tests::proxy::{ProxyMode, TcpProxy};
use acceptance_tests::redis_server::RedisServer;

/// The client timeout that tells "no answer" from "answer".
const SHORT: Duration = Duration::from_millis(300);

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}

/// A redis-rs connection through the proxy with `SHORT` timeouts.
fn client(proxy: &TcpProxy) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(proxy.url())?.get_connection_with_timeout(SHORT)?;
    con.set_read_timeout(Some(SHORT))?;
    Ok(con)
}

fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(con)
}

/// A raw TCP connection through the proxy (the proxy accepts even while partitioned).
fn raw(proxy: &TcpProxy) -> TcpStream {
    let s = TcpStream::connect(proxy.addr()).expect("the proxy accepts");
    s.set_read_timeout(Some(SHORT)).expect("read timeout");
    s
}

/// Sends an inline PING and reads one reply line.
fn raw_ping(s: &TcpStream) -> std::io::Result<String> {
    (&*s).write_all(b"PING\r\n")?;
    read_line(s)
}

fn read_line(s: &TcpStream) -> std::io::Result<String> {
    let mut line = String::new();
    match BufReader::new(s).read_line(&mut line)? {
        0 => Err(ErrorKind::UnexpectedEof.into()),
        _ => Ok(line),
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Runs `op`, which must fail at once (well within a second) with an error other than a
/// timeout: a closed or reset connection, not a silent one.
fn fails_fast<T>(what: &str, op: impl FnOnce() -> redis::RedisResult<T>) {
    let started = Instant::now();
    let Err(err) = op() else {
        panic!("{what}: succeeded");
    };
    assert!(!err.is_timeout(), "{what}: {err:?} is a timeout");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "{what}: failed only after {took:?}"
    );
}

/// Waits up to 3 s until the proxy holds `n` connections.
fn until_connections(proxy: &TcpProxy, n: usize, what: &str) {
    eventually_blocking(
        what,
        Duration::from_secs(3),
        Duration::from_millis(10),
        || {
            let held = proxy.connections();
            if held == n { Ok(()) } else { Err(held) }
        },
    );
}

#[test]
fn pass_forwards_commands_both_ways() {
    let proxy = TcpProxy::start(addr(server()));
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    let mut con = client(&proxy).expect("a connection through the proxy");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    // A reply larger than one read buffer comes through whole.
    let big = "x".repeat(100_000);
    let _: () = redis::cmd("SET")
        .arg("proxy:big")
        .arg(&big)
        .query(&mut con)
        .expect("SET");
    let back: String = redis::cmd("GET")
        .arg("proxy:big")
        .query(&mut con)
        .expect("GET");
    assert_eq!(back, big);
}

#[test]
fn blackhole_answers_nothing_and_heal_serves_new_connections() {
    let proxy = TcpProxy::start(addr(server()));
    let mut before = client(&proxy).expect("a connection before the partition");
    assert_eq!(ping(&mut before).expect("PING"), "PONG");

    proxy.blackhole();
    let started = Instant::now();
    let err = ping(&mut before).expect_err("no reply through a blackhole");
    assert!(err.is_timeout(), "a timeout, not {err:?}");
    assert!(started.elapsed() >= SHORT);

    // A new connection is accepted, but its PING gets no reply either; a redis-rs client
    // already times out in its connection set-up.
    let held = raw(&proxy);
    let err = raw_ping(&held).expect_err("no reply to a new connection");
    assert!(is_timeout(&err), "a timeout, not {err:?}");
    let err = client(&proxy)
        .err()
        .expect("no redis-rs connection through a blackhole");
    assert!(err.is_timeout(), "a timeout, not {err:?}");

    proxy.pass();
    let mut after = client(&proxy).expect("a new connection after the heal");
    assert_eq!(ping(&mut after).expect("PING after the heal"), "PONG");
    // Held bytes were delayed, not lost: the PING sent into the blackhole is answered now.
    held.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("read timeout");
    assert_eq!(
        read_line(&held).expect("the held PING's reply"),
        "+PONG\r\n"
    );
}

#[test]
fn reset_closes_open_and_new_connections_at_once() {
    let proxy = TcpProxy::start(addr(server()));
    let mut con = client(&proxy).expect("a connection");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let open = raw(&proxy);
    assert_eq!(raw_ping(&open).expect("raw PING"), "+PONG\r\n");
    con.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("read timeout");

    proxy.reset();
    fails_fast("PING on a reset connection", || ping(&mut con));
    // The raw client sees an RST, not an orderly end.
    let err = read_line(&open).expect_err("reset");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err:?}");

    fails_fast("a new connection during reset", || client(&proxy));

    proxy.pass();
    let mut con = client(&proxy).expect("a connection after reset, then pass");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
}

#[test]
fn connections_are_counted_until_they_close() {
    let proxy = TcpProxy::start(addr(server()));
    let a = raw(&proxy);
    let b = raw(&proxy);
    assert_eq!(raw_ping(&a).expect("PING a"), "+PONG\r\n");
    assert_eq!(raw_ping(&b).expect("PING b"), "+PONG\r\n");
    assert_eq!(proxy.connections(), 2);
    drop(a);
    until_connections(&proxy, 1, "one connection left");
    // A connection accepted during a blackhole ends when its client goes away.
    proxy.blackhole();
    let held = raw(&proxy);
    until_connections(&proxy, 2, "the held connection counted");
    drop(held);
    until_connections(&proxy, 1, "the held connection gone");
    // A forwarded connection whose client closes during the blackhole stays until the heal:
    // its end is held like its bytes, and reaches the server only then.
    drop(b);
    std::thread::sleep(SHORT);
    assert_eq!(proxy.connections(), 1);
    proxy.pass();
    until_connections(&proxy, 0, "no connection left");
}

#[test]
fn retargeted_proxy_sends_new_connections_to_the_new_target() {
    let other = RedisServer::start();
    let proxy = TcpProxy::start(addr(server()));
    let port = |con: &mut redis::Connection| -> u16 {
        let reply: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("port")
            .query(con)
            .expect("CONFIG GET port");
        reply[1].parse().expect("a port")
    };
    let mut first = client(&proxy).expect("a connection");
    assert_eq!(port(&mut first), server().port());
    proxy.set_target(addr(&other));
    assert_eq!(proxy.target(), addr(&other));
    let mut second = client(&proxy).expect("a connection to the new target");
    assert_eq!(port(&mut second), other.port());
    assert_eq!(
        port(&mut first),
        server().port(),
        "open connections keep theirs"
    );
}

#[test]
fn a_dead_target_resets_the_client() {
    let mut gone = RedisServer::start();
    let proxy = TcpProxy::start(addr(&gone));
    gone.stop();
    fails_fast("a connection to a dead target", || client(&proxy));
}

#[test]
fn drop_closes_the_port_and_every_connection() {
    let proxy = TcpProxy::start(addr(server()));
    let open = raw(&proxy);
    assert_eq!(raw_ping(&open).expect("PING"), "+PONG\r\n");
    let port = proxy.port();
    drop(proxy);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port closed"
    );
    let err = read_line(&open).expect_err("the connection is closed");
    assert!(!is_timeout(&err), "closed, not silent: {err:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn works_under_a_single_threaded_async_runtime() {
    let proxy = TcpProxy::start(addr(server()));
    let client = redis::Client::open(proxy.url()).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("an async connection through the proxy");
    let pong: String = redis::cmd("PING")
        .query_async(&mut con)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");
}
