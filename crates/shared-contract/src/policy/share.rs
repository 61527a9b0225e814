//! A policy's fleet share: what one of `n` instances may admit on its own, so that the `n`
//! together admit at most what the policy admits (the bounded local fallback).
//!
//! Every amount is divided by `n` and rounded down, so the fleet's total never exceeds the
//! policy's: a window's `limit`, a bucket's `capacity`, a burst. A rate (tokens or cost per
//! period) is divided exactly where it can be (`refill_amount` or GCRA `limit` divisible by
//! `n`), else its period is multiplied by `n`, and only if that leaves the accepted range is
//! the amount rounded down instead. An instance's share is therefore at least 1 whenever the
//! policy allows one per instance (`limit >= n`), and the fleet admits at least
//! `limit - (n - 1)` of a window's `limit`. A share that rounds to 0 is `None`: that instance
//! admits nothing.

use std::time::Duration;

use super::{Algorithm, AlgorithmSpec, PolicySpec, RateLimitPolicy};

impl RateLimitPolicy {
    /// The share of one instance among `fleet_size` (see the module docs): the same id,
    /// revision, rules and options with every amount divided by `fleet_size`; `max_cost`
    /// capped at the share. `fleet_size` 0 counts as 1 (this instance is at least one).
    /// `None` when the share rounds to 0. A concurrency policy is returned unchanged (leases
    /// are never decided locally).
    pub fn fleet_share(&self, fleet_size: u64) -> Option<RateLimitPolicy> {
        let n = fleet_size.max(1);
        if n == 1 || matches!(self.algorithm, Algorithm::Concurrency(_)) {
            return Some(self.clone());
        }
        let ms = Duration::from_millis;
        let candidates: Vec<AlgorithmSpec> = match self.algorithm {
            Algorithm::FixedWindow(p) => vec![match p.calendar() {
                Some(c) => AlgorithmSpec::CalendarWindow {
                    limit: p.limit() / n,
                    unit: c.unit(),
                    time_zone: c.time_zone().to_owned(),
                },
                None => AlgorithmSpec::FixedWindow {
                    limit: p.limit() / n,
                    window: ms(p.window_ms()),
                },
            }],
            Algorithm::SlidingWindow(p) => vec![AlgorithmSpec::SlidingWindow {
                limit: p.limit() / n,
                window: ms(p.window_ms()),
            }],
            Algorithm::SlidingLog(p) => vec![AlgorithmSpec::SlidingLog {
                limit: p.limit() / n,
                window: ms(p.window_ms()),
            }],
            Algorithm::TokenBucket(p) => rates(p.refill_amount(), p.refill_interval_ms(), n)
                .map(|(amount, interval)| AlgorithmSpec::TokenBucket {
                    capacity: p.capacity() / n,
                    refill_amount: amount,
                    refill_interval: ms(interval),
                })
                .collect(),
            Algorithm::Gcra(p) => rates(p.limit(), p.period_ms(), n)
                .map(|(limit, period)| AlgorithmSpec::Gcra {
                    limit,
                    period: ms(period),
                    burst: p.burst() / n,
                })
                .collect(),
            Algorithm::Concurrency(_) => return Some(self.clone()),
        };
        candidates
            .into_iter()
            .find_map(|algorithm| self.share_with(algorithm))
    }

    /// This policy with `algorithm` instead of its own, `max_cost` capped at its limit;
    /// `None` when the parameters are refused (a share of 0, a period out of range).
    fn share_with(&self, algorithm: AlgorithmSpec) -> Option<RateLimitPolicy> {
        let limit = match algorithm {
            AlgorithmSpec::FixedWindow { limit, .. }
            | AlgorithmSpec::CalendarWindow { limit, .. }
            | AlgorithmSpec::SlidingWindow { limit, .. }
            | AlgorithmSpec::SlidingLog { limit, .. }
            | AlgorithmSpec::Concurrency { limit, .. } => limit,
            AlgorithmSpec::TokenBucket { capacity, .. } => capacity,
            AlgorithmSpec::Gcra { burst, .. } => burst,
        };
        let mut share = RateLimitPolicy::new(PolicySpec {
            id: self.id.clone(),
            revision: self.revision,
            algorithm,
            max_cost: self.max_cost.get().min(limit),
            cleanup_grace: Duration::from_millis(self.cleanup_grace_ms),
            max_clock_regression: Duration::from_millis(self.max_clock_regression_ms),
            failure_policy: self.failure_policy,
        })
        .ok()?;
        share.shadow = self.shadow;
        share.deny_cache = self.deny_cache;
        Some(share)
    }
}

/// The ways to divide the rate `amount per period_ms` by `n`, best first: exactly (the amount
/// divided when it can be, else the period multiplied), then the amount rounded down.
fn rates(amount: u64, period_ms: u64, n: u64) -> impl Iterator<Item = (u64, u64)> {
    let exact = if amount.is_multiple_of(n) {
        Some((amount / n, period_ms))
    } else {
        period_ms.checked_mul(n).map(|p| (amount, p))
    };
    exact
        .into_iter()
        .chain(std::iter::once((amount / n, period_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{PolicyId, PolicyRevision};
    use crate::policy::FailurePolicy;

    fn policy(algorithm: AlgorithmSpec, max_cost: u64) -> RateLimitPolicy {
        RateLimitPolicy::new(PolicySpec {
            id: PolicyId::new("api").expect("valid id"),
            revision: PolicyRevision::new(3).expect("valid revision"),
            algorithm,
            max_cost,
            cleanup_grace: Duration::from_secs(1),
            max_clock_regression: Duration::from_secs(2),
            failure_policy: FailurePolicy::FallbackLocal,
        })
        .expect("valid policy")
    }

    #[test]
    fn a_window_limit_is_divided_and_rounded_down() {
        let p = policy(
            AlgorithmSpec::FixedWindow {
                limit: 10,
                window: Duration::from_secs(60),
            },
            5,
        );
        let share = p.fleet_share(3).expect("a share of 3");
        assert_eq!(share.algorithm().limit(), 3);
        assert_eq!(share.max_cost().get(), 3);
        assert_eq!((share.id(), share.revision()), (p.id(), p.revision()));
        assert_eq!(p.fleet_share(10).map(|s| s.algorithm().limit()), Some(1));
        assert_eq!(p.fleet_share(11), None, "10 / 11 rounds to 0");
        assert_eq!(p.fleet_share(1), Some(p.clone()));
        assert_eq!(p.fleet_share(0), Some(p));
    }

    #[test]
    fn a_rate_is_divided_exactly_by_its_amount_or_its_period() {
        let tb = |amount| {
            policy(
                AlgorithmSpec::TokenBucket {
                    capacity: 100,
                    refill_amount: amount,
                    refill_interval: Duration::from_secs(1),
                },
                1,
            )
        };
        let share = tb(10).fleet_share(5).expect("share");
        assert_eq!(spec_of(&share), bucket(20, 2, 1_000));
        assert_eq!(
            spec_of(&tb(10).fleet_share(3).expect("share")),
            bucket(33, 10, 3_000)
        );
        let gcra = policy(
            AlgorithmSpec::Gcra {
                limit: 7,
                period: Duration::from_secs(1),
                burst: 9,
            },
            9,
        );
        let share = gcra.fleet_share(2).expect("share");
        assert_eq!(
            spec_of(&share),
            AlgorithmSpec::Gcra {
                limit: 7,
                period: Duration::from_secs(2),
                burst: 4
            }
        );
        assert_eq!(share.max_cost().get(), 4);
    }

    #[test]
    fn a_period_out_of_range_rounds_the_amount_down_instead() {
        let p = policy(
            AlgorithmSpec::TokenBucket {
                capacity: 10,
                refill_amount: 5,
                refill_interval: Duration::from_millis(crate::policy::MAX_DURATION_MS / 2),
            },
            1,
        );
        let share = p.fleet_share(4).expect("share");
        assert_eq!(
            spec_of(&share),
            bucket(2, 1, crate::policy::MAX_DURATION_MS / 2)
        );
    }

    fn bucket(capacity: u64, refill_amount: u64, interval_ms: u64) -> AlgorithmSpec {
        AlgorithmSpec::TokenBucket {
            capacity,
            refill_amount,
            refill_interval: Duration::from_millis(interval_ms),
        }
    }

    fn spec_of(p: &RateLimitPolicy) -> AlgorithmSpec {
        let ms = Duration::from_millis;
        match p.algorithm() {
            Algorithm::TokenBucket(t) => {
                bucket(t.capacity(), t.refill_amount(), t.refill_interval_ms())
            }
            Algorithm::Gcra(g) => AlgorithmSpec::Gcra {
                limit: g.limit(),
                period: ms(g.period_ms()),
                burst: g.burst(),
            },
            other => panic!("not a rate: {other:?}"),
        }
    }
}
