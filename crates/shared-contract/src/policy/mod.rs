//! Rate-limit policies: one validated parameter type per algorithm, plus the rules every
//! algorithm shares. Construction refuses any policy whose arithmetic could leave Lua's exact
//! integer range, so providers never have to re-check it.

use std::fmt;
use std::time::Duration;

use crate::ids::{Cost, PolicyId, PolicyRevision};

mod algorithm;
mod builder;
pub mod calendar;
mod share;

pub use algorithm::{
    Algorithm, ConcurrencyParams, FixedWindowParams, GcraParams, Rules, SlidingLogParams,
    SlidingWindowParams, TokenBucketParams,
};
pub use builder::{
    DEFAULT_CLEANUP_GRACE, DEFAULT_MAX_CLOCK_REGRESSION, DEFAULT_MAX_COST, DEFAULT_REVISION,
    PolicyBuilder,
};

/// Latest server time (Unix ms) the models accept: 2^48-1, year 10889. Stored timestamps fit in
/// six bytes, and `time + duration` sums stay far below 2^53-1.
pub const MAX_TIME_MS: u64 = (1 << 48) - 1;

/// Longest accepted duration (window, period, refill interval, grace, regression): 2^40-1 ms,
/// about 34.8 years.
pub const MAX_DURATION_MS: u64 = (1 << 40) - 1;

/// Fixed-point scale of the sliding-window counter's weight of the previous window.
pub const SLIDING_WINDOW_SCALE: u64 = 1_000_000;

/// Largest `limit` of a sliding log: its state holds one entry per admitted request, so the
/// limit bounds memory and the work of each evaluation.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 1_000;

/// Largest `limit` of a concurrency policy: its state holds one entry per lease.
pub const CONCURRENCY_MAX_LIMIT: u64 = 1_000_000;

/// Longest `lease_ttl`: one day. A lease is meant to outlive one request, not a session;
/// a crashed holder's place stays taken this long at most.
pub const MAX_LEASE_TTL_MS: u64 = 86_400_000;

/// Smallest value of every count a policy holds (`limit`, `capacity`, `refill_amount`,
/// `burst`, `max_cost`, `revision`). A configuration layer that reads a negative number for
/// one of them reports it with this bound, in the words of [`RateLimitPolicy::new`]'s
/// "must be >= 1, got 0", so that 0 and -3 get one message.
pub const MIN_COUNT: u64 = 1;

/// A policy parameter that was refused, named by its configuration key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    /// The configuration key of the parameter (`capacity`, `window`, `max_cost`, ...).
    pub field: &'static str,
    /// What is wrong with it, with the refused value (e.g. `must be >= 1, got 0`).
    pub problem: String,
}

impl PolicyError {
    fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }
}

/// Every problem found in one policy, so a configuration can be fixed in one pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct PolicyErrors(pub Vec<PolicyError>);

/// The algorithms, by their configuration names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// Fixed window: at most `limit` cost per epoch-aligned window.
    FixedWindow,
    /// Sliding-window counter: an estimate of the cost in the last window.
    SlidingWindow,
    /// Token bucket: `capacity` tokens refilled continuously.
    TokenBucket,
    /// GCRA: a sustained rate with a burst.
    Gcra,
    /// Sliding log: exact; at most `limit` cost in any window.
    SlidingLog,
    /// At most `limit` leases held at once (not a rate: see [`crate::lease`]).
    Concurrency,
}

impl AlgorithmKind {
    /// The rate algorithms: what `evaluate` decides, one Lua program each.
    pub const RATE: [AlgorithmKind; 5] = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::SlidingLog,
    ];

    /// Every algorithm: the rate ones, then concurrency.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::SlidingLog,
        AlgorithmKind::Concurrency,
    ];

    /// The configuration name (`"token_bucket"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::SlidingLog => "sliding_log",
            AlgorithmKind::Concurrency => "concurrency",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether the algorithm takes reservations and charges after the work
    /// ([`crate::model::reserve`]): every rate algorithm but the sliding log, for which the
    /// models define no refund or overdraft; a concurrency policy is not a rate.
    pub fn takes_reservations(self) -> bool {
        !matches!(self, AlgorithmKind::SlidingLog | AlgorithmKind::Concurrency)
    }

    /// Whether decisions of this algorithm are exact (`Certain`) or an estimate.
    pub fn certainty(self) -> crate::Certainty {
        match self {
            AlgorithmKind::SlidingWindow => crate::Certainty::ApproximateAlgorithm,
            _ => crate::Certainty::Certain,
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a caller wants when the provider cannot give a certain answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Refuse the request (the default): an unknown answer is never an allow.
    #[default]
    FailClosed,
    /// Let the request through, reported as such.
    FailOpen,
    /// Decide with a per-instance local limiter, reported as `local_fallback`.
    FallbackLocal,
}

impl FailurePolicy {
    /// The configuration name (`fail_closed`, `fail_open`, `fallback_local`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FallbackLocal => "fallback_local",
        }
    }

    /// Parses a configuration name; `None` for an unknown one.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::FailClosed, Self::FailOpen, Self::FallbackLocal]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// Unvalidated algorithm parameters, as a configuration layer reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlgorithmSpec {
    /// At most `limit` cost per epoch-aligned window.
    FixedWindow {
        /// Most cost per window, `1..=2^53-1`.
        limit: u64,
        /// Window length: whole milliseconds, `1 ms..=MAX_DURATION_MS`.
        window: Duration,
    },
    /// A fixed window whose windows are calendar periods (`window = "calendar:month"`): at most
    /// `limit` cost per hour, day, week or month of `time_zone` ([`calendar`]). Validated into
    /// [`Algorithm::FixedWindow`] with a [`calendar::Calendar`].
    CalendarWindow {
        /// Most cost per period, `1..=2^53-1`.
        limit: u64,
        /// The period.
        unit: calendar::CalendarUnit,
        /// `UTC` or an IANA zone name (`Europe/Berlin`).
        time_zone: String,
    },
    /// The previous window's count weighted by its share still inside the sliding window, plus the
    /// current one's.
    SlidingWindow {
        /// Most estimated cost per window, `1..=9_007_199_254` (`limit * SLIDING_WINDOW_SCALE`
        /// stays exact).
        limit: u64,
        /// Window length: whole milliseconds, `1 ms..=9_007_199_254 ms`.
        window: Duration,
    },
    /// `capacity` tokens, starting full, refilled by `refill_amount` per `refill_interval`.
    TokenBucket {
        /// Most tokens the bucket holds, at least 1; `capacity * scale` must stay within 2^53-1.
        capacity: u64,
        /// Tokens added per `refill_interval`, at least 1 (added continuously, not in steps).
        refill_amount: u64,
        /// Refill period: whole milliseconds, `1 ms..=MAX_DURATION_MS`; refilling the whole bucket
        /// may take at most `MAX_DURATION_MS`.
        refill_interval: Duration,
    },
    /// Sustained `limit` per `period`, up to `burst` at once.
    Gcra {
        /// Sustained cost per `period`, at least 1.
        limit: u64,
        /// Period of the sustained rate: whole milliseconds, `1 ms..=MAX_DURATION_MS`.
        period: Duration,
        /// Most cost admitted at once from empty state, at least 1; a full burst must recover
        /// within `MAX_DURATION_MS`.
        burst: u64,
    },
    /// Exact: at most `limit` cost in any window `(t - window, t]`.
    SlidingLog {
        /// Most cost in any window, `1..=SLIDING_LOG_MAX_LIMIT` (1,000).
        limit: u64,
        /// Window length: whole milliseconds, `1 ms..=MAX_DURATION_MS`.
        window: Duration,
    },
    /// `max_cost` must be 1: one lease is one place.
    Concurrency {
        /// Most leases of one subject held at once, `1..=CONCURRENCY_MAX_LIMIT` (1,000,000).
        limit: u64,
        /// How long a lease lives unless released: whole milliseconds, `1 ms..=MAX_LEASE_TTL_MS`
        /// (one day).
        lease_ttl: Duration,
    },
}

/// Unvalidated policy fields; [`RateLimitPolicy::new`] checks them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// How requests and configuration name the policy; unique within a
    /// [`PolicySet`](crate::PolicySet).
    pub id: PolicyId,
    /// The policy's revision; a new revision starts from empty state.
    pub revision: PolicyRevision,
    /// The algorithm and its parameters.
    pub algorithm: AlgorithmSpec,
    /// Most cost of one request: at least 1 and at most the algorithm's limit, capacity or burst;
    /// exactly 1 for concurrency.
    pub max_cost: u64,
    /// Extra time state is kept past its reset point: whole milliseconds, `0..=MAX_DURATION_MS`.
    pub cleanup_grace: Duration,
    /// Largest clock regression that a rate algorithm computes with the last write's time instead
    /// of refused: whole milliseconds, `0..=MAX_DURATION_MS`.
    pub max_clock_regression: Duration,
    /// What the caller wants when the provider cannot give a certain answer.
    pub failure_policy: FailurePolicy,
}

/// A duration in whole milliseconds, `min..=MAX_DURATION_MS`; `None` after pushing the
/// problem. Gate settings share it, so both refuse durations alike.
pub(crate) fn millis(
    errors: &mut Vec<PolicyError>,
    field: &'static str,
    d: Duration,
    min: u64,
) -> Option<u64> {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        errors.push(PolicyError::new(
            field,
            format!("must be a whole number of milliseconds, got {d:?}"),
        ));
        return None;
    }
    let ms = d.as_millis();
    if ms < u128::from(min) || ms > u128::from(MAX_DURATION_MS) {
        errors.push(PolicyError::new(
            field,
            format!("must be between {min} ms and {MAX_DURATION_MS} ms, got {ms} ms"),
        ));
        return None;
    }
    Some(ms as u64)
}

pub(crate) fn in_range(
    errors: &mut Vec<PolicyError>,
    field: &'static str,
    v: u64,
    min: u64,
    max: u64,
) -> Option<u64> {
    if v < min {
        errors.push(PolicyError::new(
            field,
            format!("must be >= {min}, got {v}"),
        ));
        None
    } else if v > max {
        errors.push(PolicyError::new(
            field,
            format!("must be <= {max}, got {v}"),
        ));
        None
    } else {
        Some(v)
    }
}

/// A validated, frozen rate-limit policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitPolicy {
    id: PolicyId,
    revision: PolicyRevision,
    algorithm: Algorithm,
    max_cost: Cost,
    cleanup_grace_ms: u64,
    max_clock_regression_ms: u64,
    failure_policy: FailurePolicy,
    shadow: bool,
    deny_cache: bool,
}

impl RateLimitPolicy {
    /// Validates every field of `spec`.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per refused field, each named by its configuration key.
    pub fn new(spec: PolicySpec) -> Result<Self, PolicyErrors> {
        let mut errors = Vec::new();
        let algorithm = Algorithm::validate(&spec.algorithm, &mut errors);
        let grace = millis(&mut errors, "cleanup_grace", spec.cleanup_grace, 0);
        let regression = millis(
            &mut errors,
            "max_clock_regression",
            spec.max_clock_regression,
            0,
        );
        let max_cost = match algorithm {
            Some(a) => {
                let field = match a.kind() {
                    AlgorithmKind::TokenBucket => "capacity",
                    AlgorithmKind::Gcra => "burst",
                    _ => "limit",
                };
                if spec.max_cost < MIN_COUNT {
                    errors.push(PolicyError::new(
                        "max_cost",
                        format!("must be >= {MIN_COUNT}, got {}", spec.max_cost),
                    ));
                    None
                } else if a.kind() == AlgorithmKind::Concurrency && spec.max_cost != 1 {
                    errors.push(PolicyError::new(
                        "max_cost",
                        format!(
                            "must be 1 for a concurrency policy (one lease is one place), got {}",
                            spec.max_cost
                        ),
                    ));
                    None
                } else if spec.max_cost > a.limit() {
                    errors.push(PolicyError::new(
                        "max_cost",
                        format!(
                            "must be <= the policy's {field} ({}), got {}",
                            a.limit(),
                            spec.max_cost
                        ),
                    ));
                    None
                } else {
                    Cost::new(spec.max_cost).ok()
                }
            }
            None => None,
        };
        match (algorithm, max_cost, grace, regression) {
            (
                Some(algorithm),
                Some(max_cost),
                Some(cleanup_grace_ms),
                Some(max_clock_regression_ms),
            ) if errors.is_empty() => Ok(Self {
                id: spec.id,
                revision: spec.revision,
                algorithm,
                max_cost,
                cleanup_grace_ms,
                max_clock_regression_ms,
                failure_policy: spec.failure_policy,
                shadow: false,
                deny_cache: true,
            }),
            _ => Err(PolicyErrors(errors)),
        }
    }

    /// How requests name the policy.
    pub fn id(&self) -> &PolicyId {
        &self.id
    }
    /// The policy's revision; state of another revision is never used.
    pub fn revision(&self) -> PolicyRevision {
        self.revision
    }
    /// The algorithm and its validated parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
    /// Which algorithm decides.
    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm.kind()
    }
    /// Most cost of one request; a larger cost is refused as
    /// [`RequestError::CostAboveMax`](crate::RequestError::CostAboveMax).
    pub fn max_cost(&self) -> Cost {
        self.max_cost
    }
    /// Extra time, in ms, that state is kept past its reset point.
    pub fn cleanup_grace_ms(&self) -> u64 {
        self.cleanup_grace_ms
    }
    /// Largest clock regression, in ms, that a rate algorithm computes with the last write's time;
    /// a larger one answers `Unavailable(clock)`.
    pub fn max_clock_regression_ms(&self) -> u64 {
        self.max_clock_regression_ms
    }
    /// What the caller wants when the provider cannot give a certain answer.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }
    /// Whether the policy is in shadow mode: evaluated and charged as usual, but the edge
    /// never denies a request for it (operators trial a limit on live traffic). Providers
    /// ignore it: it changes no state and no decision, only what the edge does with one.
    pub fn shadow(&self) -> bool {
        self.shadow
    }
    /// The same policy, in shadow mode when `shadow` (see [`Self::shadow`]); not in it
    /// unless set.
    #[must_use]
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }
    /// Whether a provider with shared state may answer a repeated denial from this process's
    /// exact denial cache ([`crate::model::DenialBound`]) instead of a call: on unless turned
    /// off (it is exact for every rate algorithm; concurrency policies are never cached).
    /// Like shadow mode it changes no state and no decision, only where a denial comes from.
    pub fn deny_cache(&self) -> bool {
        self.deny_cache
    }
    /// The same policy, its denials cached when `deny_cache` (see [`Self::deny_cache`]).
    #[must_use]
    pub fn with_deny_cache(mut self, deny_cache: bool) -> Self {
        self.deny_cache = deny_cache;
        self
    }
    /// The rules shared by all algorithms, as the models take them.
    pub fn rules(&self) -> Rules {
        Rules {
            max_clock_regression_ms: self.max_clock_regression_ms,
            cleanup_grace_ms: self.cleanup_grace_ms,
        }
    }
    /// Longest time state lives after its last write: reset horizon plus cleanup grace.
    pub fn state_lifetime_ms(&self) -> u64 {
        self.algorithm.reset_horizon_ms() + self.cleanup_grace_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::MAX_SAFE_INTEGER;

    fn spec(algorithm: AlgorithmSpec, max_cost: u64) -> PolicySpec {
        PolicySpec {
            id: PolicyId::new("api").expect("valid id"),
            revision: PolicyRevision::new(1).expect("valid revision"),
            algorithm,
            max_cost,
            cleanup_grace: Duration::from_secs(60),
            max_clock_regression: Duration::from_secs(2),
            failure_policy: FailurePolicy::FailClosed,
        }
    }

    fn fields(r: Result<RateLimitPolicy, PolicyErrors>) -> Vec<&'static str> {
        r.err()
            .map(|e| e.0.iter().map(|e| e.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_bad_field_is_reported_by_name_at_once() {
        let r = RateLimitPolicy::new(spec(
            AlgorithmSpec::TokenBucket {
                capacity: 0,
                refill_amount: 0,
                refill_interval: Duration::ZERO,
            },
            1,
        ));
        assert_eq!(
            fields(r),
            vec!["capacity", "refill_amount", "refill_interval"]
        );
    }

    #[test]
    fn max_cost_must_fit_the_limit() {
        let fw = |max_cost| {
            RateLimitPolicy::new(spec(
                AlgorithmSpec::FixedWindow {
                    limit: 10,
                    window: Duration::from_secs(1),
                },
                max_cost,
            ))
        };
        assert!(fw(10).is_ok());
        assert_eq!(fields(fw(11)), vec!["max_cost"]);
        assert_eq!(fields(fw(0)), vec!["max_cost"]);
    }

    #[test]
    fn token_bucket_arithmetic_beyond_two_to_the_53_is_refused() {
        // 1 token per 7 ms: scale 7; capacity near 2^53 times 7 overflows.
        let r = RateLimitPolicy::new(spec(
            AlgorithmSpec::TokenBucket {
                capacity: MAX_SAFE_INTEGER / 2,
                refill_amount: 1,
                refill_interval: Duration::from_millis(7),
            },
            1,
        ));
        assert_eq!(fields(r), vec!["capacity"]);
    }

    #[test]
    fn token_bucket_rate_is_reduced_to_lowest_terms() {
        let p = RateLimitPolicy::new(spec(
            AlgorithmSpec::TokenBucket {
                capacity: 100,
                refill_amount: 10,
                refill_interval: Duration::from_secs(1),
            },
            10,
        ))
        .expect("valid policy");
        let Algorithm::TokenBucket(tb) = p.algorithm() else {
            panic!("token bucket expected")
        };
        assert_eq!((tb.scale(), tb.units_per_ms()), (100, 1));
        assert_eq!(p.algorithm().reset_horizon_ms(), 10_000);
    }

    #[test]
    fn sub_millisecond_durations_are_refused() {
        let r = RateLimitPolicy::new(spec(
            AlgorithmSpec::FixedWindow {
                limit: 1,
                window: Duration::from_micros(1500),
            },
            1,
        ));
        assert_eq!(fields(r), vec!["window"]);
    }

    #[test]
    fn sliding_window_limit_and_window_stay_exact_after_scaling() {
        let r = RateLimitPolicy::new(spec(
            AlgorithmSpec::SlidingWindow {
                limit: MAX_SAFE_INTEGER / SLIDING_WINDOW_SCALE + 1,
                window: Duration::from_millis(MAX_SAFE_INTEGER / SLIDING_WINDOW_SCALE + 1),
            },
            1,
        ));
        assert_eq!(fields(r), vec!["limit", "window"]);
    }

    #[test]
    fn sliding_log_limit_is_bounded() {
        let r = RateLimitPolicy::new(spec(
            AlgorithmSpec::SlidingLog {
                limit: SLIDING_LOG_MAX_LIMIT + 1,
                window: Duration::from_secs(1),
            },
            1,
        ));
        assert_eq!(fields(r), vec!["limit"]);
    }

    #[test]
    fn algorithm_names_round_trip() {
        for k in AlgorithmKind::ALL {
            assert_eq!(AlgorithmKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(AlgorithmKind::parse("leaky_bucket"), None);
    }
}
