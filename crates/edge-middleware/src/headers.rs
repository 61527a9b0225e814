//! The `RateLimit-Policy` and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11.
//!
//! Both are RFC 8941 structured-field Lists with one member per policy that applied: the
//! member is the policy id as an sf-string, its parameters are integers.
//!
//! - `RateLimit-Policy: "api";q=100;w=60`: quota `q` per window `w` (whole seconds). No `qu`
//!   is sent: the middleware charges one unit per request, so the unit is the default
//!   `requests`.
//! - `RateLimit: "api";r=99;t=1`: `r` units remain, the quota is fully available again in
//!   `t` seconds.
//!
//! How each algorithm maps to `q`/`w` ([`shared_contract::Algorithm::quota_window`]): fixed
//! window, sliding window and sliding log are their `limit` per `window`. A token bucket is
//! `capacity` per the time a full refill takes (`capacity * refill_interval /
//! refill_amount`): an empty bucket is full again after `w`. GCRA is `limit` per `period`, its
//! sustained rate (the `burst` shows in `r`: a fresh subject has `r = burst`).
//!
//! `t` is computed from the decision's `reset_at_ms` (the provider's clock: Redis `TIME` for
//! Redis) and this host's clock, rounded up, and bounded by `w`: clock skew between this host
//! and Redis can shift it by the skew, never beyond one window.

use std::fmt::Write as _;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use shared_contract::{RateLimitDecision, RateLimitPolicy};

pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
pub const RATELIMIT: &str = "ratelimit";
/// The names as `HeaderName`s, built at compile time (`from_static` at run time would check
/// the name on every response).
pub const RATELIMIT_POLICY_NAME: HeaderName = HeaderName::from_static(RATELIMIT_POLICY);
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

/// Appends one `RateLimit` member for `decision` under `policy` at `now_ms` (this host's
/// clock), growing `out` by exactly the member's length: a field of one member is then a
/// single allocation of its exact size, which [`bytes_value`] turns into the header value
/// without copying it.
pub fn push_limit(
    out: &mut Vec<u8>,
    policy: &RateLimitPolicy,
    decision: &RateLimitDecision,
    now_ms: u64,
) {
    let (_, w) = policy.algorithm().quota_window();
    let t = ceil_secs(decision.reset_at_ms.saturating_sub(now_ms)).min(w);
    let mut r_text = itoa::Buffer::new();
    let r = r_text.format(decision.remaining).as_bytes();
    let mut t_text = itoa::Buffer::new();
    let t = t_text.format(t).as_bytes();
    let id = policy.id().as_str().as_bytes();
    let separator: &[u8] = if out.is_empty() { b"" } else { b", " };
    // `"<id>";r=<r>;t=<t>`: 8 bytes besides the id and the two numbers.
    out.reserve_exact(separator.len() + id.len() + r.len() + t.len() + 8);
    for part in [separator, b"\"", id, b"\";r=", r, b";t=", t] {
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
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
    }
}
