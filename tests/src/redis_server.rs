//! A private `redis-server` per test group.
//!
//! Tests never depend on a server that happens to be running: each group starts its own on a
//! free loopback port and the process is killed when the handle drops. A shell guard holds
//! the server's lifetime to this test process's stdin pipe ([`crate::process`]), so even a
//! server in a `static` (never dropped) dies when the test binary exits, and a crashed test
//! leaks nothing.
//!
//! `REDIS_URL`, when set, makes [`RedisServer::shared`] use that server instead (fault tests
//! that kill or pause a server always start their own).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::eventually::poll_blocking;
use crate::process::{Guarded, free_ports, spawn_guarded};

/// How long a new server may take to answer `PING`.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// A running redis-server owned by the test (or the external `REDIS_URL` one).
#[derive(Debug)]
pub struct RedisServer {
    url: String,
    port: u16,
    extra_args: Vec<String>,
    process: Option<Guarded>,
    dir: Option<tempfile::TempDir>,
}

/// The arguments every harness `redis-server` starts with: loopback only, no persistence,
/// replicas synced without the default 5 s diskless delay, files in `dir`, log in `log`.
pub(crate) fn server_args(port: u16, dir: &Path, log: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--repl-diskless-sync-delay",
        "0",
        "--dir",
        &dir.display().to_string(),
        "--logfile",
        &log.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The last `n` lines of a log file (empty when it cannot be read).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut tail: Vec<&str> = text.lines().rev().take(n).collect();
    tail.reverse();
    tail.join("\n")
}

/// Panics with an installation hint when `redis-server` is not on PATH.
pub(crate) fn check_binary() {
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        panic!(
            "`redis-server` was not found on PATH: install Debian's `redis-server` package \
             (apt-get install redis-server) or set REDIS_URL to a server the tests may use"
        );
    }
}

impl RedisServer {
    /// Starts a new server on a free loopback port.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not answer within 10 s.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a new server with extra `redis-server` arguments (`["--maxmemory", "2mb"]`).
    ///
    /// # Panics
    /// As [`Self::start`].
    pub fn start_with(extra_args: &[&str]) -> Self {
        check_binary();
        let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_ports(1)[0];
            let mut server = RedisServer {
                url: format!("redis://127.0.0.1:{port}/0"),
                port,
                extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
                process: None,
                dir: None,
            };
            match server.spawn(dir.path()) {
                Ok(()) => {
                    server.dir = Some(dir);
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// The process-wide server of this test binary: `REDIS_URL` if set, else one started on
    /// first use and killed when the test binary exits.
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(|| match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => RedisServer {
                port: url
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.split('/').next())
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(6379),
                url,
                extra_args: Vec::new(),
                process: None,
                dir: None,
            },
            _ => RedisServer::start(),
        })
    }

    fn log_path(dir: &Path, port: u16) -> PathBuf {
        dir.join(format!("redis-{port}.log"))
    }

    fn spawn(&mut self, dir: &Path) -> Result<(), String> {
        let log = Self::log_path(dir, self.port);
        let mut args = server_args(self.port, dir, &log);
        args.extend(self.extra_args.iter().cloned());
        let process = spawn_guarded("redis-server", &args)?;
        let deadline = Instant::now() + READY_DEADLINE;
        // A server that exits at once (its port was taken meanwhile) fails fast.
        while Instant::now() < deadline && process.is_running() {
            if self.ping() {
                self.process = Some(process);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        process.kill();
        Err(format!(
            "no PONG on port {} within {READY_DEADLINE:?}; log:\n{}",
            self.port,
            log_tail(&log, 10)
        ))
    }

    /// Answers PING right now (raw RESP, no client library involved).
    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("+PONG")
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pid of the server process (`None` for an external `REDIS_URL` server).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Guarded::pid)
    }

    /// A new synchronous client connection (for assertions and planting state).
    pub fn connection(&self) -> redis::Connection {
        crate::probe::connection(&self.url)
    }

    /// Kills the server (SIGKILL): later requests find nothing listening.
    pub fn stop(&mut self) {
        self.kill_process();
    }

    /// Starts the server again on the same port, empty.
    ///
    /// # Panics
    /// When this is the external `REDIS_URL` server, or the server does not come back.
    pub fn restart(&mut self) {
        self.kill_process();
        let dir = self
            .dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .expect("restart needs a server started by the harness");
        // The port may linger briefly after the kill.
        poll_blocking(READY_DEADLINE, Duration::from_millis(50), || {
            self.spawn(&dir)
        })
        .unwrap_or_else(|e| panic!("restart failed: {e}"));
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        if let Some(p) = &self.process {
            p.pause();
        }
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        if let Some(p) = &self.process {
            p.resume();
        }
    }

    fn kill_process(&mut self) {
        if let Some(p) = self.process.take() {
            p.kill();
            // Wait until the port is really closed, so "stopped" means stopped.
            let closed = || if self.ping() { Err(()) } else { Ok(()) };
            let _ = poll_blocking(Duration::from_secs(5), Duration::from_millis(10), closed);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill_process();
    }
}
