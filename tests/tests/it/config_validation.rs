//! Configuration validation: every invalid case is reported with its full key path, all
//! problems of a file at once, secrets never shown; rate limiting is disabled by default.

use app_bootstrap::config::{self, ConfigErrors, Sources};
use app_bootstrap::{RateLimitSettings, Settings};

const SECRET: &str = "0123456789abcdef0123456789abcdef-secret";

fn errors(toml: &str) -> ConfigErrors {
    match config::from_toml(toml) {
        Ok(s) => panic!("expected configuration errors, got {s:?}"),
        Err(e) => e,
    }
}

fn ok(toml: &str) -> Settings {
    config::from_toml(toml).unwrap_or_else(|e| panic!("expected a valid configuration:\n{e}"))
}

/// The problem on `path`, failing the test with all problems when there is none.
fn problem_at(e: &ConfigErrors, path: &str) -> String {
    e.0.iter()
        .find(|p| p.path == path)
        .map(|p| p.problem.clone())
        .unwrap_or_else(|| panic!("no problem named {path}; got:\n{e}"))
}

fn redis_config(extra_rate_limit: &str, redis: &str, policy: &str) -> String {
    format!(
        r#"
[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
{extra_rate_limit}

[rate_limit.redis]
{redis}

[rate_limit.policies.api]
{policy}
"#
    )
}

const GOOD_REDIS: &str = r#"role = "coordination"
url = "redis://127.0.0.1:6379/0""#;
const GOOD_POLICY: &str = r#"algorithm = "token_bucket"
capacity = 100
refill_amount = 10
refill_interval = "1s""#;

fn secret_line() -> String {
    format!("subject_secret = \"{SECRET}\"")
}

#[test]
fn empty_configuration_is_valid_and_disabled() {
    let s = ok("");
    assert!(matches!(s.rate_limit, RateLimitSettings::Disabled));
    assert_eq!(s.http.bind.to_string(), "127.0.0.1:8080");
}

#[test]
fn configured_redis_without_enabled_stays_disabled() {
    let s = ok(&format!(
        "[rate_limit]\nprovider = \"redis\"\n\n[rate_limit.redis]\n{GOOD_REDIS}\n"
    ));
    assert!(matches!(s.rate_limit, RateLimitSettings::Disabled));
}

#[test]
fn complete_redis_configuration_is_valid() {
    let s = ok(&redis_config(&secret_line(), GOOD_REDIS, GOOD_POLICY));
    match s.rate_limit {
        RateLimitSettings::Enabled(e) => {
            assert_eq!(e.provider.name(), "redis");
            assert_eq!(e.policies.default_id().as_str(), "api");
        }
        RateLimitSettings::Disabled => panic!("enabled = true must enable"),
    }
}

#[test]
fn redis_without_subject_secret_names_the_secret_key() {
    let e = errors(&redis_config("", GOOD_REDIS, GOOD_POLICY));
    problem_at(&e, "rate_limit.subject_secret_file");
}

#[test]
fn short_subject_secret_is_refused_without_showing_it() {
    let e = errors(&redis_config(
        "subject_secret = \"hunter2-hunter2\"",
        GOOD_REDIS,
        GOOD_POLICY,
    ));
    let p = problem_at(&e, "rate_limit.subject_secret");
    assert!(p.contains("32"), "{p}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn subject_secret_file_is_read_and_short_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let short = dir.path().join("short");
    std::fs::write(&short, "too-short\n").expect("write");
    let e = errors(&redis_config(
        &format!("subject_secret_file = {:?}", short.display().to_string()),
        GOOD_REDIS,
        GOOD_POLICY,
    ));
    let p = problem_at(&e, "rate_limit.subject_secret_file");
    assert!(!p.contains("too-short"), "{p}");

    let long = dir.path().join("long");
    std::fs::write(&long, format!("{SECRET}\n")).expect("write");
    ok(&redis_config(
        &format!("subject_secret_file = {:?}", long.display().to_string()),
        GOOD_REDIS,
        GOOD_POLICY,
    ));
}

#[test]
fn unknown_algorithm_names_the_algorithm_key() {
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        "algorithm = \"leaky_bucket\"\nlimit = 5\nwindow = \"1s\"",
    ));
    let p = problem_at(&e, "rate_limit.policies.api.algorithm");
    assert!(p.contains("leaky_bucket"), "{p}");
}

#[test]
fn zero_capacity_names_the_capacity_key() {
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        "algorithm = \"token_bucket\"\ncapacity = 0\nrefill_amount = 1\nrefill_interval = \"1s\"",
    ));
    let p = problem_at(&e, "rate_limit.policies.api.capacity");
    assert!(p.contains('0'), "{p}");
}

#[test]
fn default_policy_that_is_not_defined_is_named() {
    let e = errors(&format!(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"web\"\n\n[rate_limit.policies.api]\n{GOOD_POLICY}\n"
    ));
    let p = problem_at(&e, "rate_limit.default_policy");
    assert!(p.contains("web"), "{p}");
}

#[test]
fn role_other_than_coordination_is_refused() {
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"cache\"\nurl = \"redis://127.0.0.1:6379/0\"",
        GOOD_POLICY,
    ));
    let p = problem_at(&e, "rate_limit.redis.role");
    assert!(p.contains("cache") && p.contains("coordination"), "{p}");
}

#[test]
fn missing_role_is_refused_for_redis() {
    let e = errors(&redis_config(
        &secret_line(),
        "url = \"redis://127.0.0.1:6379/0\"",
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.role");
}

#[test]
fn non_finite_and_zero_command_timeouts_are_refused() {
    for bad in ["inf", "nan", "\"0s\"", "\"forever\"", "50"] {
        let e = errors(&redis_config(
            &secret_line(),
            &format!("{GOOD_REDIS}\ncommand_timeout = {bad}"),
            GOOD_POLICY,
        ));
        problem_at(&e, "rate_limit.redis.command_timeout");
    }
}

#[test]
fn arithmetic_beyond_two_to_the_53_is_refused_by_key() {
    // 1 token per 7 ms: capacity is counted in 1/7 tokens, and 2^52 * 7 exceeds 2^53-1.
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        "algorithm = \"token_bucket\"\ncapacity = 4503599627370496\nrefill_amount = 1\nrefill_interval = \"7ms\"",
    ));
    let p = problem_at(&e, "rate_limit.policies.api.capacity");
    assert!(p.contains("2^53"), "{p}");
}

#[test]
fn parameter_of_another_algorithm_is_named() {
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        &format!("{GOOD_POLICY}\nwindow = \"60s\""),
    ));
    let p = problem_at(&e, "rate_limit.policies.api.window");
    assert!(p.contains("token_bucket"), "{p}");
}

#[test]
fn missing_parameter_is_named() {
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        "algorithm = \"gcra\"\nlimit = 10\nburst = 2",
    ));
    problem_at(&e, "rate_limit.policies.api.period");
}

/// Every count of a policy (and a route's cost) below its minimum of 1 is refused with one
/// message, whether the number is 0 or negative: a negative one used to be refused by the
/// integer reader ("must be >= 0") and 0 by the policy's check ("must be >= 1").
#[test]
fn zero_and_negative_counts_get_one_message_naming_the_bound() {
    // Each line: the key, then the policy with N for the number ("; " between keys).
    let cases = r#"
limit | algorithm = "fixed_window"; limit = N; window = "1s"
limit | algorithm = "sliding_window"; limit = N; window = "1s"
limit | algorithm = "sliding_log"; limit = N; window = "1s"
limit | algorithm = "concurrency"; limit = N; lease_ttl = "1s"
capacity | algorithm = "token_bucket"; capacity = N; refill_amount = 1; refill_interval = "1s"
refill_amount | algorithm = "token_bucket"; capacity = 5; refill_amount = N; refill_interval = "1s"
limit | algorithm = "gcra"; limit = N; period = "1s"; burst = 1
burst | algorithm = "gcra"; limit = 1; period = "1s"; burst = N
max_cost | algorithm = "fixed_window"; limit = 5; window = "1s"; max_cost = N
revision | algorithm = "fixed_window"; limit = 5; window = "1s"; revision = N
"#;
    let cases: Vec<(String, &str)> = cases
        .trim()
        .lines()
        .filter_map(|l| l.split_once(" | "))
        .map(|(key, policy)| (policy.replace("; ", "\n"), key))
        .collect();
    let problem = |policy: &str, key: &str, n: &str| {
        let path = format!("rate_limit.policies.api.{key}");
        let e = errors(&redis_config(
            &secret_line(),
            GOOD_REDIS,
            &policy.replace('N', n),
        ));
        problem_at(&e, &path)
    };
    assert_eq!(cases.len(), 10);
    for (policy, key) in &cases {
        let zero = problem(policy, key, "0");
        let negative = problem(policy, key, "-3");
        assert!(zero.ends_with(", got 0"), "{key} = 0: {zero}");
        assert_eq!(
            negative,
            zero.replace(", got 0", ", got -3"),
            "{key} = -3 vs {key} = 0"
        );
        assert!(negative.contains("1"), "{key}: the bound is 1: {negative}");
    }
    let route = |n: &str| {
        let policy = "algorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\nmax_cost = 5";
        let file = format!(
            "{}\n[[routes]]\npath_prefix = \"/a\"\npolicy = \"api\"\nsubject = \"ip\"\ncost = {n}\n",
            redis_config(&secret_line(), GOOD_REDIS, policy)
        );
        problem_at(&errors(&file), "routes[0].cost")
    };
    let (zero, negative) = (route("0"), route("-3"));
    assert_eq!(
        negative,
        zero.replace(", got 0", ", got -3"),
        "routes[0].cost"
    );
}

#[test]
fn max_cost_above_the_limit_is_named() {
    let e = errors(&redis_config(
        &secret_line(),
        GOOD_REDIS,
        &format!("{GOOD_POLICY}\nmax_cost = 101"),
    ));
    problem_at(&e, "rate_limit.policies.api.max_cost");
}

#[test]
fn every_problem_is_reported_at_once_one_line_each() {
    let e = errors(
        r#"
[http]
bind = "not an address"

[rate_limit]
enabled = true
provider = "redis"
default_policy = "web"
failure_policy = "sometimes"

[rate_limit.redis]
role = "cache"
url = "redis://127.0.0.1:6379/0"
command_timeout = "0s"
max_in_flight = 0
deny_cache_max_entries = 0
batch_max = 65

[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 0
refill_amount = 1
refill_interval = "1s"
limit = 3

[rate_limit.policies.Bad]
algorithm = "fixed_window"
limit = 1
window = "1s"

[[routes]]
path_prefix = "api"
policy = "nope"
subject = "cookie:x"
"#,
    );
    let expected = [
        "http.bind",
        "rate_limit.failure_policy",
        "rate_limit.default_policy",
        "rate_limit.redis.role",
        "rate_limit.redis.command_timeout",
        "rate_limit.redis.max_in_flight",
        "rate_limit.redis.deny_cache_max_entries",
        "rate_limit.redis.batch_max",
        "rate_limit.policies.api.capacity",
        "rate_limit.policies.api.limit",
        "rate_limit.policies.Bad",
        "routes[0].path_prefix",
        "routes[0].policy",
        "routes[0].subject",
        "rate_limit.subject_secret_file",
    ];
    for path in expected {
        problem_at(&e, path);
    }
    let text = e.to_string();
    assert_eq!(
        text.lines().count(),
        e.0.len(),
        "one line per problem:\n{text}"
    );
    for line in text.lines() {
        assert!(
            line.starts_with("http.")
                || line.starts_with("rate_limit.")
                || line.starts_with("routes["),
            "every line names its key path: {line}"
        );
    }
}

#[test]
fn unknown_keys_are_named() {
    let e = errors(&format!(
        "[rate_limit]\nenabeld = true\n\n[rate_limit.policies.api]\n{GOOD_POLICY}\ncapacty = 3\n"
    ));
    problem_at(&e, "rate_limit.enabeld");
    problem_at(&e, "rate_limit.policies.api.capacty");
}

#[test]
fn environment_overrides_file_keys_with_double_underscore_nesting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("app.toml");
    std::fs::write(
        &file,
        format!(
            "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n\n[rate_limit.policies.api]\n{GOOD_POLICY}\n"
        ),
    )
    .expect("write");
    let env = |vars: &[(&str, &str)]| Sources {
        file: Some(file.clone()),
        env: Some(
            vars.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
    };
    // The override is validated like a file key, and named by its key path.
    let e = config::load(&env(&[("APP_RATE_LIMIT__POLICIES__API__CAPACITY", "0")]))
        .expect_err("capacity 0 from the environment");
    let problem = problem_at(&e, "rate_limit.policies.api.capacity");
    assert!(problem.contains("got 0"), "{problem}");
    // Numbers and booleans arrive as text and are read as such.
    let s = config::load(&env(&[
        ("APP_RATE_LIMIT__POLICIES__API__CAPACITY", "250"),
        ("APP_RATE_LIMIT__LOCAL__MAX_KEYS", "5000"),
        ("APP_HTTP__WORKER_THREADS", "2"),
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.http.worker_threads, Some(2));
    assert!(s.render().contains("capacity = 250\n"), "{}", s.render());
    assert!(s.render().contains("max_keys = 5000\n"), "{}", s.render());
    let s = config::load(&env(&[("APP_RATE_LIMIT__ENABLED", "false")]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(s.rate_limit, RateLimitSettings::Disabled));
    let e = config::load(&env(&[("APP_RATE_LIMIT__ENABLED", "maybe")])).expect_err("not a boolean");
    problem_at(&e, "rate_limit.enabled");
    // A quoted value is the text between the quotes; a bracketed one a list.
    let s = config::load(&env(&[
        ("APP_RATE_LIMIT__PROVIDER", "redis"),
        ("APP_RATE_LIMIT__SUBJECT_SECRET", SECRET),
        ("APP_RATE_LIMIT__REDIS__ROLE", "\"coordination\""),
        ("APP_RATE_LIMIT__REDIS__TOPOLOGY", "cluster"),
        (
            "APP_RATE_LIMIT__REDIS__NODES",
            r#"["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]"#,
        ),
        ("APP_RATE_LIMIT__REDIS__COMMAND_TIMEOUT", "\"30ms\""),
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    let r = redis_of(s);
    assert_eq!(r.command_timeout, std::time::Duration::from_millis(30));
    match &r.topology {
        adapter_redis::Topology::Cluster { nodes } => assert_eq!(nodes.len(), 2, "{nodes:?}"),
        other => panic!("expected a cluster, got {other:?}"),
    }
    // Overrides apply: provider redis from the environment now needs the redis keys.
    let e = config::load(&env(&[("APP_RATE_LIMIT__PROVIDER", "redis")]))
        .expect_err("redis without role, url, secret");
    problem_at(&e, "rate_limit.redis.role");
    problem_at(&e, "rate_limit.redis.url");
    // A full redis override is valid. (An `APP_` variable that names no key, such as
    // `APP_ENV`, is refused: see `unknown_app_variables_are_errors_naming_the_variable`.)
    let s = config::load(&env(&[
        ("APP_RATE_LIMIT__PROVIDER", "redis"),
        ("APP_RATE_LIMIT__REDIS__ROLE", "coordination"),
        ("APP_RATE_LIMIT__REDIS__URL", "redis://127.0.0.1:6379/0"),
        ("APP_RATE_LIMIT__SUBJECT_SECRET", SECRET),
        ("APP_RATE_LIMIT__REDIS__COMMAND_TIMEOUT", "20ms"),
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    match s.rate_limit {
        RateLimitSettings::Enabled(e) => match &e.provider {
            app_bootstrap::ProviderSettings::Redis(r) => {
                assert_eq!(
                    r.redis.command_timeout,
                    std::time::Duration::from_millis(20)
                );
            }
            other => panic!("expected redis, got {other:?}"),
        },
        RateLimitSettings::Disabled => panic!("enabled in the file"),
    }
}

#[test]
fn unreadable_config_file_is_one_problem() {
    let e = config::load(&Sources {
        file: Some("/nonexistent/app.toml".into()),
        env: Some(Vec::new()),
    })
    .expect_err("missing file");
    assert_eq!(e.0.len(), 1);
    assert_eq!(e.0[0].path, "--config");
}

#[test]
fn check_rendering_redacts_secrets_and_url_passwords() {
    let s = ok(&redis_config(
        &secret_line(),
        "role = \"coordination\"\nurl = \"redis://limiter:s3cr3t-pw@127.0.0.1:6379/0\"",
        GOOD_POLICY,
    ));
    let text = s.render();
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains("s3cr3t-pw"), "{text}");
    assert!(text.contains("<redacted>"), "{text}");
    assert!(
        text.contains("limiter"),
        "the user name is not a secret: {text}"
    );
    // The rendering is itself a valid configuration with the same meaning (minus secrets).
    let reparsed: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(reparsed.contains_key("rate_limit"));
}

#[test]
fn bad_url_is_refused_without_echoing_it() {
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\nurl = \"http://user:pw-in-url@host\"",
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.url");
    assert!(!e.to_string().contains("pw-in-url"), "{e}");
}

#[tokio::test]
async fn disabled_settings_build_nothing() {
    let s = ok(&format!(
        "[rate_limit]\nprovider = \"redis\"\n\n[rate_limit.redis]\n{GOOD_REDIS}\n"
    ));
    let built = app_bootstrap::build(&s.rate_limit)
        .await
        .expect("disabled builds");
    assert!(built.is_none(), "disabled mode must create no port");
}

fn redis_of(s: Settings) -> adapter_redis::RedisSettings {
    match s.rate_limit {
        RateLimitSettings::Enabled(e) => match &e.provider {
            app_bootstrap::ProviderSettings::Redis(r) => r.redis.clone(),
            other => panic!("expected redis, got {other:?}"),
        },
        RateLimitSettings::Disabled => panic!("enabled = true must enable"),
    }
}

#[test]
fn sentinel_and_cluster_topologies_are_read_with_their_keys() {
    let s = ok(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"sentinel\"\nmaster_name = \"mymaster\"\n\
         sentinels = [\"redis://127.0.0.1:26379\", \"redis://127.0.0.1:26380\"]\n\
         min_replicas_ack = 1",
        GOOD_POLICY,
    ));
    let r = redis_of(s);
    assert_eq!(
        r.topology,
        adapter_redis::Topology::Sentinel {
            master_name: "mymaster".into(),
            sentinels: vec![
                "redis://127.0.0.1:26379".into(),
                "redis://127.0.0.1:26380".into()
            ],
        }
    );
    assert_eq!(r.min_replicas_ack, 1);
    // A comma-separated string (as an environment variable gives it) is a list too.
    let s = ok(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"cluster\"\n\
         nodes = \"redis://127.0.0.1:7000, redis://127.0.0.1:7001\"",
        GOOD_POLICY,
    ));
    assert_eq!(
        redis_of(s).topology,
        adapter_redis::Topology::Cluster {
            nodes: vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ],
        }
    );
}

#[test]
fn topology_mistakes_are_named_by_key_path() {
    // A cluster without seeds, with a url of the standalone topology.
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"cluster\"\nurl = \"redis://127.0.0.1:6379/0\"",
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.nodes");
    assert!(problem_at(&e, "rate_limit.redis.url").contains("not used with topology"));
    // A sentinel topology without master name; a bad second sentinel URL by its index,
    // without echoing it.
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"sentinel\"\n\
         sentinels = [\"redis://127.0.0.1:26379\", \"http://u:pw-in-url@x\"]",
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.master_name");
    problem_at(&e, "rate_limit.redis.sentinels[1]");
    assert!(!e.to_string().contains("pw-in-url"), "{e}");
    // Unknown topology, and min_replicas_ack out of range.
    let e = errors(&redis_config(
        &secret_line(),
        &format!("{GOOD_REDIS}\ntopology = \"ring\"\nmin_replicas_ack = 99"),
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.topology");
    problem_at(&e, "rate_limit.redis.min_replicas_ack");
    // Nodes given to a standalone topology.
    let e = errors(&redis_config(
        &secret_line(),
        &format!("{GOOD_REDIS}\nnodes = [\"redis://127.0.0.1:7000\"]"),
        GOOD_POLICY,
    ));
    problem_at(&e, "rate_limit.redis.nodes");
}

#[test]
fn check_rendering_shows_the_topology_with_passwords_redacted() {
    let s = ok(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"cluster\"\n\
         nodes = [\"redis://limiter:n0de-pw@127.0.0.1:7000\"]",
        GOOD_POLICY,
    ));
    let text = s.render();
    assert!(text.contains("topology = \"cluster\""), "{text}");
    assert!(text.contains("127.0.0.1:7000"), "{text}");
    assert!(!text.contains("n0de-pw"), "{text}");
    let reparsed: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(reparsed.contains_key("rate_limit"));
}

#[test]
fn worker_threads_is_read_bounded_and_rendered() {
    let s = ok("[http]\nworker_threads = 1");
    assert_eq!(s.http.worker_threads, Some(1));
    assert!(
        s.render().contains("worker_threads = 1\n"),
        "{}",
        s.render()
    );
    assert_eq!(ok("").http.worker_threads, None);
    for bad in ["0", "1025", "-1", "\"two\""] {
        let e = errors(&format!("[http]\nworker_threads = {bad}"));
        let problem = problem_at(&e, "http.worker_threads");
        assert!(
            problem.contains("1024")
                || problem.contains("whole number")
                || problem.contains(">= 0"),
            "{problem}"
        );
    }
}

#[test]
fn redis_rules_are_the_providers_and_named_by_key_path() {
    // The bounds and URL rules are the provider's own (`RedisSettings::validate`): what the
    // configuration accepts, the provider accepts, and what it refuses is named here.
    for (redis, path, says) in [
        ("command_timeout = \"60s\"", "command_timeout", "59s"),
        ("command_timeout = \"500us\"", "command_timeout", "1ms"),
        ("min_replicas_ack = 17", "min_replicas_ack", "16"),
        ("tls_ca_file = \"ca.crt\"", "tls_ca_file", "rediss://"),
    ] {
        let e = errors(&redis_config(
            &secret_line(),
            &format!("{GOOD_REDIS}\n{redis}"),
            GOOD_POLICY,
        ));
        let p = problem_at(&e, &format!("rate_limit.redis.{path}"));
        assert!(p.contains(says), "{redis}: {p}");
        assert_eq!(e.0.len(), 1, "{redis}: one problem:\n{e}");
    }
    let s = ok(&redis_config(
        &secret_line(),
        &format!("{GOOD_REDIS}\ncommand_timeout = \"59s\""),
        GOOD_POLICY,
    ));
    redis_of(s)
        .validate()
        .expect("what config accepts, the provider accepts");
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"cluster\"\n\
         nodes = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001/3\"]",
        GOOD_POLICY,
    ));
    assert!(problem_at(&e, "rate_limit.redis.nodes[1]").contains("database 0"));
}

#[test]
fn each_redis_key_gets_one_problem() {
    // Not a string: named once by its index, and the others keep their own index.
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"cluster\"\n\
         nodes = [\"redis://127.0.0.1:7000\", 7, \"http://u:pw-in-url@x\"]",
        GOOD_POLICY,
    ));
    assert_eq!(e.0.len(), 2, "{e}");
    assert!(problem_at(&e, "rate_limit.redis.nodes[1]").contains("URL string"));
    problem_at(&e, "rate_limit.redis.nodes[2]");
    assert!(!e.to_string().contains("pw-in-url"), "{e}");
    // A required key that is absent is named as required, not also as empty.
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"sentinel\"",
        GOOD_POLICY,
    ));
    assert_eq!(e.0.len(), 2, "{e}");
    assert!(problem_at(&e, "rate_limit.redis.master_name").starts_with("required"));
    assert!(problem_at(&e, "rate_limit.redis.sentinels").starts_with("required"));
    // A topology that cannot be read: the keys that do not depend on it are still checked.
    let e = errors(&redis_config(
        &secret_line(),
        "role = \"coordination\"\ntopology = \"ring\"\nconnections = 0",
        GOOD_POLICY,
    ));
    assert_eq!(e.0.len(), 2, "{e}");
    problem_at(&e, "rate_limit.redis.topology");
    problem_at(&e, "rate_limit.redis.connections");
    // Disabled, an absent url is not a problem (nothing will connect), a bad one is.
    ok("[rate_limit.redis]\nrole = \"coordination\"\n");
    let e = errors("[rate_limit.redis]\nurl = \"redis://h:99999\"\n");
    problem_at(&e, "rate_limit.redis.url");
}

#[test]
fn unknown_tables_and_keys_are_errors_at_every_depth() {
    // A misspelt top-level table used to be ignored, and with it what it enables.
    for (toml, path) in [
        ("[rate_limt]\nenabled = true\n", "rate_limt"),
        ("[htp]\nbind = \"127.0.0.1:9\"\n", "htp"),
        (
            "[event_gate.x]\nmode = \"only_once\"\nduration = \"1s\"\n",
            "event_gate",
        ),
        ("bind = \"127.0.0.1:9\"\n", "bind"),
    ] {
        let problem = problem_at(&errors(toml), path);
        assert!(problem.starts_with("unknown key"), "{path}: {problem}");
        assert!(
            problem.contains("rate_limit"),
            "known keys listed: {problem}"
        );
    }
    // And inside every section.
    let policy = format!("{GOOD_POLICY}\ncapacityy = 3");
    let redis = format!("{GOOD_REDIS}\nurll = \"x\"");
    let extra = format!(
        "{}\n\n[rate_limit.circuit_breaker]\ncool_dwn = \"1s\"\n\n[rate_limit.local]\nmax_key = 3",
        secret_line()
    );
    let mut toml = redis_config(&extra, &redis, &policy);
    toml.push_str(
        "\n[http]\nbindd = \"127.0.0.1:9\"\n\n[[routes]]\npath_prefix = \"/a\"\nsubject = \"ip\"\npolicyy = \"api\"\n\n[event_gates.x]\nmode = \"only_once\"\nduration = \"1s\"\nmodee = 1\n",
    );
    let e = errors(&toml);
    for path in [
        "rate_limit.policies.api.capacityy",
        "rate_limit.redis.urll",
        "rate_limit.circuit_breaker.cool_dwn",
        "rate_limit.local.max_key",
        "http.bindd",
        "routes[0].policyy",
        "event_gates.x.modee",
    ] {
        assert!(problem_at(&e, path).starts_with("unknown key"), "{e}");
    }
}

#[test]
fn unknown_app_variables_are_errors_naming_the_variable() {
    let load = |vars: &[(&str, &str)]| {
        config::load(&Sources {
            file: None,
            env: Some(
                vars.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
        })
    };
    for (var, path, key_path) in [
        ("APP_RATE_LIMT__ENABLED", "rate_limt", "rate_limt.enabled"),
        ("APP_HTP__BIND", "htp", "htp.bind"),
        ("APP_ENV", "env", "env"),
        (
            "APP_RATE_LIMIT__REDIS__URLL",
            "rate_limit.redis.urll",
            "rate_limit.redis.urll",
        ),
    ] {
        let e = load(&[(var, "true")]).expect_err(var);
        let problem = problem_at(&e, path);
        assert!(
            problem.starts_with("unknown key") && problem.contains(&format!("{var} ({key_path})")),
            "{var}: {problem}"
        );
    }
    // A name with an empty part names no key at all.
    let e = load(&[("APP_RATE_LIMIT____ENABLED", "true")]).expect_err("empty part");
    assert!(
        e.0.iter()
            .any(|p| p.problem.contains("APP_RATE_LIMIT____ENABLED")),
        "{e}"
    );
    // The known ones still load.
    load(&[("APP_RATE_LIMIT__ENABLED", "false")]).unwrap_or_else(|e| panic!("{e}"));
}
