//! Policies in one line, with the documented defaults:
//!
//! ```
//! use std::time::Duration;
//! use shared_contract::RateLimitPolicy;
//!
//! // 5 per 10 s, refilled continuously; everything else at its default.
//! let api = RateLimitPolicy::token_bucket("api", 5).per(Duration::from_secs(10)).build()?;
//! assert_eq!((api.revision().get(), api.max_cost().get()), (1, 1));
//! // 100 per minute in windows aligned to the clock, requests costing up to 10.
//! let tenant = RateLimitPolicy::fixed_window("tenant", 100)
//!     .per(Duration::from_secs(60))
//!     .max_cost(10)
//!     .build()?;
//! # assert_eq!(tenant.algorithm().limit(), 100);
//! // A bad value is named by its configuration key.
//! let e = RateLimitPolicy::gcra("login", 0).build().unwrap_err();
//! assert_eq!(e.0[0].field, "limit");
//! # Ok::<(), shared_contract::PolicyErrors>(())
//! ```
//!
//! | setting | default | builder |
//! | --- | --- | --- |
//! | the span (`window`, `refill_interval`, `period`) | 1 s | [`PolicyBuilder::per`] |
//! | a token bucket's refill | its capacity per span | [`PolicyBuilder::refill`] |
//! | a GCRA's burst | its limit | [`PolicyBuilder::burst`] |
//! | `revision` | [`DEFAULT_REVISION`] | [`PolicyBuilder::revision`] |
//! | `max_cost` | [`DEFAULT_MAX_COST`] | [`PolicyBuilder::max_cost`] |
//! | `cleanup_grace` | [`DEFAULT_CLEANUP_GRACE`] | [`PolicyBuilder::cleanup_grace`] |
//! | `max_clock_regression` | [`DEFAULT_MAX_CLOCK_REGRESSION`] | [`PolicyBuilder::max_clock_regression`] |
//! | `failure_policy` | `fail_closed` | [`PolicyBuilder::failure_policy`] |
//! | shadow mode | off | [`PolicyBuilder::shadow`] |
//! | the denial cache | on | [`PolicyBuilder::deny_cache`] |
//!
//! The configuration file has the same defaults (it reads them from here).

use std::time::Duration;

use super::calendar::CalendarUnit;
use super::{AlgorithmSpec, FailurePolicy, PolicyError, PolicyErrors, PolicySpec, RateLimitPolicy};
use crate::ids::{PolicyId, PolicyRevision};

/// A policy's revision when none is given.
pub const DEFAULT_REVISION: u32 = 1;
/// The largest cost of one evaluation when none is given.
pub const DEFAULT_MAX_COST: u64 = 1;
/// Extra lifetime of idle state when none is given.
pub const DEFAULT_CLEANUP_GRACE: Duration = Duration::from_secs(60);
/// The backward step of the server clock tolerated when none is given.
pub const DEFAULT_MAX_CLOCK_REGRESSION: Duration = Duration::from_secs(2);

/// The algorithm a builder makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    Gcra,
    Concurrency { lease_ttl: Duration },
    Calendar(CalendarUnit),
}

/// A policy under construction (see the module docs); [`Self::build`] validates it.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built"]
pub struct PolicyBuilder {
    id: String,
    shape: Shape,
    limit: u64,
    per: Duration,
    refill: Option<u64>,
    burst: Option<u64>,
    revision: u32,
    max_cost: u64,
    cleanup_grace: Duration,
    max_clock_regression: Duration,
    failure_policy: FailurePolicy,
    shadow: bool,
    deny_cache: bool,
    time_zone: String,
}

impl RateLimitPolicy {
    /// `limit` per span (default 1 s, [`PolicyBuilder::per`]) in windows aligned to the epoch.
    pub fn fixed_window(id: &str, limit: u64) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::FixedWindow, limit)
    }

    /// About `limit` per sliding span: the previous window weighted, the current one counted.
    pub fn sliding_window(id: &str, limit: u64) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::SlidingWindow, limit)
    }

    /// Exactly `limit` per sliding span, remembering each admitted request.
    pub fn sliding_log(id: &str, limit: u64) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::SlidingLog, limit)
    }

    /// `capacity` tokens, refilled continuously by `capacity` per span unless
    /// [`PolicyBuilder::refill`] says otherwise.
    pub fn token_bucket(id: &str, capacity: u64) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::TokenBucket, capacity)
    }

    /// `limit` per span sustained, bursts of `limit` unless [`PolicyBuilder::burst`] says
    /// otherwise.
    pub fn gcra(id: &str, limit: u64) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::Gcra, limit)
    }

    /// `limit` per calendar `unit` (hour, day, week, month) of UTC, or of
    /// [`PolicyBuilder::time_zone`].
    pub fn calendar(id: &str, limit: u64, unit: CalendarUnit) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::Calendar(unit), limit)
    }

    /// At most `limit` leases held at once per subject, each expiring after `lease_ttl`.
    pub fn concurrency(id: &str, limit: u64, lease_ttl: Duration) -> PolicyBuilder {
        PolicyBuilder::new(id, Shape::Concurrency { lease_ttl }, limit)
    }

    /// `algorithm` with every parameter as given (for code that holds an [`AlgorithmSpec`],
    /// such as a test over every algorithm); the other settings at their defaults.
    pub fn with_algorithm(id: &str, algorithm: AlgorithmSpec) -> PolicyBuilder {
        let (shape, limit, per) = match &algorithm {
            AlgorithmSpec::FixedWindow { limit, window } => (Shape::FixedWindow, *limit, *window),
            AlgorithmSpec::SlidingWindow { limit, window } => {
                (Shape::SlidingWindow, *limit, *window)
            }
            AlgorithmSpec::SlidingLog { limit, window } => (Shape::SlidingLog, *limit, *window),
            AlgorithmSpec::TokenBucket {
                capacity,
                refill_interval,
                ..
            } => (Shape::TokenBucket, *capacity, *refill_interval),
            AlgorithmSpec::Gcra { limit, period, .. } => (Shape::Gcra, *limit, *period),
            AlgorithmSpec::Concurrency { limit, lease_ttl } => (
                Shape::Concurrency {
                    lease_ttl: *lease_ttl,
                },
                *limit,
                Duration::from_secs(1),
            ),
            AlgorithmSpec::CalendarWindow {
                limit,
                unit,
                time_zone,
            } => return Self::calendar(id, *limit, *unit).time_zone(time_zone),
        };
        let mut builder = PolicyBuilder::new(id, shape, limit).per(per);
        if let AlgorithmSpec::TokenBucket { refill_amount, .. } = algorithm {
            builder = builder.refill(refill_amount);
        }
        if let AlgorithmSpec::Gcra { burst, .. } = algorithm {
            builder = builder.burst(burst);
        }
        builder
    }
}

impl PolicyBuilder {
    fn new(id: &str, shape: Shape, limit: u64) -> Self {
        Self {
            id: id.to_owned(),
            shape,
            limit,
            per: Duration::from_secs(1),
            refill: None,
            burst: None,
            revision: DEFAULT_REVISION,
            max_cost: DEFAULT_MAX_COST,
            cleanup_grace: DEFAULT_CLEANUP_GRACE,
            max_clock_regression: DEFAULT_MAX_CLOCK_REGRESSION,
            failure_policy: FailurePolicy::FailClosed,
            shadow: false,
            deny_cache: true,
            time_zone: "UTC".to_owned(),
        }
    }

    /// The time zone of a calendar policy's periods: `UTC` (the default) or an IANA name.
    pub fn time_zone(mut self, name: &str) -> Self {
        self.time_zone = name.to_owned();
        self
    }

    /// The span the limit is per: the window, the refill interval, the GCRA period.
    pub fn per(mut self, span: Duration) -> Self {
        self.per = span;
        self
    }

    /// A token bucket's refill per span (default: its capacity).
    pub fn refill(mut self, amount: u64) -> Self {
        self.refill = Some(amount);
        self
    }

    /// A GCRA's burst (default: its limit).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// A new revision is a new key space: raise it whenever the parameters change.
    pub fn revision(mut self, revision: u32) -> Self {
        self.revision = revision;
        self
    }

    /// The largest cost one evaluation may ask (at most the limit).
    pub fn max_cost(mut self, max_cost: u64) -> Self {
        self.max_cost = max_cost;
        self
    }

    /// Extra lifetime of idle state after it stops mattering.
    pub fn cleanup_grace(mut self, grace: Duration) -> Self {
        self.cleanup_grace = grace;
        self
    }

    /// How far the server clock may step back before evaluations are refused.
    pub fn max_clock_regression(mut self, regression: Duration) -> Self {
        self.max_clock_regression = regression;
        self
    }

    /// What the edge does when the provider cannot decide (the policy's own; it wins over a
    /// limiter-wide default).
    pub fn failure_policy(mut self, failure_policy: FailurePolicy) -> Self {
        self.failure_policy = failure_policy;
        self
    }

    /// Shadow mode: evaluated and charged, never denying ([`RateLimitPolicy::shadow`]).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The exact denial cache ([`RateLimitPolicy::deny_cache`]); on unless turned off.
    pub fn deny_cache(mut self, deny_cache: bool) -> Self {
        self.deny_cache = deny_cache;
        self
    }

    /// The validated policy.
    ///
    /// # Errors
    /// [`PolicyErrors`] naming every refused value by its configuration key (`id`, `limit`,
    /// `window`, `max_cost`, ...).
    pub fn build(self) -> Result<RateLimitPolicy, PolicyErrors> {
        let (limit, per) = (self.limit, self.per);
        let algorithm = match self.shape {
            Shape::FixedWindow => AlgorithmSpec::FixedWindow { limit, window: per },
            Shape::SlidingWindow => AlgorithmSpec::SlidingWindow { limit, window: per },
            Shape::SlidingLog => AlgorithmSpec::SlidingLog { limit, window: per },
            Shape::TokenBucket => AlgorithmSpec::TokenBucket {
                capacity: limit,
                refill_amount: self.refill.unwrap_or(limit),
                refill_interval: per,
            },
            Shape::Gcra => AlgorithmSpec::Gcra {
                limit,
                period: per,
                burst: self.burst.unwrap_or(limit),
            },
            Shape::Concurrency { lease_ttl } => AlgorithmSpec::Concurrency { limit, lease_ttl },
            Shape::Calendar(unit) => AlgorithmSpec::CalendarWindow {
                limit,
                unit,
                time_zone: self.time_zone.clone(),
            },
        };
        let (id, revision) = match (PolicyId::new(&self.id), PolicyRevision::new(self.revision)) {
            (Ok(id), Ok(revision)) => (id, revision),
            (id, revision) => {
                let errors = [("id", id.err()), ("revision", revision.err())]
                    .into_iter()
                    .filter_map(|(field, e)| Some(PolicyError::new(field, e?.to_string())))
                    .collect();
                return Err(PolicyErrors(errors));
            }
        };
        let policy = RateLimitPolicy::new(PolicySpec {
            id,
            revision,
            algorithm,
            max_cost: self.max_cost,
            cleanup_grace: self.cleanup_grace,
            max_clock_regression: self.max_clock_regression,
            failure_policy: self.failure_policy,
        })?;
        Ok(policy
            .with_shadow(self.shadow)
            .with_deny_cache(self.deny_cache))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{DEFAULT_CLEANUP_GRACE, DEFAULT_MAX_CLOCK_REGRESSION};
    use crate::ids::{PolicyId, PolicyRevision};
    use crate::policy::{AlgorithmSpec, FailurePolicy, PolicySpec, RateLimitPolicy};

    fn spec(id: &str, algorithm: AlgorithmSpec) -> PolicySpec {
        PolicySpec {
            id: PolicyId::new(id).expect("id"),
            revision: PolicyRevision::new(1).expect("revision"),
            algorithm,
            max_cost: 1,
            cleanup_grace: DEFAULT_CLEANUP_GRACE,
            max_clock_regression: DEFAULT_MAX_CLOCK_REGRESSION,
            failure_policy: FailurePolicy::FailClosed,
        }
    }

    #[test]
    fn each_builder_is_the_spec_it_stands_for() {
        let ten = Duration::from_secs(10);
        let second = Duration::from_secs(1);
        let cases = [
            (
                RateLimitPolicy::token_bucket("a", 5).per(ten),
                AlgorithmSpec::TokenBucket {
                    capacity: 5,
                    refill_amount: 5,
                    refill_interval: ten,
                },
            ),
            (
                RateLimitPolicy::token_bucket("a", 5).refill(1).per(ten),
                AlgorithmSpec::TokenBucket {
                    capacity: 5,
                    refill_amount: 1,
                    refill_interval: ten,
                },
            ),
            (
                RateLimitPolicy::gcra("a", 5),
                AlgorithmSpec::Gcra {
                    limit: 5,
                    period: second,
                    burst: 5,
                },
            ),
            (
                RateLimitPolicy::gcra("a", 5).burst(2),
                AlgorithmSpec::Gcra {
                    limit: 5,
                    period: second,
                    burst: 2,
                },
            ),
            (
                RateLimitPolicy::fixed_window("a", 3).per(ten),
                AlgorithmSpec::FixedWindow {
                    limit: 3,
                    window: ten,
                },
            ),
            (
                RateLimitPolicy::sliding_window("a", 3),
                AlgorithmSpec::SlidingWindow {
                    limit: 3,
                    window: second,
                },
            ),
            (
                RateLimitPolicy::sliding_log("a", 3),
                AlgorithmSpec::SlidingLog {
                    limit: 3,
                    window: second,
                },
            ),
            (
                RateLimitPolicy::concurrency("a", 3, ten),
                AlgorithmSpec::Concurrency {
                    limit: 3,
                    lease_ttl: ten,
                },
            ),
        ];
        for (builder, algorithm) in cases {
            let expected = RateLimitPolicy::new(spec("a", algorithm)).expect("valid");
            assert_eq!(builder.build().expect("valid"), expected);
        }
    }

    #[test]
    fn every_setting_reaches_the_policy_and_bad_ones_are_named() {
        let p = RateLimitPolicy::fixed_window("web", 10)
            .revision(3)
            .max_cost(4)
            .cleanup_grace(Duration::from_secs(5))
            .max_clock_regression(Duration::ZERO)
            .failure_policy(FailurePolicy::FailOpen)
            .shadow(true)
            .deny_cache(false)
            .build()
            .expect("valid");
        assert_eq!((p.revision().get(), p.max_cost().get()), (3, 4));
        assert_eq!(
            (p.cleanup_grace_ms(), p.max_clock_regression_ms()),
            (5_000, 0)
        );
        assert_eq!(p.failure_policy(), FailurePolicy::FailOpen);
        assert!(p.shadow() && !p.deny_cache());
        assert!(
            RateLimitPolicy::gcra("a", 1)
                .build()
                .expect("valid")
                .deny_cache()
        );
        let e = RateLimitPolicy::token_bucket("Bad Id", 0)
            .revision(0)
            .build()
            .expect_err("refused");
        let fields: Vec<_> = e.0.iter().map(|e| e.field).collect();
        assert_eq!(fields, ["id", "revision"]);
        let e = RateLimitPolicy::token_bucket("a", 0)
            .max_cost(2)
            .build()
            .expect_err("refused");
        let fields: Vec<_> = e.0.iter().map(|e| e.field).collect();
        assert!(fields.contains(&"capacity"), "{fields:?}");
    }

    #[test]
    fn with_algorithm_builds_exactly_the_algorithm_given() {
        let s = Duration::from_secs;
        let every = [
            AlgorithmSpec::FixedWindow {
                limit: 3,
                window: s(7),
            },
            AlgorithmSpec::SlidingWindow {
                limit: 4,
                window: s(8),
            },
            AlgorithmSpec::SlidingLog {
                limit: 5,
                window: s(9),
            },
            AlgorithmSpec::TokenBucket {
                capacity: 6,
                refill_amount: 2,
                refill_interval: s(10),
            },
            AlgorithmSpec::Gcra {
                limit: 7,
                period: s(11),
                burst: 3,
            },
            AlgorithmSpec::Concurrency {
                limit: 8,
                lease_ttl: s(12),
            },
        ];
        for algorithm in every {
            let built = RateLimitPolicy::with_algorithm("p", algorithm.clone())
                .build()
                .expect("valid policy");
            let spelled = RateLimitPolicy::new(spec("p", algorithm)).expect("valid policy");
            assert_eq!(built, spelled);
        }
    }
}
