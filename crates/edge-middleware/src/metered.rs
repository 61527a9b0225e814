//! The metered middleware: `MeteredLayer` / `Metered<S>` reserve an estimated cost before the
//! upstream works and settle the actual cost the upstream reports, for costs known only after
//! the work (the tokens an LLM call used). Semantics of reserve and settle:
//! docs/algorithms.md ("Reservations").
//!
//! - Before the upstream: one reservation of every matching [`MeteredRule`] (all or
//!   nothing). The estimate is the rule's cost: fixed, or a request header bounded by the
//!   policy's `max_cost`. A denial answers 429 problem+json with `Retry-After`, and the
//!   upstream is not called. A provider failure follows the policies' `failure_policy`: when
//!   every one fails open the request goes through unmetered, otherwise 503 problem+json
//!   `reservation_unavailable`.
//! - After: the actual cost of each rule is read from its header, in the response trailers
//!   (a streamed body reports it when it ends) or else the response headers; a value above
//!   `max_cost` counts as `max_cost`, a missing or malformed one as the estimate (both
//!   logged). The reservation is settled **exactly once**: when the body ends (before its
//!   last frame is handed on), or when it is dropped unfinished (the client went away: with
//!   what is known by then, else the estimate).
//! - A server error (5xx) that reports no actual cost is taken as the upstream failing before
//!   any work: the reservation is cancelled (its estimate refunded) at once.
//! - Settling a dropped body runs on the spawner the app gives ([`MeteredLayer::with_spawner`]);
//!   without one it is polled once (which finishes at once on the local provider) and is
//!   otherwise abandoned, logged: the reservation then expires charged at its estimate.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use shared_contract::{Outcome, ReservationId, ReservationTtl};
use tower_layer::Layer;
use tower_service::Service;

use crate::concurrency::{Spawner, Task, run_detached};
use crate::layer::rule_cost;
use crate::limiter::{Limiter, Member, PolicyIndex};
use crate::problem;
use crate::rule::{PeerIp, Rule, no_peer, subject};

/// A rule whose policy is charged the cost the upstream reports: the [`Rule`] says which
/// requests, which subject and the estimate (its cost); `actual` names the response trailer
/// or header holding the actual cost.
#[derive(Debug, Clone)]
pub struct MeteredRule {
    rule: Rule,
    actual: HeaderName,
}

impl MeteredRule {
    /// A rule reading the actual cost from the trailer or header `actual`.
    ///
    /// # Errors
    /// A message naming `actual` when it is not a header name.
    pub fn new(rule: Rule, actual: &str) -> Result<Self, String> {
        let actual = HeaderName::try_from(actual)
            .map_err(|_| format!("{actual:?} is not a valid header name"))?;
        Ok(Self { rule, actual })
    }
}

#[derive(Clone)]
struct Shared {
    limiter: Arc<Limiter>,
    rules: Vec<(MeteredRule, Option<PolicyIndex>)>,
    ttl: ReservationTtl,
    peer: PeerIp,
    spawner: Option<Spawner>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("rules", &self.rules.len())
            .field("ttl", &self.ttl)
            .field("spawner", &self.spawner.is_some())
            .finish_non_exhaustive()
    }
}

/// The metered middleware's layer. See the module docs.
#[derive(Debug, Clone)]
pub struct MeteredLayer {
    shared: Arc<Shared>,
}

impl MeteredLayer {
    /// A layer reserving for each matching rule with `limiter`; a reservation waits `ttl`
    /// for its settlement (the longest the upstream may take).
    pub fn new(limiter: Arc<Limiter>, rules: Vec<MeteredRule>, ttl: ReservationTtl) -> Self {
        let rules = rules
            .into_iter()
            .map(|r| {
                let index = limiter.resolve(r.rule.policy());
                (r, index)
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                limiter,
                rules,
                ttl,
                peer: no_peer,
                spawner: None,
            }),
        }
    }

    /// The same layer, reading the peer address of `ip` subjects with `peer`.
    #[must_use]
    pub fn with_peer_ip(self, peer: PeerIp) -> Self {
        self.map_shared(|s| s.peer = peer)
    }

    /// The same layer, settling the reservations of dropped bodies with `spawner`.
    #[must_use]
    pub fn with_spawner(self, spawner: Spawner) -> Self {
        self.map_shared(|s| s.spawner = Some(spawner))
    }

    fn map_shared(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }
}

impl<S> Layer<S> for MeteredLayer {
    type Service = Metered<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Metered {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The metered middleware's service. See the module docs.
#[derive(Debug, Clone)]
pub struct Metered<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The future of [`Metered`].
pub type MeteredFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<MeteredBody<B>>, Infallible>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Metered<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body + From<String> + Send + 'static,
    ResBody::Data: Send,
{
    type Response = Response<MeteredBody<ResBody>>;
    type Error = Infallible;
    type Future = MeteredFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone is the one that was not made ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.shared.rules.iter().any(|(r, _)| r.rule.matches(&req)) {
            let call = inner.call(req);
            return Box::pin(async move { Ok(call.await?.map(MeteredBody::plain)) });
        }
        Box::pin(meter(self.shared.clone(), inner, req))
    }
}

/// One reserved limit: what the settlement needs of it.
#[derive(Debug, Clone)]
struct Metering {
    actual: HeaderName,
    estimate: u64,
    max_cost: u64,
    /// The actual cost, once read from the response.
    known: Option<u64>,
}

/// The limits of the rules matching `req`, or the answer refusing it.
fn members<B, R: From<String>>(
    shared: &Shared,
    req: &Request<B>,
) -> Result<(Vec<Member>, Vec<Metering>), Response<R>> {
    let limiter = &shared.limiter;
    let (mut members, mut meterings) = (Vec::new(), Vec::new());
    for (metered, index) in &shared.rules {
        let rule = &metered.rule;
        if !rule.matches(req) {
            continue;
        }
        let Some(index) = *index else {
            return Err(problem::internal(
                "a route names a policy the provider does not have",
            ));
        };
        let digest = subject(rule, req, shared.peer, limiter)?;
        // Two rules over one policy and subject are one limit.
        if members
            .iter()
            .any(|m: &Member| m.index == index && m.subject == digest)
        {
            continue;
        }
        let max_cost = limiter.policy(index).max_cost().get();
        let cost = rule_cost(rule, req, max_cost, limiter, index)?;
        members.push(Member {
            index,
            subject: digest,
            cost,
        });
        meterings.push(Metering {
            actual: metered.actual.clone(),
            estimate: cost.get(),
            max_cost,
            known: None,
        });
    }
    Ok((members, meterings))
}

/// Reserves the estimates of the rules matching `req`, then calls `inner`; the response's body
/// settles the reservation.
async fn meter<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<MeteredBody<ResBody>>, Infallible>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>,
    ResBody: Body + From<String>,
{
    let refused = |r: Response<ResBody>| Ok(r.map(MeteredBody::plain));
    let limiter = &shared.limiter;
    let (members, meterings) = match members(&shared, &req) {
        Ok(m) => m,
        Err(r) => return refused(r),
    };
    let id = match limiter.reserve(&members, shared.ttl).await {
        Ok(Outcome::Evaluated(r)) => match r.id {
            Some(id) => Some(id),
            None => return refused(denied(&r.decision)),
        },
        Ok(failure) => {
            let open = members
                .iter()
                .all(|m| limiter.fails_open(limiter.policy(m.index).id()));
            if !open {
                return refused(problem::about_blank(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some("reservation_unavailable"),
                    Some(&format!(
                        "the limiter could not answer ({}); nothing was reserved",
                        failure.name()
                    )),
                ));
            }
            tracing::debug!(
                outcome = failure.name(),
                "no reservation; fail_open lets the request through unmetered"
            );
            None
        }
        Err(e) => return refused(problem::internal(&e.to_string())),
    };
    let response = inner.call(req).await?;
    let Some(id) = id else {
        return Ok(response.map(MeteredBody::plain));
    };
    let mut guard = Guard {
        limiter: shared.limiter.clone(),
        id: Some(id),
        meterings,
        spawner: shared.spawner.clone(),
    };
    guard.read(response.headers());
    if response.status().is_server_error() && guard.meterings.iter().all(|m| m.known.is_none()) {
        guard.cancel().await;
        return Ok(response.map(MeteredBody::plain));
    }
    Ok(response.map(|b| MeteredBody::new(b, guard)))
}

/// 429 problem+json naming the policies that denied, with the latest `Retry-After`.
fn denied<R: From<String>>(d: &shared_contract::MultiDecision) -> Response<R> {
    let violated: Vec<&str> = d.violated().map(|v| v.policy_id.as_str()).collect();
    let retry_ms = d
        .violated()
        .map(|v| v.retry_after_ms.max(1))
        .max()
        .unwrap_or(1);
    let mut r = problem::quota_exceeded(&violated);
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(crate::headers::ceil_secs(retry_ms).max(1)),
    );
    r
}

/// A whole number of at most 16 digits.
fn number(value: &HeaderValue) -> Option<u64> {
    let text = value.as_bytes();
    (!text.is_empty() && text.len() <= 16 && text.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(text).ok()?.parse().ok())
        .flatten()
}

/// The reservation one response settles, once.
struct Guard {
    limiter: Arc<Limiter>,
    /// `None` once settled (or handed to the settlement).
    id: Option<ReservationId>,
    meterings: Vec<Metering>,
    spawner: Option<Spawner>,
}

impl Guard {
    /// Reads the actual costs `headers` (response headers or trailers) hold.
    fn read(&mut self, headers: &HeaderMap) {
        for m in &mut self.meterings {
            let Some(value) = headers.get(&m.actual) else {
                continue;
            };
            match number(value) {
                Some(n) if n > m.max_cost => {
                    tracing::warn!(header = %m.actual, actual = n, max_cost = m.max_cost, "an actual cost above max_cost counts as max_cost");
                    m.known = Some(m.max_cost);
                }
                Some(n) => m.known = Some(n),
                None => {
                    tracing::warn!(header = %m.actual, "a malformed actual cost is ignored");
                }
            }
        }
    }

    /// The settlement of what is known now (the estimate where nothing is), once.
    fn settlement(&mut self) -> Option<Task> {
        let id = self.id.take()?;
        let actual: Vec<u64> = self
            .meterings
            .iter()
            .map(|m| m.known.unwrap_or(m.estimate))
            .collect();
        let limiter = self.limiter.clone();
        Some(Box::pin(async move {
            match limiter.settle(id, actual).await {
                Ok(Outcome::Evaluated(Ok(_))) => {}
                Ok(Outcome::Evaluated(Err(e))) => {
                    tracing::warn!(error = %e, "a reservation was not settled");
                }
                Ok(failure) => tracing::warn!(
                    outcome = failure.name(),
                    "a reservation was not settled; it expires charged at its estimate"
                ),
                Err(e) => tracing::warn!(error = %e, "a reservation was not settled"),
            }
        }))
    }

    async fn cancel(&mut self) {
        let Some(id) = self.id.take() else { return };
        match self.limiter.cancel(id).await {
            Ok(Outcome::Evaluated(Ok(_))) => {}
            Ok(other) => tracing::warn!(
                outcome = other.name(),
                "a reservation was not cancelled; it expires charged at its estimate"
            ),
            Err(e) => tracing::warn!(error = %e, "a reservation was not cancelled"),
        }
    }
}

/// Logs a settlement abandoned for want of a spawner.
fn settlement_abandoned() {
    tracing::warn!(
        "a dropped response's reservation could not be settled without a spawner; it expires charged at its estimate"
    );
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(task) = self.settlement() {
            run_detached(task, self.spawner.as_ref(), settlement_abandoned);
        }
    }
}

/// A response body that settles its request's reservation when it ends or is dropped.
///
/// Trailers are read as they pass; when the inner body says its last frame is out, the
/// settlement runs before that frame is handed on, so a client that has the whole response
/// finds the actual cost charged.
pub struct MeteredBody<B: Body> {
    inner: B,
    guard: Option<Guard>,
    /// The settlement started at the end of the body; the end is reported once it finished.
    settling: Option<Task>,
    /// The last frame, held back until the settlement finished.
    last: Option<Frame<B::Data>>,
}

impl<B: Body> fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredBody")
            .field("metered", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> MeteredBody<B> {
    /// A body with no reservation to settle.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            guard: None,
            settling: None,
            last: None,
        }
    }

    fn new(inner: B, guard: Guard) -> Self {
        Self {
            inner,
            guard: Some(guard),
            settling: None,
            last: None,
        }
    }

    /// Whether this body still has a reservation to settle.
    pub fn metered(&self) -> bool {
        self.guard.is_some()
    }

    /// Starts the settlement at the end of the body.
    fn settle(&mut self) -> bool {
        match self.guard.as_mut().and_then(Guard::settlement) {
            Some(task) => {
                self.settling = Some(task);
                true
            }
            None => false,
        }
    }
}

impl<B: Body> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        // A settlement started at the end of the body finishes in the background.
        if let Some(task) = self.settling.take() {
            let spawner = self.guard.as_ref().and_then(|g| g.spawner.clone());
            run_detached(task, spawner.as_ref(), settlement_abandoned);
        }
    }
}

impl<B: Body + Unpin> Body for MeteredBody<B>
where
    B::Data: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(task) = this.settling.as_mut() {
                if task.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.settling = None;
                return Poll::Ready(this.last.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let (Some(trailers), Some(guard)) = (frame.trailers_ref(), &mut this.guard) {
                        guard.read(trailers);
                    }
                    if !this.inner.is_end_stream() || !this.settle() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.last = Some(frame);
                }
                Poll::Ready(None) => {
                    if !this.settle() {
                        return Poll::Ready(None);
                    }
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.as_ref().is_none_or(|g| g.id.is_none())
            && self.settling.is_none()
            && self.last.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "metered_tests.rs"]
mod tests;
