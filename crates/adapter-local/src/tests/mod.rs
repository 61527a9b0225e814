//! Unit tests of the local provider. Time is a [`ManualClock`]: nothing here sleeps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::{
    AlgorithmSpec, Certainty, Cost, Deadline, ManualClock, PolicyId, PolicySet, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, RequestError, SubjectDigest,
    UnavailableCategory,
};

use super::{LocalProvider, LocalSettings, Source};

const START_MS: u64 = 1_700_000_000_000;

pub(super) fn policy(
    id: &str,
    revision: u32,
    algorithm: AlgorithmSpec,
    max_cost: u64,
) -> RateLimitPolicy {
    RateLimitPolicy::with_algorithm(id, algorithm)
        .revision(revision)
        .max_cost(max_cost)
        .cleanup_grace(Duration::from_secs(1))
        .build()
        .expect("valid policy")
}

pub(super) fn fixed(limit: u64, window_ms: u64) -> AlgorithmSpec {
    AlgorithmSpec::FixedWindow {
        limit,
        window: Duration::from_millis(window_ms),
    }
}

pub(super) fn bucket(capacity: u64, refill_amount: u64, interval_ms: u64) -> AlgorithmSpec {
    AlgorithmSpec::TokenBucket {
        capacity,
        refill_amount,
        refill_interval: Duration::from_millis(interval_ms),
    }
}

pub(super) fn set(policies: Vec<RateLimitPolicy>) -> PolicySet {
    let default = policies[0].id().clone();
    PolicySet::new(policies, default).expect("valid set")
}

pub(super) fn provider(policies: Vec<RateLimitPolicy>) -> (LocalProvider, ManualClock) {
    let clock = ManualClock::new(START_MS);
    let p = LocalProvider::new(
        set(policies),
        Arc::new(clock.clone()),
        LocalSettings::default(),
    );
    (p, clock)
}

pub(super) fn subject(n: u64) -> SubjectDigest {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    SubjectDigest::from_bytes(bytes)
}

pub(super) fn request(policy: &str, subject_n: u64, cost: u64) -> RateLimitRequest {
    RateLimitRequest {
        policy_id: PolicyId::new(policy).expect("valid id"),
        subject: subject(subject_n),
        cost: Cost::new(cost).expect("valid cost"),
        evaluation_id: None,
        deadline: Deadline::within(Duration::from_secs(5)).expect("valid deadline"),
    }
}

pub(super) fn decide(p: &LocalProvider, r: &RateLimitRequest) -> RateLimitDecision {
    match p.evaluate_now(r) {
        Ok(RateLimitOutcome::Evaluated(d)) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[test]
fn manual_clock_drives_the_window_without_sleeping() {
    let (p, clock) = provider(vec![policy("api", 1, fixed(3, 1_000), 1)]);
    clock.set(START_MS - START_MS % 1_000 + 200);
    for left in (0..3).rev() {
        let d = decide(&p, &request("api", 1, 1));
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
    }
    let denied = decide(&p, &request("api", 1, 1));
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, 800);
    clock.advance(799);
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
    clock.advance(1);
    assert!(decide(&p, &request("api", 1, 1)).allowed);
}

#[test]
fn denied_request_consumes_nothing() {
    let (p, _clock) = provider(vec![policy("api", 1, bucket(5, 1, 1_000), 5)]);
    assert!(decide(&p, &request("api", 1, 3)).allowed);
    let denied = decide(&p, &request("api", 1, 3));
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 2);
    // Exactly what is left still fits after the denial.
    let d = decide(&p, &request("api", 1, 2));
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

#[test]
fn policies_and_subjects_have_separate_state() {
    let (p, _clock) = provider(vec![
        policy("a", 1, fixed(1, 60_000), 1),
        policy("b", 7, fixed(1, 60_000), 1),
    ]);
    assert!(decide(&p, &request("a", 1, 1)).allowed);
    assert!(!decide(&p, &request("a", 1, 1)).allowed);
    // Same subject, other policy (and revision); same policy, other subject.
    let b = decide(&p, &request("b", 1, 1));
    assert!(b.allowed);
    assert_eq!(b.revision.get(), 7);
    assert!(decide(&p, &request("a", 2, 1)).allowed);
}

#[test]
fn a_new_revision_starts_from_empty_state() {
    let clock = ManualClock::new(START_MS);
    let v1 = LocalProvider::new(
        set(vec![policy("api", 1, fixed(1, 60_000), 1)]),
        Arc::new(clock.clone()),
        LocalSettings::default(),
    );
    assert!(decide(&v1, &request("api", 1, 1)).allowed);
    assert!(!decide(&v1, &request("api", 1, 1)).allowed);
    let v2 = LocalProvider::new(
        set(vec![policy("api", 2, fixed(1, 60_000), 1)]),
        Arc::new(clock),
        LocalSettings::default(),
    );
    let d = decide(&v2, &request("api", 1, 1));
    assert!(d.allowed);
    assert_eq!(d.revision.get(), 2);
}

#[test]
fn stored_keys_never_exceed_max_keys() {
    let clock = ManualClock::new(START_MS);
    let p = LocalProvider::new(
        set(vec![policy("api", 1, fixed(10, 60_000), 1)]),
        Arc::new(clock),
        LocalSettings { max_keys: 100 },
    );
    for n in 0..2_000 {
        assert!(decide(&p, &request("api", n, 1)).allowed);
    }
    let held = p.stored_keys();
    assert!(held <= 100, "{held} keys held, bound is 100");
    assert!(held > 0, "the cache holds nothing at all");
}

#[test]
fn zero_max_keys_decides_every_request_on_empty_state() {
    let p = LocalProvider::new(
        set(vec![policy("api", 1, fixed(1, 60_000), 1)]),
        Arc::new(ManualClock::new(START_MS)),
        LocalSettings { max_keys: 0 },
    );
    assert!(decide(&p, &request("api", 1, 1)).allowed);
    assert_eq!(p.stored_keys(), 0);
}

#[test]
fn entries_expire_after_their_lifetime_by_the_provider_clock() {
    // Lifetime: reset horizon 1_000 + grace 1_000 + regression 2_000.
    let (p, clock) = provider(vec![policy("api", 1, fixed(5, 1_000), 1)]);
    for n in 0..10 {
        assert!(decide(&p, &request("api", n, 1)).allowed);
    }
    assert_eq!(p.stored_keys(), 10);
    clock.advance(3_999);
    assert_eq!(p.stored_keys(), 10);
    clock.advance(1);
    assert_eq!(p.stored_keys(), 0);
    // Expired state decides like no state: the full quota again.
    assert_eq!(decide(&p, &request("api", 1, 1)).remaining, 4);
}

#[test]
fn unknown_policy_and_cost_above_max_are_request_errors() {
    let (p, _clock) = provider(vec![policy("api", 1, fixed(5, 60_000), 2)]);
    assert!(matches!(
        p.evaluate_now(&request("other", 1, 1)),
        Err(RequestError::UnknownPolicy(_))
    ));
    assert!(matches!(
        p.evaluate_now(&request("api", 1, 3)),
        Err(RequestError::CostAboveMax {
            cost: 3,
            max_cost: 2,
            ..
        })
    ));
    assert_eq!(decide(&p, &request("api", 1, 2)).remaining, 3);
}

#[test]
fn clock_regression_beyond_threshold_is_unavailable_and_leaves_state_untouched() {
    let (p, clock) = provider(vec![policy("api", 1, bucket(2, 1, 1_000), 1)]);
    assert!(decide(&p, &request("api", 1, 1)).allowed);
    clock.set(START_MS - 2_001);
    assert_eq!(
        p.evaluate_now(&request("api", 1, 1)),
        Ok(RateLimitOutcome::Unavailable {
            policy_id: PolicyId::new("api").expect("valid id"),
            retry_after_ms: 2_001,
            category: UnavailableCategory::Clock,
        })
    );
    // Within the tolerance the time is clamped: the one token left is still there.
    clock.set(START_MS - 2_000);
    let d = decide(&p, &request("api", 1, 1));
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

#[test]
fn a_quota_spent_elsewhere_is_charged_as_of_its_time() {
    let log = AlgorithmSpec::SlidingLog {
        limit: 5,
        window: Duration::from_secs(60),
    };
    let (p, clock) = provider(vec![
        policy("api", 1, fixed(10, 60_000), 1),
        policy("tokens", 1, bucket(4, 1, 1_000), 1),
        policy("log", 1, log, 1),
    ]);
    let window = START_MS - START_MS % 60_000;
    let api = PolicyId::new("api").expect("valid id");
    // 8 of the window's 10 spent as of 1 s into it, above `max_cost` (1): 2 are left.
    clock.set(window + 5_000);
    assert!(p.charge_as_of(&api, &subject(1), 8, window + 1_000));
    assert!(decide(&p, &request("api", 1, 1)).allowed);
    assert_eq!(decide(&p, &request("api", 1, 1)).remaining, 0);
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
    // Charged in the window it belongs to: a spend from the last window changes nothing.
    assert!(p.charge_as_of(&api, &subject(2), 10, window - 1));
    assert_eq!(decide(&p, &request("api", 2, 1)).remaining, 9);
    // A bucket emptied 3 s ago has refilled 3 since.
    let tokens = PolicyId::new("tokens").expect("valid id");
    assert!(p.charge_as_of(&tokens, &subject(1), 4, window + 2_000));
    assert_eq!(decide(&p, &request("tokens", 1, 1)).remaining, 2);
    // Beyond the clock's tolerance behind the stored state nothing is written.
    assert!(!p.charge_as_of(&tokens, &subject(1), 1, window + 5_000 - 2_001));
    assert_eq!(decide(&p, &request("tokens", 1, 1)).remaining, 1);
    // A sliding log holds no overdraft: an entry of what fits, leaving the window after W.
    let log = PolicyId::new("log").expect("valid id");
    assert!(p.charge_as_of(&log, &subject(1), 3, window + 1_000));
    assert_eq!(decide(&p, &request("log", 1, 1)).remaining, 1);
    assert!(p.charge_as_of(&log, &subject(1), 4, window + 5_000));
    assert!(!decide(&p, &request("log", 1, 1)).allowed);
    assert!(
        !p.charge_as_of(&log, &subject(1), 1, window + 5_000),
        "the log is full"
    );
    clock.set(window + 61_000);
    assert_eq!(
        decide(&p, &request("log", 1, 1)).remaining,
        2,
        "3 left the window"
    );
    // Nothing for an unknown policy, a cost of 0, or above the limit.
    let unknown = PolicyId::new("other").expect("valid id");
    assert!(!p.charge_as_of(&unknown, &subject(1), 1, window));
    assert!(!p.charge_as_of(&api, &subject(3), 0, window));
    assert!(!p.charge_as_of(&api, &subject(3), 11, window));
    assert_eq!(decide(&p, &request("api", 3, 1)).remaining, 9);
}

#[test]
fn source_is_local_and_certainty_follows_the_algorithm() {
    let sliding = AlgorithmSpec::SlidingWindow {
        limit: 5,
        window: Duration::from_secs(1),
    };
    let (p, _clock) = provider(vec![
        policy("exact", 1, fixed(5, 1_000), 1),
        policy("approx", 1, sliding, 1),
    ]);
    let d = decide(&p, &request("exact", 1, 1));
    assert_eq!((d.source, d.certainty), (Source::Local, Certainty::Certain));
    let d = decide(&p, &request("approx", 1, 1));
    assert_eq!(
        (d.source, d.certainty),
        (Source::Local, Certainty::ApproximateAlgorithm)
    );
}

#[test]
fn fallback_reports_local_fallback_and_approximate_fallback() {
    let p = LocalProvider::fallback(
        set(vec![policy("api", 1, fixed(1, 60_000), 1)]),
        Arc::new(ManualClock::new(START_MS)),
        LocalSettings::default(),
    );
    let d = decide(&p, &request("api", 1, 1));
    assert_eq!(
        (d.source, d.certainty),
        (Source::LocalFallback, Certainty::ApproximateFallback)
    );
    assert!(!decide(&p, &request("api", 1, 1)).allowed);
}

#[test]
fn the_port_answers_like_evaluate_now() {
    use shared_contract::EdgeRateLimitPort;
    let (p, _clock) = provider(vec![policy("api", 1, fixed(1, 60_000), 1)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let first = rt.block_on(p.evaluate(request("api", 1, 1)));
    assert!(matches!(first, Ok(RateLimitOutcome::Evaluated(ref d)) if d.allowed));
    let second = rt.block_on(p.evaluate(request("api", 1, 1)));
    assert!(matches!(second, Ok(RateLimitOutcome::Evaluated(ref d)) if !d.allowed));
    assert_eq!(p.policies().default_id().as_str(), "api");
}

fn any_algorithm() -> impl Strategy<Value = AlgorithmSpec> {
    let ms = |lo: u64, hi: u64| (lo..hi).prop_map(Duration::from_millis);
    prop_oneof![
        (1u64..20, ms(1, 2_000))
            .prop_map(|(limit, window)| AlgorithmSpec::FixedWindow { limit, window }),
        (1u64..20, ms(1, 2_000))
            .prop_map(|(limit, window)| AlgorithmSpec::SlidingWindow { limit, window }),
        (1u64..20, 1u64..10, ms(1, 2_000)).prop_map(|(capacity, refill_amount, interval)| {
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval: interval,
            }
        }),
        (1u64..20, ms(1, 2_000), 1u64..20).prop_map(|(limit, period, burst)| {
            AlgorithmSpec::Gcra {
                limit,
                period,
                burst,
            }
        }),
        (1u64..20, ms(1, 2_000))
            .prop_map(|(limit, window)| AlgorithmSpec::SlidingLog { limit, window }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The provider is the model plus storage: fed the same sequence (including small and
    /// large clock regressions), every outcome equals the model's on its own state map.
    #[test]
    fn decisions_equal_the_reference_model(
        algorithm in any_algorithm(),
        steps in proptest::collection::vec((0u64..3, -2_500i64..1_500, 1u64..25), 1..60),
    ) {
        let limit = match &algorithm {
            AlgorithmSpec::FixedWindow { limit, .. }
            | AlgorithmSpec::CalendarWindow { limit, .. }
            | AlgorithmSpec::SlidingWindow { limit, .. }
            | AlgorithmSpec::SlidingLog { limit, .. } => *limit,
            AlgorithmSpec::TokenBucket { capacity, .. } => *capacity,
            AlgorithmSpec::Gcra { burst, .. } => *burst,
            AlgorithmSpec::Concurrency { .. } => return Ok(()),
        };
        let pol = policy("api", 1, algorithm, limit);
        let (p, clock) = provider(vec![pol.clone()]);
        let mut states: HashMap<u64, AlgorithmState> = HashMap::new();
        for (subject_n, step_ms, cost) in steps {
            let now = clock.now_ms_after(step_ms);
            let cost = cost.min(limit);
            let got = p.evaluate_now(&request("api", subject_n, cost));
            let evaluation = model::evaluate(&pol, states.get(&subject_n), now, Cost::new(cost).expect("valid cost"))
                .expect("the model evaluates valid input");
            let expected = match evaluation.verdict {
                Verdict::ClockUnsafe => RateLimitOutcome::Unavailable {
                    policy_id: pol.id().clone(),
                    retry_after_ms: evaluation.retry_after_ms,
                    category: UnavailableCategory::Clock,
                },
                _ => RateLimitOutcome::Evaluated(
                    evaluation.decision(&pol, Source::Local).expect("a decision"),
                ),
            };
            if let Some(state) = evaluation.new_state {
                states.insert(subject_n, state);
            }
            prop_assert_eq!(got, Ok(expected));
        }
    }
}

/// Moves a manual clock by a signed step and reads it.
trait StepClock {
    fn now_ms_after(&self, step_ms: i64) -> u64;
}

impl StepClock for ManualClock {
    fn now_ms_after(&self, step_ms: i64) -> u64 {
        use shared_contract::Clock;
        let now = self.now_ms().saturating_add_signed(step_ms);
        self.set(now);
        now
    }
}

#[test]
fn provider_is_send_sync_and_debug_without_state() {
    fn assert_send_sync<T: Send + Sync + std::fmt::Debug>() {}
    assert_send_sync::<LocalProvider>();
    let (p, _clock) = provider(vec![policy("api", 1, fixed(1, 60_000), 1)]);
    let debug = format!("{p:?}");
    assert!(
        debug.contains("LocalProvider") && debug.contains("api"),
        "{debug}"
    );
}

mod leases;
mod multi;
mod reload;
