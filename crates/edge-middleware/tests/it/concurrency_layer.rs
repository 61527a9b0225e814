//! The concurrency middleware over the local provider: at most `limit` requests of one
//! subject in flight, 429 with `Retry-After` beyond, the lease released when the response
//! body ends or is dropped, and a rate-limit denial inside it holding no lease.

use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use edge_middleware::{
    ConcurrencyLayer, Limiter, RateLimitLayer, Rule, SubjectHasher, SubjectSecret, SubjectSource,
};
use shared_contract::testing::ScriptedPort;
use shared_contract::{
    AlgorithmSpec, FailurePolicy, ManualClock, PolicyId, PolicyRevision, PolicySet, PolicySpec,
    RateLimitPolicy,
};
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt as _};

fn policy(id: &str, algorithm: AlgorithmSpec) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid"),
        algorithm,
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy")
}

struct Fixture {
    provider: Arc<LocalProvider>,
    limiter: Arc<Limiter>,
    /// The upstream waits for a permit of this before it answers.
    gate: Arc<Semaphore>,
}

fn fixture() -> Fixture {
    let jobs = policy(
        "jobs",
        AlgorithmSpec::Concurrency {
            limit: 2,
            lease_ttl: Duration::from_secs(60),
        },
    );
    let api = policy(
        "api",
        AlgorithmSpec::FixedWindow {
            limit: 3,
            window: Duration::from_secs(3600),
        },
    );
    let set = PolicySet::new([jobs, api], PolicyId::new("api").expect("id")).expect("set");
    let provider = Arc::new(LocalProvider::new(
        set,
        Arc::new(ManualClock::new(1_700_000_000_000)),
        LocalSettings::default(),
    ));
    let limiter = Arc::new(Limiter::new(
        provider.clone(),
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    ));
    Fixture {
        provider,
        limiter,
        gate: Arc::new(Semaphore::new(0)),
    }
}

type Svc = tower::util::BoxCloneSyncService<
    Request<Body>,
    Response<edge_middleware::LeaseBody<Body>>,
    std::convert::Infallible,
>;

/// `/work` holds a `jobs` lease per `x-user`; with `rate`, also charges `api` inside it.
fn service(f: &Fixture, rate: bool) -> Svc {
    let gate = f.gate.clone();
    let upstream = tower::service_fn(move |_req: Request<Body>| {
        let gate = gate.clone();
        async move {
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("done")))
        }
    });
    let user = || SubjectSource::Header("x-user".into());
    let leases = ConcurrencyLayer::new(
        f.limiter.clone(),
        vec![Rule::new(
            "/work",
            PolicyId::new("jobs").expect("id"),
            user(),
        )],
    );
    let rates = if rate {
        vec![Rule::new(
            "/work",
            PolicyId::new("api").expect("id"),
            user(),
        )]
    } else {
        Vec::new()
    };
    let rates = RateLimitLayer::new(f.limiter.clone(), rates);
    let svc = tower::ServiceBuilder::new()
        .layer(leases)
        .layer(rates)
        .service(upstream);
    tower::util::BoxCloneSyncService::new(svc)
}

fn request(user: &str) -> Request<Body> {
    Request::get("/work/x")
        .header("x-user", user)
        .body(Body::empty())
        .expect("a request")
}

fn held(f: &Fixture, user: &str) -> u64 {
    let digest = f.limiter.digest(user.as_bytes());
    f.provider
        .held_leases(&PolicyId::new("jobs").expect("id"), &digest)
}

async fn body_text(r: Response<edge_middleware::LeaseBody<Body>>) -> String {
    let bytes = axum::body::to_bytes(Body::new(r.into_body()), 1 << 16)
        .await
        .expect("a body");
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn at_most_limit_requests_of_a_subject_are_in_flight() {
    let f = fixture();
    let svc = service(&f, false);
    let in_flight: Vec<_> = (0..2)
        .map(|_| tokio::spawn(svc.clone().oneshot(request("u-1"))))
        .collect();
    // Both reach the upstream and wait there, each holding a lease.
    tokio::time::timeout(Duration::from_secs(5), async {
        while held(&f, "u-1") < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("two leases held");
    let third = svc
        .clone()
        .oneshot(request("u-1"))
        .await
        .expect("infallible");
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    assert!(body_text(third).await.contains("lease_limit_reached"));
    assert_eq!(held(&f, "u-1"), 2, "the refused request holds nothing");
    // Let them finish: each lease is released when its body ends.
    f.gate.add_permits(2);
    for t in in_flight {
        let r = t.await.expect("a task").expect("infallible");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body_text(r).await, "done");
    }
    assert_eq!(held(&f, "u-1"), 0);
    f.gate.add_permits(1);
    let again = svc
        .clone()
        .oneshot(request("u-1"))
        .await
        .expect("infallible");
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dropped_body_releases_its_lease() {
    let f = fixture();
    let mut svc = service(&f, false);
    f.gate.add_permits(1);
    let r = svc
        .ready()
        .await
        .expect("ready")
        .call(request("u-2"))
        .await
        .expect("infallible");
    assert_eq!((r.status(), held(&f, "u-2")), (StatusCode::OK, 1));
    // The client went away: the body is dropped unread. Without a spawner the release is
    // polled once, which the local provider answers at once.
    drop(r);
    assert_eq!(held(&f, "u-2"), 0);
}

#[tokio::test]
async fn a_rate_limit_denial_inside_holds_no_lease() {
    let f = fixture();
    let svc = service(&f, true);
    f.gate.add_permits(3);
    for _ in 0..3 {
        let r = svc
            .clone()
            .oneshot(request("u-3"))
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::OK);
        body_text(r).await;
    }
    let denied = svc
        .clone()
        .oneshot(request("u-3"))
        .await
        .expect("infallible");
    assert_eq!(
        denied.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the rate limit"
    );
    assert!(!body_text(denied).await.contains("lease_limit_reached"));
    assert_eq!(held(&f, "u-3"), 0, "its lease was released with the denial");
}

#[tokio::test]
async fn a_provider_failure_follows_the_policys_failure_policy() {
    let with = |failure_policy| {
        let jobs = RateLimitPolicy::new(PolicySpec {
            failure_policy,
            ..PolicySpec {
                id: PolicyId::new("jobs").expect("valid id"),
                revision: PolicyRevision::new(1).expect("valid"),
                algorithm: AlgorithmSpec::Concurrency {
                    limit: 1,
                    lease_ttl: Duration::from_secs(1),
                },
                max_cost: 1,
                cleanup_grace: Duration::ZERO,
                max_clock_regression: Duration::ZERO,
                failure_policy: FailurePolicy::FailClosed,
            }
        })
        .expect("valid policy");
        let set = PolicySet::new([jobs], PolicyId::new("jobs").expect("id")).expect("set");
        let limiter = Arc::new(Limiter::new(
            Arc::new(
                // Every acquire `Unavailable(connect)`; a rate evaluation is not expected.
                ScriptedPort::new(set, |_| {
                    Err(shared_contract::RequestError::LeasesUnsupported)
                })
                .with_leases(|r| shared_contract::AcquireOutcome::Unavailable {
                    policy_id: r.policy_id.clone(),
                    retry_after_ms: 2_500,
                    category: shared_contract::UnavailableCategory::Connect,
                }),
            ),
            SubjectHasher::new(&SubjectSecret::random()),
            FailurePolicy::FailClosed,
            Duration::from_secs(1),
        ));
        let upstream = tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("done")))
        });
        let rule = Rule::new(
            "/work",
            PolicyId::new("jobs").expect("id"),
            SubjectSource::Header("x-user".into()),
        );
        tower::ServiceBuilder::new()
            .layer(ConcurrencyLayer::new(limiter, vec![rule]))
            .service(upstream)
    };
    let closed = with(FailurePolicy::FailClosed)
        .oneshot(request("u"))
        .await
        .expect("infallible");
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        closed.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"3"[..]),
        "2.5 s rounded up"
    );
    assert!(body_text(closed).await.contains("lease_unavailable"));
    let open = with(FailurePolicy::FailOpen)
        .oneshot(request("u"))
        .await
        .expect("infallible");
    assert_eq!(open.status(), StatusCode::OK, "through without a lease");
    assert_eq!(body_text(open).await, "done");
}

#[tokio::test]
async fn the_lease_is_free_before_the_last_frame_is_handed_on() {
    use http_body::Body as _;
    let f = fixture();
    let svc = service(&f, false);
    f.gate.add_permits(1);
    let r = svc.oneshot(request("u-5")).await.expect("infallible");
    assert_eq!(held(&f, "u-5"), 1, "held while the response is on its way");
    let mut body = r.into_body();
    let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await;
    let data = frame
        .and_then(Result::ok)
        .and_then(|f| f.into_data().ok())
        .expect("the one data frame");
    assert_eq!(&data[..], b"done");
    // A client that has the whole response may send its next request at once.
    assert_eq!(held(&f, "u-5"), 0);
    assert!(body.is_end_stream());
}
