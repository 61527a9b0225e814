//! `RateLimitLayer` wraps, `RateLimit<S>` works (tower's `limit::rate` shape).
//!
//! For each request the rules whose `path_prefix` matches are applied in order: the subject
//! is read (`header:NAME` or the peer `ip`), digested, and evaluated with cost 1. Then:
//!
//! - every policy allowed: the inner service answers, and the response gets the draft-11
//!   `RateLimit-Policy` / `RateLimit` headers (one member per policy that applied);
//! - a policy denied: 429 problem+json (quota-exceeded, `violated-policies`), the headers, and
//!   `Retry-After` in whole seconds rounded up, never earlier than the `t` of a policy with
//!   `r=0` (see [`crate::headers`]); later rules are not evaluated, so they consume nothing
//!   (rules already evaluated did consume: there is no all-or-nothing across policies);
//! - no decision (unavailable, indeterminate, incompatible): under `fail_open` the request
//!   goes through; otherwise 503 problem+json, with `Retry-After` when the provider gave a
//!   retry hint.
//!
//! A request without the subject header is limited under the empty subject: all such
//! requests share one quota, so leaving the header out is never a way around the limit. A
//! subject header longer than [`MAX_SUBJECT_BYTES`] (256, the bound of `/v1/evaluate` as well)
//! under any matching rule is 400 problem+json `subject_too_long`, answered before any rule is
//! evaluated: nothing is charged.
//!
//! The service never fails: its error type is `Infallible`, like the inner service's.
//!
//! The middleware is plain tower over `http` types, generic over the request body and over a
//! response body that can be built from text (the problem+json answers): it works under axum,
//! hyper or any tower stack. The peer address is the server's business, so `ip` subjects read
//! it through a [`PeerIp`] function given with [`RateLimitLayer::with_peer_ip`] (under axum:
//! `ConnectInfo<SocketAddr>`); without one, every request has the empty `ip` subject.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Extensions, HeaderName, HeaderValue, Request, Response, header};
use shared_contract::{Clock, Cost, PolicyId, RateLimitOutcome, SystemClock};
use tower_layer::Layer;
use tower_service::Service;

use crate::headers;
use crate::limiter::{Limiter, PolicyIndex};
use crate::problem;
use crate::subject::{MAX_SUBJECT_BYTES, SubjectSource};

/// Reads the peer's IP address from a request's extensions, where the server put it.
pub type PeerIp = fn(&Extensions) -> Option<IpAddr>;

/// The [`PeerIp`] of a layer that was given none: no address, the empty subject.
fn no_peer(_: &Extensions) -> Option<IpAddr> {
    None
}

/// Which requests a policy limits, and by which subject.
#[derive(Debug, Clone)]
pub struct Rule {
    path_prefix: String,
    policy: PolicyId,
    subject: Subject,
}

#[derive(Debug, Clone)]
enum Subject {
    Header(HeaderName),
    Ip,
}

impl Rule {
    /// A rule for paths equal to `path_prefix` or below it (`/api` matches `/api` and
    /// `/api/x`, not `/apix`).
    pub fn new(path_prefix: impl Into<String>, policy: PolicyId, subject: SubjectSource) -> Self {
        let subject = match subject {
            SubjectSource::Header(name) => match HeaderName::try_from(name) {
                Ok(h) => Subject::Header(h),
                // `SubjectSource::parse` refuses such names; one built by hand that is not a
                // header name can only match nothing.
                Err(_) => Subject::Header(HeaderName::from_static("x-invalid-subject-header")),
            },
            SubjectSource::Ip => Subject::Ip,
        };
        let mut path_prefix = path_prefix.into();
        while path_prefix.len() > 1 && path_prefix.ends_with('/') {
            path_prefix.pop();
        }
        Self {
            path_prefix,
            policy,
            subject,
        }
    }

    pub fn policy(&self) -> &PolicyId {
        &self.policy
    }

    fn matches(&self, path: &str) -> bool {
        let p = self.path_prefix.as_str();
        p == "/"
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// A rule's policy, resolved in the limiter when the layer is built.
#[derive(Debug, Clone)]
struct Resolved {
    index: PolicyIndex,
    /// The `RateLimit-Policy` value of the policy alone, built once: it depends only on the
    /// policy, and one matching rule is the common case.
    policy_value: HeaderValue,
}

#[derive(Debug, Clone)]
struct Shared {
    limiter: Arc<Limiter>,
    rules: Vec<Rule>,
    /// By rule; `None` when the limiter has no such policy (answered 500 when the rule
    /// matches).
    resolved: Vec<Option<Resolved>>,
    peer: PeerIp,
    /// This host's clock, against which the `t` of the `RateLimit` field is computed.
    clock: Arc<dyn Clock>,
}

/// The middleware's layer. See the module docs.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A layer applying `rules`, in order, with `limiter`. Give it a [`PeerIp`] with
    /// [`Self::with_peer_ip`] when a rule limits by `ip`.
    pub fn new(limiter: Arc<Limiter>, rules: Vec<Rule>) -> Self {
        let resolved = rules
            .iter()
            .map(|r| {
                limiter.resolve(&r.policy).map(|index| {
                    let mut v = String::new();
                    headers::push_policy(&mut v, limiter.policy(index));
                    Resolved {
                        index,
                        policy_value: headers::value(v),
                    }
                })
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                limiter,
                rules,
                resolved,
                peer: no_peer,
                clock: Arc::new(SystemClock),
            }),
        }
    }

    /// The same layer, reading the peer address of `ip` subjects with `peer`.
    #[must_use]
    pub fn with_peer_ip(self, peer: PeerIp) -> Self {
        self.map_shared(|s| s.peer = peer)
    }

    /// The same layer, reading the time for the `RateLimit` field's `t` from `clock` instead
    /// of the system clock (tests give the provider's manual clock, so that both agree).
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        self.map_shared(|s| s.clock = clock)
    }

    fn map_shared(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The middleware's service. See the module docs.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The future of [`RateLimit`]: boxed, because it awaits the port (an `async_trait` future,
/// boxed already) and then the inner service.
pub type ResponseFuture<B> = Pin<Box<dyn Future<Output = Result<Response<B>, Infallible>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = ResponseFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let path = req.uri().path();
        if !self.shared.rules.iter().any(|r| r.matches(path)) {
            return Box::pin(self.inner.call(req));
        }
        // The clone is the one that was not made ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(limit(shared, inner, req))
    }
}

/// The raw subject of `rule` in `req`: the header's bytes, or the peer address `peer` reads
/// as text (at most 45 bytes, the longest IPv6 text form), written into `ip`.
fn raw_subject<'a, B>(
    rule: &Rule,
    req: &'a Request<B>,
    peer: PeerIp,
    ip: &'a mut IpText,
) -> &'a [u8] {
    match &rule.subject {
        Subject::Header(name) => req
            .headers()
            .get(name)
            .map_or(&[][..], HeaderValue::as_bytes),
        Subject::Ip => match peer(req.extensions()) {
            Some(addr) => ip.format(addr),
            None => &[][..],
        },
    }
}

/// The text of an IP address (`Display`), on the stack.
struct IpText {
    buf: [u8; 64],
}

impl IpText {
    fn format(&mut self, ip: IpAddr) -> &[u8] {
        let mut cursor = std::io::Cursor::new(&mut self.buf[..]);
        // 64 bytes hold every IPv4 and IPv6 text form; a failed write is impossible, and
        // would only shorten the text.
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as usize;
        &self.buf[..len]
    }
}

/// The 400 for a request whose subject header, under any matching rule, is longer than
/// [`MAX_SUBJECT_BYTES`] (the bound of `/v1/evaluate` too). Checked before any rule is
/// evaluated, so such a request is charged nothing anywhere.
fn oversized_subject<B, R: From<String>>(rules: &[Rule], req: &Request<B>) -> Option<Response<R>> {
    let path = req.uri().path();
    rules.iter().filter(|r| r.matches(path)).find_map(|rule| {
        let Subject::Header(name) = &rule.subject else {
            return None;
        };
        let len = req.headers().get(name)?.len();
        (len > MAX_SUBJECT_BYTES).then(|| {
            problem::bad_request(
                "subject_too_long",
                &format!(
                    "the subject header {name} is {len} bytes, at most {MAX_SUBJECT_BYTES} are accepted"
                ),
            )
        })
    })
}

async fn limit<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResBody>, Infallible>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>,
    ResBody: From<String>,
{
    if let Some(refused) = oversized_subject(&shared.rules, &req) {
        return Ok(refused);
    }
    let limiter = &shared.limiter;
    let mut policy_field = String::new();
    let mut limit_field = Vec::new();
    let mut violated: Vec<&str> = Vec::new();
    // The largest `t` of the members with nothing left: a 429's `Retry-After` (see
    // `headers`: the draft wants it no earlier than the effective window's end).
    let mut retry_after_secs = 0u64;
    let mut applied = 0usize;
    let mut single_policy_value = None;
    for (rule, resolved) in shared.rules.iter().zip(&shared.resolved) {
        // Nothing borrowed from the request lives across an await: the body is `Send` but
        // not `Sync`, so the future could not be `Send` otherwise.
        if !rule.matches(req.uri().path()) {
            continue;
        }
        let Some(resolved) = resolved else {
            return Ok(problem::internal(
                "a route names a policy the provider does not have",
            ));
        };
        let policy = limiter.policy(resolved.index);
        let evaluation = {
            let mut ip = IpText { buf: [0; 64] };
            let raw = raw_subject(rule, &req, shared.peer, &mut ip);
            limiter.evaluate(resolved.index, raw, Cost::ONE)
        };
        let outcome = match evaluation.await {
            Ok(o) => o,
            Err(e) => return Ok(problem::internal(&e.to_string())),
        };
        match &outcome {
            RateLimitOutcome::Evaluated(d) => {
                applied += 1;
                if applied == 1 {
                    single_policy_value = Some(resolved.policy_value.clone());
                } else {
                    if applied == 2 {
                        // A second policy applies: the list is built member by member.
                        if let Some(first) = &single_policy_value {
                            policy_field.push_str(first.to_str().unwrap_or_default());
                        }
                    }
                    headers::push_policy(&mut policy_field, policy);
                }
                let t = headers::effective_window(policy, d, shared.clock.now_ms());
                headers::push_limit(&mut limit_field, policy, d.remaining, t);
                if d.remaining == 0
                    && let Some(t) = t
                {
                    retry_after_secs = retry_after_secs.max(t);
                }
                if !d.allowed {
                    violated.push(policy.id().as_str());
                    retry_after_secs = retry_after_secs.max(headers::retry_after_secs(d));
                    break;
                }
            }
            _ if limiter.allows(&outcome) => {}
            _ => {
                let mut response = problem::unavailable(&outcome);
                let hint = match outcome {
                    RateLimitOutcome::Unavailable { retry_after_ms, .. }
                    | RateLimitOutcome::Indeterminate { retry_after_ms, .. } => retry_after_ms,
                    _ => 0,
                };
                if hint > 0 {
                    response.headers_mut().insert(
                        header::RETRY_AFTER,
                        HeaderValue::from(headers::ceil_secs(hint)),
                    );
                }
                return Ok(response);
            }
        }
    }
    let mut response = if violated.is_empty() {
        match inner.call(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    } else {
        let mut r = problem::quota_exceeded(&violated);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        r
    };
    if applied > 0 {
        let policy_value = match single_policy_value {
            Some(v) if applied == 1 => v,
            _ => headers::value(policy_field),
        };
        let h = response.headers_mut();
        h.insert(headers::RATELIMIT_POLICY_NAME, policy_value);
        h.insert(headers::RATELIMIT_NAME, headers::bytes_value(limit_field));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::StatusCode;
    use shared_contract::{
        AlgorithmSpec, EdgeRateLimitPort, FailurePolicy, IncompatibleCategory, PolicyRevision,
        PolicySet, PolicySpec, RateLimitPolicy, RateLimitRequest, RequestError,
        UnavailableCategory,
    };
    use tower::ServiceExt as _;

    use super::*;
    use crate::subject::{SubjectHasher, SubjectSecret};

    /// A fixed-window policy of `limit` per `window_secs`.
    fn fixed_window(
        name: &str,
        limit: u64,
        window_secs: u64,
        failure_policy: FailurePolicy,
    ) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicySpec {
            id: PolicyId::new(name).expect("valid id"),
            revision: PolicyRevision::new(1).expect("valid"),
            algorithm: AlgorithmSpec::FixedWindow {
                limit,
                window: Duration::from_secs(window_secs),
            },
            max_cost: 1,
            cleanup_grace: Duration::ZERO,
            max_clock_regression: Duration::ZERO,
            failure_policy,
        })
        .expect("valid policy")
    }

    /// A port that never decides.
    #[derive(Debug)]
    struct Failing {
        policies: PolicySet,
        outcome: fn(PolicyId) -> RateLimitOutcome,
    }

    #[async_trait::async_trait]
    impl EdgeRateLimitPort for Failing {
        async fn evaluate(&self, r: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
            Ok((self.outcome)(r.policy_id))
        }
        async fn evaluate_all(
            &self,
            r: shared_contract::MultiRequest,
        ) -> Result<shared_contract::MultiOutcome, RequestError> {
            shared_contract::multi::one_by_one(self, r).await
        }
        fn policies(&self) -> &PolicySet {
            &self.policies
        }
    }

    fn service(
        failure_policy: FailurePolicy,
        outcome: fn(PolicyId) -> RateLimitOutcome,
    ) -> RateLimit<axum::routing::Router> {
        let id = PolicyId::new("api").expect("valid id");
        let policy = fixed_window("api", 5, 1, failure_policy);
        let port = Arc::new(Failing {
            policies: PolicySet::new([policy], id.clone()).expect("valid set"),
            outcome,
        });
        let limiter = Arc::new(Limiter::new(
            port,
            SubjectHasher::new(&SubjectSecret::random()),
            failure_policy,
            Duration::from_secs(1),
        ));
        let upstream = axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" }));
        RateLimitLayer::new(
            limiter,
            vec![Rule::new("/api", id, SubjectSource::Header("x-key".into()))],
        )
        .layer(upstream)
    }

    fn unavailable(policy_id: PolicyId) -> RateLimitOutcome {
        RateLimitOutcome::Unavailable {
            policy_id,
            retry_after_ms: 1500,
            category: UnavailableCategory::Connect,
        }
    }

    fn incompatible(policy_id: PolicyId) -> RateLimitOutcome {
        RateLimitOutcome::Incompatible {
            policy_id,
            category: IncompatibleCategory::State,
        }
    }

    fn get() -> Request<Body> {
        Request::get("/api/x").body(Body::empty()).expect("request")
    }

    #[tokio::test]
    async fn fail_closed_answers_503_with_retry_after_rounded_up() {
        let r = service(FailurePolicy::FailClosed, unavailable)
            .oneshot(get())
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(r.headers()[header::CONTENT_TYPE], problem::CONTENT_TYPE);
        assert!(r.headers().get(headers::RATELIMIT).is_none());
    }

    #[tokio::test]
    async fn incompatible_under_fail_closed_is_503_without_a_retry_hint() {
        let r = service(FailurePolicy::FailClosed, incompatible)
            .oneshot(get())
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }

    #[tokio::test]
    async fn fail_open_lets_the_request_through_without_claiming_a_decision() {
        let r = service(FailurePolicy::FailOpen, unavailable)
            .oneshot(get())
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get(headers::RATELIMIT).is_none());
        assert!(r.headers().get(headers::RATELIMIT_POLICY).is_none());
    }

    #[tokio::test]
    async fn paths_outside_every_rule_are_not_evaluated() {
        // The failing port would answer 503 if it were asked.
        let r = service(FailurePolicy::FailClosed, unavailable)
            .oneshot(Request::get("/apix").body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    /// A port that allows everything, remaining 7, for any of two policies.
    #[derive(Debug)]
    struct Allowing {
        policies: PolicySet,
    }

    #[async_trait::async_trait]
    impl EdgeRateLimitPort for Allowing {
        async fn evaluate(&self, r: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
            let limit = self
                .policies
                .get(&r.policy_id)
                .map_or(0, |p| p.algorithm().limit());
            Ok(RateLimitOutcome::Evaluated(
                shared_contract::RateLimitDecision {
                    allowed: true,
                    limit,
                    remaining: 7,
                    retry_after_ms: 0,
                    reset_at_ms: 0,
                    policy_id: r.policy_id,
                    revision: PolicyRevision::new(1).expect("valid"),
                    source: shared_contract::Source::Local,
                    certainty: shared_contract::Certainty::Certain,
                },
            ))
        }
        async fn evaluate_all(
            &self,
            r: shared_contract::MultiRequest,
        ) -> Result<shared_contract::MultiOutcome, RequestError> {
            shared_contract::multi::one_by_one(self, r).await
        }
        fn policies(&self) -> &PolicySet {
            &self.policies
        }
    }

    #[tokio::test]
    async fn every_matching_policy_gets_a_list_member() {
        let policy =
            |name: &str, limit: u64| fixed_window(name, limit, 60, FailurePolicy::FailClosed);
        let a = PolicyId::new("a").expect("valid id");
        let b = PolicyId::new("b").expect("valid id");
        let port = Arc::new(Allowing {
            policies: PolicySet::new([policy("a", 10), policy("b", 20)], a.clone())
                .expect("valid set"),
        });
        let limiter = Limiter::new(
            port,
            SubjectHasher::new(&SubjectSecret::random()),
            FailurePolicy::FailClosed,
            Duration::from_secs(1),
        );
        let layer = RateLimitLayer::new(
            Arc::new(limiter),
            vec![
                Rule::new("/api", a, SubjectSource::Ip),
                Rule::new("/api/x", b, SubjectSource::Ip),
            ],
        );
        let upstream = axum::Router::new()
            .route("/api/x", axum::routing::get(|| async { "up" }))
            .route("/api/y", axum::routing::get(|| async { "up" }));
        let svc = layer.layer(upstream);
        let r = svc.clone().oneshot(get()).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[headers::RATELIMIT_POLICY],
            "\"a\";q=10;w=60, \"b\";q=20;w=60"
        );
        let limit = r.headers()[headers::RATELIMIT].to_str().expect("ascii");
        assert!(limit.starts_with("\"a\";r=7;t=0, \"b\";r=7;t=0"), "{limit}");
        let r = svc
            .oneshot(Request::get("/api/y").body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(r.headers()[headers::RATELIMIT_POLICY], "\"a\";q=10;w=60");
    }

    /// The layer of `rules` over the local provider with `policies` (the first is the default).
    fn local_layer(policies: Vec<RateLimitPolicy>, rules: Vec<Rule>) -> RateLimitLayer {
        let default = policies[0].id().clone();
        let port = Arc::new(adapter_local::LocalProvider::new(
            PolicySet::new(policies, default).expect("valid set"),
            Arc::new(shared_contract::SystemClock),
            adapter_local::LocalSettings::default(),
        ));
        let limiter = Limiter::new(
            port,
            SubjectHasher::new(&SubjectSecret::random()),
            FailurePolicy::FailClosed,
            Duration::from_secs(1),
        );
        RateLimitLayer::new(Arc::new(limiter), rules)
    }

    /// The local provider behind one `ip` rule of 1 request per minute, reading the peer with
    /// `peer` when given one.
    fn ip_limited(peer: Option<PeerIp>) -> RateLimit<axum::routing::Router> {
        let id = PolicyId::new("api").expect("valid id");
        let policy = fixed_window("api", 1, 60, FailurePolicy::FailClosed);
        let mut layer = local_layer(vec![policy], vec![Rule::new("/api", id, SubjectSource::Ip)]);
        if let Some(peer) = peer {
            layer = layer.with_peer_ip(peer);
        }
        layer.layer(axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" })))
    }

    fn from_peer(last_octet: u8) -> Request<Body> {
        let mut r = get();
        let addr = std::net::SocketAddr::from(([10, 0, 0, last_octet], 40_000));
        r.extensions_mut().insert(axum::extract::ConnectInfo(addr));
        r
    }

    #[tokio::test]
    async fn ip_subjects_are_the_address_the_peer_reader_finds() {
        let svc = ip_limited(Some(|e| {
            e.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        }));
        let first = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
        assert_eq!(first.status(), StatusCode::OK);
        let again = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
        assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
        let other = svc.oneshot(from_peer(2)).await.expect("infallible");
        assert_eq!(
            other.status(),
            StatusCode::OK,
            "another peer, another quota"
        );
    }

    #[tokio::test]
    async fn without_a_peer_reader_every_ip_subject_is_the_empty_one() {
        let svc = ip_limited(None);
        let first = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
        assert_eq!(first.status(), StatusCode::OK);
        let other = svc.oneshot(from_peer(2)).await.expect("infallible");
        assert_eq!(
            other.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "one shared quota"
        );
    }

    #[tokio::test]
    async fn an_oversized_subject_is_400_and_charges_no_rule() {
        let a = PolicyId::new("a").expect("valid id");
        let b = PolicyId::new("b").expect("valid id");
        let policies = vec![
            fixed_window("a", 3, 60, FailurePolicy::FailClosed),
            fixed_window("b", 3, 60, FailurePolicy::FailClosed),
        ];
        let header = |name: &str| SubjectSource::Header(name.into());
        let rules = vec![
            Rule::new("/api", a, header("x-key")),
            Rule::new("/api", b, header("x-user")),
        ];
        let svc = local_layer(policies, rules)
            .layer(axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" })));
        let request = |user: &str| {
            Request::get("/api/x")
                .header("x-key", "k")
                .header("x-user", user)
                .body(Body::empty())
                .expect("request")
        };
        let long = "u".repeat(crate::MAX_SUBJECT_BYTES + 1);
        let r = svc
            .clone()
            .oneshot(request(&long))
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(r.headers()[header::CONTENT_TYPE], problem::CONTENT_TYPE);
        assert!(r.headers().get(headers::RATELIMIT).is_none());
        let r = svc
            .clone()
            .oneshot(request(&long[1..]))
            .await
            .expect("infallible");
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "256 bytes is the bound, not beyond it"
        );
        let limit = r.headers()[headers::RATELIMIT].to_str().expect("ascii");
        assert!(
            limit.starts_with("\"a\";r=2;"),
            "rule a was not charged by the 400: {limit}"
        );
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let id = PolicyId::new("api").expect("valid id");
        let r = Rule::new("/api/", id.clone(), SubjectSource::Ip);
        assert!(r.matches("/api") && r.matches("/api/") && r.matches("/api/x"));
        assert!(!r.matches("/apix") && !r.matches("/ap"));
        assert!(Rule::new("/", id, SubjectSource::Ip).matches("/anything"));
    }
}
