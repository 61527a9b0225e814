//! Generators shared by the model property tests: policies from the whole accepted parameter
//! space or small enough to reach their limits, time steps and start times.

use std::time::Duration;

use proptest::prelude::*;
use shared_contract::exact::MAX_SAFE_INTEGER;
use shared_contract::policy::{MAX_DURATION_MS, MAX_TIME_MS, SLIDING_LOG_MAX_LIMIT};
use shared_contract::{
    AlgorithmSpec, Cost, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
};

/// Log-uniform integer in `1..=max`: small and huge values are equally likely to be tried.
pub fn log_uniform(max: u64) -> impl Strategy<Value = u64> + Clone {
    let bits = 64 - max.leading_zeros();
    (1..=bits, any::<u64>()).prop_map(move |(b, r)| {
        let hi = if b >= 64 { u64::MAX } else { (1u64 << b) - 1 };
        let lo = 1u64 << (b - 1);
        (lo + r % (hi - lo + 1)).min(max)
    })
}

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

pub fn algorithm_spec() -> impl Strategy<Value = AlgorithmSpec> {
    let limit = log_uniform(MAX_SAFE_INTEGER);
    let dur = log_uniform(MAX_DURATION_MS);
    prop_oneof![
        (limit.clone(), dur.clone()).prop_map(|(limit, w)| AlgorithmSpec::FixedWindow {
            limit,
            window: ms(w)
        }),
        (limit.clone(), dur.clone()).prop_map(|(limit, w)| AlgorithmSpec::SlidingWindow {
            limit,
            window: ms(w)
        }),
        (limit.clone(), limit.clone(), dur.clone()).prop_map(|(capacity, refill_amount, i)| {
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval: ms(i),
            }
        }),
        (limit.clone(), dur.clone(), limit.clone()).prop_map(|(limit, p, burst)| {
            AlgorithmSpec::Gcra {
                limit,
                period: ms(p),
                burst,
            }
        }),
        (log_uniform(SLIDING_LOG_MAX_LIMIT), dur).prop_map(|(limit, w)| {
            AlgorithmSpec::SlidingLog {
                limit,
                window: ms(w),
            }
        }),
    ]
}

/// Any accepted policy. Invalid draws are rejected, so only the accepted space is explored.
pub fn policy() -> impl Strategy<Value = RateLimitPolicy> {
    (
        algorithm_spec(),
        any::<u64>(),
        log_uniform(MAX_DURATION_MS),
        prop_oneof![Just(0u64), log_uniform(MAX_DURATION_MS)],
    )
        .prop_filter_map(
            "policy refused by validation",
            |(algorithm, mc, grace, regression)| {
                let limit = match algorithm {
                    AlgorithmSpec::FixedWindow { limit, .. }
                    | AlgorithmSpec::CalendarWindow { limit, .. }
                    | AlgorithmSpec::SlidingWindow { limit, .. }
                    | AlgorithmSpec::SlidingLog { limit, .. } => limit,
                    AlgorithmSpec::TokenBucket { capacity, .. } => capacity,
                    AlgorithmSpec::Gcra { burst, .. } => burst,
                    // Concurrency policies are never evaluated: their own properties are in
                    // concurrency_model.rs.
                    AlgorithmSpec::Concurrency { .. } => return None,
                };
                // max_cost is small, the whole limit, or anything between.
                let max_cost = match mc % 3 {
                    0 => 1 + mc % limit.min(10),
                    1 => limit,
                    _ => 1 + mc % limit,
                };
                built("p", algorithm, max_cost, grace, regression)
            },
        )
}

/// Policies small enough that a sequence of tens of steps reaches the limit and refills.
pub fn small_policy() -> impl Strategy<Value = RateLimitPolicy> {
    small_policy_named("p")
}

/// [`small_policy`] with the id `id`.
pub fn small_policy_named(id: &'static str) -> impl Strategy<Value = RateLimitPolicy> {
    let spec = prop_oneof![
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::FixedWindow {
            limit,
            window: ms(w)
        }),
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::SlidingWindow {
            limit,
            window: ms(w)
        }),
        (1u64..20, 1u64..20, 1u64..5_000).prop_map(|(capacity, refill_amount, i)| {
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval: ms(i),
            }
        }),
        (1u64..20, 1u64..5_000, 1u64..20).prop_map(|(limit, p, burst)| AlgorithmSpec::Gcra {
            limit,
            period: ms(p),
            burst,
        }),
        (1u64..20, 1u64..5_000).prop_map(|(limit, w)| AlgorithmSpec::SlidingLog {
            limit,
            window: ms(w)
        }),
    ];
    (spec, 1u64..20, 0u64..100, 0u64..3).prop_filter_map(
        "max_cost above limit",
        move |(algorithm, max_cost, regression, grace)| {
            built(id, algorithm, max_cost, grace, regression)
        },
    )
}

/// The policy `id` (revision 1, fail closed), or `None` when validation refuses it.
pub fn built(
    id: &str,
    algorithm: AlgorithmSpec,
    max_cost: u64,
    grace_ms: u64,
    regression_ms: u64,
) -> Option<RateLimitPolicy> {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).ok()?,
        revision: PolicyRevision::new(1).ok()?,
        algorithm,
        max_cost,
        cleanup_grace: ms(grace_ms),
        max_clock_regression: ms(regression_ms),
        failure_policy: FailurePolicy::FailClosed,
    })
    .ok()
}

/// A raw step: `(scale selector, raw offset, backwards?, raw cost)`, turned into a concrete
/// time step and cost by [`step`] once the policy is known.
pub type RawStep = (u8, u64, bool, u64);

pub fn raw_steps(max_len: usize) -> impl Strategy<Value = Vec<RawStep>> {
    proptest::collection::vec(
        (
            0u8..4,
            any::<u64>(),
            proptest::bool::weighted(0.1),
            any::<u64>(),
        ),
        1..max_len,
    )
}

/// Time step (signed) and cost for one raw step under `policy`.
pub fn step(policy: &RateLimitPolicy, raw: RawStep) -> (i64, Cost) {
    let (sel, r, back, c) = raw;
    let horizon = policy.algorithm().reset_horizon_ms().max(1);
    let span = match sel {
        0 => 3,
        1 => (horizon / 50).max(1),
        2 => (horizon / 5).max(1),
        _ => horizon.saturating_mul(2),
    };
    let dt = (r % (span + 1)).min(1 << 44) as i64;
    let dt = if back {
        -((r % (2 * policy.max_clock_regression_ms() + 3)) as i64)
    } else {
        dt
    };
    let cost = Cost::new(1 + c % policy.max_cost().get()).expect("cost within max_cost");
    (dt, cost)
}

pub fn start_time() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1_600_000_000_000u64..2_100_000_000_000,
        1 => 0u64..10_000,
        1 => (MAX_TIME_MS - (1 << 42))..=MAX_TIME_MS,
    ]
}
