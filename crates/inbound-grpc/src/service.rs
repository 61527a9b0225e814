//! `ShouldRateLimit`: a `RateLimitRequest` checked, its descriptors matched to policies, one
//! all-or-nothing evaluation of every matched descriptor, and the answer in Envoy's terms.
//!
//! | outcome | gRPC answer |
//! | --- | --- |
//! | evaluated, every limit admits | `OK`, each descriptor `OK` |
//! | evaluated, some limit denies (nothing charged) | `OVER_LIMIT`; the denying descriptors `OVER_LIMIT`, the others `OK` |
//! | unknown domain or descriptor, `unknown_descriptor = "allow"` | that descriptor `OK`, no limit |
//! | unknown, `"deny"` | `OVER_LIMIT` without evaluating (nothing charged); unknown descriptors `OVER_LIMIT`, matched ones `UNKNOWN` |
//! | not evaluated, every matched policy `fail_open` | `OK`, matched descriptors `OK` without a limit |
//! | not evaluated, otherwise: provider unavailable / incompatible | gRPC status `UNAVAILABLE` |
//! | not evaluated, otherwise: result unknown (`indeterminate`) | gRPC status `UNKNOWN` |
//! | bad request | gRPC status `INVALID_ARGUMENT`, nothing charged |
//! | a rule with `charge = "after"` (docs/envoy.md): cost 0, a check | `OK` while a cost of 1 would be admitted, else `OVER_LIMIT` (nothing else evaluated) |
//! | a rule with `charge = "after"`: any other cost | charged past the limit if need be: `OK` |
//!
//! A gRPC error status is what Envoy's `failure_mode_deny` acts on: with it true the request is
//! refused, with it false (Envoy's default) it goes through.

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use edge_middleware::descriptors::{
    DescriptorRules, MAX_ENTRIES, MAX_ENTRY_BYTES, UnknownDescriptor,
};
use edge_middleware::{Limiter, Member, failure, headers};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use shared_contract::{
    Cost, FailurePolicy, MAX_LIMITS, MultiOutcome, RateLimitDecision, RateLimitOutcome,
    RateLimitPolicy,
};
use tonic::Status;

/// Most descriptors in one request (matched or not); more is refused before any matching.
pub const MAX_DESCRIPTORS: usize = 64;

/// The service behind `envoy.service.ratelimit.v3.RateLimitService`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RlsService {
    /// What is in force; a request answers on the one it loaded, so a reload
    /// ([`RlsService::replace_with`]) never changes a request in flight.
    current: Arc<ArcSwap<Inner>>,
    /// Joins a call's span to the caller's trace (its W3C `traceparent` metadata); set by
    /// the app when it exports traces, so this crate needs no tracing backend.
    trace_parent: Option<TraceParent>,
}

#[derive(Debug)]
struct Inner {
    /// The edge's limiter: digests, deadlines, evaluations, shadow mode and metrics are the
    /// HTTP edge's own, so the two entry points answer and count alike.
    limiter: Arc<Limiter>,
    rules: DescriptorRules,
    unknown: UnknownDescriptor,
}

/// Makes `span` a child of the trace that a call's metadata (`headers`) names, if any.
pub type TraceParent = fn(headers: &http::HeaderMap, span: &tracing::Span);

/// A descriptor matched to a policy: which limit of the evaluation it is.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Unknown,
    Limit(usize),
    /// A descriptor of a rule that charges after the work: which of the charged limits.
    After(usize),
}

impl RlsService {
    /// A service over `limiter` (the HTTP edge's, when both are served: one set of metrics,
    /// one subject key): descriptors matched by `rules` (each rule's policy must be one of the
    /// limiter's; a rule naming another never matches), subjects digested and evaluations
    /// timed, recorded and split into enforced and shadow limits by the limiter, as at the
    /// HTTP edge.
    pub fn new(limiter: Arc<Limiter>, rules: DescriptorRules, unknown: UnknownDescriptor) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(Inner {
                limiter,
                rules,
                unknown,
            })),
            trace_parent: None,
        }
    }

    /// Puts what `next` answers with in force for this service and every clone of it (a
    /// configuration reload): requests already being answered finish on what they started
    /// with, later ones use `next`'s port, rules and unknown-descriptor answer. This
    /// service's trace hook stays.
    pub fn replace_with(&self, next: &RlsService) {
        self.current.store(next.current.load_full());
    }

    /// The service with each call's span joined to the caller's trace by `parent` (see
    /// [`TraceParent`]).
    #[must_use]
    pub fn with_trace_parent(mut self, parent: TraceParent) -> Self {
        self.trace_parent = Some(parent);
        self
    }

    /// Answers one `RateLimitRequest`.
    ///
    /// # Errors
    /// A gRPC [`Status`]: `INVALID_ARGUMENT` for a bad request (nothing charged),
    /// `UNAVAILABLE` or `UNKNOWN` when the provider could not decide and a matched policy does
    /// not fail open (see the module docs).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        self.should_rate_limit_from(request, &http::HeaderMap::new())
            .await
    }

    /// [`Self::should_rate_limit`] for a call whose metadata is `headers`: its span
    /// (`rls.should_rate_limit`: domain, descriptor count, overall code or gRPC status; never
    /// a descriptor value) joins the caller's trace when a [`TraceParent`] is set.
    ///
    /// # Errors
    /// As [`Self::should_rate_limit`].
    pub async fn should_rate_limit_from(
        &self,
        request: &RateLimitRequest,
        headers: &http::HeaderMap,
    ) -> Result<RateLimitResponse, Status> {
        let span = tracing::debug_span!(
            "rls.should_rate_limit",
            otel.kind = "server",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            overall_code = tracing::field::Empty,
            grpc_status = tracing::field::Empty,
        );
        // A disabled span (no exporter, no debug log) costs nothing more per call.
        let answer = if span.is_disabled() {
            self.answer(request).await
        } else {
            if let Some(parent) = self.trace_parent {
                parent(headers, &span);
            }
            let answer = tracing::Instrument::instrument(self.answer(request), span.clone()).await;
            match &answer {
                Ok(r) => span.record(
                    "overall_code",
                    Code::try_from(r.overall_code).map_or("UNKNOWN", |c| c.as_str_name()),
                ),
                Err(s) => span.record("grpc_status", format!("{:?}", s.code())),
            };
            answer
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            // The domain and counts only: descriptor values are subjects, never logged.
            match &answer {
                Ok(r) => tracing::debug!(
                    domain = %request.domain,
                    descriptors = request.descriptors.len(),
                    overall_code = r.overall_code,
                    "rls.should_rate_limit"
                ),
                Err(s) => tracing::debug!(
                    domain = %request.domain,
                    descriptors = request.descriptors.len(),
                    code = ?s.code(),
                    message = s.message(),
                    "rls.should_rate_limit refused"
                ),
            }
        }
        answer
    }

    async fn answer(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.current.load_full().answer(request).await
    }
}

impl Inner {
    async fn answer(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        check(request)?;
        let (slots, members, after) = self.matched(request)?;
        let unknown = slots.iter().any(|s| matches!(s, Slot::Unknown));
        if unknown && self.unknown == UnknownDescriptor::Deny {
            let statuses = slots
                .iter()
                .map(|s| status_only(matches!(s, Slot::Unknown), Code::Unknown))
                .collect();
            return Ok(response(Code::OverLimit, statuses, Vec::new()));
        }
        if members.is_empty() && after.is_empty() {
            let statuses = slots.iter().map(|_| status_only(false, Code::Ok)).collect();
            return Ok(response(Code::Ok, statuses, Vec::new()));
        }
        let charged = match crate::after::charge(&self.limiter, &after).await {
            Ok(decisions) => decisions,
            Err(crate::after::Refused::Status(status)) => return Err(status),
            Err(crate::after::Refused::Failed(failure)) => {
                let policies: Vec<&RateLimitPolicy> =
                    after.iter().map(|a| self.limiter.policy(a.index)).collect();
                return failed(&slots, &policies, &failure);
            }
        };
        let charged: Vec<(&RateLimitPolicy, RateLimitDecision)> = after
            .iter()
            .map(|a| self.limiter.policy(a.index))
            .zip(charged)
            .collect();
        // A check that denies refuses the request: the other limits are not evaluated.
        let refused = charged.iter().any(|(p, d)| !d.allowed && !p.shadow());
        if refused || members.is_empty() {
            return Ok(answered(&slots, &[], &[], &charged, !refused));
        }
        self.evaluate(&slots, &members, &charged).await
    }

    /// `members` by the shadow split ([`Limiter::evaluate_split`], as at the HTTP edge): the
    /// enforced ones as one all-or-nothing evaluation; when they let the request through,
    /// every shadow one on its own. A shadow descriptor's status is `OK` whatever its limit
    /// decided (its figures are in the status and the headers); it was not evaluated when
    /// the enforced limits refused, and a provider failure of it changes nothing.
    async fn evaluate(
        &self,
        slots: &[Slot],
        members: &[Member],
        charged: &[(&RateLimitPolicy, RateLimitDecision)],
    ) -> Result<RateLimitResponse, Status> {
        let limiter = &self.limiter;
        let policies: Vec<&RateLimitPolicy> =
            members.iter().map(|m| limiter.policy(m.index)).collect();
        let shadow: Vec<bool> = members.iter().map(|m| limiter.is_shadow(m.index)).collect();
        let split = limiter
            .evaluate_split(members, &shadow, None)
            .await
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut decisions: Vec<Option<RateLimitDecision>> = vec![None; members.len()];
        let mut allowed = true;
        let enforced = (0..members.len()).filter(|&i| !shadow[i]);
        match split.enforced {
            Some(MultiOutcome::Evaluated(d)) => {
                allowed = d.allowed;
                for (i, decision) in enforced.zip(d.decisions) {
                    decisions[i] = Some(decision);
                }
            }
            Some(failure) => {
                // An error status unless every enforced policy fails open; then, without
                // shadow limits to report, `OK` without limits.
                let enforced_policies: Vec<&RateLimitPolicy> =
                    enforced.map(|i| policies[i]).collect();
                let answer = failed(slots, &enforced_policies, &failure);
                if !split.through || split.shadow.is_empty() {
                    return answer;
                }
            }
            None => {}
        }
        for (i, outcome) in split.shadow {
            let outcome = outcome.map_err(|e| Status::invalid_argument(e.to_string()))?;
            if let RateLimitOutcome::Evaluated(d) = outcome {
                decisions[i] = Some(d);
            }
        }
        let decisions: Vec<Option<&RateLimitDecision>> =
            decisions.iter().map(Option::as_ref).collect();
        Ok(answered(slots, &policies, &decisions, charged, allowed))
    }

    /// Each descriptor's slot, and the members of the matched ones (a descriptor that repeats
    /// an earlier one's policy and subject shares its member, whose cost is then the sum).
    fn matched(&self, request: &RateLimitRequest) -> Result<Matched, Status> {
        let default_cost = u64::from(request.hits_addend.max(1));
        let mut slots = Vec::with_capacity(request.descriptors.len());
        let mut members: Vec<Member> = Vec::new();
        let mut after: Vec<crate::after::After> = Vec::new();
        // The descriptors of each member, for a message about their summed cost.
        let mut sharing: Vec<Vec<usize>> = Vec::new();
        for (i, d) in request.descriptors.iter().enumerate() {
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            let Some((index, charges_after)) =
                self.rules.find(&request.domain, entries).and_then(|rule| {
                    Some((self.limiter.resolve(rule.policy())?, rule.charges_after()))
                })
            else {
                slots.push(Slot::Unknown);
                continue;
            };
            let policy = self.limiter.policy(index);
            let subject = self
                .limiter
                .digest_composed(d.entries.iter().map(|e| e.value.as_bytes()));
            if charges_after {
                let cost = crate::after::cost(d, request.hits_addend);
                let j = crate::after::add(&mut after, i, (index, subject, cost), policy)?;
                slots.push(Slot::After(j));
                continue;
            }
            let cost = descriptor_cost(d, default_cost);
            // At most MAX_LIMITS members: a scan is cheaper than a map.
            let slot = match members
                .iter()
                .position(|m| m.index == index && m.subject == subject)
            {
                Some(j) => {
                    sharing[j].push(i);
                    let sum = members[j].cost.get().saturating_add(cost);
                    members[j].cost = summed_cost_of(&sharing[j], sum, policy)?;
                    j
                }
                None => {
                    if members.len() == MAX_LIMITS {
                        return Err(Status::invalid_argument(format!(
                            "more than {MAX_LIMITS} descriptors match a rule; one evaluation takes at most {MAX_LIMITS}"
                        )));
                    }
                    members.push(Member {
                        index,
                        subject,
                        cost: cost_of(i, cost, policy)?,
                    });
                    sharing.push(vec![i]);
                    members.len() - 1
                }
            };
            slots.push(Slot::Limit(slot));
        }
        Ok((slots, members, after))
    }
}

/// Each descriptor's slot, the limits evaluated as one, and the limits charged after the work.
type Matched = (Vec<Slot>, Vec<Member>, Vec<crate::after::After>);

/// The descriptor's own `hits_addend` when set and not 0, else the request's.
fn descriptor_cost(d: &RateLimitDescriptor, default_cost: u64) -> u64 {
    match d.hits_addend {
        Some(h) if h.value > 0 => h.value,
        _ => default_cost,
    }
}

/// The cost of descriptor `i` under `policy`, within its `max_cost`.
fn cost_of(i: usize, cost: u64, policy: &RateLimitPolicy) -> Result<Cost, Status> {
    if cost > policy.max_cost().get() {
        return Err(Status::invalid_argument(format!(
            "descriptors[{i}]: hits_addend {cost} is above max_cost {} of policy {}",
            policy.max_cost().get(),
            policy.id()
        )));
    }
    Cost::new(cost).map_err(|e| Status::invalid_argument(format!("descriptors[{i}]: {e}")))
}

/// The cost `sum` of the limit that the descriptors at `indexes` (more than one, in order)
/// share, within `policy`'s `max_cost`: a refusal names them all and their summed cost, since
/// none of them alone need be above it.
fn summed_cost_of(indexes: &[usize], sum: u64, policy: &RateLimitPolicy) -> Result<Cost, Status> {
    let max = policy.max_cost().get();
    if sum <= max {
        return Cost::new(sum).map_err(|e| Status::invalid_argument(e.to_string()));
    }
    let mut names = String::new();
    for (n, i) in indexes.iter().enumerate() {
        names.push_str(match n {
            0 => "",
            n if n + 1 == indexes.len() => " and ",
            _ => ", ",
        });
        names.push_str(&format!("descriptors[{i}]"));
    }
    Err(Status::invalid_argument(format!(
        "{names} have the same policy {} and values, so they are one limit charged their summed cost: summed cost {sum} is above max_cost {max}",
        policy.id()
    )))
}

/// The checks of a request's shape, before anything is matched or charged.
fn check(request: &RateLimitRequest) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(m));
    if request.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if request.domain.len() > MAX_ENTRY_BYTES {
        return bad(format!("domain is longer than {MAX_ENTRY_BYTES} bytes"));
    }
    if request.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return bad(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are accepted",
            request.descriptors.len()
        ));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return bad(format!("descriptors[{i}] has no entries"));
        }
        // A refund of hits charged before: charging it as a cost would do the opposite.
        if d.is_negative_hits {
            return bad(format!(
                "descriptors[{i}] has is_negative_hits (a refund), which this service does not take; nothing was charged"
            ));
        }
        if d.entries.len() > MAX_ENTRIES {
            return bad(format!(
                "descriptors[{i}] has {} entries; at most {MAX_ENTRIES} are accepted",
                d.entries.len()
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            let what = if e.key.is_empty() {
                "an empty key".to_owned()
            } else if e.value.is_empty() {
                "an empty value".to_owned()
            } else if e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
                format!("a key or value longer than {MAX_ENTRY_BYTES} bytes")
            } else {
                continue;
            };
            return bad(format!("descriptors[{i}].entries[{j}] has {what}"));
        }
    }
    Ok(())
}

fn response(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    headers: Vec<HeaderValue>,
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: headers,
        ..Default::default()
    }
}

/// A status without a limit: `OVER_LIMIT` when `over`, else `otherwise`.
fn status_only(over: bool, otherwise: Code) -> DescriptorStatus {
    DescriptorStatus {
        code: if over { Code::OverLimit } else { otherwise } as i32,
        ..Default::default()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The response to a request whose limits (one per policy, in order) decided `decisions`
/// (`None`: a shadow limit without a decision) and `allowed` it or not. A limit in shadow
/// mode is `OK` whatever it decided.
fn answered(
    slots: &[Slot],
    policies: &[&RateLimitPolicy],
    decisions: &[Option<&RateLimitDecision>],
    charged: &[(&RateLimitPolicy, RateLimitDecision)],
    allowed: bool,
) -> RateLimitResponse {
    let now = now_ms();
    let statuses = slots
        .iter()
        .map(|s| match s {
            Slot::Unknown => status_only(false, Code::Ok),
            Slot::After(j) => match charged.get(*j) {
                Some((policy, decision)) => {
                    let mut status = descriptor_status(policy, decision, now);
                    if policy.shadow() {
                        status.code = Code::Ok as i32;
                    }
                    status
                }
                None => status_only(false, Code::Unknown),
            },
            Slot::Limit(i) => match (decisions.get(*i), policies.get(*i)) {
                (Some(Some(decision)), Some(policy)) => {
                    let mut status = descriptor_status(policy, decision, now);
                    if policy.shadow() {
                        status.code = Code::Ok as i32;
                    }
                    status
                }
                (Some(None), Some(_)) => status_only(false, Code::Ok),
                _ => status_only(false, Code::Unknown),
            },
        })
        .collect();
    let code = if allowed { Code::Ok } else { Code::OverLimit };
    response(
        code,
        statuses,
        rate_limit_headers(policies, decisions, allowed, now),
    )
}

fn descriptor_status(
    policy: &RateLimitPolicy,
    d: &RateLimitDecision,
    now_ms: u64,
) -> DescriptorStatus {
    let until_reset_ms = d.reset_at_ms.saturating_sub(now_ms);
    DescriptorStatus {
        code: if d.allowed { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: Some(current_limit(policy)),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: i64::try_from(until_reset_ms / 1000).unwrap_or(i64::MAX),
            // Below 1e9: fits.
            nanos: i32::try_from((until_reset_ms % 1000) * 1_000_000).unwrap_or(0),
        }),
        ..Default::default()
    }
}

/// The policy as Envoy's `requests_per_unit` per `unit`, from its quota and window in whole
/// seconds ([`shared_contract::Algorithm::quota_window`]; a window of a fraction of a second
/// counts as its next whole second).
///
/// - **Exact as a rate when it can be**: the largest unit not longer than the window, or a
///   larger one if needed, the smallest in which the quota scaled to the unit is a whole number
///   (at least 1): 100 per 60 s is 100/MINUTE, 120 per 120 s is 60/MINUTE, 5 per 10 s (0.5 a
///   second) is 30/MINUTE, 7 per 3 s is 140/MINUTE. Staying near the window keeps the unit
///   meaningful as Envoy's `w=` of its own rate-limit headers; moving up only when needed keeps
///   the rate exact.
/// - **Otherwise** (no unit up to a week gives a whole number: 7 per 13 s, 1 per 14 days): the
///   largest unit not longer than the window, the quota scaled to it and rounded down, at
///   least 1. Then the rate is not exact: understated when rounded down, overstated when the
///   floor of 1 applies (7 per 13 s is sent as 1/SECOND, 13 per 13 s; 1 per 14 days as 1/WEEK).
///
/// Units are SECOND to WEEK: MONTH and YEAR are not fixed lengths, so no quota is exact in them.
/// `requests_per_unit` saturates at `u32::MAX`.
pub fn current_limit(policy: &RateLimitPolicy) -> RateLimit {
    let (quota, window) = policy.algorithm().quota_window();
    let (requests_per_unit, unit) = per_unit(quota, window);
    RateLimit {
        name: policy.id().as_str().to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

/// [`current_limit`]'s rule for `quota` per `window_secs`.
fn per_unit(quota: u64, window_secs: u64) -> (u32, Unit) {
    /// The fixed-length units, shortest first; each is a whole multiple of the ones before,
    /// so a quota that is whole in one unit is whole in every longer one.
    const UNITS: [(Unit, u64); 5] = [
        (Unit::Second, 1),
        (Unit::Minute, 60),
        (Unit::Hour, 3_600),
        (Unit::Day, 86_400),
        (Unit::Week, 604_800),
    ];
    let w = u128::from(window_secs.max(1));
    let q = u128::from(quota);
    let floor = UNITS
        .iter()
        .rposition(|(_, secs)| u128::from(*secs) <= w)
        .unwrap_or(0);
    let exact = UNITS[floor..].iter().find(|(_, secs)| {
        let scaled = q * u128::from(*secs);
        scaled % w == 0 && scaled >= w
    });
    let (unit, per) = match exact {
        Some(&(unit, secs)) => (unit, q * u128::from(secs) / w),
        None => {
            let (unit, secs) = UNITS[floor];
            (unit, (q * u128::from(secs) / w).max(1))
        }
    };
    (u32::try_from(per).unwrap_or(u32::MAX), unit)
}

/// `RateLimit-Policy`, `RateLimit` (one member per limit with a decision) and, when denied,
/// `Retry-After`: the longest wait among the denying limits (shadow ones never deny).
fn rate_limit_headers(
    policies: &[&RateLimitPolicy],
    decisions: &[Option<&RateLimitDecision>],
    allowed: bool,
    now_ms: u64,
) -> Vec<HeaderValue> {
    let mut policy_field = String::new();
    let mut limit_field = Vec::new();
    let mut retry_after = None;
    for (policy, decision) in policies.iter().zip(decisions) {
        let Some(decision) = decision else { continue };
        headers::push_policy(&mut policy_field, policy);
        let t = headers::effective_window(policy, decision, now_ms);
        headers::push_limit(&mut limit_field, policy, decision.remaining, t);
        if !decision.allowed && !policy.shadow() {
            retry_after = retry_after.max(Some(headers::retry_after_secs(decision)));
        }
    }
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    let mut out = vec![
        header("RateLimit-Policy", policy_field),
        header(
            "RateLimit",
            String::from_utf8_lossy(&limit_field).into_owned(),
        ),
    ];
    if !allowed && let Some(secs) = retry_after {
        out.push(header("Retry-After", secs.to_string()));
    }
    out
}

/// The response, or the gRPC error, when the provider could not decide: the rule of
/// [`edge_middleware::failure`] (the first policy, in request order, that does not fail open
/// decides and is named; `OK` when every one fails open), as the HTTP edge answers it.
fn failed(
    slots: &[Slot],
    policies: &[&RateLimitPolicy],
    failure: &MultiOutcome,
) -> Result<RateLimitResponse, Status> {
    let Some((deciding, outcome)) = failure::failure_outcome(policies, failure.clone()) else {
        return Err(Status::internal("a failure without policies"));
    };
    // An unknown answer is never an allow for a policy that does not say so.
    if deciding.failure_policy() == FailurePolicy::FailOpen {
        let statuses = slots.iter().map(|_| status_only(false, Code::Ok)).collect();
        return Ok(response(Code::Ok, statuses, Vec::new()));
    }
    Err(match outcome {
        RateLimitOutcome::Indeterminate { policy_id, .. } => Status::unknown(format!(
            "the rate-limit provider's result is unknown (policy {policy_id}); the request may or may not have been charged"
        )),
        RateLimitOutcome::Unavailable {
            policy_id,
            category,
            ..
        } => Status::unavailable(format!(
            "the rate-limit provider is unavailable ({}, policy {policy_id}); nothing was charged",
            category.as_str()
        )),
        RateLimitOutcome::Incompatible {
            policy_id,
            category,
            ..
        } => Status::unavailable(format!(
            "the rate-limit provider cannot decide ({} incompatible, policy {policy_id}); a refused state or program charged nothing, an unreadable reply came after the program ran",
            category.as_str()
        )),
        RateLimitOutcome::Evaluated(_) => Status::internal("an evaluated outcome is not a failure"),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn window(limit: u64, secs: u64) -> RateLimitPolicy {
        window_ms(limit, secs * 1000)
    }

    fn window_ms(limit: u64, ms: u64) -> RateLimitPolicy {
        RateLimitPolicy::fixed_window("p", limit)
            .per(Duration::from_millis(ms))
            .build()
            .expect("valid policy")
    }

    fn of(policy: &RateLimitPolicy) -> (u32, Unit) {
        let l = current_limit(policy);
        (l.requests_per_unit, Unit::try_from(l.unit).expect("a unit"))
    }

    #[test]
    fn current_limit_is_the_unit_of_the_window_when_the_quota_is_whole_in_it() {
        let at = |limit, secs| of(&window(limit, secs));
        assert_eq!(at(100, 1), (100, Unit::Second));
        assert_eq!(at(100, 60), (100, Unit::Minute));
        assert_eq!(at(5, 3_600), (5, Unit::Hour));
        assert_eq!(at(1, 86_400), (1, Unit::Day));
        assert_eq!(at(7, 86_400), (7, Unit::Day));
        assert_eq!(at(7, 604_800), (7, Unit::Week));
        // Between units: the largest unit not longer than the window, when whole there.
        assert_eq!(at(120, 120), (60, Unit::Minute));
        assert_eq!(at(60, 120), (30, Unit::Minute));
        assert_eq!(at(3_600, 3_600), (3_600, Unit::Hour));
        // Beyond a week: per week.
        assert_eq!(at(1_400, 1_209_600), (700, Unit::Week));
    }

    #[test]
    fn current_limit_moves_to_a_longer_unit_to_keep_the_rate_exact() {
        let at = |limit, secs| of(&window(limit, secs));
        // 0.5 a second is 30 a minute, exactly.
        assert_eq!(at(5, 10), (30, Unit::Minute));
        // 7/3 a second is 140 a minute; 100/90 s is 4,000 an hour; 1 per 7 h is 24 a week.
        assert_eq!(at(7, 3), (140, Unit::Minute));
        assert_eq!(at(100, 90), (4_000, Unit::Hour));
        assert_eq!(at(1, 25_200), (24, Unit::Week));
        // 1 per 2 days: half a day, 3.5 a week: no exact unit up to a week (see below).
        assert_eq!(at(1, 172_800), (1, Unit::Day));
    }

    #[test]
    fn current_limit_without_an_exact_unit_is_rounded_down_at_least_1() {
        let at = |limit, secs| of(&window(limit, secs));
        // 13 is prime and divides no unit: 7 per 13 s is never whole. 0.54/SECOND -> 1.
        assert_eq!(at(7, 13), (1, Unit::Second));
        // 40 per 13 s: 3.08 a second, rounded down.
        assert_eq!(at(40, 13), (3, Unit::Second));
        // 1 per 14 days: half a week, shown as 1/WEEK.
        assert_eq!(at(1, 1_209_600), (1, Unit::Week));
    }

    #[test]
    fn current_limit_counts_a_sub_second_window_as_a_whole_second() {
        assert_eq!(of(&window_ms(5, 1)), (5, Unit::Second));
        assert_eq!(of(&window_ms(5, 500)), (5, Unit::Second));
        // 1.5 s counts as 2 s: 3 per 2 s is 90 a minute (never more than the policy allows).
        assert_eq!(of(&window_ms(3, 1_500)), (90, Unit::Minute));
    }
}
