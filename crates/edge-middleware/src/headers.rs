//! The `RateLimit-Policy` and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11
//! (revision of 23 May 2026).
//!
//! Both are RFC 8941 structured-field Lists with one member per policy that applied: the
//! member is the policy id as an sf-string, its parameters are integers.
//!
//! - `RateLimit-Policy: "api";q=100;w=60`: quota `q` per window `w` (whole seconds). No `qu`
//!   is sent: the middleware charges one unit per request, so the unit is the default
//!   `requests`.
//! - `RateLimit: "api";r=99;t=1`: `r` is the available quota (requests admitted now), `t` the
//!   effective window, which the draft defines as "the number of seconds within which the
//!   client can use no more than the available quota" (its section 4.1.2).
//!
//! How each algorithm maps to `q`/`w` ([`shared_contract::Algorithm::quota_window`]): fixed
//! window, sliding window and sliding log are their `limit` per `window`. A token bucket is
//! `capacity` per the time a full refill takes (`capacity * refill_interval /
//! refill_amount`): an empty bucket is full again after `w`. GCRA is `limit` per `period`, its
//! sustained rate (the `burst` shows in `r`: a fresh subject has `r = burst`).
//!
//! ## `t`: until the available quota grows
//!
//! For `t` to be true, the quota must not grow beyond `r` before `t` ends; to be useful, `t`
//! should end when it does. So `t` is the time until the policy makes quota beyond `r`
//! available, in whole seconds rounded up (like `Retry-After`), per
//! [`effective_window`]:
//!
//! | decision | `t` |
//! | --- | --- |
//! | denied, any algorithm | the decision's `retry_after_ms`: when this request fits again (equal to `Retry-After`) |
//! | allowed, fixed window | until the window ends (the whole quota returns then, none before) |
//! | allowed, token bucket, GCRA | until the next whole unit has refilled: at most one unit's refill time (`refill_interval / refill_amount`, `period / limit`) |
//! | allowed, sliding window, sliding log | not sent: when the quota grows depends on the ages of earlier requests, which a decision does not carry |
//!
//! It is not the time until the quota is *fully* available again: a drained bucket that gets a
//! token every second and is full in 10 s has `r=0;t=1`, not `t=10` (with `t=10` it would both
//! say "nothing for 10 s" and, on a 429, `Retry-After: 1`).
//!
//! On a 429 the draft asks that `Retry-After` not point earlier than the end of the effective
//! window; the middleware sends the largest `t` among the members with `r=0` (the violated
//! policy's, and any other policy this request exhausted), so retrying earlier would be refused
//! by one of them.
//!
//! The allowed rows read the decision's `reset_at_ms` (the provider's clock: Redis `TIME` for
//! Redis) against this host's clock: skew between the two shifts `t` by the skew, bounded by
//! one window (fixed window) or one unit's refill time (token bucket, GCRA).

use std::fmt::Write as _;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use shared_contract::{Algorithm, RateLimitDecision, RateLimitPolicy};

/// The `RateLimit-Policy` field name, lowercase.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// The `RateLimit` field name, lowercase.
pub const RATELIMIT: &str = "ratelimit";
/// The names as `HeaderName`s, built at compile time (`from_static` at run time would check
/// the name on every response).
pub const RATELIMIT_POLICY_NAME: HeaderName = HeaderName::from_static(RATELIMIT_POLICY);
/// [`RATELIMIT`] as a `HeaderName`.
pub const RATELIMIT_NAME: HeaderName = HeaderName::from_static(RATELIMIT);

/// Whole seconds in `ms`, rounded up.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Appends one `RateLimit-Policy` member for `policy`.
pub fn push_policy(out: &mut String, policy: &RateLimitPolicy) {
    let (q, w) = policy.algorithm().quota_window();
    if !out.is_empty() {
        out.push_str(", ");
    }
    // Policy ids are [a-z0-9_-]: valid sf-string content without escapes.
    let _ = write!(out, "\"{}\";q={q};w={w}", policy.id());
}

/// The `t` of `decision` under `policy`, `now_ms` being this host's clock: the whole seconds,
/// rounded up, within which the client can use no more than `decision.remaining`, i.e. until
/// the available quota grows beyond it. `None` when the decision does not tell (see the
/// module docs: the sliding algorithms on an allow).
pub fn effective_window(
    policy: &RateLimitPolicy,
    decision: &RateLimitDecision,
    now_ms: u64,
) -> Option<u64> {
    if !decision.allowed {
        return Some(retry_after_secs(decision));
    }
    let to_reset_ms = decision.reset_at_ms.saturating_sub(now_ms);
    let ms = match policy.algorithm() {
        // The whole quota comes back at the end of the window, and nothing before it.
        Algorithm::FixedWindow(p) => to_reset_ms.min(p.window_ms()),
        Algorithm::TokenBucket(p) => next_unit_ms(
            decision,
            to_reset_ms,
            p.refill_interval_ms(),
            p.refill_amount(),
        ),
        Algorithm::Gcra(p) => next_unit_ms(decision, to_reset_ms, p.period_ms(), p.limit()),
        // A place frees when a lease is released or expires: no window tells when.
        Algorithm::SlidingWindow(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => {
            return None;
        }
    };
    Some(ceil_secs(ms))
}

/// The `Retry-After` of a denied `decision`: its `retry_after_ms` in whole seconds rounded up,
/// at least 1 (the request is refused now, so "retry after 0 s" would be wrong).
pub fn retry_after_secs(decision: &RateLimitDecision) -> u64 {
    ceil_secs(decision.retry_after_ms).max(1)
}

/// Milliseconds until a quota that refills linearly, `units` per `per_ms`, and is full in
/// `to_full_ms`, holds one unit more than `decision.remaining`: the full refill less the
/// refill of the units above that one. (`to_full_ms` is rounded up by the provider, so this is
/// at most 1 ms late.) Bounded by one unit's refill time, which the next unit never exceeds,
/// so that clock skew between this host and the provider cannot stretch it further.
fn next_unit_ms(decision: &RateLimitDecision, to_full_ms: u64, per_ms: u64, units: u64) -> u64 {
    let units = units.max(1);
    let above_next = decision
        .limit
        .saturating_sub(decision.remaining.saturating_add(1));
    let refill_above_ms = u128::from(above_next) * u128::from(per_ms) / u128::from(units);
    let one_unit_ms = per_ms.div_ceil(units);
    let ms = u128::from(to_full_ms).saturating_sub(refill_above_ms);
    u64::try_from(ms).map_or(one_unit_ms, |ms| ms.min(one_unit_ms))
}

/// Appends one `RateLimit` member for `policy`: `r` and, when known, `t` (see
/// [`effective_window`]). Grows `out` by exactly the member's length: a field of one member is
/// then a single allocation of its exact size, which [`bytes_value`] turns into the header
/// value without copying it.
pub fn push_limit(out: &mut Vec<u8>, policy: &RateLimitPolicy, r: u64, t: Option<u64>) {
    let mut r_text = itoa::Buffer::new();
    let r = r_text.format(r).as_bytes();
    let mut t_text = itoa::Buffer::new();
    let (t_key, t): (&[u8], &[u8]) = match t {
        Some(t) => (b";t=", t_text.format(t).as_bytes()),
        None => (b"", b""),
    };
    let id = policy.id().as_str().as_bytes();
    let separator: &[u8] = if out.is_empty() { b"" } else { b", " };
    let parts = [separator, b"\"", id, b"\";r=", r, t_key, t];
    out.reserve_exact(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// A header value from text this module built (always visible ASCII).
pub fn value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A header value from bytes this module built (always visible ASCII), taking the buffer over:
/// no copy, and no second allocation when its length is its capacity.
pub fn bytes_value(bytes: Vec<u8>) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from(bytes))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{AlgorithmSpec, Certainty, PolicyId, PolicyRevision, Source};

    use super::*;

    fn policy(algorithm: AlgorithmSpec) -> RateLimitPolicy {
        RateLimitPolicy::with_algorithm("p", algorithm)
            .build()
            .expect("valid policy")
    }

    fn allowed(limit: u64, remaining: u64, reset_at_ms: u64) -> RateLimitDecision {
        RateLimitDecision {
            allowed: true,
            limit,
            remaining,
            retry_after_ms: 0,
            reset_at_ms,
            policy_id: PolicyId::new("p").expect("valid id"),
            revision: PolicyRevision::new(1).expect("valid revision"),
            source: Source::GlobalRedis,
            certainty: Certainty::Certain,
            fleet: None,
        }
    }

    #[test]
    fn a_bucket_reset_skewed_far_ahead_still_gives_at_most_one_units_refill() {
        // 10 tokens, one per 2 s; this host's clock 1 h behind the provider's.
        let bucket = policy(AlgorithmSpec::TokenBucket {
            capacity: 10,
            refill_amount: 1,
            refill_interval: Duration::from_secs(2),
        });
        let now = 1_000_000;
        let skewed = allowed(10, 4, now + 3_600_000);
        assert_eq!(effective_window(&bucket, &skewed, now), Some(2));
        // Unskewed: 5.5 tokens missing after the allow, full in 11 s; the 5th in 1 s.
        let exact = allowed(10, 4, now + 11_000);
        assert_eq!(effective_window(&bucket, &exact, now), Some(1));
    }

    #[test]
    fn sliding_allows_send_no_t_and_every_denial_sends_its_retry() {
        let window = Duration::from_secs(60);
        for algorithm in [
            AlgorithmSpec::SlidingWindow { limit: 5, window },
            AlgorithmSpec::SlidingLog { limit: 5, window },
        ] {
            let p = policy(algorithm);
            assert_eq!(effective_window(&p, &allowed(5, 0, 120_000), 0), None);
            let denied = RateLimitDecision {
                allowed: false,
                retry_after_ms: 2_001,
                ..allowed(5, 0, 120_000)
            };
            assert_eq!(effective_window(&p, &denied, 0), Some(3));
            let at_once = RateLimitDecision {
                retry_after_ms: 0,
                ..denied
            };
            assert_eq!(
                retry_after_secs(&at_once),
                1,
                "a 429 never says retry after 0 s"
            );
        }
    }

    #[test]
    fn members_without_t_leave_the_parameter_out() {
        let p = policy(AlgorithmSpec::SlidingLog {
            limit: 5,
            window: Duration::from_secs(60),
        });
        let mut out = Vec::new();
        push_limit(&mut out, &p, 3, None);
        push_limit(&mut out, &p, 0, Some(12));
        assert_eq!(out, b"\"p\";r=3, \"p\";r=0;t=12");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
    }
}
