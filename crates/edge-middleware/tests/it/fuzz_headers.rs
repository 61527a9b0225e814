//! Fuzzing the `RateLimit-Policy` / `RateLimit` / `Retry-After` rendering: the middleware
//! over a port that answers arbitrary outcomes (decisions with any numbers, even ones that
//! contradict their policy; failures with any retry hint) for arbitrary policies of every
//! algorithm, at any clock. It never panics, answers 200, 429 or 503, and the fields it
//! sends are well-formed lists whose `r` is the decision's remaining, a 429 exactly when a
//! member denied (several rules are one evaluation: every member is reported), with a 429's
//! `Retry-After` at least 1 and no earlier than any exhausted member's `t`.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use edge_middleware::headers;
use edge_middleware::{Limiter, RateLimitLayer, Rule, SubjectHasher, SubjectSecret, SubjectSource};
use proptest::prelude::*;
use shared_contract::testing::ScriptedPort;
use shared_contract::{
    AlgorithmSpec, Certainty, FailurePolicy, IncompatibleCategory, ManualClock, PolicyId,
    PolicyRevision, PolicySet, PolicySpec, RateLimitDecision, RateLimitOutcome, RateLimitPolicy,
    Source, UnavailableCategory,
};
use tower::{Layer as _, ServiceExt as _};

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

fn ms() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..5_000, 0u64..=(1 << 53), Just(u64::MAX), any::<u64>()]
}

/// Algorithms with parameters from tiny to huge; the invalid ones are filtered out below.
fn algorithm() -> impl Strategy<Value = AlgorithmSpec> {
    let n = || prop_oneof![1u64..10, 1u64..=1_000_000, Just(1 << 40), any::<u64>()];
    let d = || prop_oneof![1u64..10_000, 1u64..=(1 << 40)].prop_map(Duration::from_millis);
    prop_oneof![
        (n(), d()).prop_map(|(limit, window)| AlgorithmSpec::FixedWindow { limit, window }),
        (n(), d()).prop_map(|(limit, window)| AlgorithmSpec::SlidingWindow { limit, window }),
        (n(), d()).prop_map(|(limit, window)| AlgorithmSpec::SlidingLog { limit, window }),
        (n(), n(), d()).prop_map(|(capacity, refill_amount, refill_interval)| {
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval,
            }
        }),
        (n(), d(), n()).prop_map(|(limit, period, burst)| AlgorithmSpec::Gcra {
            limit,
            period,
            burst
        }),
    ]
}

fn policy(i: usize, algorithm: AlgorithmSpec) -> Option<RateLimitPolicy> {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(&format!("p{i}")).ok()?,
        revision: PolicyRevision::new(1).ok()?,
        algorithm,
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .ok()
}

/// An outcome for policy `id`: mostly decisions, with any numbers.
fn outcome(id: PolicyId) -> impl Strategy<Value = RateLimitOutcome> {
    let decision = (any::<bool>(), ms(), ms(), ms(), ms()).prop_map({
        let id = id.clone();
        move |(allowed, limit, remaining, retry_after_ms, reset_at_ms)| {
            RateLimitOutcome::Evaluated(RateLimitDecision {
                allowed,
                limit,
                remaining,
                retry_after_ms,
                reset_at_ms,
                policy_id: id.clone(),
                revision: PolicyRevision::new(1).expect("valid revision"),
                source: Source::GlobalRedis,
                certainty: Certainty::Certain,
                fleet: None,
            })
        }
    });
    let (a, b, c) = (id.clone(), id.clone(), id);
    prop_oneof![
        6 => decision,
        1 => ms().prop_map(move |retry_after_ms| RateLimitOutcome::Unavailable {
            policy_id: a.clone(),
            retry_after_ms,
            category: UnavailableCategory::Connect,
        }),
        1 => ms().prop_map(move |retry_after_ms| RateLimitOutcome::Indeterminate {
            policy_id: b.clone(),
            retry_after_ms,
        }),
        1 => Just(RateLimitOutcome::Incompatible {
            policy_id: c,
            category: IncompatibleCategory::Reply,
        }),
    ]
}

/// Policies (one to three), one outcome each, the clock and the failure policy.
fn case() -> impl Strategy<Value = (Vec<RateLimitPolicy>, Vec<RateLimitOutcome>, u64, bool)> {
    prop::collection::vec(algorithm(), 1..4)
        .prop_filter_map("a valid policy", |algorithms| {
            algorithms
                .into_iter()
                .enumerate()
                .map(|(i, a)| policy(i, a))
                .collect()
        })
        .prop_flat_map(|policies: Vec<RateLimitPolicy>| {
            let outcomes: Vec<_> = policies.iter().map(|p| outcome(p.id().clone())).collect();
            (Just(policies), outcomes, ms(), any::<bool>())
        })
}

/// The members of a structured-field List built of `"id";k=v;...` members.
fn members(field: &str) -> Vec<(String, Vec<(String, u64)>)> {
    field
        .split(", ")
        .map(|m| {
            let mut parts = m.split(';');
            let id = parts.next().unwrap_or_default();
            assert!(
                id.len() > 2 && id.starts_with('"') && id.ends_with('"'),
                "{field}"
            );
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or_else(|| panic!("{field}"));
                    (
                        k.to_owned(),
                        v.parse().unwrap_or_else(|_| panic!("{field}")),
                    )
                })
                .collect();
            (id.trim_matches('"').to_owned(), params)
        })
        .collect()
}

fn header<'a>(r: &'a axum::response::Response, name: &str) -> Option<&'a str> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("visible ASCII"))
}

fn run(
    policies: &[RateLimitPolicy],
    outcomes: Vec<RateLimitOutcome>,
    now_ms: u64,
    fail_open: bool,
) -> Result<(), TestCaseError> {
    let set = PolicySet::new(policies.iter().cloned(), policies[0].id().clone()).expect("a set");
    let port = ScriptedPort::in_order(set, outcomes.clone());
    let failure = if fail_open {
        FailurePolicy::FailOpen
    } else {
        FailurePolicy::FailClosed
    };
    let limiter = Limiter::new(
        Arc::new(port),
        SubjectHasher::new(&SubjectSecret::random()),
        failure,
        Duration::from_secs(1),
    );
    let rules = policies
        .iter()
        .map(|p| {
            Rule::new(
                "/api",
                p.id().clone(),
                SubjectSource::Header("x-key".into()),
            )
        })
        .collect();
    let service = RateLimitLayer::new(Arc::new(limiter), rules)
        .with_clock(Arc::new(ManualClock::new(now_ms)))
        .layer(axum::Router::new().route("/api", axum::routing::get(|| async { "up" })));
    let request = Request::get("/api")
        .header("x-key", "k")
        .body(Body::empty())
        .expect("a request");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let r = runtime
        .block_on(service.oneshot(request))
        .expect("infallible");

    let status = r.status();
    prop_assert!(
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE
        ]
        .contains(&status),
        "{status}"
    );
    let retry_after = header(&r, "retry-after").map(|v| v.parse::<u64>().expect("whole seconds"));
    let Some(limit) = header(&r, headers::RATELIMIT) else {
        prop_assert!(header(&r, headers::RATELIMIT_POLICY).is_none());
        return Ok(());
    };
    let policy_field = header(&r, headers::RATELIMIT_POLICY).expect("sent with RateLimit");
    let limit_members = members(limit);
    let policy_members = members(policy_field);
    prop_assert_eq!(
        limit_members.len(),
        policy_members.len(),
        "{} / {}",
        limit,
        policy_field
    );
    let mut denied = false;
    for ((id, params), (pid, pparams)) in limit_members.iter().zip(&policy_members) {
        prop_assert_eq!(id, pid);
        let decision = outcomes.iter().find_map(|o| match o {
            RateLimitOutcome::Evaluated(d) if d.policy_id.as_str() == id => Some(d),
            _ => None,
        });
        let Some(d) = decision else {
            return Err(TestCaseError::fail(format!(
                "member {id} without a decision: {limit}"
            )));
        };
        prop_assert_eq!(id.as_str(), d.policy_id.as_str());
        prop_assert_eq!(&params[0], &("r".to_owned(), d.remaining), "{}", limit);
        prop_assert!(
            params.len() <= 2 && params.get(1).is_none_or(|(k, _)| k == "t"),
            "{}",
            limit
        );
        prop_assert!(
            pparams.len() == 2 && pparams[0].0 == "q" && pparams[1].0 == "w",
            "{}",
            policy_field
        );
        denied |= !d.allowed;
        if status == StatusCode::TOO_MANY_REQUESTS
            && d.remaining == 0
            && let Some((_, t)) = params.get(1)
        {
            prop_assert!(
                retry_after.is_some_and(|ra| ra >= *t),
                "{limit} / {retry_after:?}"
            );
        }
    }
    prop_assert_eq!(denied, status == StatusCode::TOO_MANY_REQUESTS);
    if denied {
        prop_assert!(retry_after.is_some_and(|ra| ra >= 1), "{:?}", retry_after);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn arbitrary_decisions_render_well_formed_fields((policies, outcomes, now_ms, fail_open) in case()) {
        run(&policies, outcomes, now_ms, fail_open)?;
    }

    #[test]
    fn the_field_functions_never_panic(algorithm in algorithm(), o in outcome(PolicyId::new("p0").expect("id")), now_ms in ms()) {
        let Some(p) = policy(0, algorithm) else { return Ok(()) };
        if let RateLimitOutcome::Evaluated(d) = o {
            let t = headers::effective_window(&p, &d, now_ms);
            prop_assert!(headers::retry_after_secs(&d) >= 1);
            let mut out = Vec::new();
            headers::push_limit(&mut out, &p, d.remaining, t);
            prop_assert!(!headers::bytes_value(out).is_empty());
        }
        let mut policy_field = String::new();
        headers::push_policy(&mut policy_field, &p);
        prop_assert!(!headers::value(policy_field).is_empty());
    }
}
