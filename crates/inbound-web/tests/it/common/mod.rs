//! Support for the end-to-end tests: the real `inbound-web` binary on a free port, the
//! configuration pieces and fixtures several test files share, a strict RFC 8941 List parser
//! for the rate-limit headers, and the WebSocket client of the gate streams.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acceptance_tests::eventually::poll_blocking;

pub const BIN: &str = env!("CARGO_BIN_EXE_inbound-web");
pub const SECRET: &str = "e2e-subject-secret-of-at-least-32-bytes!";

/// A running `inbound-web`, killed on drop.
pub struct App {
    child: Option<Child>,
    pub addr: String,
    stderr: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl App {
    /// Starts the binary with `config` (TOML) on a free loopback port, plus `env`.
    pub fn start(config: &str, env: &[(&str, &str)]) -> App {
        Self::start_limited(config, env, None)
    }

    /// [`Self::start`] with the open-file limit (soft and hard) set to `open_files` before
    /// the binary starts (by `prlimit`), when given.
    pub fn start_limited(config: &str, env: &[(&str, &str)], open_files: Option<u64>) -> App {
        // The defaults first, so that `env` (a test's RUST_LOG) wins.
        let mut all = vec![("APP_HTTP__BIND", "127.0.0.1:0"), ("RUST_LOG", "info")];
        all.extend_from_slice(env);
        let (dir, mut cmd) = command_as(config, &[], &all, open_files);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn inbound-web");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1)
                        && let Some(t) = tx.take()
                    {
                        // The address ends at a space or, in a JSON log line, a quote.
                        let addr = rest.split(['"', ' ']).next().unwrap_or(rest);
                        let _ = t.send(addr.trim().to_owned());
                    }
                    let mut l = log.lock().expect("log lock");
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "inbound-web did not start; stderr:\n{}",
                    log.lock().expect("log lock")
                );
            }
        };
        App {
            child: Some(child),
            addr,
            stderr: log,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    pub fn log(&self) -> String {
        self.stderr.lock().expect("log lock").clone()
    }

    /// The configuration file the app was started with (tests rewrite it to reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("app.toml")
    }

    /// Sends `signal` (a `kill` name: `HUP`, `KILL`, ...) to the app.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// The gRPC address the app logged (with `[grpc] bind`).
    pub fn grpc_addr(&self) -> String {
        let log = self.log();
        log.split("gRPC rate-limit service listening on ")
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .map(|a| a.trim().to_owned())
            .unwrap_or_else(|| panic!("no gRPC listener in the log:\n{log}"))
    }

    /// Sends SIGKILL (a crash: nothing is drained, released or flushed) and reaps it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Sends SIGTERM and waits (at most 10 s) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let exited = poll_blocking(Duration::from_secs(10), Duration::from_millis(20), || {
            child.try_wait().expect("wait").ok_or(())
        });
        exited.unwrap_or_else(|()| {
            let _ = child.kill();
            panic!("inbound-web did not exit within 10 s of SIGTERM");
        })
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The binary with `--config <config written to a temp dir>`, `args` and `env`, stdin
/// closed; the temp dir lives as long as the returned handle.
fn command(config: &str, args: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Command) {
    command_as(config, args, env, None)
}

/// [`command`], run by `prlimit` with `open_files` as the open-file limit when given (it
/// execs the binary: the child's pid is the binary's).
fn command_as(
    config: &str,
    args: &[&str],
    env: &[(&str, &str)],
    open_files: Option<u64>,
) -> (tempfile::TempDir, Command) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = match open_files {
        None => Command::new(BIN),
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(BIN);
            c
        }
    };
    cmd.arg("--config")
        .arg(&path)
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    (dir, cmd)
}

/// Runs the binary to completion with `args` and `config` (and a clean `APP_` environment).
pub fn run(config: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let (_dir, mut cmd) = command(config, args, env);
    cmd.output().expect("run inbound-web")
}

/// The `[rate_limit]` and `[rate_limit.redis]` tables of an app limiting on the Redis at
/// `url` with `failure_policy`, plus `extra_redis` lines in the redis table; policies and
/// routes follow.
pub fn redis_rate_limit(url: &str, failure_policy: &str, extra_redis: &str) -> String {
    format!(
        r#"
[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
failure_policy = "{failure_policy}"
subject_secret = "{SECRET}"

[rate_limit.redis]
role = "coordination"
url = "{url}"
{extra_redis}
"#
    )
}

/// The value of the sample line starting with `series` (name and labels) in a `/metrics`
/// text, 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The text of `/metrics`.
pub async fn metrics(client: &reqwest::Client, app: &App) -> String {
    client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("text")
}

/// The receipts of the worked examples of `docs/event-gates.md` as (unit, key, id), with a
/// duration of 3 units. The last one comes at 8 units, not 7: in `strictly_once` it is
/// exactly one duration after the one at 4, and a late send of that one would make a test
/// measure scheduler jitter instead of the gate.
pub const WORKED_EXAMPLE: [(u64, &str, &str); 5] = [
    (1, "apple", "a1"),
    (2, "taco", "t2"),
    (3, "taco", "t3"),
    (4, "taco", "t4"),
    (8, "taco", "t7"),
];

/// The fates the worked examples end with, as (gate, id, status) on an app whose `once`
/// gate is `only_once` and whose `strict` gate is `strictly_once`: `only_once` allows
/// {1 apple} {2 taco} {7 taco}, `strictly_once` {1 apple} {7 taco}.
pub const WORKED_EXAMPLE_FATES: [(&str, &str, &str); 6] = [
    ("once", "a1", "published"),
    ("once", "t2", "published"),
    ("once", "t7", "published"),
    ("strict", "a1", "published"),
    ("strict", "t2", "invalidated"),
    ("strict", "t7", "published"),
];

/// A JSON POST of `/v1/evaluate`: (status, retry-after, body).
pub async fn evaluate(
    client: &reqwest::Client,
    app: &App,
    body: &str,
) -> (u16, Option<String>, serde_json::Value) {
    let r = client
        .post(app.url("/v1/evaluate"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("POST /v1/evaluate");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let text = r.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, retry, json)
}

/// The keys of a JSON object, sorted.
pub fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

/// One member of an RFC 8941 List whose items are strings with integer parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub item: String,
    pub params: Vec<(String, i64)>,
}

impl Member {
    pub fn param(&self, key: &str) -> Option<i64> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

/// Parses an RFC 8941 List of sf-string items with integer parameters, strictly (section
/// 4.2: no leading/trailing junk, keys `lcalpha / "*"` then `lcalpha / DIGIT / "_" / "-" /
/// "." / "*"`, integers of at most 15 digits).
pub fn parse_sf_list(input: &str) -> Result<Vec<Member>, String> {
    let b = input.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let sp = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t') {
            *i += 1;
        }
    };
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    if i == b.len() {
        return Ok(out);
    }
    loop {
        // sf-string
        if b.get(i) != Some(&b'"') {
            return Err(format!("expected '\"' at {i} in {input:?}"));
        }
        i += 1;
        let mut item = String::new();
        loop {
            match b.get(i) {
                None => return Err(format!("unterminated string in {input:?}")),
                Some(b'\\') => {
                    match b.get(i + 1) {
                        Some(c @ (b'"' | b'\\')) => item.push(*c as char),
                        _ => return Err(format!("bad escape in {input:?}")),
                    }
                    i += 2;
                }
                Some(b'"') => {
                    i += 1;
                    break;
                }
                Some(c) if (0x20..=0x7e).contains(c) => {
                    item.push(*c as char);
                    i += 1;
                }
                Some(_) => return Err(format!("non-printable in string in {input:?}")),
            }
        }
        let mut params = Vec::new();
        while b.get(i) == Some(&b';') {
            i += 1;
            sp(&mut i);
            let start = i;
            match b.get(i) {
                Some(c) if c.is_ascii_lowercase() || *c == b'*' => i += 1,
                _ => return Err(format!("bad parameter key at {i} in {input:?}")),
            }
            while let Some(c) = b.get(i) {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c) {
                    i += 1;
                } else {
                    break;
                }
            }
            let key = input[start..i].to_owned();
            if b.get(i) != Some(&b'=') {
                return Err(format!("parameter {key} has no integer value in {input:?}"));
            }
            i += 1;
            let vstart = i;
            if b.get(i) == Some(&b'-') {
                i += 1;
            }
            let dstart = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == dstart || i - dstart > 15 {
                return Err(format!("parameter {key} is not an sf-integer in {input:?}"));
            }
            let v: i64 = input[vstart..i].parse().map_err(|e| format!("{e}"))?;
            params.push((key, v));
        }
        out.push(Member { item, params });
        sp(&mut i);
        if i == b.len() {
            return Ok(out);
        }
        if b[i] != b',' {
            return Err(format!("expected ',' at {i} in {input:?}"));
        }
        i += 1;
        sp(&mut i);
        if i == b.len() {
            return Err(format!("trailing comma in {input:?}"));
        }
    }
}

#[test]
fn sf_list_parser_is_strict() {
    assert_eq!(
        parse_sf_list("\"api\";q=100;w=60, \"b\";r=0").expect("valid"),
        vec![
            Member {
                item: "api".into(),
                params: vec![("q".into(), 100), ("w".into(), 60)]
            },
            Member {
                item: "b".into(),
                params: vec![("r".into(), 0)]
            },
        ]
    );
    for bad in [
        "api;q=1",
        "\"api\";Q=1",
        "\"api\";q=1.5",
        "\"api\",",
        "\"api\" x",
        "\"api\";q=",
    ] {
        assert!(parse_sf_list(bad).is_err(), "{bad}");
    }
}

/// A client WebSocket to the app (the gate streams).
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next message on `ws`, whatever it is; fails after 5 s or if the stream ends.
pub async fn ws_message(ws: &mut Ws) -> tokio_tungstenite::tungstenite::Message {
    use futures::StreamExt as _;
    tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("a frame within 5 s")
        .expect("stream open")
        .expect("frame")
}

/// The next message on `ws`, parsed as a JSON text frame; fails after 5 s.
pub async fn ws_json(ws: &mut Ws) -> serde_json::Value {
    let text = ws_message(ws).await.into_text().expect("a text frame");
    serde_json::from_str(text.as_str()).expect("JSON frame")
}
