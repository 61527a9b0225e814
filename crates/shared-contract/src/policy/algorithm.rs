//! Validated algorithm parameters, one type per algorithm, beside the [`Rules`] every algorithm
//! shares, and the checks that build them: every bound keeps the algorithm's arithmetic inside
//! Lua's exact integer range.

use std::time::Duration;

use super::calendar::Calendar;
use super::{
    AlgorithmKind, AlgorithmSpec, CONCURRENCY_MAX_LIMIT, MAX_DURATION_MS, MAX_LEASE_TTL_MS,
    MIN_COUNT, PolicyError, SLIDING_LOG_MAX_LIMIT, SLIDING_WINDOW_SCALE, in_range, millis,
};
use crate::exact::{self, MAX_SAFE_INTEGER};

/// The rules every algorithm shares, taken from the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Largest step back of the clock, in ms, that is computed with the last write's time instead;
    /// further back answers `ClockUnsafe`.
    pub max_clock_regression_ms: u64,
    /// Extra time, in ms, a write lives past the point where it no longer differs from no state.
    pub cleanup_grace_ms: u64,
}

/// Fixed window: at most `limit` cost per epoch-aligned window of `window_ms`, or per calendar
/// period ([`Self::calendar`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowParams {
    limit: u64,
    window_ms: u64,
    calendar: Option<Calendar>,
}

impl FixedWindowParams {
    /// Most cost per window, at least 1.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Window length in ms, at least 1; for a calendar period, its longest length (what
    /// horizons and lifetimes take).
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
    /// The calendar period of the windows, when they are calendar periods rather than
    /// `window_ms` from the epoch.
    pub fn calendar(&self) -> Option<Calendar> {
        self.calendar
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
    /// Most estimated cost per window, at least 1.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Window length in ms, at least 1.
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
    /// Most tokens the bucket holds, at least 1; a new bucket starts full.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Tokens added per refill interval, at least 1.
    pub fn refill_amount(&self) -> u64 {
        self.refill_amount
    }
    /// Refill interval in ms, at least 1.
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
    /// Sustained cost per period, at least 1.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Period of the sustained rate in ms, at least 1.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }
    /// Most cost admitted at once from empty state, at least 1.
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
    /// Most cost in any window, `1..=1_000`.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Window length in ms, at least 1.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// Concurrency: at most `limit` leases of one subject held at once, each expiring
/// `lease_ttl_ms` after its acquire unless released first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyParams {
    limit: u64,
    lease_ttl_ms: u64,
}

impl ConcurrencyParams {
    /// Most leases of one subject held at once, `1..=1_000_000`.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// How long a lease lives unless released, in ms: `1..=86_400_000` (one day).
    pub fn lease_ttl_ms(&self) -> u64 {
        self.lease_ttl_ms
    }
}

/// Validated algorithm parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// At most `limit` cost per epoch-aligned window.
    FixedWindow(FixedWindowParams),
    /// An estimate of the cost in the last window, from two fixed windows' counts.
    SlidingWindow(SlidingWindowParams),
    /// `capacity` tokens refilled continuously.
    TokenBucket(TokenBucketParams),
    /// A sustained rate with a burst.
    Gcra(GcraParams),
    /// Exact: every admitted cost in the window is kept.
    SlidingLog(SlidingLogParams),
    /// At most `limit` leases held at once (not a rate: see [`crate::lease`]).
    Concurrency(ConcurrencyParams),
}

impl Algorithm {
    /// Which algorithm this is.
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Algorithm::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Algorithm::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            Algorithm::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Algorithm::Gcra(_) => AlgorithmKind::Gcra,
            Algorithm::SlidingLog(_) => AlgorithmKind::SlidingLog,
            Algorithm::Concurrency(_) => AlgorithmKind::Concurrency,
        }
    }

    /// The most cost that can be admitted at once from empty state: limit, capacity or burst
    /// (for concurrency: the most leases held at once).
    pub fn limit(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(p) => p.limit,
            Algorithm::SlidingWindow(p) => p.limit,
            Algorithm::TokenBucket(p) => p.capacity,
            Algorithm::Gcra(p) => p.burst,
            Algorithm::SlidingLog(p) => p.limit,
            Algorithm::Concurrency(p) => p.limit,
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
            // The latest lease expires `lease_ttl` after the last write (an acquire).
            Algorithm::Concurrency(p) => p.lease_ttl_ms,
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
            Algorithm::Concurrency(p) => (p.limit, secs(p.lease_ttl_ms)),
        }
    }

    /// Validates `spec`, pushing one problem per refused field: each algorithm's check reads
    /// every field before any `?` gives up, so all problems are reported at once.
    pub(super) fn validate(spec: &AlgorithmSpec, e: &mut Vec<PolicyError>) -> Option<Algorithm> {
        Some(match *spec {
            AlgorithmSpec::FixedWindow { limit, window } => {
                let (limit, window_ms) = limit_and_window(e, limit, MAX_SAFE_INTEGER, window)?;
                Algorithm::FixedWindow(FixedWindowParams {
                    limit,
                    window_ms,
                    calendar: None,
                })
            }
            AlgorithmSpec::CalendarWindow {
                limit,
                unit,
                ref time_zone,
            } => {
                let limit = in_range(e, "limit", limit, MIN_COUNT, MAX_SAFE_INTEGER);
                let calendar = Calendar::new(unit, time_zone);
                if calendar.is_none() {
                    let shown: String = time_zone.chars().take(64).collect();
                    e.push(PolicyError {
                        field: "time_zone",
                        problem: format!("{shown:?} is not UTC or an IANA time zone name"),
                    });
                }
                Algorithm::FixedWindow(FixedWindowParams {
                    limit: limit?,
                    window_ms: unit.longest_ms(),
                    calendar: Some(calendar?),
                })
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
            AlgorithmSpec::Concurrency { limit, lease_ttl } => {
                let limit = in_range(e, "limit", limit, MIN_COUNT, CONCURRENCY_MAX_LIMIT);
                let ttl = millis(e, "lease_ttl", lease_ttl, 1).and_then(|ms| {
                    if ms > MAX_LEASE_TTL_MS {
                        e.push(PolicyError::new(
                            "lease_ttl",
                            format!("must be <= {MAX_LEASE_TTL_MS} ms (one day), got {ms} ms"),
                        ));
                        None
                    } else {
                        Some(ms)
                    }
                });
                Algorithm::Concurrency(ConcurrencyParams {
                    limit: limit?,
                    lease_ttl_ms: ttl?,
                })
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
    let limit = in_range(e, "limit", limit, MIN_COUNT, max_limit);
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
        let limit = in_range(e, "limit", limit, MIN_COUNT, max);
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
        let capacity = in_range(e, "capacity", capacity, MIN_COUNT, MAX_SAFE_INTEGER);
        let amount = in_range(
            e,
            "refill_amount",
            refill_amount,
            MIN_COUNT,
            MAX_SAFE_INTEGER,
        );
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
        let limit = in_range(e, "limit", limit, MIN_COUNT, MAX_SAFE_INTEGER);
        let period = millis(e, "period", period, 1);
        let burst = in_range(e, "burst", burst, MIN_COUNT, MAX_SAFE_INTEGER);
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
