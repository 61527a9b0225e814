//! The concurrency middleware: `ConcurrencyLayer` / `Concurrency<S>` hold a lease of each
//! matching rule's concurrency policy while the upstream works and its response body is
//! sent, so at most `limit` requests of one subject are in flight.
//!
//! - Before the upstream: one lease per matching rule (one per policy and subject). A
//!   denial answers 429 problem+json `lease_limit_reached` with `Retry-After`, and releases
//!   the leases this request already took (nothing stays held for a refused request).
//! - A provider failure follows the policy's `failure_policy`: `fail_open` lets the request
//!   through without that lease, otherwise 503 problem+json.
//! - The leases are released when the response body ends (when the inner body says its last
//!   frame is out, before that frame is handed on, so a client that has the whole response
//!   finds the place free; else before the end is reported) or is dropped (the client went away): on drop the release runs on the
//!   spawner the app gives ([`ConcurrencyLayer::with_spawner`]); without one it is polled
//!   once, which finishes at once on the local provider, and is otherwise abandoned. A
//!   release that fails or is abandoned is logged and counted
//!   (`rate_limit_lease_release_failures_total`); the lease then expires by its TTL.
//!
//! Put this layer outside the rate-limit layer: a lease denial then charges no rate limit,
//! and a rate-limit denial's short response ends at once, releasing the lease with it.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use shared_contract::{AcquireOutcome, LeaseId, ReleaseOutcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::leases::names::RELEASE_FAILURES;
use crate::leases::respond::not_acquired;
use crate::limiter::{Limiter, PolicyIndex};
use crate::problem;
use crate::rule::{PeerIp, Rule, no_peer, subject};

/// A boxed task the app runs to completion (the reference app gives `tokio::spawn`).
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs a [`Task`] in the background.
pub type Spawner = Arc<dyn Fn(Task) + Send + Sync>;

#[derive(Clone)]
struct Shared {
    limiter: Arc<Limiter>,
    /// The rules, each with its policy's index (`None`: the limiter has no such policy).
    rules: Vec<(Rule, Option<PolicyIndex>)>,
    peer: PeerIp,
    spawner: Option<Spawner>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("rules", &self.rules.len())
            .field("spawner", &self.spawner.is_some())
            .finish_non_exhaustive()
    }
}

/// The concurrency middleware's layer. See the module docs.
#[derive(Debug, Clone)]
pub struct ConcurrencyLayer {
    shared: Arc<Shared>,
}

impl ConcurrencyLayer {
    /// A layer holding a lease of each matching rule's policy (a concurrency policy) with
    /// `limiter`. Give it a [`PeerIp`] with [`Self::with_peer_ip`] when a rule uses `ip`.
    pub fn new(limiter: Arc<Limiter>, rules: Vec<Rule>) -> Self {
        let rules = rules
            .into_iter()
            .map(|r| {
                let index = limiter.resolve(r.policy());
                (r, index)
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                limiter,
                rules,
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

    /// The same layer, running the releases of dropped bodies with `spawner`.
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

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = Concurrency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The concurrency middleware's service. See the module docs.
#[derive(Debug, Clone)]
pub struct Concurrency<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The future of [`Concurrency`].
pub type ConcurrencyFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<LeaseBody<B>>, Infallible>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Concurrency<S>
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
    type Response = Response<LeaseBody<ResBody>>;
    type Error = Infallible;
    type Future = ConcurrencyFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone is the one that was not made ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.shared.rules.iter().any(|(r, _)| r.matches(&req)) {
            let call = inner.call(req);
            return Box::pin(async move { Ok(call.await?.map(LeaseBody::plain)) });
        }
        Box::pin(hold(self.shared.clone(), inner, req))
    }
}

/// Acquires the leases of the rules matching `req`, then calls `inner` with them held.
async fn hold<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<LeaseBody<ResBody>>, Infallible>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>, Error = Infallible>,
    ResBody: Body + From<String>,
{
    let limiter = &shared.limiter;
    let mut held: Vec<LeaseId> = Vec::new();
    let mut taken: Vec<(PolicyIndex, shared_contract::SubjectDigest)> = Vec::new();
    for (rule, index) in &shared.rules {
        if !rule.matches(&req) {
            continue;
        }
        let refused = |r: Response<ResBody>| r.map(LeaseBody::plain);
        let Some(index) = *index else {
            release_all(limiter, std::mem::take(&mut held)).await;
            return Ok(refused(problem::internal(
                "a route names a policy the provider does not have",
            )));
        };
        let digest = match subject(rule, &req, shared.peer, limiter) {
            Ok(d) => d,
            Err(r) => {
                release_all(limiter, std::mem::take(&mut held)).await;
                return Ok(refused(r));
            }
        };
        // Two rules over one policy and subject hold one place, not two.
        if taken.contains(&(index, digest)) {
            continue;
        }
        taken.push((index, digest));
        let policy = limiter.policy(index).id().clone();
        let outcome = match limiter.acquire(index, digest).await {
            Ok(AcquireOutcome::Acquired(lease)) => {
                held.push(lease.id);
                continue;
            }
            Ok(o) => o,
            Err(e) => {
                release_all(limiter, std::mem::take(&mut held)).await;
                return Ok(refused(problem::internal(&e.to_string())));
            }
        };
        let denied = matches!(outcome, AcquireOutcome::Denied { .. });
        if !denied && limiter.fails_open(&policy) {
            tracing::debug!(%policy, outcome = outcome.name(), "no lease; fail_open lets the request through");
            continue;
        }
        release_all(limiter, std::mem::take(&mut held)).await;
        let response = not_acquired(&outcome)
            .unwrap_or_else(|| problem::internal("an acquired lease answered as not acquired"));
        return Ok(refused(response));
    }
    let response = inner.call(req).await?;
    let guard = Guard {
        limiter: shared.limiter.clone(),
        leases: held,
        spawner: shared.spawner.clone(),
    };
    Ok(response.map(|b| LeaseBody::new(b, guard)))
}

/// Releases `leases`, logging and counting those that did not answer `released` (an
/// `expired` lease was free already; anything else expires by its TTL).
async fn release_all(limiter: &Limiter, leases: Vec<LeaseId>) {
    for lease in leases {
        let policy = lease.policy_id.clone();
        match limiter.release(lease).await {
            Ok(ReleaseOutcome::Released | ReleaseOutcome::Expired) => {}
            Ok(other) => tracing::warn!(
                %policy,
                outcome = other.name(),
                "a lease was not released; it expires by its TTL"
            ),
            Err(e) => {
                tracing::warn!(%policy, error = %e, "a lease was not released; it expires by its TTL")
            }
        }
    }
}

/// The leases one response holds until its body ends or is dropped.
struct Guard {
    limiter: Arc<Limiter>,
    leases: Vec<LeaseId>,
    spawner: Option<Spawner>,
}

impl Guard {
    fn into_release(mut self) -> Task {
        let limiter = self.limiter.clone();
        let leases = std::mem::take(&mut self.leases);
        Box::pin(async move { release_all(&limiter, leases).await })
    }
}

/// Hands `task` to `spawner`, or polls it once without one: a task the provider answers at
/// once (the local provider) completes; any other is abandoned, and `abandoned` says so.
pub(crate) fn run_detached(task: Task, spawner: Option<&Spawner>, abandoned: impl FnOnce()) {
    if let Some(spawn) = spawner {
        spawn(task);
        return;
    }
    let mut task = task;
    let mut cx = Context::from_waker(Waker::noop());
    if task.as_mut().poll(&mut cx).is_pending() {
        abandoned();
    }
}

/// What an abandoned release of `leases` leaves: logged and counted; they expire by their TTL.
fn releases_abandoned(leases: &[LeaseId]) {
    for lease in leases {
        metrics::counter!(RELEASE_FAILURES, "policy" => lease.policy_id.to_string()).increment(1);
    }
    tracing::warn!(
        leases = leases.len(),
        "a dropped response's leases could not be released without a spawner; they expire by their TTL"
    );
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let leases = self.leases.clone();
        let spawner = self.spawner.clone();
        let limiter = self.limiter.clone();
        let taken = std::mem::take(&mut self.leases);
        run_detached(
            Box::pin(async move { release_all(&limiter, taken).await }),
            spawner.as_ref(),
            || releases_abandoned(&leases),
        );
    }
}

/// A response body that releases its request's leases when it ends or is dropped.
///
/// When the inner body says its last data frame is out (`is_end_stream` after a frame), the
/// release runs before that frame is handed on, so a client that sends its next request as
/// soon as it has the whole response finds the place free.
pub struct LeaseBody<B: Body> {
    inner: B,
    guard: Option<Guard>,
    /// The release started at the end of the body; the end is reported once it finished.
    releasing: Option<Task>,
    /// The last frame, held back until the release finished.
    last: Option<Frame<B::Data>>,
}

impl<B: Body> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseBody")
            .field("leases", &self.guard.as_ref().map_or(0, |g| g.leases.len()))
            .finish_non_exhaustive()
    }
}

impl<B: Body> LeaseBody<B> {
    /// A body that holds no lease.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            guard: None,
            releasing: None,
            last: None,
        }
    }

    fn new(inner: B, guard: Guard) -> Self {
        Self {
            inner,
            guard: (!guard.leases.is_empty()).then_some(guard),
            releasing: None,
            last: None,
        }
    }

    /// The wrapped body; its leases are released now (as when it is dropped).
    pub fn into_inner(mut self) -> B
    where
        B: Default,
    {
        std::mem::take(&mut self.inner)
    }

    /// How many leases this body still holds.
    pub fn leases_held(&self) -> usize {
        self.guard.as_ref().map_or(0, |g| g.leases.len())
    }
}

impl<B: Body> Drop for LeaseBody<B> {
    fn drop(&mut self) {
        // A release started at the end of the body finishes in the background.
        if let Some(task) = self.releasing.take() {
            let spawner = self.guard.as_ref().and_then(|g| g.spawner.clone());
            run_detached(task, spawner.as_ref(), || releases_abandoned(&[]));
        }
    }
}

impl<B: Body + Unpin> Body for LeaseBody<B>
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
            if let Some(task) = this.releasing.as_mut() {
                if task.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.releasing = None;
                return Poll::Ready(this.last.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if this.inner.is_end_stream() => {
                    match this.guard.take() {
                        Some(guard) => {
                            this.releasing = Some(guard.into_release());
                            this.last = Some(frame);
                        }
                        None => return Poll::Ready(Some(Ok(frame))),
                    }
                }
                Poll::Ready(None) => match this.guard.take() {
                    Some(guard) => this.releasing = Some(guard.into_release()),
                    None => return Poll::Ready(None),
                },
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.is_none()
            && self.releasing.is_none()
            && self.last.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
