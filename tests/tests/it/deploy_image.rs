//! The container image, built by `deploy/image/build.sh` from the release `inbound-web` and run
//! with podman exactly as docs/operations.md ("Container image") says: a read-only root file
//! system, the configuration mounted read-only, the Redis provider against a `redis-server` on
//! the host (reached at 10.0.2.2 through slirp4netns), HTTP and gRPC ports published.
//!
//! Checked: `/healthz` and `/readyz` answer; a limit is enforced over HTTP; the RLS port answers
//! the Python grpcio client; the image's own health check passes; the process runs as
//! 65532:65532 with no writable path at all (read-only root, no tmpfs); SIGTERM lets a request
//! in flight finish and stops the container within the grace period, exit status 0.
//!
//! Needs podman, buildah and runc, and a release build (`cargo build --release -p
//! inbound-web`; `BIN=` another binary). Skipped, saying so, when any is missing, unless
//! `IMAGE_TEST_REQUIRED=1` (CI sets it): then a missing piece fails.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually_blocking;
use acceptance_tests::rate::random_u64;
use acceptance_tests::redis_server::RedisServer;
use acceptance_tests::requires::{available, missing_commands};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn binary() -> PathBuf {
    std::env::var_os("BIN").map_or_else(
        || {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| root().join("target"), PathBuf::from);
            target.join("release/inbound-web")
        },
        PathBuf::from,
    )
}

/// `CONTAINERS_CONF` for hosts that need runc and bounded ulimits (see the file).
fn podman() -> Command {
    let mut c = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        c.env(
            "CONTAINERS_CONF",
            root().join("deploy/image/containers.conf"),
        );
    }
    c
}

fn run(mut c: Command) -> Output {
    let out = c.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether everything the test needs is here; panics when not and it is required.
fn ready() -> bool {
    let mut missing = missing_commands(&["podman", "buildah", "runc", "slirp4netns"]);
    if !binary().exists() {
        missing.push(format!(
            "{} (cargo build --release -p inbound-web)",
            binary().display()
        ));
    }
    available("the image test", &missing, "IMAGE_TEST_REQUIRED")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("an address").port()
}

/// Status and body of one HTTP/1.1 request on a new connection; status 0 and the error when
/// the exchange failed (the app not listening yet).
fn http(port: u16, head: &str, body: &str) -> (u16, String) {
    let exchange = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "{head}Host: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    };
    match exchange() {
        Ok(text) => {
            let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
            let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
            (status, body)
        }
        Err(e) => (0, e.to_string()),
    }
}

fn config(redis_port: u16) -> String {
    format!(
        r#"[http]
bind = "0.0.0.0:8080"

[grpc]
bind = "0.0.0.0:8081"

[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
subject_secret = "image-test-subject-secret-at-least-32-bytes"

[rate_limit.redis]
role = "coordination"
url = "redis://10.0.2.2:{redis_port}/0"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 2
window = "1h"

[[routes]]
path_prefix = "/api"
subject = "header:x-api-key"

[[rls.descriptors]]
domain = "image"
entries = ["key"]
policy = "api"
"#
    )
}

/// The container, removed (and its image) when dropped.
struct Container {
    name: String,
    image: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "0", &self.name]).output();
        let _ = podman().args(["rmi", "-f", &self.image]).output();
    }
}

fn inspect(name: &str, format: &str) -> String {
    let out = run({
        let mut c = podman();
        c.args(["inspect", "--format", format, name]);
        c
    });
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn python_rls(port: u16) -> serde_json::Value {
    let script = root().join("tests/python/rls_client.py");
    let requests =
        serde_json::json!([{"domain": "image", "hits": 1, "descriptors": [[["key", "g"]]]}]);
    let out = run({
        let mut c = Command::new("python3");
        c.arg(script)
            .arg(format!("127.0.0.1:{port}"))
            .arg(requests.to_string());
        c
    });
    serde_json::from_slice(&out.stdout).expect("the client prints JSON")
}

#[test]
fn the_image_serves_limits_over_http_and_grpc_as_a_non_root_read_only_container() {
    if !ready() {
        return;
    }
    // It builds an image and times a shutdown: nothing else heavy beside it.
    let _heavy = crate::heavy_blocking();
    let server = RedisServer::start();
    let tag = format!("rate-limit:test-{:x}", random_u64());
    let built = run({
        let mut c = Command::new(root().join("deploy/image/build.sh"));
        c.arg(&tag).env("BIN", binary());
        c
    });
    println!("{}", String::from_utf8_lossy(&built.stdout).trim());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("config.toml");
    std::fs::write(&file, config(server.port())).expect("write the configuration");
    let (hp, gp) = (free_port(), free_port());
    let name = format!("rl-image-test-{:x}", random_u64());
    let container = Container {
        name: name.clone(),
        image: tag.clone(),
    };
    start(&container, &file, hp, gp);
    // Until the app listens, the published port may accept and close: status 0.
    let answers = |path: &'static str| {
        move || match http(hp, &format!("GET {path} HTTP/1.1\r\n"), "") {
            (200, _) => Ok(()),
            other => Err(other),
        }
    };
    let every = Duration::from_millis(100);
    eventually_blocking(
        "/healthz",
        Duration::from_secs(20),
        every,
        answers("/healthz"),
    );
    eventually_blocking(
        "/readyz",
        Duration::from_secs(10),
        every,
        answers("/readyz"),
    );
    let statuses: Vec<u16> = (0..3)
        .map(|_| http(hp, "GET /api/x HTTP/1.1\r\nx-api-key: k\r\n", "").0)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "a limit of 2 enforced over HTTP");
    let answers = python_rls(gp);
    assert_eq!(answers[0]["overall_code"], "OK", "{answers}");
    run({
        let mut c = podman();
        c.args(["healthcheck", "run", &name]);
        c
    });
    assert_eq!(inspect(&name, "{{.Config.User}}"), "65532:65532");
    let pid = inspect(&name, "{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process");
    assert!(
        status.lines().any(|l| l
            .split_whitespace()
            .eq(["Uid:", "65532", "65532", "65532", "65532"])),
        "{status}"
    );
    stop_with_a_request_in_flight(&name, hp);
}

fn start(c: &Container, config: &Path, hp: u16, gp: u16) {
    run({
        let mut cmd = podman();
        // Read-only, and without the writable tmpfs podman adds at /tmp, /var/tmp and /run:
        // the app has nowhere to write, and serves.
        cmd.args([
            "run",
            "-d",
            "--name",
            &c.name,
            "--read-only",
            "--read-only-tmpfs=false",
        ])
        .args(["--network", "slirp4netns:allow_host_loopback=true"])
        .args([
            "-p",
            &format!("127.0.0.1:{hp}:8080"),
            "-p",
            &format!("127.0.0.1:{gp}:8081"),
        ])
        .arg("-v")
        .arg(format!(
            "{}:/etc/rate-limit/config.toml:ro",
            config.display()
        ))
        .arg(&c.image);
        cmd
    });
}

/// SIGTERM (`podman stop`, 10 s grace) while a request's body is still arriving: the request
/// is answered, then the app exits 0, well within the grace period.
fn stop_with_a_request_in_flight(name: &str, hp: u16) {
    let body = r#"{"subject":"in-flight"}"#;
    let mut s = TcpStream::connect(("127.0.0.1", hp)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "POST /v1/evaluate HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..5]
    )
    .expect("write the head");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut stop = podman();
    stop.args(["stop", "-t", "10", name])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let stopping = stop.spawn().expect("podman stop");
    std::thread::sleep(Duration::from_millis(500));
    s.write_all(&body.as_bytes()[5..])
        .expect("the rest of the body");
    let mut answer = [0u8; 12];
    s.read_exact(&mut answer).expect("an answer after SIGTERM");
    assert_eq!(
        &answer[..],
        b"HTTP/1.1 200",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let stopped = stopping.wait_with_output().expect("podman stop ends");
    assert!(stopped.status.success());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(9), "stopped after {took:?}");
    assert_eq!(inspect(name, "{{.State.ExitCode}}"), "0");
    println!("stopped {took:?} after SIGTERM, the request in flight answered");
}
