//! Fuzzing the configuration loader: arbitrary text, TOML built from the real section and key
//! names with values of every type and edge, and `APP_` environment variables. The loader
//! never panics; a secret never appears in a problem; a configuration it accepts renders
//! (`--check`) as TOML.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use app_bootstrap::Settings;
use app_bootstrap::config::{self, ConfigErrors, Sources};
use proptest::prelude::*;

fn config_cases(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

/// Secrets of the fuzzed configurations, only ever the values of `SECRET_KEYS`: one long
/// enough to be accepted, one too short; both unmistakable in any text they leaked into.
const SECRETS: [&str; 2] = [
    "fuzz-secret-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e",
    "fuzz-short-9d2c",
];
const SECRET_KEYS: &[&str] = &["subject_secret", "password"];

/// Keys holding Redis URLs, whose passwords are secrets too.
const URL_KEYS: &[&str] = &["url", "sentinels", "nodes"];

/// The value of `key`: a secret for a secret key, or a URL with the short secret as its
/// password for a URL key, when `secret` says which; `value` otherwise.
fn value_of(key: &str, value: String, secret: Option<bool>) -> String {
    let url = |long: bool| {
        let [good, bad] = [
            "redis://u:fuzz-short-9d2c@127.0.0.1:6379/0",
            "redis://u:fuzz-short-9d2c/x@127.0.0.1:16401/0",
        ];
        let url = if long { good } else { bad };
        if key == "url" {
            format!("{url:?}")
        } else {
            format!("[{url:?}]")
        }
    };
    match secret {
        Some(long) if SECRET_KEYS.contains(&key) => format!("{:?}", SECRETS[usize::from(!long)]),
        Some(long) if URL_KEYS.contains(&key) => url(long),
        _ => value,
    }
}

fn leaks(text: &str) -> bool {
    SECRETS.iter().any(|s| text.contains(s))
}

/// The sections and the keys each may hold (and one key no section knows).
const SECTIONS: &[(&str, &[&str])] = &[
    ("http", &["bind", "worker_threads", "max_in_flight"]),
    (
        "rate_limit",
        &[
            "enabled",
            "provider",
            "default_policy",
            "failure_policy",
            "subject_secret",
            "subject_secret_file",
        ],
    ),
    ("rate_limit.local", &["max_keys"]),
    (
        "rate_limit.circuit_breaker",
        &["failure_threshold", "cool_down", "enabled"],
    ),
    (
        "rate_limit.redis",
        &[
            "role",
            "topology",
            "url",
            "master_name",
            "sentinels",
            "nodes",
            "username",
            "password",
            "password_file",
            "tls_ca_file",
            "tls_cert_file",
            "tls_key_file",
            "key_prefix",
            "connect_timeout",
            "command_timeout",
            "connections",
            "min_replicas_ack",
            "strict_eviction_policy",
            "deny_cache_max_entries",
            "batch_max",
        ],
    ),
    (
        "rate_limit.policies.api",
        &[
            "revision",
            "algorithm",
            "capacity",
            "refill_amount",
            "refill_interval",
            "limit",
            "window",
            "period",
            "burst",
            "max_cost",
            "cleanup_grace",
            "max_clock_regression",
            "failure_policy",
            "deny_cache",
        ],
    ),
    (
        "rate_limit.policies.login",
        &["algorithm", "limit", "window"],
    ),
    ("[routes]", &["path_prefix", "policy", "subject"]),
    (
        "event_gates.orders",
        &[
            "mode",
            "duration",
            "retention",
            "max_events",
            "max_clock_regression",
        ],
    ),
    ("rate_limt", &["enabled"]),
];

/// TOML values: the strings each key expects and their near misses, numbers at their edges,
/// and the other types.
fn toml_value() -> impl Strategy<Value = String> {
    let strings = prop::sample::select(vec![
        "true",
        "1s",
        "0s",
        "10ms",
        "1h",
        "-1s",
        "1.5s",
        "99999999999999999999h",
        "",
        " ",
        "local",
        "redis",
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "fail_open",
        "fail_closed",
        "fallback_local",
        "only_once",
        "strictly_once",
        "ip",
        "header:x-api-key",
        "header:",
        "coordination",
        "standalone",
        "sentinel",
        "cluster",
        "api",
        "login",
        "nope",
        "/api",
        "api",
        "127.0.0.1:8080",
        "[::1]:0",
        "0.0.0.0:99999",
        "redis://127.0.0.1:6379/0",
        "rediss://h:1/0",
        "redis://u:PW/x@127.0.0.1:16401/0",
        "redis://u:PW@[::1/0",
        "redis://u:PW#frag@127.0.0.1/0",
        "redis://",
        "unix:///tmp/x",
        "/nonexistent/file",
        "\u{0}",
        "é",
        "\u{202e}",
    ])
    .prop_map(|s| format!("{s:?}"));
    prop_oneof![
        4 => strings,
        2 => prop_oneof![
            Just(0i64), Just(1), Just(-1), Just(i64::MAX), Just(i64::MIN), Just(9_007_199_254_740_993),
            any::<i64>(),
        ].prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "true", "false", "1.5", "nan", "-inf", "1e308", "[]", "[1, 2]", "[\"redis://a:7000\", \"redis://b:7001\"]",
            "{}", "{ a = 1 }", "1979-05-27T07:32:00Z", "18446744073709551616",
        ]).prop_map(str::to_owned),
        1 => any::<String>().prop_map(|s| format!("{s:?}")),
    ]
}

/// A document of some sections (some twice, some with a misspelt key), each with some keys.
fn toml_document() -> impl Strategy<Value = String> {
    let key = (
        any::<prop::sample::Index>(),
        toml_value(),
        prop::option::weighted(0.05, "[a-z_]{1,12}"),
        prop::option::weighted(0.7, any::<bool>()),
    );
    let section = (
        any::<prop::sample::Index>(),
        prop::collection::vec(key, 0..8),
    );
    prop::collection::vec(section, 0..8).prop_map(|sections| {
        let mut doc = String::new();
        for (which, keys) in sections {
            let (name, names) = SECTIONS[which.index(SECTIONS.len())];
            doc.push_str(&format!("[{name}]\n"));
            for (k, value, typo, secret) in keys {
                let key = typo.unwrap_or_else(|| names[k.index(names.len())].to_owned());
                let value = value_of(&key, value, secret);
                doc.push_str(&format!("{key} = {value}\n"));
            }
        }
        doc
    })
}

/// No problem repeats a secret.
fn check_errors(e: &ConfigErrors) -> Result<(), TestCaseError> {
    for p in &e.0 {
        prop_assert!(!p.path.is_empty(), "a problem without a path: {p:?}");
        prop_assert!(!leaks(&p.problem), "a secret in {p}");
    }
    prop_assert!(!leaks(&e.to_string()));
    Ok(())
}

/// An accepted configuration renders as TOML, without its secrets.
fn check_settings(s: &Settings) -> Result<(), TestCaseError> {
    let rendered = s.render();
    prop_assert!(!leaks(&rendered), "a secret in\n{rendered}");
    if let Err(e) = config::from_toml(&rendered) {
        prop_assert!(
            !e.names("--config"),
            "--check rendered no TOML:\n{rendered}\n{e}"
        );
    }
    Ok(())
}

fn check(result: &Result<Settings, ConfigErrors>) -> Result<(), TestCaseError> {
    match result {
        Ok(s) => check_settings(s),
        Err(e) => check_errors(e),
    }
}

/// `APP_` variables naming real keys in any case, or anything.
fn env_vars() -> impl Strategy<Value = Vec<(String, String)>> {
    let named = (
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        any::<bool>(),
        toml_value(),
        prop::option::weighted(0.7, any::<bool>()),
    )
        .prop_map(|(s, k, lower, value, secret)| {
            let (section, keys) = SECTIONS[s.index(SECTIONS.len())];
            let key = keys[k.index(keys.len())];
            let value = value_of(key, value, secret);
            let path = format!("{section}.{key}").replace(['[', ']'], "");
            let name = format!("APP_{}", path.replace('.', "__"));
            let name = if lower {
                name.to_lowercase()
            } else {
                name.to_uppercase()
            };
            // Environment values are text; sometimes quoted as TOML would quote them.
            (name, value.trim_matches('"').to_owned())
        });
    let raw = ("(APP|app)_[A-Za-z_]{0,30}", any::<String>());
    prop::collection::vec(prop_oneof![4 => named, 1 => raw], 0..8)
}

proptest! {
    #![proptest_config(config_cases(200))]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        check(&config::from_toml(&text))?;
    }

    #[test]
    fn toml_like_text_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        const TOML_CHARS: &[u8] = b"[]=.\"'\n\n {}ratelimt_enbdpoicsy1s:,#";
        let text: String = bytes
            .iter()
            .map(|&b| char::from(TOML_CHARS[usize::from(b) % TOML_CHARS.len()]))
            .collect();
        check(&config::from_toml(&text))?;
    }

    #[test]
    fn structured_toml_from_the_real_keys_never_panics(doc in toml_document()) {
        check(&config::from_toml(&doc))?;
    }

    #[test]
    fn app_environment_variables_over_a_file_never_panic(doc in toml_document(), vars in env_vars()) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("fuzz.toml");
        std::fs::write(&file, doc).expect("written");
        let sources = Sources { file: Some(file), env: Some(vars) };
        check(&config::load(&sources))?;
    }
}

#[test]
fn a_toml_syntax_error_on_a_secret_line_names_the_line_but_not_the_secret() {
    // Regression: the parser's message quoted the line (`3 | subject_secret = "..."`).
    let doc = format!(
        "[rate_limit]\nsubject_secret = \"x\"\nsubject_secret = {:?}\n",
        SECRETS[0]
    );
    let e = config::from_toml(&doc).expect_err("a duplicate key");
    assert!(!leaks(&e.to_string()), "{e}");
    assert!(e.to_string().contains("line 3"), "{e}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("dup.toml");
    std::fs::write(&file, &doc).expect("written");
    let sources = Sources {
        file: Some(file),
        env: Some(Vec::new()),
    };
    let e = config::load(&sources).expect_err("a duplicate key");
    assert!(!leaks(&e.to_string()), "{e}");
}
