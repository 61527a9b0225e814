//! Exact integer arithmetic inside Lua's exact range.
//!
//! Redis runs Lua 5.1, whose numbers are doubles: integers are exact only up to 2^53-1. The
//! reference models do every step through these helpers, so a property test over the whole
//! accepted parameter space proves that no intermediate value of a model (and so of the Lua
//! program that mirrors it operation for operation) ever leaves `0..=2^53-1`.

/// 2^53-1, the largest integer a Lua 5.1 number holds exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// An intermediate value left `0..=2^53-1`: a model bug or a policy that validation should
/// have refused. Never silently wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("arithmetic left the exact integer range 0..=2^53-1 in `{op}`")]
pub struct OutOfRange {
    /// The operation that left the range (`add`, `sub`, `mul`, `div` or `rem`).
    pub op: &'static str,
}

type R = Result<u64, OutOfRange>;

fn check(value: Option<u64>, op: &'static str) -> R {
    match value {
        Some(v) if v <= MAX_SAFE_INTEGER => Ok(v),
        _ => Err(OutOfRange { op }),
    }
}

/// `a + b`; a sum above 2^53-1 is out of range.
pub fn add(a: u64, b: u64) -> R {
    check(a.checked_add(b), "add")
}

/// `a - b`; a negative result is out of range too.
pub fn sub(a: u64, b: u64) -> R {
    check(a.checked_sub(b), "sub")
}

/// `a * b`; a product above 2^53-1 is out of range.
pub fn mul(a: u64, b: u64) -> R {
    check(a.checked_mul(b), "mul")
}

/// Floor division; `b` must be > 0.
pub fn div(a: u64, b: u64) -> R {
    check(a.checked_div(b), "div")
}

/// `a mod b`; `b` must be > 0.
pub fn rem(a: u64, b: u64) -> R {
    check(a.checked_rem(b), "rem")
}

/// Ceiling division by quotient and remainder, never forming `a + b - 1`.
pub fn div_ceil(a: u64, b: u64) -> R {
    let q = div(a, b)?;
    if rem(a, b)? == 0 { Ok(q) } else { add(q, 1) }
}

/// Whether `a * b >= c`, without forming a product that could leave the range: the
/// comparison `a >= ceil(c / b)` makes, by one multiplication instead of a division (a
/// division costs a local decision several nanoseconds).
#[inline]
pub fn product_reaches(a: u64, b: u64, c: u64) -> bool {
    u128::from(a) * u128::from(b) >= u128::from(c)
}

/// Greatest common divisor (Euclid); `gcd(a, 0) = a`. Plain `u64`: it never exceeds the larger
/// input.
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_beyond_two_to_the_53_are_refused() {
        assert_eq!(add(MAX_SAFE_INTEGER, 0), Ok(MAX_SAFE_INTEGER));
        assert!(add(MAX_SAFE_INTEGER, 1).is_err());
        assert!(mul(1 << 27, 1 << 26).is_err());
        assert!(sub(1, 2).is_err());
        assert!(div(1, 0).is_err());
    }

    #[test]
    fn div_ceil_rounds_up_without_overflowing_near_the_top() {
        assert_eq!(div_ceil(10, 5), Ok(2));
        assert_eq!(div_ceil(11, 5), Ok(3));
        assert_eq!(div_ceil(MAX_SAFE_INTEGER, MAX_SAFE_INTEGER - 1), Ok(2));
        assert_eq!(div_ceil(0, 7), Ok(0));
    }
}
