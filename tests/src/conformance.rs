//! The conformance suite, written once and run on every provider.
//!
//! A provider is reached only through `Arc<dyn EdgeRateLimitPort>`, built by a [`Target`],
//! which also says how its time moves: a manual clock the suite advances exactly (local), or
//! the provider's own real clock (Redis `TIME`), which advances only by really sleeping. Every
//! case asserts only what holds on both; the cases that need exact time (decision equal to the
//! reference model at every step, "still denied 1 ms before `retry_after`") run their exact
//! part only when [`Target::exact_time`] says so.
//!
//! Each case builds its own policies under fresh random policy ids and uses fresh random
//! subject digests, so cases never share state and may run in parallel against one server.
//!
//! A test file instantiates the whole suite with [`conformance_tests!`](crate::conformance_tests), which expands to one
//! `#[tokio::test]` per (algorithm, case): `fixed_window::burst_admits_exactly_the_limit`, ...
//!
//! ```text
//! acceptance_tests::conformance_tests!(LocalTarget::new());
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::rate::{TestPolicy, algorithm, fresh_subject, policy_set, random_u64, request};

use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::{
    AlgorithmKind, Certainty, Cost, EdgeRateLimitPort, EvaluationId, PolicyId, PolicySet,
    RateLimitDecision, RateLimitOutcome, RateLimitPolicy, RequestError, Source, SubjectDigest,
    UnavailableCategory,
};

/// A provider under test, and how its time moves.
#[async_trait::async_trait]
pub trait Target: Send + Sync {
    /// A provider enforcing `policies`. Policy ids are fresh per call, so a target may share
    /// one backing store (one Redis server) between calls.
    async fn provider(&self, policies: PolicySet) -> Arc<dyn EdgeRateLimitPort>;

    /// Lets `ms` milliseconds of the provider's time pass (a manual clock: exactly; a real
    /// clock: at least, by sleeping).
    async fn advance(&self, ms: u64);

    /// The provider's clock now, Unix ms. Exact when [`Self::exact_time`], else an estimate
    /// within about a second (a host clock next to the server's `TIME`).
    async fn now_ms(&self) -> u64;

    /// Whether time moves only through [`Self::advance`], so decisions can be predicted to
    /// the millisecond.
    fn exact_time(&self) -> bool;

    /// The `source` of every decision of this target's providers.
    fn source(&self) -> Source;

    /// Whether one evaluation's keys must share a slot (a Redis Cluster): a multi-limit
    /// request over several subjects is then refused with `SpansSlots`.
    fn one_slot_per_call(&self) -> bool {
        false
    }
}

/// Expands to one `#[tokio::test]` per algorithm and case, in modules named after the
/// algorithm. `$target` is evaluated once per test and must implement [`Target`].
#[macro_export]
macro_rules! conformance_tests {
    ($target:expr) => {
        $crate::conformance_tests!(@algorithms $target;
            fixed_window => FixedWindow,
            sliding_window => SlidingWindow,
            token_bucket => TokenBucket,
            gcra => Gcra,
            sliding_log => SlidingLog
        );
    };
    (@algorithms $target:expr; $($module:ident => $kind:ident),*) => {
        $(
            mod $module {
                #[allow(unused_imports)]
                use super::*;
                $crate::conformance_tests!(@cases $target; $kind;
                    burst_admits_exactly_the_limit,
                    denied_request_consumes_nothing,
                    retry_after_is_positive_and_waiting_it_admits,
                    decisions_match_the_reference_model,
                    subjects_and_revisions_are_isolated,
                    request_errors_consume_nothing,
                    evaluation_id_retry_answers_the_first_decision,
                    decision_fields_are_consistent,
                    source_and_certainty_are_reported,
                    concurrent_requests_on_one_key_admit_exactly_the_limit,
                    multi_limit_charges_all_or_nothing,
                    multi_limit_evaluation_id_charges_once,
                    multi_limit_request_errors_consume_nothing,
                    multi_limit_across_subjects
                );
            }
        )*
    };
    (@cases $target:expr; $kind:ident; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let target = $target;
                $crate::conformance::$case(
                    &target,
                    ::shared_contract::AlgorithmKind::$kind,
                )
                .await;
            }
        )*
    };
}

pub use crate::conformance_multi::{
    multi_limit_across_subjects, multi_limit_charges_all_or_nothing,
    multi_limit_evaluation_id_charges_once, multi_limit_request_errors_consume_nothing,
};

// ---------------------------------------------------------------------------------------------
// Building blocks

/// A fresh random policy id with a readable prefix.
pub fn fresh_policy_id(tag: &str) -> PolicyId {
    PolicyId::new(&format!("conf-{tag}-{:012x}", random_u64() >> 16)).expect("a valid policy id")
}

/// A policy of `kind` under a fresh id, with the suite's short cleanup grace and clock
/// regression (1 s each).
pub fn policy(
    kind: AlgorithmKind,
    revision: u32,
    limit: u64,
    window_ms: u64,
    max_cost: u64,
) -> RateLimitPolicy {
    policy_with_id(
        fresh_policy_id(kind.as_str()),
        kind,
        revision,
        limit,
        window_ms,
        max_cost,
    )
}

/// A policy of `kind` admitting `limit` at once and recovering over `window_ms`, with the
/// suite's short cleanup grace and clock regression (1 s each).
fn policy_with_id(
    id: PolicyId,
    kind: AlgorithmKind,
    revision: u32,
    limit: u64,
    window_ms: u64,
    max_cost: u64,
) -> RateLimitPolicy {
    TestPolicy::with_id(id, algorithm(kind, limit, Duration::from_millis(window_ms)))
        .revision(revision)
        .max_cost(max_cost)
        .cleanup_grace(Duration::from_secs(1))
        .max_clock_regression(Duration::from_secs(1))
        .build()
        // The suite holds every decision to the model's, figure for figure, and some targets
        // inject the server's clock: a cached denial's retry is shorter by design and timed by
        // the real clock. The cache has its own checks (tests/tests/it/redis_deny_cache.rs).
        .with_deny_cache(false)
}

/// A provider of one fresh policy of `kind` (revision 1, see [`policy`]) on `target`, and a
/// fresh subject: how most cases start.
async fn one_policy(
    target: &dyn Target,
    kind: AlgorithmKind,
    limit: u64,
    window_ms: u64,
    max_cost: u64,
) -> (RateLimitPolicy, Arc<dyn EdgeRateLimitPort>, SubjectDigest) {
    let p = policy(kind, 1, limit, window_ms, max_cost);
    let port = target.provider(policy_set(vec![p.clone()])).await;
    (p, port, fresh_subject())
}

/// The decision of one evaluation; any other outcome fails the case.
pub async fn decide(
    port: &dyn EdgeRateLimitPort,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
    cost: u64,
) -> RateLimitDecision {
    match port.evaluate(request(policy, subject, cost)).await {
        Ok(RateLimitOutcome::Evaluated(d)) => d,
        other => panic!(
            "{} cost {cost}: expected a decision, got {other:?}",
            policy.id()
        ),
    }
}

/// The certainty a target's decisions of `kind` must carry.
pub fn expected_certainty(target: &dyn Target, kind: AlgorithmKind) -> Certainty {
    match target.source() {
        Source::LocalFallback => Certainty::ApproximateFallback,
        _ => kind.certainty(),
    }
}

/// How often a case that a real clock can disturb (a window boundary falling inside a burst)
/// is tried before it fails. Exact-time targets get one try: there nothing can disturb it.
fn tries(target: &dyn Target) -> usize {
    if target.exact_time() { 1 } else { 3 }
}

/// Runs `attempt` until it succeeds or [`tries`] is exhausted, then panics with its message.
async fn with_retries<'a, F, Fut>(target: &'a dyn Target, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>> + 'a,
{
    let n = tries(target);
    let mut last = String::new();
    for _ in 0..n {
        match attempt().await {
            Ok(()) => return,
            Err(e) => last = e,
        }
    }
    panic!("{last}");
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// A one-hour window: a burst of milliseconds crosses a boundary about once in a million runs,
/// and [`with_retries`] absorbs that on real clocks.
const LONG_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------------------------
// Cases

/// From empty state exactly `limit` unit requests are admitted, with `remaining` counting
/// down, and the next one is denied.
pub async fn burst_admits_exactly_the_limit(target: &dyn Target, kind: AlgorithmKind) {
    with_retries(target, || async {
        let limit = 10;
        let (p, port, s) = one_policy(target, kind, limit, LONG_MS, 1).await;
        for i in 1..=limit {
            let d = decide(&*port, &p, s, 1).await;
            ensure!(
                d.allowed,
                "{kind}: request {i} of {limit} was denied: {d:?}"
            );
            ensure!(
                d.remaining == limit - i,
                "{kind}: remaining after {i} is {}, expected {}",
                d.remaining,
                limit - i
            );
        }
        let d = decide(&*port, &p, s, 1).await;
        ensure!(
            !d.allowed,
            "{kind}: request {} was admitted: {d:?}",
            limit + 1
        );
        ensure!(d.remaining == 0, "{kind}: remaining after the limit: {d:?}");
        Ok(())
    })
    .await;
}

/// A denial takes nothing: what was left is still admissible afterwards, to the exact unit.
pub async fn denied_request_consumes_nothing(target: &dyn Target, kind: AlgorithmKind) {
    with_retries(target, || async {
        let (p, port, s) = one_policy(target, kind, 10, LONG_MS, 10).await;
        let d = decide(&*port, &p, s, 8).await;
        ensure!(d.allowed && d.remaining == 2, "{kind}: cost 8 of 10: {d:?}");
        for _ in 0..3 {
            let d = decide(&*port, &p, s, 3).await;
            ensure!(
                !d.allowed && d.remaining == 2,
                "{kind}: cost 3 with 2 left: {d:?}"
            );
        }
        // Exactly the rest fits (the boundary), and then nothing does.
        let d = decide(&*port, &p, s, 2).await;
        ensure!(
            d.allowed && d.remaining == 0,
            "{kind}: cost 2 with 2 left after denials: {d:?}"
        );
        let d = decide(&*port, &p, s, 1).await;
        ensure!(!d.allowed, "{kind}: cost 1 with nothing left: {d:?}");
        Ok(())
    })
    .await;
}

/// A denial says when to come back (`retry_after > 0`), and coming back then is admitted.
/// On an exact clock, 1 ms earlier is still denied.
pub async fn retry_after_is_positive_and_waiting_it_admits(
    target: &dyn Target,
    kind: AlgorithmKind,
) {
    let limit = 3;
    let (p, port, s) = one_policy(target, kind, limit, 300, 1).await;
    // Spend until the first denial: on a real clock a window may turn during the burst.
    let mut denial = None;
    for _ in 0..4 * limit {
        let d = decide(&*port, &p, s, 1).await;
        if !d.allowed {
            denial = Some(d);
            break;
        }
    }
    let denial = denial.unwrap_or_else(|| panic!("{kind}: never denied"));
    assert!(denial.retry_after_ms > 0, "{kind}: denial {denial:?}");
    assert!(
        denial.retry_after_ms <= 2 * 300,
        "{kind}: retry_after beyond the reset horizon: {denial:?}"
    );
    if target.exact_time() {
        target.advance(denial.retry_after_ms - 1).await;
        let d = decide(&*port, &p, s, 1).await;
        assert!(
            !d.allowed,
            "{kind}: admitted 1 ms before retry_after: {d:?}"
        );
        target.advance(1).await;
    } else {
        target.advance(denial.retry_after_ms).await;
    }
    let d = decide(&*port, &p, s, 1).await;
    assert!(
        d.allowed,
        "{kind}: denied after waiting retry_after {} ms: {d:?}",
        denial.retry_after_ms
    );
    assert_eq!(d.retry_after_ms, 0, "{kind}: an allow has no retry_after");
}

/// Deterministic xorshift steps from a printed seed, so a failing sequence can be replayed.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Every decision equals the reference model's, fed the same requests at the same times.
///
/// Exact time: a random sequence of time steps, costs and two subjects, compared outcome by
/// outcome (allow, remaining, retry_after, reset_at, ...). Real time: a random-cost burst
/// within one long window, where allow and remaining do not depend on the clock.
pub async fn decisions_match_the_reference_model(target: &dyn Target, kind: AlgorithmKind) {
    let seed = random_u64() | 1;
    if target.exact_time() {
        let (limit, window_ms) = (5, 1_000);
        let p = policy(kind, 1, limit, window_ms, 3);
        let port = target.provider(policy_set(vec![p.clone()])).await;
        let subjects = [fresh_subject(), fresh_subject()];
        let mut states: HashMap<usize, AlgorithmState> = HashMap::new();
        let mut steps = Steps(seed);
        for step in 0..300 {
            target.advance(steps.next(window_ms / 4)).await;
            let now = target.now_ms().await;
            let who = steps.next(2) as usize;
            let cost = 1 + steps.next(3);
            let got = port.evaluate(request(&p, subjects[who], cost)).await;
            let evaluation = model::evaluate(
                &p,
                states.get(&who),
                now,
                Cost::new(cost).expect("a valid cost"),
            )
            .expect("the model evaluates valid input");
            let expected = expected_outcome(target, &p, &evaluation);
            if let Some(state) = evaluation.new_state {
                states.insert(who, state);
            }
            assert_eq!(
                got,
                Ok(expected),
                "{kind}: step {step} (seed {seed}) at {now} ms, cost {cost}"
            );
        }
    } else {
        with_retries(target, || async {
            let limit = 20;
            let (p, port, s) = one_policy(target, kind, limit, LONG_MS, 7).await;
            let mut steps = Steps(seed);
            let mut state: Option<AlgorithmState> = None;
            // Any time in the middle of a window: nothing below depends on which.
            let now = LONG_MS * 500_000 + LONG_MS / 2;
            for step in 0..40 {
                let cost = 1 + steps.next(7);
                let d = decide(&*port, &p, s, cost).await;
                let evaluation = model::evaluate(
                    &p,
                    state.as_ref(),
                    now,
                    Cost::new(cost).expect("a valid cost"),
                )
                .expect("the model evaluates valid input");
                let allowed = evaluation.verdict == Verdict::Allowed;
                ensure!(
                    (d.allowed, d.remaining) == (allowed, evaluation.remaining),
                    "{kind}: step {step} (seed {seed}), cost {cost}: provider {d:?}, model {evaluation:?}"
                );
                if let Some(new) = evaluation.new_state {
                    state = Some(new);
                }
            }
            Ok(())
        })
        .await;
    }
}

fn expected_outcome(
    target: &dyn Target,
    policy: &RateLimitPolicy,
    evaluation: &model::Evaluation<AlgorithmState>,
) -> RateLimitOutcome {
    match evaluation.decision(policy, target.source()) {
        Some(mut d) => {
            d.certainty = expected_certainty(target, policy.kind());
            RateLimitOutcome::Evaluated(d)
        }
        None => RateLimitOutcome::Unavailable {
            policy_id: policy.id().clone(),
            retry_after_ms: evaluation.retry_after_ms,
            category: UnavailableCategory::Clock,
        },
    }
}

/// Subjects, policies and revisions have separate state: exhausting one leaves the others
/// untouched, and a new revision of a policy starts from empty state.
pub async fn subjects_and_revisions_are_isolated(target: &dyn Target, kind: AlgorithmKind) {
    with_retries(target, || async {
        let id = fresh_policy_id(kind.as_str());
        let a = policy_with_id(id.clone(), kind, 1, 2, LONG_MS, 2);
        let b = policy(kind, 1, 2, LONG_MS, 2);
        let port = target
            .provider(policy_set(vec![a.clone(), b.clone()]))
            .await;
        let (s, t) = (fresh_subject(), fresh_subject());
        ensure!(
            decide(&*port, &a, s, 2).await.allowed,
            "{kind}: first spend"
        );
        ensure!(!decide(&*port, &a, s, 1).await.allowed, "{kind}: exhausted");
        let d = decide(&*port, &a, t, 2).await;
        ensure!(d.allowed, "{kind}: another subject shares state: {d:?}");
        let d = decide(&*port, &b, s, 2).await;
        ensure!(d.allowed, "{kind}: another policy shares state: {d:?}");

        let a2 = policy_with_id(id, kind, 2, 2, LONG_MS, 2);
        let port2 = target.provider(policy_set(vec![a2.clone()])).await;
        let d = decide(&*port2, &a2, s, 2).await;
        ensure!(
            d.allowed && d.revision.get() == 2,
            "{kind}: revision 2 sees revision 1's state: {d:?}"
        );
        let d = decide(&*port, &a, s, 1).await;
        ensure!(
            !d.allowed && d.revision.get() == 1,
            "{kind}: revision 1 lost its state: {d:?}"
        );
        Ok(())
    })
    .await;
}

/// A cost above `max_cost` and an unknown policy are request errors, and consume nothing.
pub async fn request_errors_consume_nothing(target: &dyn Target, kind: AlgorithmKind) {
    with_retries(target, || async {
        let (p, port, s) = one_policy(target, kind, 4, LONG_MS, 2).await;
        let r = port.evaluate(request(&p, s, 3)).await;
        ensure!(
            matches!(
                r,
                Err(RequestError::CostAboveMax {
                    cost: 3,
                    max_cost: 2,
                    ..
                })
            ),
            "{kind}: cost 3 above max_cost 2: {r:?}"
        );
        let unknown = policy(kind, 1, 4, LONG_MS, 2);
        let r = port.evaluate(request(&unknown, s, 1)).await;
        ensure!(
            matches!(r, Err(RequestError::UnknownPolicy(ref id)) if id == unknown.id()),
            "{kind}: unknown policy: {r:?}"
        );
        for i in 0..2 {
            let d = decide(&*port, &p, s, 2).await;
            ensure!(d.allowed, "{kind}: spend {i} after request errors: {d:?}");
        }
        ensure!(
            !decide(&*port, &p, s, 1).await.allowed,
            "{kind}: past the limit"
        );
        Ok(())
    })
    .await;
}

/// A retry with the same evaluation id answers the first decision and charges nothing more.
pub async fn evaluation_id_retry_answers_the_first_decision(
    target: &dyn Target,
    kind: AlgorithmKind,
) {
    let (p, port, s) = one_policy(target, kind, 2, LONG_MS, 1).await;
    let mut r = request(&p, s, 1);
    r.evaluation_id =
        Some(EvaluationId::new(&format!("conformance-{:016x}", random_u64())).expect("a valid id"));
    let first = port.evaluate(r.clone()).await;
    assert!(
        matches!(&first, Ok(RateLimitOutcome::Evaluated(d)) if d.allowed && d.remaining == 1),
        "{kind}: {first:?}"
    );
    for _ in 0..3 {
        assert_eq!(port.evaluate(r.clone()).await, first, "{kind}");
    }
    assert_eq!(
        decide(&*port, &p, s, 1).await.remaining,
        0,
        "{kind}: charged once"
    );
}

/// `limit`, `remaining`, `retry_after`, `reset_at`, policy id and revision agree with each
/// other and with the policy, on allows and on denials.
pub async fn decision_fields_are_consistent(target: &dyn Target, kind: AlgorithmKind) {
    let (limit, window_ms) = (4, 400);
    let p = policy(kind, 3, limit, window_ms, 2);
    let horizon = p.algorithm().reset_horizon_ms();
    let port = target.provider(policy_set(vec![p.clone()])).await;
    let s = fresh_subject();
    // Real clocks: the host's estimate of the provider's clock may be a little off.
    let slack = if target.exact_time() { 0 } else { 1_000 };
    let mut denied = 0;
    for i in 0..8 {
        let before = target.now_ms().await;
        let d = decide(&*port, &p, s, 1 + i % 2).await;
        let after = target.now_ms().await;
        assert_eq!(d.limit, limit, "{kind}: {d:?}");
        assert!(d.remaining <= limit, "{kind}: {d:?}");
        assert_eq!((&d.policy_id, d.revision), (p.id(), p.revision()), "{kind}");
        assert!(
            d.reset_at_ms + slack >= before && d.reset_at_ms <= after + horizon + slack,
            "{kind}: reset_at {} outside [{before}, {after} + {horizon}]: {d:?}",
            d.reset_at_ms
        );
        if d.allowed {
            assert_eq!(d.retry_after_ms, 0, "{kind}: {d:?}");
            assert!(
                d.reset_at_ms + slack > before,
                "{kind}: an allow leaves the quota short until later: {d:?}"
            );
        } else {
            denied += 1;
            assert!(d.retry_after_ms > 0, "{kind}: {d:?}");
            assert!(d.retry_after_ms <= horizon, "{kind}: {d:?}");
            assert!(
                d.remaining < 1 + i % 2,
                "{kind}: denied though it fits: {d:?}"
            );
        }
    }
    assert!(
        denied > 0,
        "{kind}: 12 cost in 8 requests against 4 was never denied"
    );
}

/// Decisions name their source, and their certainty: the sliding-window counter is an
/// approximation, the other algorithms are certain (a local fallback is always approximate).
pub async fn source_and_certainty_are_reported(target: &dyn Target, kind: AlgorithmKind) {
    let (p, port, s) = one_policy(target, kind, 1, LONG_MS, 1).await;
    for _ in 0..2 {
        let d = decide(&*port, &p, s, 1).await;
        assert_eq!(d.source, target.source(), "{kind}: {d:?}");
        assert_eq!(
            d.certainty,
            expected_certainty(target, kind),
            "{kind}: {d:?}"
        );
    }
    let expected = if kind == AlgorithmKind::SlidingWindow {
        Certainty::ApproximateAlgorithm
    } else {
        Certainty::Certain
    };
    assert_eq!(kind.certainty(), expected, "{kind}");
}

/// 8 tasks sending 1,000 requests each at one key admit exactly the limit of 1,000.
pub async fn concurrent_requests_on_one_key_admit_exactly_the_limit(
    target: &dyn Target,
    kind: AlgorithmKind,
) {
    with_retries(target, || async {
        let (tasks, per_task, limit) = (8u64, 1_000u64, 1_000u64);
        let (p, port, s) = one_policy(target, kind, limit, LONG_MS, 1).await;
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let (port, p) = (Arc::clone(&port), p.clone());
            handles.push(tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..per_task {
                    if decide(&*port, &p, s, 1).await.allowed {
                        allowed += 1;
                    }
                }
                allowed
            }));
        }
        let mut allowed = 0;
        for h in handles {
            allowed += h.await.map_err(|e| format!("{kind}: a task failed: {e}"))?;
        }
        ensure!(
            allowed == limit,
            "{kind}: {allowed} of {} admitted, limit {limit}",
            tasks * per_task
        );
        Ok(())
    })
    .await;
}
