//! The configuration through the real binary: a misspelt table or `APP_` variable stops it
//! (exit 2, key path named) under `--check` and at start-up alike; `--check` refuses what
//! start-up refuses and renders every key, secrets as `<redacted>` with their source.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const POLICY: &str =
    "[rate_limit.policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n";

/// The binary with `config` (written to `dir`), `args` and `env` on a free port, stdout and
/// stderr captured; killed when it has not exited within 10 s (a configuration it should
/// refuse but serves), which the returned `None` status says.
fn run(dir: &Path, config: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, Output) {
    let path = dir.join("app.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(common::BIN);
    cmd.arg("--config")
        .arg(&path)
        .args(args)
        .env("APP_HTTP__BIND", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn inbound-web");
    let started = Instant::now();
    let exited = loop {
        if child.try_wait().expect("wait").is_some() {
            break true;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    (exited.then(|| out.status.code()).flatten(), out)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The problem lines of a refused configuration (`key.path: problem`), without log lines.
fn problems(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| !l.contains(" INFO ") && !l.contains(" WARN "))
        .map(str::to_owned)
        .collect()
}

/// Runs `config` with `env` both under `--check` and as a server: each must exit 2 with the
/// same problem lines, one of them starting with `line`.
fn refused_alike(config: &str, env: &[(&str, &str)], line: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let (check, checked) = run(dir.path(), config, &["--check"], env);
    let (serve, served) = run(dir.path(), config, &[], env);
    assert_eq!(check, Some(2), "--check: {}", stderr(&checked));
    assert_eq!(serve, Some(2), "start-up: {}", stderr(&served));
    let lines = problems(&checked);
    assert_eq!(lines, problems(&served), "--check and start-up disagree");
    assert!(
        lines.iter().any(|l| l.starts_with(line)),
        "no {line:?} in {lines:?}"
    );
    lines
}

#[test]
fn a_misspelt_table_stops_check_and_start_up() {
    let local = format!(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n{POLICY}"
    );
    refused_alike(
        "[rate_limt]\nenabled = true\n",
        &[],
        "rate_limt: unknown key",
    );
    refused_alike(
        &format!("{local}\n[htp]\nbind = \"127.0.0.1:0\"\n"),
        &[],
        "htp: unknown key",
    );
    refused_alike(
        &format!("{local}\n[event_gates.x]\nmode = \"only_once\"\nduration = \"1s\"\nmodee = 1\n"),
        &[],
        "event_gates.x.modee: unknown key",
    );
}

#[test]
fn a_misspelt_app_variable_stops_check_and_start_up_naming_it() {
    let lines = refused_alike(
        "",
        &[("APP_RATE_LIMT__ENABLED", "true")],
        "rate_limt: unknown key",
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("APP_RATE_LIMT__ENABLED (rate_limt.enabled)")),
        "{lines:?}"
    );
}

#[test]
fn check_refuses_the_urls_start_up_refuses() {
    for url in [
        "redis://u:PW/x@127.0.0.1:16401/0",
        "redis://u:PW@[::1/0",
        "redis://u:PW#frag@127.0.0.1:16401/0",
    ] {
        let config = format!(
            "{}{POLICY}",
            common::redis_rate_limit(url, "fail_closed", "")
        );
        let lines = refused_alike(&config, &[], "rate_limit.redis.url: ");
        assert!(!lines.concat().contains("PW"), "{lines:?}");
    }
}

/// A self-signed certificate and its key, for the TLS file keys.
fn certificate(dir: &Path) -> (String, String) {
    let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
    let status = Command::new("openssl")
        .args(["req", "-x509", "-new", "-nodes", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-days", "1"])
        .args(["-subj", "/CN=test", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success());
    (cert.display().to_string(), key.display().to_string())
}

/// `--check`'s output for `redis` lines of `[rate_limit.redis]` (the secret from a file).
fn check_output(dir: &Path, redis: &str) -> String {
    std::fs::write(dir.join("secret"), common::SECRET).expect("write secret");
    let config = format!(
        "[rate_limit]\nenabled = true\nprovider = \"redis\"\ndefault_policy = \"api\"\nsubject_secret_file = \"secret\"\n\n[rate_limit.redis]\nrole = \"coordination\"\n{redis}\n{POLICY}"
    );
    let (code, out) = run(dir, &config, &["--check"], &[]);
    assert_eq!(code, Some(0), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn has_line(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
}

#[test]
fn check_renders_every_key_with_secret_sources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = certificate(dir.path());
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "pw-from-file\n").expect("write password");
    let password_file = password_file.display().to_string();
    let text = check_output(
        dir.path(),
        &format!(
            "url = \"rediss://127.0.0.1:6380/0\"\nusername = \"limiter\"\npassword_file = \"{password_file}\"\ntls_ca_file = \"{cert}\"\ntls_cert_file = \"{cert}\"\ntls_key_file = \"{key}\"\nstrict_eviction_policy = true"
        ),
    );
    let secret_file = dir.path().join("secret").display().to_string();
    for line in [
        "username = \"limiter\"".to_owned(),
        format!("password = \"<redacted>\"  # from password_file \"{password_file}\""),
        format!("password_file = \"{password_file}\""),
        format!("tls_ca_file = \"{cert}\""),
        format!("tls_cert_file = \"{cert}\""),
        format!("tls_key_file = \"{key}\""),
        "strict_eviction_policy = true".to_owned(),
        format!("subject_secret_file = \"{secret_file}\""),
    ] {
        has_line(&text, &line);
    }
    assert!(!text.contains("pw-from-file") && !text.contains(common::SECRET));

    // A password in the URL, or the `password` key, is named as such.
    let text = check_output(
        dir.path(),
        "url = \"redis://limiter:pw-in-url@127.0.0.1:6379/0\"",
    );
    has_line(&text, "password = \"<redacted>\"  # from url");
    has_line(&text, "# password_file: none");
    has_line(&text, "# tls_ca_file: none");
    has_line(&text, "strict_eviction_policy = false");
    assert!(!text.contains("pw-in-url"), "{text}");
    let text = check_output(
        dir.path(),
        "url = \"redis://127.0.0.1:6379/0\"\npassword = \"pw-inline\"",
    );
    has_line(&text, "password = \"<redacted>\"  # from password");
    assert!(!text.contains("pw-inline"), "{text}");
}
