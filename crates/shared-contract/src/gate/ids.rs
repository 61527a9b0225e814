//! Validated names of the things a gate handles: the gate itself, the key that decides which
//! events conflict, the id that names one event, and the gate's scalar clock.
//!
//! Each constructor checks its invariant, so providers never re-check a value of these types.

use std::fmt;

use crate::exact::MAX_SAFE_INTEGER;
use crate::ids::{PolicyId, is_name, is_visible_ascii};

/// Why a gate value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateValueError {
    /// The refused gate id (at most its first 80 characters).
    #[error("gate id {0:?} must be 1..=64 characters of [a-z0-9_-]")]
    GateId(String),
    #[error(
        "event key must be 1..=256 bytes of UTF-8 without control characters, got {len} bytes starting {prefix:?}"
    )]
    /// An empty or too long event key, or one with a control character.
    EventKey {
        /// Length of the refused key, in bytes.
        len: usize,
        /// The refused key's first 40 characters.
        prefix: String,
    },
    /// The refused event id (at most its first 130 characters).
    #[error("event id must be 1..=128 bytes of visible ASCII, got {0:?}")]
    EventId(String),
    /// A clock value above 2^53-1; carries the value.
    #[error("gate clock {0} is above 2^53-1")]
    Clock(u64),
}

/// A gate identifier: the same alphabet as [`PolicyId`] (`[a-z0-9_-]`, 1..=64), because it
/// appears in the same places (configuration tables, Redis keys, routes, metrics labels).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GateId(Box<str>);

impl GateId {
    /// Largest accepted length in bytes.
    pub const MAX_LEN: usize = PolicyId::MAX_LEN;

    /// # Errors
    /// [`GateValueError::GateId`] when `value` is empty, too long, or has a character outside
    /// `[a-z0-9_-]`.
    pub fn new(value: &str) -> Result<Self, GateValueError> {
        // The check policy ids use keeps the two alphabets identical by construction.
        if is_name(value, Self::MAX_LEN) {
            Ok(Self(value.into()))
        } else {
            Err(GateValueError::GateId(value.chars().take(80).collect()))
        }
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for GateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GateId({})", self.0)
    }
}

/// The key that decides which events conflict (`"taco"`): 1..=256 bytes of UTF-8 without
/// control characters.
///
/// Unlike a rate-limit subject, a key is **not** digested: it is part of what a gate
/// publishes (every status frame and snapshot entry names it, so subscribers can act on it),
/// and a digest would make those frames useless. Callers who must not reveal a key digest
/// it themselves before submitting. Control characters are refused so that a key is always
/// safe to print in a log line or a frame.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EventKey(Box<str>);

impl EventKey {
    /// Largest accepted length in bytes.
    pub const MAX_LEN: usize = 256;

    /// # Errors
    /// [`GateValueError::EventKey`] when `value` is empty, longer than 256 bytes, or has a
    /// control character.
    pub fn new(value: &str) -> Result<Self, GateValueError> {
        if !value.is_empty() && value.len() <= Self::MAX_LEN && !value.chars().any(char::is_control)
        {
            Ok(Self(value.into()))
        } else {
            Err(GateValueError::EventKey {
                len: value.len(),
                prefix: value.chars().take(40).collect(),
            })
        }
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of one event (`"e-17"`): 1..=128 bytes of visible ASCII. The caller chooses it, or
/// the edge makes one when the request has none; it is what makes a retried submission safe
/// (a known id is answered as a duplicate, see [`crate::gate::SubmitOutcome::Duplicate`]).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EventId(Box<str>);

impl EventId {
    /// Largest accepted length in bytes.
    pub const MAX_LEN: usize = 128;

    /// # Errors
    /// [`GateValueError::EventId`] when `value` is empty, longer than 128 bytes or not visible
    /// ASCII.
    pub fn new(value: &str) -> Result<Self, GateValueError> {
        if is_visible_ascii(value, Self::MAX_LEN) {
            Ok(Self(value.into()))
        } else {
            Err(GateValueError::EventId(value.chars().take(130).collect()))
        }
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One value of a gate's scalar clock: `0..=2^53-1`, exact in Lua and in JSON numbers.
///
/// One counter per gate hands out every value; 0 is "nothing has happened yet" (the clock of
/// a fresh gate's snapshot), so the first state change gets 1. Values are unique and strictly
/// increasing, and a smaller value happened before a greater one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct GateClock(u64);

impl GateClock {
    /// The clock of a gate where nothing has happened.
    pub const ZERO: GateClock = GateClock(0);

    /// # Errors
    /// [`GateValueError::Clock`] when `value` is above 2^53-1.
    pub fn new(value: u64) -> Result<Self, GateValueError> {
        if value <= MAX_SAFE_INTEGER {
            Ok(Self(value))
        } else {
            Err(GateValueError::Clock(value))
        }
    }

    /// The clock value, in `0..=2^53-1`.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The next value, or `None` when the counter is exhausted (2^53-1 values: at a million
    /// state changes per second, 285 years).
    pub fn next(self) -> Option<Self> {
        if self.0 < MAX_SAFE_INTEGER {
            Some(Self(self.0 + 1))
        } else {
            None
        }
    }
}

impl fmt::Display for GateClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_id_accepts_exactly_the_policy_id_alphabet() {
        assert!(GateId::new("orders_v2-x").is_ok());
        assert!(GateId::new("").is_err());
        assert!(GateId::new("Orders").is_err());
        assert!(GateId::new("a/b").is_err());
        assert!(GateId::new(&"a".repeat(64)).is_ok());
        assert!(GateId::new(&"a".repeat(65)).is_err());
    }

    #[test]
    fn event_key_is_bounded_utf8_without_control_characters() {
        assert!(EventKey::new("taco").is_ok());
        assert!(EventKey::new("🌮 al pastor").is_ok());
        assert!(EventKey::new("").is_err());
        assert!(EventKey::new("a\nb").is_err());
        assert!(EventKey::new(&"k".repeat(256)).is_ok());
        assert!(EventKey::new(&"k".repeat(257)).is_err());
        // 64 four-byte characters are exactly 256 bytes; one more is refused by bytes, not chars.
        assert!(EventKey::new(&"🌮".repeat(64)).is_ok());
        assert!(EventKey::new(&"🌮".repeat(65)).is_err());
    }

    #[test]
    fn event_id_is_bounded_visible_ascii() {
        assert!(EventId::new("e-17").is_ok());
        assert!(EventId::new("").is_err());
        assert!(EventId::new("e 17").is_err());
        assert!(EventId::new("é").is_err());
        assert!(EventId::new(&"i".repeat(128)).is_ok());
        assert!(EventId::new(&"i".repeat(129)).is_err());
    }

    #[test]
    fn gate_clock_stays_exact_and_stops_at_two_to_the_53() {
        assert_eq!(GateClock::ZERO.next().map(GateClock::get), Some(1));
        assert!(GateClock::new(MAX_SAFE_INTEGER).is_ok());
        assert!(GateClock::new(MAX_SAFE_INTEGER + 1).is_err());
        assert_eq!(
            GateClock::new(MAX_SAFE_INTEGER)
                .ok()
                .and_then(GateClock::next),
            None
        );
    }
}
