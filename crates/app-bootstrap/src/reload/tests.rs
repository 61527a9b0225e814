use super::check;
use crate::config::{ConfigErrors, from_toml};
use crate::settings::Settings;

const BASE: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 5
window = "1m"
revision = 3

[rate_limit.policies.other]
algorithm = "token_bucket"
capacity = 10
refill_amount = 1
refill_interval = "1s"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-user"
"#;

fn settings(toml: &str) -> Settings {
    match from_toml(toml) {
        Ok(s) => s,
        Err(e) => panic!("test config refused:\n{e}"),
    }
}

fn refused(next: &str) -> ConfigErrors {
    match check(&settings(BASE), &settings(next)) {
        Ok(()) => panic!("the reload was taken"),
        Err(e) => e,
    }
}

#[test]
fn the_same_file_is_taken() {
    assert_eq!(check(&settings(BASE), &settings(BASE)), Ok(()));
}

#[test]
fn a_changed_limit_with_a_higher_revision_is_taken() {
    let next = BASE
        .replace("limit = 5", "limit = 50")
        .replace("revision = 3", "revision = 4");
    assert_eq!(check(&settings(BASE), &settings(&next)), Ok(()));
}

#[test]
fn a_changed_limit_without_a_new_revision_is_refused_by_key_path() {
    let e = refused(&BASE.replace("limit = 5", "limit = 50"));
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].path, "rate_limit.policies.api.revision");
    assert!(e.0[0].problem.contains("limit"), "{e}");
    assert!(e.0[0].problem.contains("revision = 4"), "{e}");
}

#[test]
fn a_policy_without_a_revision_key_is_revision_one_and_follows_the_same_rule() {
    let e = refused(&BASE.replace("capacity = 10", "capacity = 11"));
    assert!(e.names("rate_limit.policies.other.revision"), "{e}");
    let next = BASE.replace("capacity = 10", "capacity = 11\nrevision = 2");
    assert_eq!(check(&settings(BASE), &settings(&next)), Ok(()));
}

#[test]
fn a_changed_algorithm_needs_a_new_revision() {
    let next = BASE.replace(
        "algorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"",
        "algorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1m\"",
    );
    assert!(refused(&next).names("rate_limit.policies.api.revision"));
}

#[test]
fn a_revision_never_goes_down() {
    let e = refused(&BASE.replace("revision = 3", "revision = 2"));
    assert!(e.names("rate_limit.policies.api.revision"), "{e}");
    assert!(e.0[0].problem.contains("went down from 3 to 2"), "{e}");
}

#[test]
fn shadow_failure_policy_and_deny_cache_need_no_new_revision() {
    let next = BASE.replace(
        "revision = 3",
        "revision = 3\nshadow = true\nfailure_policy = \"fail_open\"\ndeny_cache = true",
    );
    assert_eq!(check(&settings(BASE), &settings(&next)), Ok(()));
}

#[test]
fn policies_and_routes_may_be_added_and_removed() {
    let next = BASE
        .replace(
            "[rate_limit.policies.other]\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_amount = 1\nrefill_interval = \"1s\"\n",
            "[rate_limit.policies.new]\nalgorithm = \"gcra\"\nlimit = 3\nperiod = \"1s\"\nburst = 3\n",
        )
        .replace("path_prefix = \"/api\"", "path_prefix = \"/v2\"");
    assert_eq!(check(&settings(BASE), &settings(&next)), Ok(()));
}

#[test]
fn listener_provider_and_store_settings_need_a_restart() {
    let next = format!(
        "[http]\nbind = \"127.0.0.1:9999\"\n[log]\nformat = \"json\"\n{}",
        BASE.replace(
            "default_policy = \"api\"",
            "default_policy = \"api\"\n[rate_limit.local]\nmax_keys = 10"
        )
    );
    let e = refused(&next);
    for path in ["http.bind", "log.format", "rate_limit.local.max_keys"] {
        assert!(e.names(path), "{path} not named in:\n{e}");
    }
    assert!(e.0.iter().all(|p| p.problem.contains("restart")), "{e}");
}

#[test]
fn enabling_or_disabling_rate_limiting_needs_a_restart() {
    let e = refused(&BASE.replace("enabled = true", "enabled = false"));
    assert!(e.names("rate_limit.enabled"), "{e}");
}

#[test]
fn local_event_gates_may_come_and_go_but_a_kept_gate_keeps_its_settings() {
    let with = format!("{BASE}\n[event_gates.signup]\nmode = \"only_once\"\nduration = \"1m\"\n");
    assert_eq!(check(&settings(BASE), &settings(&with)), Ok(()));
    assert_eq!(check(&settings(&with), &settings(BASE)), Ok(()));
    let changed = with.replace("duration = \"1m\"", "duration = \"2m\"");
    let e = check(&settings(&with), &settings(&changed)).expect_err("a changed gate");
    assert!(e.names("event_gates.signup.duration"), "{e}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let next = BASE
        .replace("limit = 5", "limit = 6")
        .replace("capacity = 10", "capacity = 9")
        .replace("[rate_limit]", "[http]\nmax_connections = 5\n[rate_limit]");
    let e = refused(&next);
    assert!(e.names("rate_limit.policies.api.revision"), "{e}");
    assert!(e.names("rate_limit.policies.other.revision"), "{e}");
    assert!(e.names("http.max_connections"), "{e}");
}

#[cfg(feature = "redis")]
const ON_REDIS: &str = r#"
[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
subject_secret = "a-subject-secret-of-at-least-32-bytes!!"

[rate_limit.redis]
url = "redis://127.0.0.1:1/0"
role = "coordination"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 5
window = "1m"

[event_gates.orders]
mode = "only_once"
duration = "1m"
"#;

#[cfg(feature = "redis")]
#[test]
fn redis_gates_may_come_and_go_but_a_kept_gate_keeps_its_settings() {
    let base = settings(ON_REDIS);
    let added =
        format!("{ON_REDIS}\n[event_gates.signups]\nmode = \"only_once\"\nduration = \"5s\"\n");
    assert_eq!(check(&base, &settings(&added)), Ok(()));
    assert!(super::gates_changed(&base, &settings(&added)));
    assert!(!super::gates_changed(&base, &settings(ON_REDIS)));
    let removed = ON_REDIS.replace(
        "[event_gates.orders]\nmode = \"only_once\"\nduration = \"1m\"\n",
        "",
    );
    assert_eq!(check(&base, &settings(&removed)), Ok(()));
    let changed = ON_REDIS.replace("duration = \"1m\"", "duration = \"2m\"");
    let e = check(&base, &settings(&changed)).expect_err("a changed gate");
    assert!(e.names("event_gates.orders.duration"), "{e}");
}

/// A redis configuration whose `[rate_limit.redis]` holds `redis` (the role is added).
#[cfg(feature = "redis")]
fn on_redis(redis: &str) -> String {
    format!(
        r#"
[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
subject_secret = "a-subject-secret-of-at-least-32-bytes!!"

[rate_limit.redis]
role = "coordination"
{redis}

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 5
window = "1m"
"#
    )
}

/// Asserts that replacing `was` by `now` in `config` is refused by `path` alone, with a
/// problem that says a restart applies it and shows neither value.
#[cfg(feature = "redis")]
fn secret_change_refused(config: &str, was: &str, now: &str, path: &str) {
    let running = settings(config);
    let next = settings(&config.replace(was, now));
    let e = check(&running, &next).expect_err("a changed secret must not be taken");
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].path, path, "{e}");
    let text = e.to_string();
    assert!(text.contains("changed") && text.contains("restart"), "{e}");
    assert!(
        !text.contains(was) && !text.contains(now),
        "a secret shown: {e}"
    );
    assert_eq!(check(&running, &settings(config)), Ok(()), "unchanged");
}

#[cfg(feature = "redis")]
#[test]
fn a_url_differing_only_in_its_password_is_refused_by_key_path_without_showing_it() {
    let config = on_redis("url = \"redis://limiter:old-pass-1@127.0.0.1:1/0\"");
    secret_change_refused(&config, "old-pass-1", "new-pass-2", "rate_limit.redis.url");
    // A password with no user name is the same.
    let config = on_redis("url = \"redis://:old-pass-1@127.0.0.1:1/0\"");
    secret_change_refused(&config, "old-pass-1", "new-pass-2", "rate_limit.redis.url");
}

#[cfg(feature = "redis")]
#[test]
fn a_sentinel_url_differing_only_in_its_password_is_refused_by_key_path() {
    let config = on_redis(
        "topology = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"redis://127.0.0.1:26379\", \"redis://:old-pass-1@127.0.0.1:26380\"]",
    );
    secret_change_refused(
        &config,
        "old-pass-1",
        "new-pass-2",
        "rate_limit.redis.sentinels",
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_cluster_node_url_differing_only_in_its_password_is_refused_by_key_path() {
    let config =
        on_redis("topology = \"cluster\"\nnodes = [\"redis://limiter:old-pass-1@127.0.0.1:7000\"]");
    secret_change_refused(
        &config,
        "old-pass-1",
        "new-pass-2",
        "rate_limit.redis.nodes",
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_changed_password_key_is_refused_by_key_path() {
    let config = on_redis(
        "url = \"redis://127.0.0.1:1/0\"\nusername = \"limiter\"\npassword = \"old-pass-1\"",
    );
    secret_change_refused(
        &config,
        "old-pass-1",
        "new-pass-2",
        "rate_limit.redis.password",
    );
}

/// A fresh directory for one test's files.
#[cfg(feature = "redis")]
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rl-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[cfg(feature = "redis")]
#[test]
fn a_password_file_with_new_content_under_the_same_path_is_refused_by_key_path() {
    let dir = scratch("password-file");
    let file = dir.join("redis-password");
    std::fs::write(&file, "old-pass-1\n").expect("write the password file");
    let config = on_redis(&format!(
        "url = \"redis://127.0.0.1:1/0\"\nusername = \"limiter\"\npassword_file = \"{}\"",
        file.display()
    ));
    let running = settings(&config);
    std::fs::write(&file, "new-pass-2\n").expect("rotate the password file");
    let e = check(&running, &settings(&config)).expect_err("a rotated password file");
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].path, "rate_limit.redis.password_file", "{e}");
    let text = e.to_string();
    assert!(
        !text.contains("old-pass-1") && !text.contains("new-pass-2"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "redis")]
#[test]
fn a_changed_subject_secret_is_refused_without_showing_it() {
    let config = on_redis("url = \"redis://127.0.0.1:1/0\"");
    secret_change_refused(
        &config,
        "a-subject-secret-of-at-least-32-bytes!!",
        "another-subject-secret-of-32-bytes-or-more",
        "rate_limit.subject_secret",
    );
}

/// Writes a fresh self-signed certificate and its key to `dir/ca.crt` and `dir/client.key`
/// (and the certificate again as `client.crt`), replacing what was there.
#[cfg(feature = "redis")]
fn new_certificate(dir: &std::path::Path) {
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-days",
            "2",
            "-subj",
            "/CN=reload-test",
            "-keyout",
            "client.key",
            "-out",
            "ca.crt",
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl made a certificate");
    std::fs::copy(dir.join("ca.crt"), dir.join("client.crt")).expect("copy the certificate");
}

#[cfg(feature = "redis")]
#[test]
fn tls_files_with_new_content_under_the_same_paths_are_refused_by_key_path() {
    let dir = scratch("tls");
    new_certificate(&dir);
    let p = |f: &str| dir.join(f).display().to_string();
    let config = on_redis(&format!(
        "url = \"rediss://127.0.0.1:1/0\"\ntls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
        p("ca.crt"),
        p("client.crt"),
        p("client.key")
    ));
    let running = settings(&config);
    assert_eq!(check(&running, &settings(&config)), Ok(()));
    new_certificate(&dir);
    let e = check(&running, &settings(&config)).expect_err("new TLS material");
    for key in ["tls_ca_file", "tls_cert_file", "tls_key_file"] {
        assert!(e.names(&format!("rate_limit.redis.{key}")), "{key}: {e}");
    }
    assert_eq!(e.0.len(), 3, "{e}");
    assert!(!e.to_string().contains("PRIVATE KEY"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
