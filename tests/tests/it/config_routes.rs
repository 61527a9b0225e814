//! `[[routes]]` rules: every condition, subject part and cost is read and rendered back, every
//! bad one is named by its key path (list items by index), and a set of routes of which more
//! than one evaluation's limits can match one request is refused.

use app_bootstrap::config::{self, ConfigErrors};
use app_bootstrap::{CostSource, HeaderCondition, RouteSettings, Settings, SubjectSource};
use shared_contract::MAX_LIMITS;

const POLICIES: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 100
window = "1m"
max_cost = 5

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 10
window = "1m"
"#;

fn with_routes(routes: &str) -> String {
    format!("{POLICIES}\n{routes}")
}

fn ok(toml: &str) -> Settings {
    config::from_toml(toml).unwrap_or_else(|e| panic!("expected a valid configuration:\n{e}"))
}

fn errors(toml: &str) -> ConfigErrors {
    match config::from_toml(toml) {
        Ok(s) => panic!("expected configuration errors, got {:?}", s.routes),
        Err(e) => e,
    }
}

fn problem_at(e: &ConfigErrors, path: &str) -> String {
    e.0.iter()
        .find(|p| p.path == path)
        .map(|p| p.problem.clone())
        .unwrap_or_else(|| panic!("no problem named {path}; got:\n{e}"))
}

const RULES: &str = r#"
[[routes]]
path_prefix = "/api"
subject = "header:x-api-key"

[[routes]]
method = ["get", "POST"]
path_prefix = "/v1/tenants"
host = "API.example.com"
header = ["x-tenant", "x-tier=gold"]
policy = "tenant"
subject = ["header:x-tenant", "ip", "path:2", "const:global"]

[[routes]]
method = "DELETE"
subject = "ip"
cost = 3

[[routes]]
header = "x-batch"
subject = "const:batch"
cost = "header:X-Cost"
"#;

#[test]
fn route_rules_read_every_condition_subject_list_and_cost() {
    let s = ok(&with_routes(RULES));
    let r = &s.routes;
    assert_eq!(r.len(), 4);
    assert_eq!(r[0].subject, [SubjectSource::Header("x-api-key".into())]);
    assert_eq!(r[0].cost.to_string(), "1");
    assert!(r[0].methods.is_empty() && r[0].host.is_none() && r[0].header.is_empty());
    assert_eq!(r[1].methods, ["GET", "POST"]);
    assert_eq!(r[1].host.as_deref(), Some("api.example.com"));
    assert_eq!(
        r[1].header,
        [
            HeaderCondition::Present("x-tenant".into()),
            HeaderCondition::Equals("x-tier".into(), "gold".into())
        ]
    );
    assert_eq!(
        r[1].subject,
        [
            SubjectSource::Header("x-tenant".into()),
            SubjectSource::Ip,
            SubjectSource::PathSegment(2),
            SubjectSource::Const("global".into()),
        ]
    );
    assert_eq!(r[2].path_prefix, "/", "a method alone needs no prefix");
    assert_eq!(r[2].cost.to_string(), "3");
    assert_eq!(r[3].cost, CostSource::Header("x-cost".into()));
    // `--check` renders a configuration with the same routes.
    let text = s.render();
    let again = ok(&text);
    assert_eq!(again.routes, s.routes, "{text}");
}

#[test]
fn bad_route_rules_are_named_by_key_path() {
    let e = errors(&with_routes(
        r#"
[[routes]]
method = ["GET", "G T"]
host = "api.example.com:8080"
header = "x tenant"
subject = ["ip", "cookie:x"]

[[routes]]
path_prefix = "/api"
policy = "tenant"
subject = []
cost = 2

[[routes]]
path_prefix = "/api"
subject = "ip"
cost = 0

[[routes]]
path_prefix = "/api"
subject = ["ip", "ip", "ip", "ip", "ip", "ip", "ip", "ip", "ip"]
cost = "cookie:x-cost"

[[routes]]
subject = "ip"

[[routes]]
path_prefix = "/api"
subject = "ip"
header = ["x-a=\u0007"]
cost = 6
"#,
    ));
    let expect = [
        ("routes[0].method[1]", "\"G T\""),
        ("routes[0].host", "no port"),
        ("routes[0].header", "\"x tenant\""),
        ("routes[0].subject[1]", "\"cookie:x\""),
        ("routes[1].subject", "empty"),
        ("routes[1].cost", "max_cost 1 of policy tenant"),
        ("routes[2].cost", "must be >= 1"),
        ("routes[3].subject", "at most 8 parts"),
        ("routes[3].cost", "\"cookie:x-cost\""),
        ("routes[4].path_prefix", "required"),
        ("routes[5].header[0]", "header value"),
        ("routes[5].cost", "max_cost 5 of policy api"),
    ];
    for (path, says) in expect {
        let p = problem_at(&e, path);
        assert!(p.contains(says), "{path}: {p}");
    }
    assert_eq!(e.0.len(), expect.len(), "{e}");
}

fn routes_on(n: usize, conditions: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|i| format!("[[routes]]\n{}\nsubject = \"ip\"\n", conditions(i)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn routes_of_which_one_request_could_match_too_many_are_refused() {
    let nested = routes_on(MAX_LIMITS + 1, |i| {
        format!("path_prefix = \"/api{}\"", "/x".repeat(i))
    });
    let e = errors(&with_routes(&nested));
    let p = problem_at(&e, "routes");
    assert!(p.contains("9 routes can match one request"), "{p}");
    assert!(p.contains("routes[0]") && p.contains("routes[8]"), "{p}");

    // As many routes, no request matching more than 8 of them: by method, by host, by header
    // value, by disjoint paths.
    let split = routes_on(MAX_LIMITS + 4, |i| match i % 4 {
        0 => format!("path_prefix = \"/api\"\nmethod = \"GET\"\nheader = \"x-{i}\""),
        1 => format!("path_prefix = \"/api\"\nmethod = \"POST\"\nheader = \"x-{i}\""),
        2 => format!("host = \"h{i}.example\""),
        _ => format!("path_prefix = \"/api\"\nheader = \"x-tier=t{i}\""),
    });
    let s = ok(&with_routes(&split));
    assert_eq!(s.routes.len(), MAX_LIMITS + 4);
    let exactly = routes_on(MAX_LIMITS, |_| "path_prefix = \"/api\"".to_owned());
    assert_eq!(ok(&with_routes(&exactly)).routes.len(), MAX_LIMITS);
}

#[test]
fn a_route_is_the_middleware_rule_it_describes() {
    let s = ok(&with_routes(RULES));
    let default = shared_contract::PolicyId::new("api").expect("valid");
    let rules: Vec<_> = s
        .routes
        .iter()
        .map(|r: &RouteSettings| r.rule(&default))
        .collect();
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut b = http::Request::get(path).header("host", "api.example.com:443");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("a request")
    };
    assert!(rules[0].matches(&get("/api/x", &[])));
    assert!(!rules[1].matches(&get("/v1/tenants/t-9", &[("x-tenant", "t")])));
    assert!(rules[1].matches(&get(
        "/v1/tenants/t-9",
        &[("x-tenant", "t"), ("x-tier", "gold")]
    )));
    assert_eq!(rules[1].policy().as_str(), "tenant");
    assert_eq!(rules[0].policy().as_str(), "api");
    assert!(!rules[2].matches(&get("/anything", &[])));
    assert!(rules[3].matches(&get("/anything", &[("x-batch", "1")])));
}
