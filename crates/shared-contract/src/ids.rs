//! Newtypes for the values a request carries. Each constructor checks its invariant, so a
//! value of these types is valid by construction and providers never re-check it.

use std::fmt;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use crate::exact::MAX_SAFE_INTEGER;

/// Why a request value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The refused policy id (at most its first 80 characters).
    #[error("policy id {0:?} must be 1..=64 characters of [a-z0-9_-]")]
    PolicyId(String),
    /// A policy revision of 0.
    #[error("policy revision must be >= 1")]
    Revision,
    /// A subject digest of the wrong length; carries the length given, in bytes.
    #[error("subject digest must be exactly 32 bytes, got {0}")]
    SubjectDigestLength(usize),
    /// A cost of 0 or above 2^53-1; carries the refused value.
    #[error("cost {0} must be between 1 and 2^53-1")]
    Cost(u64),
    /// The refused evaluation id (at most its first 130 characters).
    #[error("evaluation id must be 1..=128 bytes of visible ASCII, got {0:?}")]
    EvaluationId(String),
    /// A deadline budget of zero or longer than [`Deadline::MAX_BUDGET`].
    #[error("deadline budget must be > 0 and <= {max_ms} ms, got {got_ms} ms")]
    Deadline {
        /// The budget given, in whole milliseconds (rounded down).
        got_ms: u128,
        /// The longest budget accepted, in ms.
        max_ms: u64,
    },
}

/// Whether `value` is 1..=`max_len` bytes of `[a-z0-9_-]`: the alphabet of names that end up
/// in Redis keys, routes, metrics labels and logs (policy and gate ids).
pub(crate) fn is_name(value: &str, max_len: usize) -> bool {
    !value.is_empty()
        && value.len() <= max_len
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Whether `value` is 1..=`max_len` bytes of visible ASCII: the ids a caller chooses
/// (evaluation and event ids), printable anywhere without escaping.
pub(crate) fn is_visible_ascii(value: &str, max_len: usize) -> bool {
    !value.is_empty() && value.len() <= max_len && value.bytes().all(|b| b.is_ascii_graphic())
}

/// A policy identifier: 1..=64 characters of `[a-z0-9_-]`, safe in keys, metrics and logs.
///
/// Held inline (65 bytes), because every decision carries one: a clone is a copy of bytes,
/// where an `Arc` would be two atomic operations on a count that every thread deciding for the
/// policy shares (measured in the local provider: about a tenth of a decision on one thread,
/// more on two).
#[derive(Clone)]
pub struct PolicyId {
    len: u8,
    bytes: [u8; PolicyId::MAX_LEN],
}

impl PolicyId {
    /// Largest accepted length in bytes.
    pub const MAX_LEN: usize = 64;

    /// # Errors
    /// [`IdError::PolicyId`] when `value` is empty, too long, or has a character outside
    /// `[a-z0-9_-]`.
    pub fn new(value: &str) -> Result<Self, IdError> {
        if is_name(value, Self::MAX_LEN) {
            let mut bytes = [0u8; Self::MAX_LEN];
            bytes[..value.len()].copy_from_slice(value.as_bytes());
            Ok(Self {
                // At most MAX_LEN (64), checked above.
                len: value.len() as u8,
                bytes,
            })
        } else {
            Err(IdError::PolicyId(value.chars().take(80).collect()))
        }
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        // Only ever filled from a `&str` of ASCII, whole.
        std::str::from_utf8(self.text_bytes()).unwrap_or_default()
    }

    /// The id's bytes: what equality, order and hashing compare (ASCII, so the order is the
    /// text's), without the UTF-8 check of [`Self::as_str`].
    fn text_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl PartialEq for PolicyId {
    fn eq(&self, other: &Self) -> bool {
        self.text_bytes() == other.text_bytes()
    }
}

impl Eq for PolicyId {}

impl std::hash::Hash for PolicyId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text_bytes().hash(state);
    }
}

impl PartialOrd for PolicyId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PolicyId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text_bytes().cmp(other.text_bytes())
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyId({})", self.as_str())
    }
}

/// A policy revision (>= 1). A new revision is a new key space: old state expires naturally.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct PolicyRevision(u32);

impl PolicyRevision {
    /// # Errors
    /// [`IdError::Revision`] when `value` is 0.
    pub fn new(value: u32) -> Result<Self, IdError> {
        if value == 0 {
            Err(IdError::Revision)
        } else {
            Ok(Self(value))
        }
    }

    /// The revision number, at least 1.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for PolicyRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An already pseudonymized subject: 32 bytes (an HMAC-SHA256 made at the edge). The raw
/// subject never enters the contract, so no provider can leak it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubjectDigest([u8; 32]);

impl SubjectDigest {
    /// Length of a digest in bytes.
    pub const LEN: usize = 32;

    /// A digest from its 32 bytes; any value is valid.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// # Errors
    /// [`IdError::SubjectDigestLength`] when `bytes` is not 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, IdError> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| IdError::SubjectDigestLength(bytes.len()))
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for SubjectDigest {
    // Only a prefix: enough to correlate in a debugger, not a full pseudonym in every log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SubjectDigest({:02x}{:02x}{:02x}{:02x}..)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// The cost of one request: 1..=2^53-1. A policy's `max_cost` bounds it further.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Cost(NonZeroU64);

impl Cost {
    /// A cost of 1, the usual cost of one request.
    pub const ONE: Cost = Cost(NonZeroU64::MIN);

    /// # Errors
    /// [`IdError::Cost`] when `value` is 0 or above 2^53-1.
    pub fn new(value: u64) -> Result<Self, IdError> {
        match NonZeroU64::new(value) {
            Some(v) if value <= MAX_SAFE_INTEGER => Ok(Self(v)),
            _ => Err(IdError::Cost(value)),
        }
    }

    /// The cost, in `1..=2^53-1`.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

/// A caller-chosen evaluation id, for providers that deduplicate retried evaluations.
/// Providers that do not deduplicate reject requests that carry one.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct EvaluationId(Box<str>);

impl EvaluationId {
    /// Largest accepted length in bytes.
    pub const MAX_LEN: usize = 128;

    /// # Errors
    /// [`IdError::EvaluationId`] when `value` is empty, longer than 128 bytes or not visible
    /// ASCII.
    pub fn new(value: &str) -> Result<Self, IdError> {
        if is_visible_ascii(value, Self::MAX_LEN) {
            Ok(Self(value.into()))
        } else {
            Err(IdError::EvaluationId(value.chars().take(130).collect()))
        }
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A finite point in time by which the caller needs an answer. Providers that cannot answer
/// by then must not start work they cannot finish (they answer `Unavailable(deadline)`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct Deadline(Instant);

impl Deadline {
    /// Longest budget a caller may give: a limiter answer that takes longer is useless.
    pub const MAX_BUDGET: Duration = Duration::from_secs(60);

    /// A deadline `budget` from now.
    ///
    /// # Errors
    /// [`IdError::Deadline`] when `budget` is zero or longer than [`Self::MAX_BUDGET`].
    pub fn within(budget: Duration) -> Result<Self, IdError> {
        Self::at(Instant::now(), budget)
    }

    /// A deadline `budget` after `start`.
    ///
    /// # Errors
    /// As [`Self::within`].
    pub fn at(start: Instant, budget: Duration) -> Result<Self, IdError> {
        if budget.is_zero() || budget > Self::MAX_BUDGET {
            return Err(IdError::Deadline {
                got_ms: budget.as_millis(),
                max_ms: Self::MAX_BUDGET.as_millis() as u64,
            });
        }
        Ok(Self(start + budget))
    }

    /// A deadline `budget` after `start`, for a budget that was checked, or chosen, earlier
    /// (a configured one): a zero budget, or one longer than [`Self::MAX_BUDGET`], is
    /// [`Self::MAX_BUDGET`]. Infallible, so a caller has no impossible error to report.
    pub fn clamped(start: Instant, budget: Duration) -> Self {
        if budget.is_zero() || budget > Self::MAX_BUDGET {
            Self(start + Self::MAX_BUDGET)
        } else {
            Self(start + budget)
        }
    }

    /// The point in time by which the answer is needed.
    pub fn instant(self) -> Instant {
        self.0
    }

    /// Time left from `now`; zero when the deadline has passed.
    pub fn remaining_from(self, now: Instant) -> Duration {
        self.0.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_id_accepts_only_the_documented_alphabet() {
        assert!(PolicyId::new("api_v2-x").is_ok());
        assert!(PolicyId::new("").is_err());
        assert!(PolicyId::new("Api").is_err());
        assert!(PolicyId::new("a b").is_err());
        assert!(PolicyId::new(&"a".repeat(64)).is_ok());
        assert!(PolicyId::new(&"a".repeat(65)).is_err());
    }

    /// Held inline, the id still compares, orders, hashes and prints as its text: a prefix
    /// is another id, and the unused bytes never count.
    #[test]
    fn policy_id_behaves_as_its_text() {
        use std::hash::BuildHasher;
        let id = |s: &str| PolicyId::new(s).expect("valid id");
        let long = "z".repeat(64);
        for text in ["a", "ab", "abc", "b", long.as_str()] {
            assert_eq!(id(text).as_str(), text);
            assert_eq!(id(text).to_string(), text);
            assert_eq!(id(text), id(text).clone());
        }
        assert_ne!(id("ab"), id("abc"));
        let mut sorted = [id("b"), id("abc"), id(&long), id("ab")];
        sorted.sort();
        let texts: Vec<&str> = sorted.iter().map(PolicyId::as_str).collect();
        assert_eq!(texts, ["ab", "abc", "b", long.as_str()]);
        let hasher = std::collections::hash_map::RandomState::new();
        assert_eq!(hasher.hash_one(id("abc")), hasher.hash_one(id("abc")));
        assert_ne!(hasher.hash_one(id("ab")), hasher.hash_one(id("abc")));
        assert_eq!(format!("{:?}", id("ab")), "PolicyId(ab)");
    }

    #[test]
    fn cost_is_positive_and_exact_in_lua() {
        assert!(Cost::new(0).is_err());
        assert_eq!(Cost::new(1).map(Cost::get), Ok(1));
        assert!(Cost::new(MAX_SAFE_INTEGER).is_ok());
        assert!(Cost::new(MAX_SAFE_INTEGER + 1).is_err());
    }

    #[test]
    fn deadline_must_be_finite_and_positive() {
        assert!(Deadline::within(Duration::ZERO).is_err());
        assert!(Deadline::within(Duration::from_secs(61)).is_err());
        assert!(Deadline::within(Duration::from_millis(50)).is_ok());
        let start = Instant::now();
        let at = |budget| Deadline::clamped(start, budget).instant() - start;
        assert_eq!(at(Duration::from_millis(50)), Duration::from_millis(50));
        assert_eq!(at(Duration::ZERO), Deadline::MAX_BUDGET);
        assert_eq!(at(Duration::from_secs(61)), Deadline::MAX_BUDGET);
        assert_eq!(at(Deadline::MAX_BUDGET), Deadline::MAX_BUDGET);
    }

    #[test]
    fn subject_digest_debug_shows_only_a_prefix() {
        let d = SubjectDigest::from_bytes([0xab; 32]);
        assert_eq!(format!("{d:?}"), "SubjectDigest(abababab..)");
        assert!(SubjectDigest::from_slice(&[0; 31]).is_err());
    }
}
