//! The Prometheus rules in `deploy/prometheus/`: `promtool check rules` and `promtool test
//! rules` pass, and every metric they name is one the real binary exports, scraped from
//! `/metrics` after driving the app through what the alerts watch (decisions, a Redis outage
//! answered by the local fallback and the breaker, a refused reload).
//!
//! Skipped, saying so, without `promtool` (Debian: `prometheus`), unless
//! `PROMTOOL_REQUIRED=1` (CI sets it, and installs it).

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use acceptance_tests::requires::{available, missing_commands};
use common::{App, evaluate};

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

fn promtool_ready() -> bool {
    let missing = missing_commands(&["promtool"]);
    available(
        "the rules test (Debian: prometheus)",
        &missing,
        "PROMTOOL_REQUIRED",
    )
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The metric names the rules' expressions use (recorded names, with a colon, excluded).
fn names_in_rules() -> BTreeSet<String> {
    let text = std::fs::read_to_string(rules_dir().join("rules.yml")).expect("rules.yml");
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest
            .find("rate_limit_")
            .or_else(|| rest.find("config_reloads_"))
        {
            let word: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let after_colon = i > 0 && rest.as_bytes()[i - 1] == b':';
            if !after_colon {
                names.insert(word.clone());
            }
            rest = &rest[i + word.len()..];
        }
    }
    names
}

/// The metric names of a Prometheus text scrape (histogram series under their family name).
fn names_in_scrape(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_owned()
        })
        .collect()
}

fn config(redis_url: &str) -> String {
    let rate_limit =
        common::redis_rate_limit(redis_url, "fallback_local", "command_timeout = \"200ms\"");
    format!(
        r#"{rate_limit}
[rate_limit.circuit_breaker]
failure_threshold = 1
cool_down = "60s"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[routes]]
path_prefix = "/api"
subject = "header:x-api-key"
"#
    )
}

#[tokio::test]
async fn the_rules_pass_promtool_and_name_only_metrics_the_binary_exports() {
    if !promtool_ready() {
        return;
    }
    promtool(&["check", "rules", "rules.yml"]);
    promtool(&["test", "rules", "rules_test.yml"]);

    let mut server = RedisServer::start();
    let app = App::start(&config(server.url()), &[]);
    let c = reqwest::Client::new();
    // Decisions from Redis: an allow, then a denial (answered again by the denial cache).
    for _ in 0..3 {
        evaluate(&c, &app, r#"{"subject":"s"}"#).await;
    }
    // Redis gone: the local fallback decides and the breaker opens.
    server.stop();
    eventually(
        "the local fallback",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let (_, _, v) = evaluate(&c, &app, r#"{"subject":"other"}"#).await;
            if v["source"] == "local_fallback" {
                Ok(())
            } else {
                Err(v)
            }
        },
    )
    .await;
    // A reload refused: the file no longer parses.
    std::fs::write(app.config_path(), "[rate_limit\n").expect("rewrite the configuration");
    app.signal("HUP");
    let text = eventually(
        "a refused reload in /metrics",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let text = common::metrics(&c, &app).await;
            if common::sample(&text, "config_reloads_total{outcome=\"refused\"}") >= 1.0 {
                Ok(text)
            } else {
                Err("not yet")
            }
        },
    )
    .await;
    let exported = names_in_scrape(&text);
    let used = names_in_rules();
    assert!(
        used.len() >= 7,
        "the parser found the rules' metrics: {used:?}"
    );
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the rules name metrics /metrics does not export: {missing:?}\n{text}"
    );
    assert!(
        common::sample(&text, "rate_limit_circuit_breaker_state") >= 1.0,
        "{text}"
    );
}
