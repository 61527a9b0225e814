//! One evaluation at the edge: digest the raw subject, give it a deadline, ask the port,
//! record metrics, inside a tracing span that names the policy but never the subject.
//!
//! Policies are resolved once into a [`PolicyIndex`] (by the middleware's rules when the layer
//! is built, by `/v1/evaluate` through a name table), and each policy's metric handles are
//! registered when the [`Limiter`] is built. An evaluation therefore looks nothing up by name:
//! it records with atomic increments and allocates no label strings.
//!
//! A [`Limiter`] is built from plain parts (the port, the subject hasher, the failure policy,
//! the deadline budget), so any composition of the port can be put behind the edge: the
//! reference app's, or one an application builds in code.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};
use shared_contract::{
    Cost, Deadline, EdgeRateLimitPort, EvaluationId, FailurePolicy, Limit, Limits, MultiOutcome,
    MultiRequest, PolicyId, PolicySet, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    RequestError, Source, SubjectDigest,
};
use tracing::Instrument as _;

use crate::subject::SubjectHasher;

/// Metric names, as `/metrics` shows them.
pub mod names {
    /// Evaluations, by `policy` and `outcome`.
    pub const DECISIONS: &str = "rate_limit_decisions_total";
    /// Evaluated decisions (allowed or denied, shadow mode included), by `policy` and `source`.
    pub const DECISIONS_BY_SOURCE: &str = "rate_limit_decisions_by_source_total";
    /// Histogram of the port's latency in seconds, by `policy`.
    pub const LATENCY: &str = "rate_limit_evaluation_duration_seconds";
    /// Outcomes without a decision, by error `category`.
    pub const PROVIDER_ERRORS: &str = "rate_limit_provider_errors_total";
    /// Gauge of the circuit breaker: 0 closed, 1 open, 2 half open.
    pub const BREAKER_STATE: &str = "rate_limit_circuit_breaker_state";
}

/// Every decision source, in the order of [`PolicyMetrics`]'s per-source counters.
const SOURCES: [Source; 4] = [
    Source::GlobalRedis,
    Source::LocalCache,
    Source::Local,
    Source::LocalFallback,
];

/// One policy's decision counters ([`names::DECISIONS`] by outcome,
/// [`names::DECISIONS_BY_SOURCE`] by who decided) and latency histogram, registered once.
/// Only the limiter records them, so every entry point (the middleware, `/v1/evaluate`, the
/// gRPC server) counts alike.
#[derive(Debug)]
struct PolicyMetrics {
    /// Evaluated decisions that allowed the request.
    allowed: Counter,
    /// Evaluated decisions that denied the request (shadow mode excluded).
    denied: Counter,
    /// Outcomes without a decision, nothing charged ([`RateLimitOutcome::Unavailable`]).
    unavailable: Counter,
    /// Outcomes without a decision that may have charged quota
    /// ([`RateLimitOutcome::Indeterminate`]).
    indeterminate: Counter,
    /// Outcomes refused for a state, program or reply mismatch
    /// ([`RateLimitOutcome::Incompatible`]).
    incompatible: Counter,
    /// Denials of a limit in shadow mode: the request went through, the limit would have
    /// refused it.
    shadow_denied: Counter,
    /// The port's latency, in seconds.
    latency: Histogram,
    /// One counter per [`SOURCES`] entry: see [`Self::count_source`].
    by_source: [Counter; SOURCES.len()],
}

impl PolicyMetrics {
    /// Registers the handles of `policy` with the metrics recorder installed now (without one, they
    /// record nothing).
    fn new(policy: &PolicyId) -> Self {
        let c = |outcome: &'static str| metrics::counter!(names::DECISIONS, "policy" => policy.as_str().to_owned(), "outcome" => outcome);
        Self {
            allowed: c("allowed"),
            denied: c("denied"),
            unavailable: c("unavailable"),
            indeterminate: c("indeterminate"),
            incompatible: c("incompatible"),
            shadow_denied: c("shadow_denied"),
            latency: metrics::histogram!(names::LATENCY, "policy" => policy.as_str().to_owned()),
            by_source: SOURCES.map(|source| metrics::counter!(names::DECISIONS_BY_SOURCE, "policy" => policy.as_str().to_owned(), "source" => source.as_str())),
        }
    }

    /// Counts one evaluated decision (allowed or denied, shadow mode included) under its
    /// `source`, wherever `allowed`, `denied` or `shadow_denied` is counted. A source this
    /// build does not know (the contract's enum is open) is not counted.
    fn count_source(&self, source: Source) {
        if let Some(i) = SOURCES.iter().position(|s| *s == source) {
            self.by_source[i].increment(1);
        }
    }
}

/// A [`Limiter`] under construction ([`Limiter::builder`]).
#[must_use = "a builder does nothing until built"]
pub struct LimiterBuilder {
    port: Arc<dyn EdgeRateLimitPort>,
    secret: Option<crate::subject::SubjectSecret>,
    budget: Duration,
}

impl LimiterBuilder {
    /// Each evaluation's deadline when none is given.
    pub const DEFAULT_BUDGET: Duration = Duration::from_secs(1);

    /// The key subjects are digested with (at least 32 bytes); the same on every instance
    /// that shares a provider's state.
    pub fn secret(mut self, secret: crate::subject::SubjectSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// How long one evaluation may take, from the request's arrival.
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The limiter. Registers its metrics as [`Limiter::new`] does.
    pub fn build(self) -> Limiter {
        let secret = self
            .secret
            .unwrap_or_else(crate::subject::SubjectSecret::random);
        // Only a request for a policy the port does not know falls back to this: a policy
        // carries its own failure policy.
        Limiter::new(
            self.port,
            SubjectHasher::new(&secret),
            FailurePolicy::FailClosed,
            self.budget,
        )
    }
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// A policy of one [`Limiter`], resolved by [`Limiter::resolve`]. Only meaningful for the
/// limiter that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyIndex(usize);

/// One limit of a multi-limit evaluation ([`Limiter::evaluate_all`]), its subject digested
/// already ([`Limiter::digest`], [`Limiter::digest_parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The limit's policy, resolved by the limiter that evaluates it.
    pub index: PolicyIndex,
    /// The digested subject the limit is charged to.
    pub subject: SubjectDigest,
    /// The units the limit is charged.
    pub cost: Cost,
}

#[derive(Debug)]
struct Entry {
    policy: RateLimitPolicy,
    metrics: PolicyMetrics,
}

/// A circuit breaker around the port, as far as the edge sees it: the value of the
/// [`names::BREAKER_STATE`] gauge (0 closed, 1 open, 2 half open), refreshed on every scrape.
pub trait BreakerGauge: Send + Sync + fmt::Debug {
    /// The gauge's current value: 0 closed, 1 open, 2 half open.
    fn gauge(&self) -> f64;
}

/// The edge's view of an enabled limiter. Cheap to share (`Arc<Limiter>`).
#[derive(Debug)]
pub struct Limiter {
    port: Arc<dyn EdgeRateLimitPort>,
    hasher: SubjectHasher,
    failure_policy: FailurePolicy,
    budget: Duration,
    breaker: Option<Arc<dyn BreakerGauge>>,
    provider: &'static str,
    entries: Vec<Entry>,
    by_id: HashMap<PolicyId, PolicyIndex>,
    default: PolicyIndex,
    /// [`names::PROVIDER_ERRORS`], one counter per name of
    /// [`RateLimitOutcome::error_categories`], registered once.
    errors: Vec<(&'static str, Counter)>,
}

impl Limiter {
    /// A limiter over `port`: each evaluation digests its subject with `hasher` and gets a
    /// deadline `budget` from now ([`Deadline::MAX_BUDGET`](shared_contract::Deadline::MAX_BUDGET)
    /// when `budget` is zero or longer than that). Whether a request the port could not
    /// decide goes through is its policy's own `failure_policy` ([`Self::fails_open`]);
    /// `failure_policy` here answers only for an id the port has no policy for.
    /// [`Self::builder`] needs neither.
    ///
    /// Registers the metrics of every policy of the port (install the metrics recorder
    /// first; without one, recording is a no-op).
    pub fn new(
        port: Arc<dyn EdgeRateLimitPort>,
        hasher: SubjectHasher,
        failure_policy: FailurePolicy,
        budget: Duration,
    ) -> Self {
        let entries: Vec<Entry> = port
            .policies()
            .iter()
            .map(|p| Entry {
                policy: p.clone(),
                metrics: PolicyMetrics::new(p.id()),
            })
            .collect();
        let by_id = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.policy.id().clone(), PolicyIndex(i)))
            .collect::<HashMap<_, _>>();
        // A policy set always holds its default, so the fallback (the first policy) is never
        // taken.
        let default = by_id
            .get(port.policies().default_id())
            .copied()
            .unwrap_or(PolicyIndex(0));
        // The categories come from the contract, so a category added there has its counter.
        let errors = RateLimitOutcome::error_categories()
            .map(|category| {
                let counter = metrics::counter!(names::PROVIDER_ERRORS, "category" => category);
                (category, counter)
            })
            .collect();
        Self {
            port,
            hasher,
            failure_policy,
            budget,
            breaker: None,
            provider: "custom",
            entries,
            by_id,
            default,
            errors,
        }
    }

    /// A limiter over `port` with the defaults: each request's failure policy is its
    /// policy's own (`fail_closed` unless the policy says otherwise: the one place it is
    /// set), a random subject secret (right for one process; instances sharing a Redis must
    /// share one: [`LimiterBuilder::secret`]), and a deadline of one second per evaluation.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use shared_contract::{PolicySet, RateLimitPolicy, SystemClock};
    /// # use adapter_local::{LocalProvider, LocalSettings};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let api = RateLimitPolicy::token_bucket("api", 5).per(Duration::from_secs(10)).build()?;
    /// let policies = PolicySet::new([api.clone()], api.id().clone())?;
    /// let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
    /// let limiter = edge_middleware::Limiter::builder(Arc::new(port)).build();
    /// assert!(!limiter.fails_open(api.id()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(port: Arc<dyn EdgeRateLimitPort>) -> LimiterBuilder {
        LimiterBuilder {
            port,
            secret: None,
            budget: LimiterBuilder::DEFAULT_BUDGET,
        }
    }

    /// The same limiter, reporting `breaker`'s state on `/metrics`.
    #[must_use]
    pub fn with_breaker(mut self, breaker: Arc<dyn BreakerGauge>) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// The same limiter, naming its provider `provider` (`/readyz` shows it; `"custom"` until
    /// named).
    #[must_use]
    pub fn with_provider_name(mut self, provider: &'static str) -> Self {
        self.provider = provider;
        self
    }

    /// The policy `id` of this limiter, if it has one.
    pub fn resolve(&self, id: &PolicyId) -> Option<PolicyIndex> {
        self.by_id.get(id).copied()
    }

    /// The policy set's default policy.
    pub fn default_policy(&self) -> PolicyIndex {
        self.default
    }

    /// Every policy of this limiter with its index.
    pub fn indexed(&self) -> impl Iterator<Item = (PolicyIndex, &RateLimitPolicy)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (PolicyIndex(i), &e.policy))
    }

    /// The policy at `index`.
    ///
    /// # Panics
    /// When `index` was not made by this limiter's [`Self::resolve`] or [`Self::indexed`]
    /// and is out of its range.
    pub fn policy(&self, index: PolicyIndex) -> &RateLimitPolicy {
        &self.entries[index.0].policy
    }

    /// Whether the policy at `index` is in shadow mode ([`RateLimitPolicy::shadow`]).
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub fn is_shadow(&self, index: PolicyIndex) -> bool {
        self.entries[index.0].policy.shadow()
    }

    /// The port this limiter asks.
    pub fn port(&self) -> &Arc<dyn EdgeRateLimitPort> {
        &self.port
    }

    /// The provider's name: `"custom"`, or what [`Self::with_provider_name`] set.
    pub fn provider_name(&self) -> &'static str {
        self.provider
    }

    /// The policies of the port.
    pub fn policies(&self) -> &PolicySet {
        self.port.policies()
    }

    /// The global failure policy, which applies to a policy id the port does not know.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }

    /// Whether the request goes through: an evaluated allow, a non-evaluated outcome of a
    /// policy that fails open, or any outcome of a policy in shadow mode (which never
    /// denies). (`fallback_local` answers are evaluated already.)
    pub fn allows(&self, outcome: &RateLimitOutcome) -> bool {
        let policy = outcome.policy_id();
        if self
            .policies()
            .get(policy)
            .is_some_and(RateLimitPolicy::shadow)
        {
            return true;
        }
        match outcome {
            RateLimitOutcome::Evaluated(d) => d.allowed,
            _ => self.fails_open(policy),
        }
    }

    /// Whether a request without a decision for `policy` goes through: the policy's own
    /// `failure_policy` (which is the global one unless the policy sets its own) is
    /// `fail_open`. An unknown id falls back to the limiter's global failure policy.
    pub fn fails_open(&self, policy: &PolicyId) -> bool {
        self.policies()
            .get(policy)
            .map_or(self.failure_policy, RateLimitPolicy::failure_policy)
            == FailurePolicy::FailOpen
    }

    /// The breaker's [`names::BREAKER_STATE`] gauge value, when there is a breaker.
    pub fn breaker_gauge(&self) -> Option<f64> {
        self.breaker.as_ref().map(|b| b.gauge())
    }

    /// `HMAC-SHA256(secret, raw)`: the subject digest of one raw subject.
    pub fn digest(&self, raw: &[u8]) -> SubjectDigest {
        self.hasher.digest(raw)
    }

    /// The digest of a subject composed of `parts` ([`SubjectHasher::digest_parts`]).
    pub fn digest_parts(&self, parts: &[&[u8]]) -> SubjectDigest {
        self.hasher.digest_parts(parts)
    }

    /// The length-prefixed digest of a subject of several parts, streamed
    /// ([`SubjectHasher::digest_composed`]).
    pub fn digest_composed<'p>(&self, parts: impl IntoIterator<Item = &'p [u8]>) -> SubjectDigest {
        self.hasher.digest_composed(parts)
    }

    /// A deadline `budget` from `start` (a budget that is zero or beyond
    /// [`Deadline::MAX_BUDGET`] gets the longest allowed one).
    pub(crate) fn deadline(&self, start: Instant) -> Deadline {
        Deadline::clamped(start, self.budget)
    }

    /// Evaluates `cost` for the raw subject `raw_subject` under the policy at `index`.
    ///
    /// The subject is digested before this returns: the future borrows only the limiter, not
    /// `raw_subject`, so a caller may hand in bytes it cannot hold across an await.
    ///
    /// # Errors
    /// [`RequestError`] when the port refuses the request (unknown policy, cost above
    /// `max_cost`); nothing was consumed.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub fn evaluate<'a>(
        &'a self,
        index: PolicyIndex,
        raw_subject: &[u8],
        cost: Cost,
    ) -> impl Future<Output = Result<RateLimitOutcome, RequestError>> + Send + use<'a> {
        self.evaluate_digest(index, self.hasher.digest(raw_subject), cost)
    }

    /// [`Self::evaluate`] of a subject digested already.
    ///
    /// # Errors
    /// As [`Self::evaluate`].
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub fn evaluate_digest<'a>(
        &'a self,
        index: PolicyIndex,
        subject: SubjectDigest,
        cost: Cost,
    ) -> impl Future<Output = Result<RateLimitOutcome, RequestError>> + Send + use<'a> {
        self.evaluate_as(index, subject, cost, self.is_shadow(index))
    }

    /// [`Self::evaluate_digest`] of a limit in shadow mode, whatever its policy says (a rule
    /// in shadow mode over an enforcing policy): evaluated and charged as usual; a denial is
    /// counted as `shadow_denied`, not `denied`. What the caller does with the outcome is its
    /// business: the edge lets the request through.
    ///
    /// # Errors
    /// As [`Self::evaluate`].
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub fn evaluate_shadow<'a>(
        &'a self,
        index: PolicyIndex,
        subject: SubjectDigest,
        cost: Cost,
    ) -> impl Future<Output = Result<RateLimitOutcome, RequestError>> + Send + use<'a> {
        self.evaluate_as(index, subject, cost, true)
    }

    /// Every member evaluated on its own in shadow mode ([`Self::evaluate_shadow`]), all at
    /// once: one outcome per member, in order. A shadow limit is not part of the request's
    /// all-or-nothing evaluation (it never denies, so it must not keep the enforced limits
    /// from being charged); the edge evaluates the shadow limits after the enforced ones
    /// admitted the request, so a refused request charges neither.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub async fn evaluate_shadows(
        &self,
        members: &[Member],
    ) -> Vec<Result<RateLimitOutcome, RequestError>> {
        join_all(
            members
                .iter()
                .map(|m| self.evaluate_as(m.index, m.subject, m.cost, true))
                .collect(),
        )
        .await
    }

    pub(crate) fn evaluate_as<'a>(
        &'a self,
        index: PolicyIndex,
        subject: SubjectDigest,
        cost: Cost,
        shadow: bool,
    ) -> impl Future<Output = Result<RateLimitOutcome, RequestError>> + Send + use<'a> {
        let entry = &self.entries[index.0];
        let policy = entry.policy.id();
        let span = tracing::debug_span!(
            "rate_limit.evaluate",
            policy = %policy,
            cost = cost.get(),
            shadow,
            outcome = tracing::field::Empty,
            allowed = tracing::field::Empty,
            source = tracing::field::Empty,
        );
        // One clock read starts both the deadline and the latency measurement.
        let start = Instant::now();
        let request = RateLimitRequest {
            policy_id: policy.clone(),
            subject,
            cost,
            evaluation_id: None,
            deadline: self.deadline(start),
        };
        async move {
            let result = traced(&span, self.port.evaluate(request)).await;
            let elapsed = start.elapsed();
            if let Ok(outcome) = &result {
                self.record(entry, outcome, shadow, elapsed.as_secs_f64());
                if !span.is_disabled() {
                    span.record("outcome", outcome.name());
                    span.record("allowed", self.allows(outcome));
                    if let Some(d) = outcome.decision() {
                        span.record("source", d.source.as_str());
                    }
                    tracing::debug!(
                        parent: &span,
                        micros = elapsed.as_micros() as u64,
                        "rate-limit evaluation"
                    );
                }
            }
            result
        }
    }

    /// Evaluates `members` as one, all-or-nothing ([`EdgeRateLimitPort::evaluate_all`]), with
    /// `evaluation_id` when given (a retry answers the first decision, `replayed`).
    ///
    /// Every member is enforced here, whatever its policy's shadow mode: callers evaluate
    /// the shadow members apart ([`Self::evaluate_shadows`]).
    ///
    /// Metrics count per policy what happened to the request: `allowed` when it was charged,
    /// `denied` for every member of a denied evaluation (nothing was charged, even for the
    /// members that would have admitted), the failure outcome for every member otherwise. A
    /// replay is counted like the decision it replays.
    ///
    /// # Errors
    /// [`RequestError`] for no members, more than [`shared_contract::MAX_LIMITS`], a policy
    /// and subject twice, or what the port refuses; nothing was consumed.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub fn evaluate_all<'a>(
        &'a self,
        members: &[Member],
        evaluation_id: Option<EvaluationId>,
    ) -> impl Future<Output = Result<MultiOutcome, RequestError>> + Send + use<'a> {
        let entries: Vec<&'a Entry> = members.iter().map(|m| &self.entries[m.index.0]).collect();
        let limits = members
            .iter()
            .zip(&entries)
            .map(|(m, e)| Limit {
                policy_id: e.policy.id().clone(),
                subject: m.subject,
                cost: m.cost,
            })
            .collect();
        let span = tracing::debug_span!(
            "rate_limit.evaluate_all",
            limits = members.len(),
            policies = tracing::field::Empty,
            costs = tracing::field::Empty,
            outcome = tracing::field::Empty,
            allowed = tracing::field::Empty,
            source = tracing::field::Empty,
        );
        if !span.is_disabled() {
            // Joined only for a span someone listens to: the policy ids and costs, never a
            // subject (the members hold digests, which are not recorded either).
            let policies: Vec<&str> = entries.iter().map(|e| e.policy.id().as_str()).collect();
            let costs: Vec<String> = members.iter().map(|m| m.cost.get().to_string()).collect();
            span.record("policies", policies.join(","));
            span.record("costs", costs.join(","));
        }
        let start = Instant::now();
        let request = Limits::new(limits).map(|limits| MultiRequest {
            limits,
            evaluation_id,
            deadline: self.deadline(start),
        });
        async move {
            let result = traced(&span, self.port.evaluate_all(request?)).await;
            let elapsed = start.elapsed();
            if let Ok(outcome) = &result {
                self.record_all(&entries, outcome, elapsed.as_secs_f64());
                if !span.is_disabled() {
                    span.record("outcome", outcome.name());
                    span.record("allowed", outcome.decision().is_some_and(|d| d.allowed));
                    // The first member's source: one provider decided them all.
                    if let Some(d) = outcome.decision().and_then(|d| d.decisions.first()) {
                        span.record("source", d.source.as_str());
                    }
                }
            }
            result
        }
    }

    /// Counts `outcome` of `members` in the decision metrics, as [`Self::evaluate_all`] does.
    pub(crate) fn record_members(&self, members: &[Member], outcome: &MultiOutcome, seconds: f64) {
        let entries: Vec<&Entry> = members.iter().map(|m| &self.entries[m.index.0]).collect();
        self.record_all(&entries, outcome, seconds);
    }

    fn record_all(&self, entries: &[&Entry], outcome: &MultiOutcome, seconds: f64) {
        for (i, entry) in entries.iter().enumerate() {
            let single = match outcome {
                MultiOutcome::Evaluated(d) => match d.decisions.get(i) {
                    Some(member) => {
                        RateLimitOutcome::Evaluated(shared_contract::RateLimitDecision {
                            allowed: d.allowed,
                            ..member.clone()
                        })
                    }
                    None => continue,
                },
                failure => failure.clone().into_single(entry.policy.id()),
            };
            self.record(entry, &single, false, seconds);
        }
    }

    fn record(&self, entry: &Entry, outcome: &RateLimitOutcome, shadow: bool, seconds: f64) {
        let m = &entry.metrics;
        m.latency.record(seconds);
        if let RateLimitOutcome::Evaluated(d) = outcome {
            m.count_source(d.source);
        }
        match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => m.allowed.increment(1),
            RateLimitOutcome::Evaluated(_) if shadow => m.shadow_denied.increment(1),
            RateLimitOutcome::Evaluated(_) => m.denied.increment(1),
            RateLimitOutcome::Unavailable { .. } => m.unavailable.increment(1),
            RateLimitOutcome::Indeterminate { .. } => m.indeterminate.increment(1),
            RateLimitOutcome::Incompatible { .. } => m.incompatible.increment(1),
        }
        let Some(category) = outcome.error_category() else {
            return;
        };
        if let Some((_, counter)) = self.errors.iter().find(|(c, _)| *c == category) {
            counter.increment(1);
        }
    }
}

/// `evaluation`, inside `span` when it is enabled: a disabled span (the usual case in
/// production) is not entered on every poll.
async fn traced<F: Future>(span: &tracing::Span, evaluation: F) -> F::Output {
    if span.is_disabled() {
        evaluation.await
    } else {
        evaluation.instrument(span.clone()).await
    }
}

/// Every future of `futures` polled to completion together; their outputs in order. (The
/// edge depends on no futures crate for this one use.)
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *output = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
