//! `[rate_limit.policies.<id>]`: one table per policy, its algorithm's parameters and the
//! common fields, checked by [`RateLimitPolicy::new`] whose field names complete the key
//! path (`rate_limit.policies.api.capacity`).
//!
//! Read here: the table's keys, their types, and which parameters the named algorithm takes
//! (a parameter of another algorithm is a mistake worth naming). Every bound is the
//! contract's.

use figment::value::{Dict, Value};
use shared_contract::policy::calendar::CalendarUnit;
// Defaults of the optional common fields: the contract's, so code and files agree.
use shared_contract::policy::{
    DEFAULT_CLEANUP_GRACE, DEFAULT_MAX_CLOCK_REGRESSION, DEFAULT_MAX_COST, DEFAULT_REVISION,
};
use shared_contract::{
    Algorithm, AlgorithmKind, AlgorithmSpec, FailurePolicy, MIN_COUNT, PolicyId, PolicyRevision,
    PolicySet, PolicySpec, RateLimitPolicy,
};

use super::reader::{Check, Toml, join};
use crate::features::Feature;

const P: &str = "rate_limit.policies";

const COMMON_KEYS: &[&str] = &[
    "revision",
    "algorithm",
    "max_cost",
    "cleanup_grace",
    "max_clock_regression",
    "failure_policy",
    "shadow",
    "deny_cache",
];
const ALGORITHM_KEYS: &[&str] = &[
    "limit",
    "window",
    "capacity",
    "refill_amount",
    "refill_interval",
    "period",
    "burst",
    "lease_ttl",
    "time_zone",
];

/// The parameters of each algorithm, in the order they are documented.
fn parameters(kind: AlgorithmKind) -> &'static [&'static str] {
    match kind {
        AlgorithmKind::TokenBucket => &["capacity", "refill_amount", "refill_interval"],
        AlgorithmKind::Gcra => &["limit", "period", "burst"],
        AlgorithmKind::Concurrency => &["limit", "lease_ttl"],
        AlgorithmKind::FixedWindow => &["limit", "window", "time_zone"],
        _ => &["limit", "window"],
    }
}

/// A policy id (`rate_limit.default_policy`, `routes[i].policy`).
pub(super) fn read_id(c: &mut Check, path: &str, v: &Value) -> Option<PolicyId> {
    c.parsed(path, Some(v), PolicyId::new)
}

/// A reference to a policy at `path` (`routes[0].policy`), which must be among `defined`.
pub(super) fn read_ref(
    c: &mut Check,
    path: &str,
    v: &Value,
    defined: &[PolicyId],
) -> Option<PolicyId> {
    let id = read_id(c, path, v)?;
    if defined.contains(&id) {
        Some(id)
    } else {
        c.push(path, undefined(&id, defined));
        None
    }
}

/// The problem of a reference to a policy that is not among `defined`.
pub(super) fn undefined(id: &PolicyId, defined: &[PolicyId]) -> String {
    let defined = if defined.is_empty() {
        "none".to_owned()
    } else {
        defined
            .iter()
            .map(PolicyId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{:?} is not defined under rate_limit.policies (defined: {defined})",
        id.as_str()
    )
}

/// The valid policies, and the ids of every policy table (valid or not), so that references
/// to a policy with problems are not reported as undefined too.
pub(super) fn read(
    c: &mut Check,
    v: Option<&Value>,
    failure_policy: FailurePolicy,
) -> (Vec<RateLimitPolicy>, Vec<PolicyId>) {
    let mut out = Vec::new();
    let mut declared = Vec::new();
    let Some(d) = c.table(P, v) else {
        return (out, declared);
    };
    for (name, value) in d {
        let path = join(P, name);
        let id = match PolicyId::new(name) {
            Ok(id) => {
                declared.push(id.clone());
                Some(id)
            }
            Err(e) => {
                c.push(&path, e.to_string());
                None
            }
        };
        let Some(p) = c.table(&path, Some(value)) else {
            continue;
        };
        if let Some(policy) = read_policy(c, &path, id, p, failure_policy) {
            out.push(policy);
        }
    }
    (out, declared)
}

fn read_policy(
    c: &mut Check,
    path: &str,
    id: Option<PolicyId>,
    d: &Dict,
    failure_policy: FailurePolicy,
) -> Option<RateLimitPolicy> {
    let before = c.count();
    c.unknown_keys(path, d, COMMON_KEYS.iter().chain(ALGORITHM_KEYS).copied());
    let at = |key: &str| join(path, key);
    let revision = read_revision(c, &at("revision"), d.get("revision"));
    let kind = read_kind(c, &at("algorithm"), d.get("algorithm"));
    let max_cost = c.whole_at_least(&at("max_cost"), d.get("max_cost"), MIN_COUNT);
    let grace = c.duration(&at("cleanup_grace"), d.get("cleanup_grace"));
    let regression = c.duration(&at("max_clock_regression"), d.get("max_clock_regression"));
    // The policy's own failure policy overrides `rate_limit.failure_policy`.
    let own_failure_policy = c.choice(
        &at("failure_policy"),
        d.get("failure_policy"),
        FailurePolicy::parse,
        "a failure policy",
        "\"fail_closed\", \"fail_open\" or \"fallback_local\"",
    );
    if let Some(f) = own_failure_policy {
        check_failure_policy(c, &at("failure_policy"), f);
    }
    let shadow = c.bool(&at("shadow"), d.get("shadow")).unwrap_or(false);
    // On unless turned off: exact for every rate algorithm (docs/operations.md).
    let deny_cache = c
        .bool(&at("deny_cache"), d.get("deny_cache"))
        .unwrap_or(true);
    let algorithm = kind.and_then(|kind| read_algorithm(c, path, d, kind));
    // The contract's checks run whenever the parameters could be read, even next to other
    // problems of this policy, so that they are reported in the same pass.
    let spec = PolicySpec {
        // An invalid table name is reported already; a stand-in id still lets the
        // parameters be checked.
        id: match id {
            Some(id) => id,
            None => PolicyId::new("invalid").ok()?,
        },
        revision: revision?,
        algorithm: algorithm?,
        max_cost: max_cost.unwrap_or(DEFAULT_MAX_COST),
        cleanup_grace: grace.unwrap_or(DEFAULT_CLEANUP_GRACE),
        max_clock_regression: regression.unwrap_or(DEFAULT_MAX_CLOCK_REGRESSION),
        failure_policy: own_failure_policy.unwrap_or(failure_policy),
    };
    let policy = c
        .owned(path, RateLimitPolicy::new(spec))
        .map(|p| p.with_shadow(shadow).with_deny_cache(deny_cache));
    policy.filter(|_| c.count() == before)
}

/// A failure policy this build can apply: `fallback_local` needs the `local` feature.
pub(super) fn check_failure_policy(c: &mut Check, path: &str, f: FailurePolicy) {
    if f == FailurePolicy::FallbackLocal {
        c.needs(path, "\"fallback_local\"", Feature::Local);
    }
}

/// `revision`: 1 when absent, and when unreadable (reported) so that the other fields are
/// still checked. Its bounds are worded as the contract words a policy's other counts.
fn read_revision(c: &mut Check, path: &str, v: Option<&Value>) -> Option<PolicyRevision> {
    let Some(r) = c.whole_at_least::<u64>(path, v, MIN_COUNT) else {
        return PolicyRevision::new(DEFAULT_REVISION).ok();
    };
    match u32::try_from(r) {
        Ok(r) => {
            let revision = PolicyRevision::new(r).ok();
            if revision.is_none() {
                c.push(path, format!("must be >= {MIN_COUNT}, got {r}"));
            }
            revision
        }
        Err(_) => {
            c.push(path, format!("must be <= {}, got {r}", u32::MAX));
            None
        }
    }
}

fn read_kind(c: &mut Check, path: &str, v: Option<&Value>) -> Option<AlgorithmKind> {
    let names = "fixed_window, sliding_window, token_bucket, gcra, sliding_log, concurrency";
    let v = c.required(path, v, &format!("required; one of {names}"))?;
    let choices = "fixed_window, sliding_window, token_bucket, gcra, sliding_log or concurrency";
    c.choice(path, Some(v), AlgorithmKind::parse, "an algorithm", choices)
}

/// The named algorithm's parameters: each required, and no parameter of another algorithm.
fn read_algorithm(
    c: &mut Check,
    path: &str,
    d: &Dict,
    kind: AlgorithmKind,
) -> Option<AlgorithmSpec> {
    let params = parameters(kind);
    for key in ALGORITHM_KEYS {
        if d.contains_key(*key) && !params.contains(key) {
            c.push(
                join(path, key),
                format!(
                    "is not a parameter of algorithm {kind} (its parameters: {})",
                    params.join(", ")
                ),
            );
        }
    }
    let required = format!("required by algorithm {kind}");
    let num = |c: &mut Check, key: &str| {
        let p = join(path, key);
        let v = c.required(&p, d.get(key), &required)?;
        c.whole_at_least::<u64>(&p, Some(v), MIN_COUNT)
    };
    let dur = |c: &mut Check, key: &str| {
        let p = join(path, key);
        let v = c.required(&p, d.get(key), &required)?;
        c.duration(&p, Some(v))
    };
    match kind {
        AlgorithmKind::TokenBucket => {
            let capacity = num(c, "capacity");
            let refill_amount = num(c, "refill_amount");
            let refill_interval = dur(c, "refill_interval");
            Some(AlgorithmSpec::TokenBucket {
                capacity: capacity?,
                refill_amount: refill_amount?,
                refill_interval: refill_interval?,
            })
        }
        AlgorithmKind::Gcra => {
            let limit = num(c, "limit");
            let period = dur(c, "period");
            let burst = num(c, "burst");
            Some(AlgorithmSpec::Gcra {
                limit: limit?,
                period: period?,
                burst: burst?,
            })
        }
        AlgorithmKind::Concurrency => {
            let limit = num(c, "limit");
            let lease_ttl = dur(c, "lease_ttl");
            Some(AlgorithmSpec::Concurrency {
                limit: limit?,
                lease_ttl: lease_ttl?,
            })
        }
        AlgorithmKind::FixedWindow => {
            let limit = num(c, "limit");
            fixed_window(c, path, d, limit)
        }
        AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog => {
            let limit = num(c, "limit")?;
            let window = dur(c, "window")?;
            Some(match kind {
                AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow { limit, window },
                _ => AlgorithmSpec::SlidingLog { limit, window },
            })
        }
        // `AlgorithmKind` is non-exhaustive: an algorithm this crate does not know how to
        // configure is refused rather than guessed.
        #[allow(unreachable_patterns)]
        _ => {
            c.push(
                join(path, "algorithm"),
                format!("{kind} cannot be configured by this build"),
            );
            None
        }
    }
}

/// A fixed window's `window`: a duration, or a calendar period (`"calendar:day"`) in
/// `time_zone` (default `UTC`), which applies to calendar periods only.
fn fixed_window(c: &mut Check, path: &str, d: &Dict, limit: Option<u64>) -> Option<AlgorithmSpec> {
    let at = |key: &str| join(path, key);
    let window = d.get("window");
    let calendar = match window {
        Some(Value::String(_, s)) => s.strip_prefix("calendar:"),
        _ => None,
    };
    let Some(unit) = calendar else {
        if d.contains_key("time_zone") {
            c.push(
                at("time_zone"),
                "applies to calendar windows only (window = \"calendar:day\", ...)".to_owned(),
            );
        }
        let required = "required by algorithm fixed_window";
        let v = c.required(&at("window"), window, required)?;
        let window = c.duration(&at("window"), Some(v))?;
        return Some(AlgorithmSpec::FixedWindow {
            limit: limit?,
            window,
        });
    };
    let unit = match CalendarUnit::parse(unit) {
        Some(u) => Some(u),
        None => {
            let shown: String = unit.chars().take(32).collect();
            c.push(
                at("window"),
                format!("calendar:{shown} is not a calendar period (calendar:hour, calendar:day, calendar:week or calendar:month)"),
            );
            None
        }
    };
    let time_zone = match d.get("time_zone") {
        None => Some("UTC".to_owned()),
        Some(Value::String(_, s)) => Some(s.clone()),
        Some(_) => {
            c.push(
                at("time_zone"),
                "must be a string: UTC or an IANA time zone name".to_owned(),
            );
            None
        }
    };
    Some(AlgorithmSpec::CalendarWindow {
        limit: limit?,
        unit: unit?,
        time_zone: time_zone?,
    })
}

/// One table per policy, every field shown with its effective value.
pub(super) fn render(o: &mut Toml, policies: &PolicySet) {
    for p in policies.iter() {
        o.table(format_args!("{P}.{}", p.id()));
        o.raw("revision", p.revision());
        o.str("algorithm", p.kind().as_str());
        match p.algorithm() {
            Algorithm::TokenBucket(t) => {
                o.raw("capacity", t.capacity());
                o.raw("refill_amount", t.refill_amount());
                o.ms("refill_interval", t.refill_interval_ms());
            }
            Algorithm::Gcra(g) => {
                o.raw("limit", g.limit());
                o.ms("period", g.period_ms());
                o.raw("burst", g.burst());
            }
            Algorithm::FixedWindow(w) => match w.calendar() {
                Some(cal) => {
                    o.raw("limit", w.limit());
                    o.str("window", &format!("calendar:{}", cal.unit()));
                    o.str("time_zone", cal.time_zone());
                }
                None => window(o, w.limit(), w.window_ms()),
            },
            Algorithm::SlidingWindow(w) => window(o, w.limit(), w.window_ms()),
            Algorithm::SlidingLog(w) => window(o, w.limit(), w.window_ms()),
            Algorithm::Concurrency(l) => {
                o.raw("limit", l.limit());
                o.ms("lease_ttl", l.lease_ttl_ms());
            }
        }
        o.raw("max_cost", p.max_cost().get());
        o.ms("cleanup_grace", p.cleanup_grace_ms());
        o.ms("max_clock_regression", p.max_clock_regression_ms());
        o.str("failure_policy", p.failure_policy().as_str());
        o.raw("shadow", p.shadow());
        o.raw("deny_cache", p.deny_cache());
    }
}

fn window(o: &mut Toml, limit: u64, window_ms: u64) {
    o.raw("limit", limit);
    o.ms("window", window_ms);
}

// An enabled section needs a provider; the local one is the one without a server.
#[cfg(all(test, feature = "local"))]
mod failure_policy_tests {
    use shared_contract::{FailurePolicy, PolicyId};

    use crate::config::from_toml;
    use crate::settings::RateLimitSettings;

    const FILE: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "a"
failure_policy = "fail_closed"
[rate_limit.policies.a]
algorithm = "fixed_window"
limit = 5
window = "1s"
[rate_limit.policies.b]
algorithm = "fixed_window"
limit = 5
window = "1s"
failure_policy = "fail_open"
"#;

    #[test]
    fn a_policy_may_set_its_own_failure_policy() {
        let s = from_toml(FILE).expect("valid");
        let RateLimitSettings::Enabled(e) = &s.rate_limit else {
            panic!("enabled");
        };
        let of = |id: &str| {
            e.policies
                .get(&PolicyId::new(id).expect("id"))
                .expect("defined")
                .failure_policy()
        };
        assert_eq!(of("a"), FailurePolicy::FailClosed, "inherited");
        assert_eq!(of("b"), FailurePolicy::FailOpen, "its own");
        assert!(s.render().contains("failure_policy = \"fail_open\""));
        let bad = FILE.replace("\"fail_open\"\n", "\"fail_sometimes\"\n");
        assert!(
            e.policies.iter().all(|p| !p.shadow()),
            "enforcing unless set"
        );
        let e = from_toml(&bad).expect_err("bad value");
        assert!(e.names("rate_limit.policies.b.failure_policy"), "{e}");
    }
}

#[cfg(all(test, feature = "local"))]
mod concurrency_tests {
    use shared_contract::{Algorithm, PolicyId};

    use crate::config::from_toml;
    use crate::settings::RateLimitSettings;

    const FILE: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "a"
[rate_limit.policies.a]
algorithm = "fixed_window"
limit = 5
window = "1s"
[rate_limit.policies.jobs]
algorithm = "concurrency"
limit = 10
lease_ttl = "30s"
"#;

    #[test]
    fn a_concurrency_policy_reads_limit_and_lease_ttl_and_renders_them() {
        let s = from_toml(FILE).expect("valid");
        let RateLimitSettings::Enabled(e) = &s.rate_limit else {
            panic!("enabled");
        };
        let jobs = e
            .policies
            .get(&PolicyId::new("jobs").expect("id"))
            .expect("jobs");
        let Algorithm::Concurrency(p) = jobs.algorithm() else {
            panic!("concurrency")
        };
        assert_eq!((p.limit(), p.lease_ttl_ms()), (10, 30_000));
        let rendered = s.render();
        assert!(
            rendered.contains("algorithm = \"concurrency\""),
            "{rendered}"
        );
        assert!(rendered.contains("lease_ttl = \"30s\""), "{rendered}");
    }

    #[test]
    fn refused_concurrency_combinations_name_their_key() {
        let cases = [
            (
                "lease_ttl = \"30s\"",
                "lease_ttl = \"30s\"\nwindow = \"1s\"",
                "jobs.window",
            ),
            (
                "lease_ttl = \"30s\"",
                "lease_ttl = \"30s\"\nmax_cost = 2",
                "jobs.max_cost",
            ),
            ("lease_ttl = \"30s\"", "", "jobs.lease_ttl"),
            (
                "lease_ttl = \"30s\"",
                "lease_ttl = \"2d\"",
                "jobs.lease_ttl",
            ),
            ("limit = 10\n", "limit = 0\n", "jobs.limit"),
        ];
        for (from, to, key) in cases {
            let file = FILE.replacen(from, to, 1);
            let e = from_toml(&file).expect_err(key);
            assert!(e.names(&format!("rate_limit.policies.{key}")), "{key}: {e}");
        }
    }

    #[test]
    fn a_concurrency_route_takes_no_cost_header_or_shadow_and_no_descriptor_names_one() {
        let route = "[[routes]]\npath_prefix = \"/jobs\"\npolicy = \"jobs\"\nsubject = \"ip\"\n";
        assert!(from_toml(&format!("{FILE}{route}")).is_ok());
        let cases = [
            (format!("{route}cost = \"header:x-cost\"\n"), "routes[0].cost"),
            (format!("{route}shadow = true\n"), "routes[0].shadow"),
            (
                "[[rls.descriptors]]\ndomain = \"edge\"\nentries = [\"remote_address\"]\npolicy = \"jobs\"\n"
                    .to_owned(),
                "rls.descriptors[0].policy",
            ),
        ];
        for (extra, key) in cases {
            let e = from_toml(&format!("{FILE}{extra}")).expect_err(key);
            assert!(e.names(key), "{key}: {e}");
        }
    }
}

#[cfg(all(test, feature = "local"))]
mod shadow_tests {
    use shared_contract::{PolicyId, RateLimitPolicy};

    use crate::config::from_toml;
    use crate::settings::RateLimitSettings;

    /// A policy with only its required keys is the contract's builder with its defaults: the
    /// file and code share one set of defaults.
    #[test]
    fn the_defaults_of_a_file_are_the_builders() {
        let file = "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"a\"\n\
             [rate_limit.policies.a]\nalgorithm = \"token_bucket\"\ncapacity = 5\n\
             refill_amount = 5\nrefill_interval = \"10s\"\n";
        let s = from_toml(file).expect("valid");
        let RateLimitSettings::Enabled(e) = &s.rate_limit else {
            panic!("enabled");
        };
        let built = RateLimitPolicy::token_bucket("a", 5)
            .per(std::time::Duration::from_secs(10))
            .build()
            .expect("valid");
        assert_eq!(e.policies.get(built.id()), Some(&built));
    }

    /// `shadow` (off unless set) and `deny_cache` (on unless turned off): read as booleans,
    /// shown by `--check`.
    #[test]
    fn a_policy_may_be_put_in_shadow_mode_or_stop_caching_its_denials() {
        type Flag = fn(&RateLimitPolicy) -> bool;
        let flags: [(&str, Flag, bool); 2] = [
            ("shadow", RateLimitPolicy::shadow, false),
            ("deny_cache", RateLimitPolicy::deny_cache, true),
        ];
        for (flag, get, default) in flags {
            let set = format!("{flag} = {}", !default);
            let file = format!(
                "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"a\"\n\
                 [rate_limit.policies.a]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n{set}\n\
                 [rate_limit.policies.b]\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\nburst = 5\n"
            );
            let s = from_toml(&file).expect("valid");
            let RateLimitSettings::Enabled(e) = &s.rate_limit else {
                panic!("enabled");
            };
            let policy = |id: &str| {
                e.policies
                    .get(&PolicyId::new(id).expect("id"))
                    .expect("a policy")
            };
            assert_eq!(
                (get(policy("a")), get(policy("b"))),
                (!default, default),
                "{flag}"
            );
            let shown = s.render();
            assert!(shown.contains(&format!("{flag} = true")), "{shown}");
            assert!(shown.contains(&format!("{flag} = false")), "{shown}");
            let e = from_toml(&file.replace(&set, &format!("{flag} = \"yes\"")))
                .expect_err("not a boolean");
            assert!(e.names(&format!("rate_limit.policies.a.{flag}")), "{e}");
        }
    }
}

#[cfg(all(test, feature = "local"))]
#[path = "policies_calendar_tests.rs"]
mod calendar_tests;
