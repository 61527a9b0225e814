//! An embedding service's `[rate_limit]` table: read from a file whose other keys are the
//! service's, overridden by the service's prefix, and as strict inside as the reference app.

use std::path::PathBuf;

use super::*;
use crate::settings::EnabledSettings;

/// A service's own file: its keys and tables around a `[rate_limit]` table.
const SERVICE: &str = r#"
name = "orders"
env = "prod"

[server]
port = 3000
unknown_to_us = [1, 2, 3]

[http]
anything = "the service's own [http]"

[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 5
window = "10s"

[[routes]]
whatever = true
"#;

struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn file(text: &str) -> File {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("service.toml");
    std::fs::write(&path, text).expect("written");
    File { _dir: dir, path }
}

fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn enabled(settings: RateLimitSettings) -> Box<EnabledSettings> {
    match settings {
        RateLimitSettings::Enabled(e) => e,
        RateLimitSettings::Disabled => panic!("expected an enabled section"),
    }
}

fn problems(section: &RateLimitSection) -> Vec<String> {
    match section.load() {
        Ok(s) => panic!("expected problems, got {s:?}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn only_the_rate_limit_table_is_read_and_the_rest_of_the_file_is_the_services() {
    let f = file(SERVICE);
    let e = enabled(RateLimitSection::file(&f.path).load().expect("valid"));
    assert_eq!(e.provider.name(), "local");
    assert_eq!(e.policies.default_id().as_str(), "api");
    assert_eq!(e.policies.iter().count(), 1);
}

#[test]
fn inside_the_section_unknown_keys_are_still_errors_all_at_once() {
    let text = SERVICE.replace("limit = 5", "limit = 5\nlimt = 6") + "\n[rate_limit.redsi]\n";
    let f = file(&text);
    let p = problems(&RateLimitSection::file(&f.path));
    assert!(
        p.iter()
            .any(|l| l.starts_with("rate_limit.policies.api.limt:")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|l| l.starts_with("rate_limit.redsi:")),
        "{p:?}"
    );
}

#[test]
fn variables_of_the_chosen_prefix_override_the_file_and_others_are_left_alone() {
    let f = file(SERVICE);
    let env = vars(&[
        ("MYSVC_RATE_LIMIT__DEFAULT_POLICY", "login"),
        (
            "MYSVC_RATE_LIMIT__POLICIES__LOGIN__ALGORITHM",
            "fixed_window",
        ),
        ("MYSVC_RATE_LIMIT__POLICIES__LOGIN__LIMIT", "3"),
        ("MYSVC_RATE_LIMIT__POLICIES__LOGIN__WINDOW", "60s"),
        // The service's own, and the reference app's: neither is read.
        ("MYSVC_ENV", "prod"),
        ("MYSVC_HTTP__BIND", "not an address"),
        ("APP_ENV", "prod"),
        ("APP_RATE_LIMIT__ENABLED", "false"),
    ]);
    let section = RateLimitSection::file(&f.path)
        .env_prefix("MYSVC_")
        .env_vars(env.clone());
    let e = enabled(section.load().expect("valid"));
    assert_eq!(e.policies.default_id().as_str(), "login");
    assert_eq!(e.policies.iter().count(), 2);
    // Without a prefix no variable is read, not even the service's.
    let e = enabled(
        RateLimitSection::file(&f.path)
            .env_vars(env)
            .load()
            .expect("valid"),
    );
    assert_eq!(e.policies.default_id().as_str(), "api");
}

#[test]
fn a_variable_naming_an_unknown_key_of_the_section_is_named_in_the_problem() {
    let f = file(SERVICE);
    let section = RateLimitSection::file(&f.path)
        .env_prefix("mysvc_")
        .env_vars(vars(&[
            ("MYSVC_RATE_LIMIT__PROVIDR", "redis"),
            ("MYSVC_RATE_LIMIT____X", "an empty part"),
        ]));
    let p = problems(&section);
    assert!(
        p.iter().any(|l| l.starts_with("rate_limit.providr:")
            && l.contains("set by MYSVC_RATE_LIMIT__PROVIDR")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.contains("MYSVC_RATE_LIMIT____X names no key")),
        "{p:?}"
    );
}

#[test]
fn without_a_rate_limit_table_it_is_disabled() {
    let f = file("[server]\nport = 3000\n");
    assert!(matches!(
        RateLimitSection::file(&f.path).load(),
        Ok(RateLimitSettings::Disabled)
    ));
    assert!(matches!(
        RateLimitSection::without_file().load(),
        Ok(RateLimitSettings::Disabled)
    ));
}

#[test]
fn a_missing_file_or_bad_toml_is_one_problem_named_by_the_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let missing = dir.path().join("absent.toml");
    let p = problems(&RateLimitSection::file(&missing));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with(&format!("{}: cannot read", missing.display())),
        "{p:?}"
    );
    let f = file("[rate_limit\nenabled = true\n");
    let p = problems(&RateLimitSection::file(&f.path));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with(&f.path.display().to_string()), "{p:?}");
}

#[test]
fn a_relative_secret_file_is_read_beside_the_services_file() {
    let f = file(&SERVICE.replace(
        "default_policy = \"api\"",
        "default_policy = \"api\"\nsubject_secret_file = \"secret.key\"",
    ));
    let dir = f.path.parent().expect("a directory");
    std::fs::write(dir.join("secret.key"), [7u8; 32]).expect("written");
    let e = enabled(RateLimitSection::file(&f.path).load().expect("valid"));
    assert_eq!(e.subject_secret_file, Some(dir.join("secret.key")));
    assert_eq!(e.subject_secret.as_ref().map(|s| s.len()), Some(32));
}
