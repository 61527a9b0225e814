//! Rate-limit policies: one validated parameter type per algorithm, plus the rules every
//! algorithm shares. Construction refuses any policy whose arithmetic could leave Lua's exact
//! integer range, so providers never have to re-check it.

use std::fmt;
use std::time::Duration;

use crate::exact::{self, MAX_SAFE_INTEGER};
use crate::ids::{Cost, PolicyId, PolicyRevision};

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

/// A policy parameter that was refused, named by its configuration key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    /// The configuration key of the parameter (`capacity`, `window`, `max_cost`, ...).
    pub field: &'static str,
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
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    Gcra,
    SlidingLog,
}

impl AlgorithmKind {
    pub const ALL: [AlgorithmKind; 5] = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::SlidingLog,
    ];

    /// The configuration name (`"token_bucket"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::SlidingLog => "sliding_log",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
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
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FallbackLocal => "fallback_local",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::FailClosed, Self::FailOpen, Self::FallbackLocal]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// Unvalidated algorithm parameters, as a configuration layer reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlgorithmSpec {
    FixedWindow {
        limit: u64,
        window: Duration,
    },
    SlidingWindow {
        limit: u64,
        window: Duration,
    },
    TokenBucket {
        capacity: u64,
        refill_amount: u64,
        refill_interval: Duration,
    },
    Gcra {
        limit: u64,
        period: Duration,
        burst: u64,
    },
    SlidingLog {
        limit: u64,
        window: Duration,
    },
}

/// Unvalidated policy fields; [`RateLimitPolicy::new`] checks them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    pub id: PolicyId,
    pub revision: PolicyRevision,
    pub algorithm: AlgorithmSpec,
    pub max_cost: u64,
    pub cleanup_grace: Duration,
    pub max_clock_regression: Duration,
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

fn in_range(
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

/// Fixed window: at most `limit` cost per epoch-aligned window of `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowParams {
    limit: u64,
    window_ms: u64,
}

impl FixedWindowParams {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// Sliding-window counter: the previous window's count weighted by the part of it still
/// inside the sliding window (conservatively rounded up), plus the current window's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowParams {
    limit: u64,
    window_ms: u64,
}

impl SlidingWindowParams {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// Token bucket: `capacity` tokens, starting full, refilled continuously at
/// `refill_amount / refill_interval`.
///
/// Tokens are counted in units of `1/scale` token with `scale = refill_interval_ms / g`
/// (`g = gcd(refill_amount, refill_interval_ms)`), so one millisecond adds exactly
/// `units_per_ms = refill_amount / g` units: refill is an exact integer product, and the
/// sub-token remainder lives in the low part of the count instead of a separate field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketParams {
    capacity: u64,
    refill_amount: u64,
    refill_interval_ms: u64,
    scale: u64,
    units_per_ms: u64,
}

impl TokenBucketParams {
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn refill_amount(&self) -> u64 {
        self.refill_amount
    }
    pub fn refill_interval_ms(&self) -> u64 {
        self.refill_interval_ms
    }
    /// Units per token.
    pub fn scale(&self) -> u64 {
        self.scale
    }
    /// Units added per millisecond.
    pub fn units_per_ms(&self) -> u64 {
        self.units_per_ms
    }
    /// Capacity in units (`capacity * scale`).
    pub fn capacity_units(&self) -> u64 {
        self.capacity * self.scale
    }
}

/// GCRA: sustained `limit` per `period`, up to `burst` at once.
///
/// Time is counted in units of `1/units_per_ms` ms with `units_per_ms = limit / g` and the
/// emission interval is `interval_units = period_ms / g` (`g = gcd(limit, period_ms)`), so
/// the theoretical arrival time is an exact integer. State keeps the TAT as a debt: how far
/// the TAT lies ahead of the last update, in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    limit: u64,
    period_ms: u64,
    burst: u64,
    interval_units: u64,
    units_per_ms: u64,
}

impl GcraParams {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// Emission interval of one cost unit, in time units.
    pub fn interval_units(&self) -> u64 {
        self.interval_units
    }
    /// Time units per millisecond.
    pub fn units_per_ms(&self) -> u64 {
        self.units_per_ms
    }
    /// The largest debt: `burst * interval_units`.
    pub fn tolerance_units(&self) -> u64 {
        self.burst * self.interval_units
    }
}

/// Sliding log: exact; at most `limit` cost in any window `(t - window, t]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLogParams {
    limit: u64,
    window_ms: u64,
}

impl SlidingLogParams {
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// Validated algorithm parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    FixedWindow(FixedWindowParams),
    SlidingWindow(SlidingWindowParams),
    TokenBucket(TokenBucketParams),
    Gcra(GcraParams),
    SlidingLog(SlidingLogParams),
}

impl Algorithm {
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Algorithm::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Algorithm::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            Algorithm::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Algorithm::Gcra(_) => AlgorithmKind::Gcra,
            Algorithm::SlidingLog(_) => AlgorithmKind::SlidingLog,
        }
    }

    /// The most cost that can be admitted at once from empty state: limit, capacity or burst.
    pub fn limit(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(p) => p.limit,
            Algorithm::SlidingWindow(p) => p.limit,
            Algorithm::TokenBucket(p) => p.capacity,
            Algorithm::Gcra(p) => p.burst,
            Algorithm::SlidingLog(p) => p.limit,
        }
    }

    /// Longest time after its last write that state can still differ from no state at all.
    pub fn reset_horizon_ms(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(p) => p.window_ms,
            Algorithm::SlidingWindow(p) => 2 * p.window_ms,
            Algorithm::TokenBucket(p) => p.capacity_units().div_ceil(p.units_per_ms),
            Algorithm::Gcra(p) => p.tolerance_units().div_ceil(p.units_per_ms),
            Algorithm::SlidingLog(p) => p.window_ms,
        }
    }

    /// The header mapping of draft-ietf-httpapi-ratelimit-headers: quota and window seconds.
    /// Windows map directly; a token bucket is `capacity` per full refill time, GCRA is `limit`
    /// per `period` (its sustained rate).
    pub fn quota_window(&self) -> (u64, u64) {
        let secs = |ms: u64| ms.div_ceil(1000).max(1);
        match self {
            Algorithm::FixedWindow(p) => (p.limit, secs(p.window_ms)),
            Algorithm::SlidingWindow(p) => (p.limit, secs(p.window_ms)),
            Algorithm::SlidingLog(p) => (p.limit, secs(p.window_ms)),
            Algorithm::TokenBucket(p) => (p.capacity, secs(self.reset_horizon_ms().max(1))),
            Algorithm::Gcra(p) => (p.limit, secs(p.period_ms)),
        }
    }

    /// Validates `spec`, pushing one problem per refused field: each algorithm's check reads
    /// every field before any `?` gives up, so all problems are reported at once.
    fn validate(spec: &AlgorithmSpec, e: &mut Vec<PolicyError>) -> Option<Algorithm> {
        Some(match *spec {
            AlgorithmSpec::FixedWindow { limit, window } => {
                let (limit, window_ms) = limit_and_window(e, limit, MAX_SAFE_INTEGER, window)?;
                Algorithm::FixedWindow(FixedWindowParams { limit, window_ms })
            }
            AlgorithmSpec::SlidingWindow { limit, window } => {
                Algorithm::SlidingWindow(SlidingWindowParams::validate(e, limit, window)?)
            }
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_amount,
                refill_interval,
            } => Algorithm::TokenBucket(TokenBucketParams::validate(
                e,
                capacity,
                refill_amount,
                refill_interval,
            )?),
            AlgorithmSpec::Gcra {
                limit,
                period,
                burst,
            } => Algorithm::Gcra(GcraParams::validate(e, limit, period, burst)?),
            AlgorithmSpec::SlidingLog { limit, window } => {
                let (limit, window_ms) = limit_and_window(e, limit, SLIDING_LOG_MAX_LIMIT, window)?;
                Algorithm::SlidingLog(SlidingLogParams { limit, window_ms })
            }
        })
    }
}

/// `limit` in `1..=max_limit` and a window of at least 1 ms. Both are checked before either
/// gives up, so every problem is reported.
fn limit_and_window(
    e: &mut Vec<PolicyError>,
    limit: u64,
    max_limit: u64,
    window: Duration,
) -> Option<(u64, u64)> {
    let limit = in_range(e, "limit", limit, 1, max_limit);
    let window_ms = millis(e, "window", window, 1);
    Some((limit?, window_ms?))
}

/// A rate of `amount` per `interval_ms` in lowest terms: `(amount / g, interval_ms / g)` with
/// `g = gcd(amount, interval_ms)`.
fn lowest_terms(amount: u64, interval_ms: u64) -> (u64, u64) {
    let g = exact::gcd(amount, interval_ms);
    (amount / g, interval_ms / g)
}

/// Checks the largest state of a token bucket or GCRA: `count * per_count` units (a full
/// bucket, a full burst) must stay exact, and working it off at `units_per_ms` must take at
/// most [`MAX_DURATION_MS`]. Pushes `overflow` or `too_slow(ms)` otherwise.
fn full_units_fit(
    e: &mut Vec<PolicyError>,
    count: u64,
    per_count: u64,
    units_per_ms: u64,
    overflow: impl FnOnce() -> PolicyError,
    too_slow: impl FnOnce(u64) -> PolicyError,
) -> Option<()> {
    match exact::mul(count, per_count) {
        Err(_) => {
            e.push(overflow());
            None
        }
        Ok(units) if units.div_ceil(units_per_ms) > MAX_DURATION_MS => {
            e.push(too_slow(units.div_ceil(units_per_ms)));
            None
        }
        Ok(_) => Some(()),
    }
}

impl SlidingWindowParams {
    fn validate(e: &mut Vec<PolicyError>, limit: u64, window: Duration) -> Option<Self> {
        // Both `limit` and `window` are multiplied by the weight scale.
        let max = MAX_SAFE_INTEGER / SLIDING_WINDOW_SCALE;
        let limit = in_range(e, "limit", limit, 1, max);
        let window_ms = millis(e, "window", window, 1).and_then(|w| {
            if w > max {
                e.push(PolicyError::new(
                    "window",
                    format!("must be <= {max} ms so that window * {SLIDING_WINDOW_SCALE} stays exact, got {w} ms"),
                ));
                None
            } else {
                Some(w)
            }
        });
        Some(Self {
            limit: limit?,
            window_ms: window_ms?,
        })
    }
}

impl TokenBucketParams {
    fn validate(
        e: &mut Vec<PolicyError>,
        capacity: u64,
        refill_amount: u64,
        refill_interval: Duration,
    ) -> Option<Self> {
        let capacity = in_range(e, "capacity", capacity, 1, MAX_SAFE_INTEGER);
        let amount = in_range(e, "refill_amount", refill_amount, 1, MAX_SAFE_INTEGER);
        let interval = millis(e, "refill_interval", refill_interval, 1);
        let (capacity, amount, interval) = (capacity?, amount?, interval?);
        let (units_per_ms, scale) = lowest_terms(amount, interval);
        full_units_fit(
            e,
            capacity,
            scale,
            units_per_ms,
            || {
                PolicyError::new(
                    "capacity",
                    format!(
                        "capacity * (refill_interval_ms / gcd) = {capacity} * {scale} exceeds 2^53-1; lower capacity or choose a refill rate with a smaller denominator"
                    ),
                )
            },
            |ms| {
                PolicyError::new(
                    "refill_amount",
                    format!(
                        "refilling the whole bucket takes {ms} ms, more than {MAX_DURATION_MS} ms"
                    ),
                )
            },
        )?;
        Some(Self {
            capacity,
            refill_amount: amount,
            refill_interval_ms: interval,
            scale,
            units_per_ms,
        })
    }
}

impl GcraParams {
    fn validate(
        e: &mut Vec<PolicyError>,
        limit: u64,
        period: Duration,
        burst: u64,
    ) -> Option<Self> {
        let limit = in_range(e, "limit", limit, 1, MAX_SAFE_INTEGER);
        let period = millis(e, "period", period, 1);
        let burst = in_range(e, "burst", burst, 1, MAX_SAFE_INTEGER);
        let (limit, period_ms, burst) = (limit?, period?, burst?);
        let (units_per_ms, interval_units) = lowest_terms(limit, period_ms);
        full_units_fit(
            e,
            burst,
            interval_units,
            units_per_ms,
            || {
                PolicyError::new(
                    "burst",
                    format!(
                        "burst * (period_ms / gcd) = {burst} * {interval_units} exceeds 2^53-1"
                    ),
                )
            },
            |ms| {
                PolicyError::new(
                    "burst",
                    format!(
                        "a full burst takes {ms} ms to recover, more than {MAX_DURATION_MS} ms"
                    ),
                )
            },
        )?;
        Some(Self {
            limit,
            period_ms,
            burst,
            interval_units,
            units_per_ms,
        })
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
                if spec.max_cost == 0 || spec.max_cost > a.limit() {
                    errors.push(PolicyError::new(
                        "max_cost",
                        format!(
                            "must be between 1 and the policy's {field} ({}), got {}",
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
            }),
            _ => Err(PolicyErrors(errors)),
        }
    }

    pub fn id(&self) -> &PolicyId {
        &self.id
    }
    pub fn revision(&self) -> PolicyRevision {
        self.revision
    }
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm.kind()
    }
    pub fn max_cost(&self) -> Cost {
        self.max_cost
    }
    pub fn cleanup_grace_ms(&self) -> u64 {
        self.cleanup_grace_ms
    }
    pub fn max_clock_regression_ms(&self) -> u64 {
        self.max_clock_regression_ms
    }
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }
    /// The rules shared by all algorithms, as the models take them.
    pub fn rules(&self) -> crate::model::Rules {
        crate::model::Rules {
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
