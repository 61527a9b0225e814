//! The metered middleware over the local provider, behind a port that records every settle
//! and cancel: a streamed body's trailer settles once, a body dropped mid-stream settles its
//! estimate once, a header reports the actual cost, a server error cancels, a denial never
//! reaches the upstream.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body as AxumBody, Bytes};
use shared_contract::{
    AlgorithmSpec, CancelOutcome, CancelRequest, EdgeRateLimitPort, FailurePolicy, MultiOutcome,
    MultiRequest, PolicyId, PolicySet, PolicySpec, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, RequestError, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest,
};
use tower::ServiceExt as _;

use super::*;
use crate::rule::CostSource;
use crate::subject::{SubjectHasher, SubjectSecret, SubjectSource};

/// The local provider, recording the actual costs of every settle and counting cancels.
#[derive(Debug)]
struct Recording {
    inner: adapter_local::LocalProvider,
    settles: Mutex<Vec<Vec<u64>>>,
    cancels: AtomicUsize,
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for Recording {
    async fn evaluate(&self, r: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        self.inner.evaluate(r).await
    }
    async fn evaluate_all(&self, r: MultiRequest) -> Result<MultiOutcome, RequestError> {
        self.inner.evaluate_all(r).await
    }
    fn policies(&self) -> &PolicySet {
        self.inner.policies()
    }
    async fn reserve(&self, r: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        self.inner.reserve(r).await
    }
    async fn settle(&self, r: SettleRequest) -> Result<SettleOutcome, RequestError> {
        self.settles.lock().expect("lock").push(r.actual.clone());
        self.inner.settle(r).await
    }
    async fn cancel(&self, r: CancelRequest) -> Result<CancelOutcome, RequestError> {
        self.cancels.fetch_add(1, Ordering::SeqCst);
        self.inner.cancel(r).await
    }
}

/// A body of the given frames, then pending forever when `hang` (a client never reads the end).
struct Frames {
    frames: VecDeque<Frame<Bytes>>,
    hang: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.frames.pop_front() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.hang
    }
}

fn trailers(tokens: &str) -> Frame<Bytes> {
    let mut t = HeaderMap::new();
    t.insert("x-tokens", HeaderValue::from_str(tokens).expect("a value"));
    Frame::trailers(t)
}

struct Setup {
    port: Arc<Recording>,
    limiter: Arc<Limiter>,
    calls: Arc<AtomicUsize>,
}

/// A policy of 1,000 tokens a day, estimates read from `x-max-tokens`, actual costs from
/// `x-tokens`, in front of an upstream answering each request with `answer()`.
fn setup(
    answer: impl Fn() -> Response<AxumBody> + Clone + Send + Sync + 'static,
) -> (Setup, Metered<axum::Router>) {
    let policy = RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("tokens").expect("valid"),
        revision: shared_contract::PolicyRevision::new(1).expect("valid"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: 1_000,
            window: Duration::from_secs(86_400),
        },
        max_cost: 500,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid");
    let id = policy.id().clone();
    let port = Arc::new(Recording {
        inner: adapter_local::LocalProvider::new(
            PolicySet::new(vec![policy], id.clone()).expect("valid set"),
            Arc::new(shared_contract::SystemClock),
            adapter_local::LocalSettings::default(),
        ),
        settles: Mutex::new(Vec::new()),
        cancels: AtomicUsize::new(0),
    });
    let limiter = Arc::new(Limiter::new(
        port.clone(),
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    ));
    let rule = Rule::new("/llm", id, SubjectSource::header("x-team"))
        .with_cost(CostSource::parse_header("header:x-max-tokens").expect("valid"));
    let rules = vec![MeteredRule::new(rule, "x-tokens").expect("a header name")];
    let ttl = ReservationTtl::from_millis(60_000).expect("valid");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let upstream = axum::Router::new().route(
        "/llm",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            async move { answer() }
        }),
    );
    let svc = MeteredLayer::new(limiter.clone(), rules, ttl).layer(upstream);
    let s = Setup {
        port,
        limiter,
        calls,
    };
    (s, svc)
}

fn request(max_tokens: u64) -> Request<AxumBody> {
    Request::post("/llm")
        .header("x-team", "team-1")
        .header("x-max-tokens", max_tokens.to_string())
        .body(AxumBody::empty())
        .expect("a request")
}

fn streamed(hang: bool) -> Response<AxumBody> {
    let frames = [Frame::data(Bytes::from("a")), Frame::data(Bytes::from("b"))];
    let mut frames: VecDeque<Frame<Bytes>> = frames.into_iter().collect();
    if !hang {
        frames.push_back(trailers("37"));
    }
    Response::new(AxumBody::new(Frames { frames, hang }))
}

/// What the policy has left for `team-1` (an evaluation of cost 1, which charges it).
async fn remaining(s: &Setup) -> u64 {
    let index = s
        .limiter
        .resolve(&PolicyId::new("tokens").expect("valid"))
        .expect("a policy");
    let subject = s.limiter.digest(b"team-1");
    let one = shared_contract::Cost::new(1).expect("valid");
    match s
        .limiter
        .evaluate_digest(index, subject, one)
        .await
        .expect("valid")
    {
        RateLimitOutcome::Evaluated(d) => d.remaining + 1,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_streamed_bodys_trailer_settles_the_actual_cost_once() {
    let (s, svc) = setup(|| streamed(false));
    let r = svc.oneshot(request(200)).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    let body = axum::body::to_bytes(AxumBody::new(r.into_body()), usize::MAX)
        .await
        .expect("a body");
    assert_eq!(body, "ab");
    assert_eq!(*s.port.settles.lock().expect("lock"), vec![vec![37]]);
    assert_eq!(remaining(&s).await, 1_000 - 37);
}

#[tokio::test]
async fn a_body_dropped_mid_stream_settles_its_estimate_once() {
    let (s, svc) = setup(|| streamed(true));
    let r = svc.oneshot(request(200)).await.expect("infallible");
    let mut body = r.into_body();
    let first = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
    assert!(first.is_some_and(|f| f.is_ok()));
    assert!(body.metered(), "not settled while the stream runs");
    assert!(s.port.settles.lock().expect("lock").is_empty());
    drop(body);
    assert_eq!(*s.port.settles.lock().expect("lock"), vec![vec![200]]);
    assert_eq!(remaining(&s).await, 1_000 - 200);
}

#[tokio::test]
async fn a_response_header_reports_the_actual_cost() {
    let (s, svc) = setup(|| {
        let mut r = Response::new(AxumBody::from("done"));
        r.headers_mut()
            .insert("x-tokens", HeaderValue::from_static("12"));
        r
    });
    let r = svc.oneshot(request(300)).await.expect("infallible");
    let _ = axum::body::to_bytes(AxumBody::new(r.into_body()), usize::MAX).await;
    assert_eq!(*s.port.settles.lock().expect("lock"), vec![vec![12]]);
    assert_eq!(remaining(&s).await, 1_000 - 12);
}

#[tokio::test]
async fn a_server_error_without_an_actual_cost_cancels() {
    let (s, svc) = setup(|| {
        let mut r = Response::new(AxumBody::from("upstream down"));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    });
    let r = svc.oneshot(request(300)).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert!(!r.body().metered());
    assert_eq!(s.port.cancels.load(Ordering::SeqCst), 1);
    assert!(s.port.settles.lock().expect("lock").is_empty());
    assert_eq!(remaining(&s).await, 1_000);
}

#[tokio::test]
async fn a_denied_reservation_never_reaches_the_upstream() {
    let (s, svc) = setup(|| streamed(false));
    // 500 + 500 reserved and held by bodies not yet read: the next estimate does not fit.
    let held = [
        svc.clone().oneshot(request(500)).await.expect("infallible"),
        svc.clone().oneshot(request(500)).await.expect("infallible"),
    ];
    let r = svc.oneshot(request(1)).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(s.calls.load(Ordering::SeqCst), 2);
    drop(held);
    assert_eq!(s.port.settles.lock().expect("lock").len(), 2);
}

/// Serves `svc` on a loopback port; the address.
async fn serve(svc: Metered<axum::Router>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("an address");
    let app = axum::Router::new().fallback_service(svc);
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Sends a request over a real connection and reads `bytes` of the answer (all of it when
/// `None`), then closes the connection.
async fn over_tcp(addr: std::net::SocketAddr, bytes: Option<usize>) -> String {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let request = "POST /llm HTTP/1.1\r\nhost: x\r\nx-team: team-1\r\nx-max-tokens: 200\r\n\
                       content-length: 0\r\nconnection: close\r\n\r\n";
        s.write_all(request.as_bytes()).expect("send");
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while bytes.is_none_or(|n| got.len() < n) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    })
    .await
    .expect("no panic")
}

/// The settlements recorded within a few seconds, once there are `n`.
async fn settled(s: &Setup, n: usize) -> Vec<Vec<u64>> {
    for _ in 0..500 {
        let got = s.port.settles.lock().expect("lock").clone();
        if got.len() >= n {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.port.settles.lock().expect("lock").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_streamed_answer_settles_its_trailer_once_and_a_client_gone_its_estimate() {
    let (s, svc) = setup(|| streamed(false));
    let answer = over_tcp(serve(svc).await, None).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(settled(&s, 1).await, vec![vec![37]]);
    // A client that reads the start of a stream that never ends, then goes away.
    let (s, svc) = setup(|| streamed(true));
    let start = over_tcp(serve(svc).await, Some(20)).await;
    assert!(start.starts_with("HTTP/1.1 200"), "{start}");
    assert_eq!(
        settled(&s, 1).await,
        vec![vec![200]],
        "settled once, at the estimate"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.port.settles.lock().expect("lock").len(), 1);
}
