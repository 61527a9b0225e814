//! `RateLimitLayer` wraps, `RateLimit<S>` works (tower's `limit::rate` shape).
//!
//! For each request, every rule that matches it ([`Rule`]: path prefix, methods, host, header
//! conditions) contributes one limit: its policy, its subject (read and digested), its cost.
//! The limits of one request are **one all-or-nothing evaluation**: one matching rule is one
//! single evaluation; several are one [`evaluate_all`](shared_contract::EdgeRateLimitPort::evaluate_all),
//! so either every policy is charged or none is. Then:
//!
//! - every policy allowed: the inner service answers, and the response gets the draft-11
//!   `RateLimit-Policy` / `RateLimit` headers (one member per matching rule, in rule order);
//! - any policy denied: nothing was charged anywhere; 429 problem+json (quota-exceeded,
//!   `violated-policies` naming every policy that denied), the headers, and `Retry-After` in
//!   whole seconds rounded up: the latest retry among the violated policies, and never
//!   earlier than the `t` of a member with `r=0` (see [`crate::headers`]). The members of
//!   policies that would have admitted show the figures they would have had after the charge,
//!   as the port reports them;
//! - no decision (unavailable, indeterminate, incompatible): under `fail_open` the request
//!   goes through; otherwise 503 problem+json, with `Retry-After` when the provider gave a
//!   retry hint.
//!
//! A rule or policy in **shadow mode** ([`Rule::with_shadow`],
//! [`shared_contract::RateLimitPolicy::shadow`]) never denies: the request's enforced limits
//! are evaluated first, as above; when they let it through, every shadow limit is evaluated
//! on its own (all at once) and charged as usual, and its member is added to the headers
//! after the enforced ones. A refused request charges no shadow limit, a shadow limit that
//! would deny never keeps the enforced ones from being charged, and a provider failure of a
//! shadow limit lets the request through.
//!
//! At most [`MAX_LIMITS`] rules may match one request (one evaluation takes at most that
//! many limits): a request matching more is answered 500 problem+json and charged nothing.
//! The reference app's configuration refuses rule sets where a request could match more
//! ([`crate::rule::most_overlapping`]), so there this answer never happens. Two matching rules
//! that name the same policy for the same subject are one limit of their summed cost (400
//! `invalid_cost` when the sum is above the policy's `max_cost`).
//!
//! A request without a subject part (no such header, no peer address, no such path segment)
//! is limited under that part empty: all such requests share one quota, so leaving a header
//! out is never a way around the limit. A subject header or path segment longer than
//! [`MAX_SUBJECT_BYTES`](crate::subject::MAX_SUBJECT_BYTES) (256, the bound of `/v1/evaluate` as well) under any matching rule
//! is 400 problem+json `subject_too_long`; a cost header that is missing, not a whole number,
//! 0 or above the policy's `max_cost` is 400 `invalid_cost` naming the header. Both are
//! answered before anything is evaluated: nothing is charged.
//!
//! The service never fails: its error type is `Infallible`, like the inner service's.
//!
//! The middleware is plain tower over `http` types, generic over the request body and over a
//! response body that can be built from text (the problem+json answers): it works under axum,
//! hyper or any tower stack. The peer address is the server's business, so `ip` subjects read
//! it through a [`PeerIp`] function given with [`RateLimitLayer::with_peer_ip`] (under axum:
//! `ConnectInfo<SocketAddr>`); without one, every request has the empty `ip` subject.
//!
//! The common case, one matching rule, allocates nothing per request beyond the response
//! headers: members are gathered on the stack, and the rule's `RateLimit-Policy` value is
//! built once, when the layer is.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, header};
use shared_contract::{
    Clock, Cost, MAX_LIMITS, MultiOutcome, PolicyId, RateLimitDecision, RateLimitOutcome,
    RateLimitPolicy, SystemClock,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::headers;
use crate::limiter::{Limiter, Member, PolicyIndex};
use crate::problem;
pub use crate::rule::{PeerIp, Rule};
use crate::rule::{RuleCost, no_peer, subject};
use crate::subject::SubjectSource;

/// A rule's policy, resolved in the limiter when the layer is built.
#[derive(Debug, Clone)]
struct Resolved {
    index: PolicyIndex,
    /// The `RateLimit-Policy` value of the policy alone, built once: it depends only on the
    /// policy, and one matching rule is the common case.
    policy_value: HeaderValue,
    /// The rule or its policy is in shadow mode: evaluated apart, never denies.
    shadow: bool,
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

/// A policy id that a layer was asked for and its limiter does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no policy {id:?} in this limiter; it has: {}", .known.join(", "))]
pub struct UnknownPolicy {
    /// The id asked for.
    pub id: String,
    /// The limiter's policy ids, in its order.
    pub known: Vec<String>,
}

impl UnknownPolicy {
    fn new(id: &str, limiter: &Limiter) -> Self {
        Self {
            id: id.to_owned(),
            known: limiter
                .indexed()
                .map(|(_, p)| p.id().as_str().to_owned())
                .collect(),
        }
    }
}

/// The middleware's layer. See the module docs.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl RateLimitLayer {
    /// A layer applying `rules` with `limiter`. Give it a [`PeerIp`] with
    /// [`Self::with_peer_ip`] when a rule limits by `ip`.
    pub fn new(limiter: Arc<Limiter>, rules: Vec<Rule>) -> Self {
        let resolved = rules
            .iter()
            .map(|r| {
                limiter.resolve(r.policy()).map(|index| {
                    let mut v = String::new();
                    headers::push_policy(&mut v, limiter.policy(index));
                    Resolved {
                        index,
                        policy_value: headers::value(v),
                        shadow: r.shadow() || limiter.is_shadow(index),
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

    /// A layer for one route, to hang on it with axum's `route_layer`: every request that
    /// reaches it is limited by `policy` (cost 1), its subject read from `subject`.
    ///
    /// The trade-off with [`Self::new`]: here the route decides what is limited, so the limit
    /// cannot drift from the routes, and a route without the layer is never limited. A rule
    /// list matches path prefixes, methods, hosts and headers of its own, across routes, and
    /// can come from a configuration file (reloaded without a restart); it can also give costs
    /// and several subjects ([`Rule`]), and every rule matching a request is one
    /// all-or-nothing evaluation. Both can be combined: layers of both kinds on one route are
    /// evaluated one after the other, each charging on its own.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use edge_middleware::{Limiter, RateLimitLayer, SubjectSource};
    /// # fn limited(limiter: Arc<Limiter>, policy: shared_contract::PolicyId) -> axum::Router {
    /// axum::Router::new()
    ///     .route("/login", axum::routing::post(|| async { "welcome" }))
    ///     .route_layer(RateLimitLayer::for_route(
    ///         limiter,
    ///         policy,
    ///         SubjectSource::Header("x-api-key".into()),
    ///     ))
    ///     .route("/healthz", axum::routing::get(|| async { "ok" }))
    /// # }
    /// ```
    pub fn for_route(limiter: Arc<Limiter>, policy: PolicyId, subject: SubjectSource) -> Self {
        Self::new(limiter, vec![Rule::new("/", policy, subject)])
    }

    /// A layer for one route limited by every `(policy id, subject)` of `limits` at once, all
    /// or nothing (each at cost 1): the request goes through only when every policy admits
    /// it, and a denial charges none of them. Unlike [`Self::for_route`], an id `limiter`
    /// does not have is an error here, when the layer is made, rather than a 500 per request:
    /// the form for ids that come from a configuration file.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use edge_middleware::{Limiter, RateLimitLayer, SubjectSource};
    /// # fn limited(limiter: Arc<Limiter>) -> Result<axum::Router, edge_middleware::UnknownPolicy> {
    /// let per_user_and_tenant = RateLimitLayer::for_policies(
    ///     &limiter,
    ///     [("user", SubjectSource::header("x-user")), ("tenant", SubjectSource::header("x-tenant"))],
    /// )?;
    /// Ok(axum::Router::new().route(
    ///     "/reports",
    ///     axum::routing::get(|| async { "report" }).route_layer(per_user_and_tenant),
    /// ))
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`UnknownPolicy`] naming the first id `limiter` lacks and the ids it has.
    pub fn for_policies<'a>(
        limiter: &Arc<Limiter>,
        limits: impl IntoIterator<Item = (&'a str, SubjectSource)>,
    ) -> Result<Self, UnknownPolicy> {
        let rules = limits
            .into_iter()
            .map(|(id, subject)| {
                let policy = PolicyId::new(id)
                    .ok()
                    .filter(|p| limiter.resolve(p).is_some())
                    .ok_or_else(|| UnknownPolicy::new(id, limiter))?;
                Ok(Rule::new("/", policy, subject))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self::new(limiter.clone(), rules))
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
        if !self.shared.rules.iter().any(|r| r.matches(&req)) {
            return Box::pin(self.inner.call(req));
        }
        // The clone is the one that was not made ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(limit(shared, inner, req))
    }
}

/// The limits of one request while they are gathered, on the stack: at most [`MAX_LIMITS`].
struct Gathered<'s> {
    members: [Option<Member>; MAX_LIMITS],
    resolved: [Option<&'s Resolved>; MAX_LIMITS],
    len: usize,
}

/// The limits of one request as they are evaluated. Small, because the request's future
/// holds it across the evaluation (and a larger future costs a larger copy into its box).
enum Limits<'s> {
    /// The common case: one single evaluation, nothing on the heap.
    One(Member, &'s Resolved),
    Many(Vec<Member>, Vec<&'s Resolved>),
}

impl<'s> Gathered<'s> {
    fn finish(&self) -> Option<Limits<'s>> {
        match (self.members[0], self.resolved[0]) {
            (Some(m), Some(r)) if self.len == 1 => Some(Limits::One(m, r)),
            _ if self.len > 1 => Some(Limits::Many(
                self.members[..self.len].iter().flatten().copied().collect(),
                self.resolved[..self.len]
                    .iter()
                    .flatten()
                    .copied()
                    .collect(),
            )),
            _ => None,
        }
    }
}

/// The limits of the rules that match `req`, or the answer when they cannot be evaluated (a
/// rule without its policy, too many rules, an oversized subject, a bad cost header).
fn gather<'s, B, R: From<String>>(
    shared: &'s Shared,
    req: &Request<B>,
) -> Result<Limits<'s>, Response<R>> {
    let limiter = &shared.limiter;
    let mut g = Gathered {
        members: [None; MAX_LIMITS],
        resolved: [None; MAX_LIMITS],
        len: 0,
    };
    for (rule, resolved) in shared.rules.iter().zip(&shared.resolved) {
        if !rule.matches(req) {
            continue;
        }
        let Some(resolved) = resolved else {
            return Err(problem::internal(
                "a route names a policy the provider does not have",
            ));
        };
        let max_cost = limiter.policy(resolved.index).max_cost().get();
        let cost = rule_cost(rule, req, max_cost, limiter, resolved.index)?;
        let subject = subject(rule, req, shared.peer, limiter)?;
        // A shadow rule and an enforcing one over the same key stay two limits: the shadow
        // one is evaluated apart.
        let same = g.members[..g.len]
            .iter_mut()
            .zip(&g.resolved[..g.len])
            .find_map(|(m, r)| match (m, r) {
                (Some(m), Some(r))
                    if m.index == resolved.index
                        && m.subject == subject
                        && r.shadow == resolved.shadow =>
                {
                    Some(m)
                }
                _ => None,
            });
        if let Some(m) = same {
            // One key charged by two rules: one limit of the summed cost, as two charges of
            // it one after the other would have been.
            let sum = m.cost.get().saturating_add(cost.get());
            m.cost = match Cost::new(sum) {
                Ok(c) if sum <= max_cost => c,
                _ => {
                    return Err(cost_problem(&format!(
                        "the routes matching this request charge policy {} {sum} for one subject, above its max_cost {max_cost}",
                        limiter.policy(resolved.index).id()
                    )));
                }
            };
            continue;
        }
        if g.len == MAX_LIMITS {
            return Err(problem::internal(&format!(
                "more than {MAX_LIMITS} routes match this request; one evaluation takes at most {MAX_LIMITS} limits"
            )));
        }
        g.members[g.len] = Some(Member {
            index: resolved.index,
            subject,
            cost,
        });
        g.resolved[g.len] = Some(resolved);
        g.len += 1;
    }
    // Converted here, so the stack arrays are never returned or held across an await.
    g.finish()
        .ok_or_else(|| problem::internal("no route matches this request"))
}

fn cost_problem<R: From<String>>(detail: &str) -> Response<R> {
    problem::bad_request("invalid_cost", detail)
}

/// The cost `rule` charges for `req`: fixed, or its cost header (1..=`max_cost`).
pub(crate) fn rule_cost<B, R: From<String>>(
    rule: &Rule,
    req: &Request<B>,
    max_cost: u64,
    limiter: &Limiter,
    index: PolicyIndex,
) -> Result<Cost, Response<R>> {
    let name = match &rule.cost {
        RuleCost::Fixed(c) => return Ok(*c),
        RuleCost::Header(name) => name,
    };
    let policy = limiter.policy(index).id();
    let Some(value) = req.headers().get(name) else {
        return Err(cost_problem(&format!(
            "the cost header {name} is missing (policy {policy} reads its cost from it)"
        )));
    };
    let text = value.as_bytes();
    let number = (!text.is_empty() && text.len() <= 16 && text.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(text).ok()?.parse::<u64>().ok())
        .flatten();
    match number.map(Cost::new) {
        Some(Ok(c)) if c.get() <= max_cost => Ok(c),
        _ => Err(cost_problem(&format!(
            "the cost header {name} must be a whole number from 1 to max_cost {max_cost} of policy {policy}, got {:?}",
            String::from_utf8_lossy(&text[..text.len().min(32)])
        ))),
    }
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
    let limiter = &shared.limiter;
    // Nothing borrowed from the request lives across an await: the body is `Send` but not
    // `Sync`, so the future could not be `Send` otherwise.
    let gathered = match gather(&shared, &req) {
        Ok(limits) => limits,
        Err(refused) => return Ok(refused),
    };
    let verdict = match gathered {
        Limits::One(m, resolved) if !resolved.shadow => {
            match limiter.evaluate_digest(m.index, m.subject, m.cost).await {
                Ok(RateLimitOutcome::Evaluated(d)) => Some(verdict(
                    &shared,
                    std::slice::from_ref(&resolved),
                    std::slice::from_ref(&d),
                )),
                Ok(other) if limiter.allows(&other) => None,
                Ok(other) => return Ok(unavailable(&other)),
                Err(e) => return Ok(problem::internal(&e.to_string())),
            }
        }
        Limits::One(m, resolved) => match evaluate_many(&shared, vec![m], vec![resolved]).await {
            Ok(v) => v,
            Err(refused) => return Ok(refused),
        },
        Limits::Many(members, resolved) => match evaluate_many(&shared, members, resolved).await {
            Ok(v) => v,
            Err(refused) => return Ok(refused),
        },
    };
    // `None`: no decision, and the failure policy lets the request through without headers.
    let Some(mut verdict) = verdict else {
        return inner.call(req).await;
    };
    let mut response = match verdict.refused.take() {
        Some(r) => r,
        None => match inner.call(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
    };
    let h = response.headers_mut();
    h.insert(headers::RATELIMIT_POLICY_NAME, verdict.policy_value);
    h.insert(headers::RATELIMIT_NAME, verdict.limit_value);
    Ok(response)
}

/// The verdict of a request with several limits, or with a limit in shadow mode, by the
/// shadow split ([`Limiter::evaluate_split`]): the enforced limits first, as one
/// all-or-nothing evaluation (one limit: a single one); when they let the request through,
/// every shadow limit on its own, all at once. Without a
/// decision the request goes through only when every enforced policy fails open. A shadow
/// limit never refuses the request, not even when its provider cannot decide; its decision,
/// when there is one, is in the headers. `Ok(None)`: no decision at all, the request goes
/// through without headers; `Err`: the answer to send instead of calling the inner service
/// (a 503).
async fn evaluate_many<'s, R: From<String>>(
    shared: &'s Shared,
    members: Vec<Member>,
    resolved: Vec<&'s Resolved>,
) -> Result<Option<Verdict<R>>, Response<R>> {
    let limiter = &shared.limiter;
    let shadow: Vec<bool> = resolved.iter().map(|r| r.shadow).collect();
    let split = limiter
        .evaluate_split(&members, &shadow, None)
        .await
        .map_err(|e| problem::internal(&e.to_string()))?;
    let mut decided: Vec<(&Resolved, RateLimitDecision)> = Vec::with_capacity(members.len());
    let enforced = || members.iter().zip(&resolved).filter(|(_, r)| !r.shadow);
    match split.enforced {
        Some(MultiOutcome::Evaluated(d)) => {
            decided.extend(enforced().map(|(_, r)| *r).zip(d.decisions));
        }
        Some(failure) if !split.through => {
            // The rule of [`crate::failure`]: the first policy that does not fail open
            // decides and is named.
            let policies: Vec<&RateLimitPolicy> =
                enforced().map(|(m, _)| limiter.policy(m.index)).collect();
            return Err(match crate::failure::failure_outcome(&policies, failure) {
                Some((_, outcome)) => unavailable(&outcome),
                None => problem::internal("a failure without limits"),
            });
        }
        // Failed open, or every limit in shadow mode: the request goes through.
        _ => {}
    }
    for (i, outcome) in split.shadow {
        if let Ok(RateLimitOutcome::Evaluated(d)) = outcome {
            decided.push((resolved[i], d));
        }
    }
    if decided.is_empty() {
        return Ok(None);
    }
    let (resolved, decisions): (Vec<&Resolved>, Vec<RateLimitDecision>) =
        decided.into_iter().unzip();
    Ok(Some(verdict(shared, &resolved, &decisions)))
}

/// The 503 of an outcome that is not a decision, with `Retry-After` when there is a hint.
fn unavailable<R: From<String>>(outcome: &RateLimitOutcome) -> Response<R> {
    let mut response = problem::unavailable(outcome);
    let hint = match outcome {
        RateLimitOutcome::Unavailable { retry_after_ms, .. }
        | RateLimitOutcome::Indeterminate { retry_after_ms, .. } => *retry_after_ms,
        _ => 0,
    };
    if hint > 0 {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(headers::ceil_secs(hint)),
        );
    }
    response
}

/// What the decisions of a request's limits say: the `RateLimit-Policy` / `RateLimit` values
/// (one member per limit, in order) and, when any denied, the 429.
struct Verdict<R> {
    policy_value: HeaderValue,
    limit_value: HeaderValue,
    refused: Option<Response<R>>,
}

/// The [`Verdict`] of `decisions`, one per `resolved` limit.
fn verdict<R: From<String>>(
    shared: &Shared,
    resolved: &[&Resolved],
    decisions: &[RateLimitDecision],
) -> Verdict<R> {
    let limiter = &shared.limiter;
    let now_ms = shared.clock.now_ms();
    let mut limit_field = Vec::new();
    let mut violated: Vec<&str> = Vec::new();
    // The largest `t` of the members with nothing left, and every violated policy's retry:
    // a 429's `Retry-After` (see `headers`: the draft wants it no earlier than the effective
    // window's end).
    let mut retry_after_secs = 0u64;
    for (d, r) in decisions.iter().zip(resolved) {
        let policy = limiter.policy(r.index);
        let t = headers::effective_window(policy, d, now_ms);
        headers::push_limit(&mut limit_field, policy, d.remaining, t);
        if d.remaining == 0
            && let Some(t) = t
        {
            retry_after_secs = retry_after_secs.max(t);
        }
        if !d.allowed && !r.shadow {
            violated.push(policy.id().as_str());
            retry_after_secs = retry_after_secs.max(headers::retry_after_secs(d));
        }
    }
    let policy_value = match resolved {
        [one] => one.policy_value.clone(),
        many => {
            let mut field = String::new();
            for r in many {
                headers::push_policy(&mut field, limiter.policy(r.index));
            }
            headers::value(field)
        }
    };
    let refused = (!violated.is_empty()).then(|| {
        let mut r = problem::quota_exceeded(&violated);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        r
    });
    Verdict {
        policy_value,
        limit_value: headers::bytes_value(limit_field),
        refused,
    }
}

#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;
