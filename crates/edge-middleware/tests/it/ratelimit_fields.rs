//! The `RateLimit` field's `r` and `t` and the `Retry-After` of a 429 against what the policy
//! really does next, for each of the five algorithms: the middleware over the local provider,
//! both reading one manual clock, and every claim checked by probing a replay of the same
//! history at the moment the headers point to.
//!
//! The claims, as draft-ietf-httpapi-ratelimit-headers-11 words them:
//! - `r` is the available quota: exactly `r` more requests are admitted now;
//! - `t` is the effective window, the seconds within which the client can use no more than
//!   `r`: the quota grows beyond `r` within `t` seconds and not before `t - 1` (whole seconds,
//!   rounded up); a member without `t` claims nothing;
//! - a 429 has `r = 0`, and its `Retry-After` does not point earlier than the end of the
//!   effective window: the request is admitted after `Retry-After` seconds, not a second
//!   before.

use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use edge_middleware::{
    Limiter, RateLimit, RateLimitLayer, Rule, SubjectHasher, SubjectSecret, SubjectSource,
};
use shared_contract::{
    AlgorithmSpec, Clock, FailurePolicy, ManualClock, PolicyId, PolicyRevision, PolicySet,
    PolicySpec, RateLimitPolicy,
};
use tower::{Layer as _, ServiceExt as _};

/// A start aligned to every window below, so that fixed windows begin at offset 0.
const T0: u64 = 1_700_000_000_000;

/// Request times, ms after [`T0`]: bursts, partial refills, window edges, rounding edges.
const STEPS: [u64; 16] = [
    0, 0, 0, 0, 400, 1_300, 2_250, 2_900, 4_100, 6_000, 6_001, 9_500, 9_999, 10_400, 12_000, 14_700,
];

fn policy(algorithm: AlgorithmSpec) -> RateLimitPolicy {
    named("p", algorithm)
}

fn named(id: &str, algorithm: AlgorithmSpec) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm,
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy")
}

/// The five algorithms, each admitting 3 at once.
fn algorithms() -> Vec<(&'static str, RateLimitPolicy)> {
    let secs = Duration::from_secs;
    vec![
        (
            "fixed_window",
            policy(AlgorithmSpec::FixedWindow {
                limit: 3,
                window: secs(10),
            }),
        ),
        (
            "sliding_window",
            policy(AlgorithmSpec::SlidingWindow {
                limit: 3,
                window: secs(10),
            }),
        ),
        (
            "token_bucket",
            policy(AlgorithmSpec::TokenBucket {
                capacity: 3,
                refill_amount: 2,
                refill_interval: secs(3),
            }),
        ),
        (
            "gcra",
            policy(AlgorithmSpec::Gcra {
                limit: 2,
                period: secs(3),
                burst: 3,
            }),
        ),
        (
            "sliding_log",
            policy(AlgorithmSpec::SlidingLog {
                limit: 3,
                window: secs(10),
            }),
        ),
    ]
}

/// The middleware over a fresh local provider with `policy`, on `clock`.
fn service(policy: &RateLimitPolicy, clock: &ManualClock) -> RateLimit<axum::Router> {
    service_of(std::slice::from_ref(policy), clock)
}

/// The middleware applying each of `policies` to `/api`, in order, on `clock`.
fn service_of(policies: &[RateLimitPolicy], clock: &ManualClock) -> RateLimit<axum::Router> {
    let first = policies[0].id().clone();
    let set = PolicySet::new(policies.iter().cloned(), first).expect("valid set");
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let port = LocalProvider::new(set, clock.clone(), LocalSettings::default());
    let limiter = Limiter::new(
        Arc::new(port),
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    );
    let subject = || SubjectSource::Header("x-key".into());
    let rules = policies
        .iter()
        .map(|p| Rule::new("/api", p.id().clone(), subject()))
        .collect();
    RateLimitLayer::new(Arc::new(limiter), rules)
        .with_clock(clock)
        .layer(axum::Router::new().route("/api", axum::routing::get(|| async { "up" })))
}

/// What one response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    allowed: bool,
    r: u64,
    t: Option<u64>,
    retry_after: Option<u64>,
}

/// The value of parameter `key` in the one-member `RateLimit` field `field`.
fn param(field: &str, key: &str) -> Option<u64> {
    field
        .split(';')
        .skip(1)
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.parse().expect("an integer parameter"))
}

async fn send(svc: &RateLimit<axum::Router>) -> Seen {
    let request = Request::get("/api")
        .header("x-key", "k")
        .body(Body::empty())
        .expect("request");
    let response = svc.clone().oneshot(request).await.expect("infallible");
    let text = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    let field = text("ratelimit").expect("a RateLimit field on every limited response");
    assert!(field.starts_with("\"p\";"), "{field}");
    Seen {
        allowed: response.status() == StatusCode::OK,
        r: param(&field, "r").expect("r is required"),
        t: param(&field, "t"),
        retry_after: text("retry-after").map(|v| v.parse().expect("whole seconds")),
    }
}

/// A fresh service that has seen the requests of `steps`, its clock then set to `at` ms after
/// [`T0`].
async fn replay(policy: &RateLimitPolicy, steps: &[u64], at: u64) -> RateLimit<axum::Router> {
    let clock = ManualClock::new(T0);
    let svc = service(policy, &clock);
    for &step in steps {
        clock.set(T0 + step);
        send(&svc).await;
    }
    clock.set(T0 + at);
    svc
}

/// How many of `n` requests sent at once are admitted.
async fn admitted(svc: &RateLimit<axum::Router>, n: u64) -> u64 {
    let mut count = 0;
    for _ in 0..n {
        if send(svc).await.allowed {
            count += 1;
        }
    }
    count
}

/// Checks every claim of `seen`, the answer to the request at `steps.last()`.
async fn check(name: &str, policy: &RateLimitPolicy, steps: &[u64], seen: Seen) {
    let now = *steps.last().expect("a request was sent");
    let at = |secs: u64| now + secs * 1000;
    let context = format!("{name}, request at +{now} ms: {seen:?}");
    // r: exactly r more are admitted now.
    let probe = replay(policy, steps, now).await;
    assert_eq!(admitted(&probe, seen.r + 1).await, seen.r, "r: {context}");
    if !seen.allowed {
        assert_eq!(seen.r, 0, "a 429 has no available quota: {context}");
        let retry = seen.retry_after.expect("Retry-After on every 429");
        let t = seen.t.expect("t on every 429: when the request fits again");
        assert!(
            retry >= t,
            "Retry-After points before the effective window ends: {context}"
        );
        let probe = replay(policy, steps, at(retry)).await;
        assert_eq!(
            admitted(&probe, 1).await,
            1,
            "admitted after Retry-After: {context}"
        );
        let probe = replay(policy, steps, at(retry - 1)).await;
        assert_eq!(
            admitted(&probe, 1).await,
            0,
            "not a second earlier: {context}"
        );
    } else {
        assert_eq!(seen.retry_after, None, "{context}");
    }
    if let Some(t) = seen.t {
        assert!(t >= 1, "{context}");
        // More than r within t seconds...
        let probe = replay(policy, steps, at(t)).await;
        assert!(
            admitted(&probe, seen.r + 1).await > seen.r,
            "the quota has grown beyond r after t: {context}"
        );
        // ...and no more than r until t - 1 seconds (less the millisecond by which the edge
        // may overestimate the refill of a bucket).
        if t >= 2 {
            let probe = replay(policy, steps, at(t - 1) - 1).await;
            assert_eq!(
                admitted(&probe, seen.r + 1).await,
                seen.r,
                "the quota grew long before t: {context}"
            );
        }
    }
}

#[tokio::test]
async fn r_t_and_retry_after_say_what_each_algorithm_does_next() {
    for (name, policy) in algorithms() {
        let clock = ManualClock::new(T0);
        let svc = service(&policy, &clock);
        let mut denials = 0;
        for (i, &step) in STEPS.iter().enumerate() {
            clock.set(T0 + step);
            let seen = send(&svc).await;
            denials += u32::from(!seen.allowed);
            check(name, &policy, &STEPS[..=i], seen).await;
        }
        assert!(denials >= 2, "{name}: the history reaches denials");
    }
}

#[tokio::test]
async fn a_429_of_an_exhausted_token_bucket_has_t_equal_to_retry_after() {
    // The live report: capacity 10, one token per second, drained: the next token comes in
    // 1 s, the bucket is full again in 10 s. t = 10 with Retry-After: 1 would tell the client
    // both "nothing more for 10 s" and "retry in 1 s".
    let policy = policy(AlgorithmSpec::TokenBucket {
        capacity: 10,
        refill_amount: 1,
        refill_interval: Duration::from_secs(1),
    });
    let clock = ManualClock::new(T0);
    let svc = service(&policy, &clock);
    for _ in 0..10 {
        assert!(send(&svc).await.allowed);
    }
    let seen = send(&svc).await;
    assert_eq!(
        seen,
        Seen {
            allowed: false,
            r: 0,
            t: Some(1),
            retry_after: Some(1),
        }
    );
}

#[tokio::test]
async fn retry_after_covers_every_policy_the_request_exhausted() {
    // `long` (2 per minute) is evaluated first, then `short` (1 per 10 s). The second request
    // takes the last unit of `long` and is refused by `short`, which would admit it 9 s later;
    // `long` would not before the minute ends, so retrying after 9 s is refused again.
    let window = |limit, secs| AlgorithmSpec::FixedWindow {
        limit,
        window: Duration::from_secs(secs),
    };
    let policies = [named("long", window(2, 60)), named("short", window(1, 10))];
    let minute = T0 + 40_000; // aligned to a minute
    let clock = ManualClock::new(minute);
    let svc = service_of(&policies, &clock);
    let request = || {
        Request::get("/api")
            .header("x-key", "k")
            .body(Body::empty())
    };
    let first = svc.clone().oneshot(request().expect("request")).await;
    assert_eq!(first.expect("infallible").status(), StatusCode::OK);
    clock.set(minute + 1_000);
    let second = svc
        .clone()
        .oneshot(request().expect("request"))
        .await
        .expect("infallible");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        second.headers()["ratelimit"],
        "\"long\";r=0;t=59, \"short\";r=0;t=9"
    );
    assert_eq!(second.headers()["retry-after"], "59");
}
