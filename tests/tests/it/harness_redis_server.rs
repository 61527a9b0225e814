//! The Redis harness itself: servers start on their own ports, stop, restart and pause.

use std::time::{Duration, Instant};

use acceptance_tests::redis_server::RedisServer;

#[test]
fn harness_servers_are_private_and_killed_on_drop() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert!(a.ping() && b.ping());
    let port = a.port();
    drop(a);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(b.ping());
}

#[test]
fn harness_restart_comes_back_empty_on_the_same_port() {
    let mut s = RedisServer::start();
    let mut c = s.connection();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut c)
        .expect("SET");
    let port = s.port();
    s.stop();
    assert!(!s.ping());
    s.restart();
    assert_eq!(s.port(), port);
    let mut c = s.connection();
    let v: Option<String> = redis::cmd("GET").arg("k").query(&mut c).expect("GET");
    assert_eq!(v, None);
}

#[test]
fn harness_pause_freezes_and_resume_thaws() {
    let s = RedisServer::start();
    s.pause();
    let started = Instant::now();
    assert!(!s.ping(), "a SIGSTOPped server must not answer");
    assert!(started.elapsed() >= Duration::from_millis(400));
    s.resume();
    assert!(s.ping());
}
