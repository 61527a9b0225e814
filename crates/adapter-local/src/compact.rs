//! A stored algorithm state in 24 bytes, so that a store bucket (key and entry) is 64:
//! one cache line.
//!
//! `AlgorithmState` is 32 bytes: the sliding log's and the concurrency policy's `Vec` set its
//! size, though the other four algorithms need two or three words. Here those four are three
//! words inline, the algorithm's tag in the top byte of the first beside `last_ms` (below 2^48,
//! like every time the models accept, so the word is never 0 and the enum needs no tag of its
//! own); the two that hold a `Vec` keep their entries on the heap anyway, and are boxed, as is
//! the rare state in overdraft (a reservation settled above its estimate).

use std::borrow::Cow;
use std::num::NonZeroU64;

use shared_contract::model::{
    AlgorithmState, FixedWindowState, GcraState, SlidingWindowState, TokenBucketState,
};

/// A state as the store keeps it. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compact {
    /// Fixed window, sliding window, token bucket, GCRA: `head` is the tag (1..=4) << 56 |
    /// `last_ms`; `b` and `c` the state's other fields.
    Inline { head: NonZeroU64, b: u64, c: u64 },
    /// Sliding log, concurrency (and, defensively, a time too large to share a word).
    Boxed(Box<AlgorithmState>),
}

const TAG_SHIFT: u32 = 56;
const TIME_MASK: u64 = (1 << TAG_SHIFT) - 1;
const FIXED_WINDOW: u64 = 1;
const SLIDING_WINDOW: u64 = 2;
const TOKEN_BUCKET: u64 = 3;
const GCRA: u64 = 4;

impl Compact {
    /// Packs `state`.
    pub(crate) fn pack(state: AlgorithmState) -> Self {
        let (tag, last_ms, b, c) = match state {
            AlgorithmState::FixedWindow(s) if s.overdraft == 0 => {
                (FIXED_WINDOW, s.last_ms, s.count, 0)
            }
            AlgorithmState::SlidingWindow(s) if s.overdraft == 0 => {
                (SLIDING_WINDOW, s.last_ms, s.previous, s.current)
            }
            AlgorithmState::TokenBucket(s) if s.overdraft == 0 => {
                (TOKEN_BUCKET, s.last_ms, s.tokens, 0)
            }
            AlgorithmState::Gcra(s) if s.overdraft == 0 => (GCRA, s.last_ms, s.debt, 0),
            other => return Self::Boxed(Box::new(other)),
        };
        match NonZeroU64::new((tag << TAG_SHIFT) | last_ms) {
            Some(head) if last_ms <= TIME_MASK => Self::Inline { head, b, c },
            _ => Self::Boxed(Box::new(Self::unpacked(tag, last_ms, b, c))),
        }
    }

    /// The time of the state's last write, when it is at hand without unpacking (`None` for
    /// a boxed state).
    pub(crate) fn written_at_ms(&self) -> Option<u64> {
        match self {
            Self::Inline { head, .. } => Some(head.get() & TIME_MASK),
            Self::Boxed(_) => None,
        }
    }

    /// The state: built on the stack for an inline one, borrowed for a boxed one.
    pub(crate) fn unpack(&self) -> Cow<'_, AlgorithmState> {
        match self {
            Self::Inline { head, b, c } => {
                let (tag, last_ms) = (head.get() >> TAG_SHIFT, head.get() & TIME_MASK);
                Cow::Owned(Self::unpacked(tag, last_ms, *b, *c))
            }
            Self::Boxed(state) => Cow::Borrowed(state),
        }
    }

    fn unpacked(tag: u64, last_ms: u64, b: u64, c: u64) -> AlgorithmState {
        match tag {
            FIXED_WINDOW => AlgorithmState::FixedWindow(FixedWindowState {
                last_ms,
                count: b,
                overdraft: 0,
            }),
            SLIDING_WINDOW => AlgorithmState::SlidingWindow(SlidingWindowState {
                last_ms,
                previous: b,
                current: c,
                overdraft: 0,
            }),
            TOKEN_BUCKET => AlgorithmState::TokenBucket(TokenBucketState {
                last_ms,
                tokens: b,
                overdraft: 0,
            }),
            // Only the four tags above are ever packed.
            _ => AlgorithmState::Gcra(GcraState {
                last_ms,
                debt: b,
                overdraft: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use shared_contract::LeaseToken;
    use shared_contract::model::{ConcurrencyState, SlidingLogState};
    use shared_contract::policy::MAX_TIME_MS;

    use super::*;

    #[test]
    fn every_state_comes_back_as_it_was_packed() {
        let states = [
            AlgorithmState::FixedWindow(FixedWindowState {
                last_ms: MAX_TIME_MS,
                count: u64::MAX,
                overdraft: 0,
            }),
            AlgorithmState::SlidingWindow(SlidingWindowState {
                last_ms: 1,
                previous: 7,
                current: 9,
                overdraft: 0,
            }),
            AlgorithmState::TokenBucket(TokenBucketState {
                last_ms: 0,
                tokens: 3,
                overdraft: 0,
            }),
            AlgorithmState::Gcra(GcraState {
                last_ms: 1_764_000_000_000,
                debt: 5,
                overdraft: 0,
            }),
            // A time beyond the models' range still round-trips (boxed).
            AlgorithmState::Gcra(GcraState {
                last_ms: u64::MAX,
                debt: 5,
                overdraft: 0,
            }),
            AlgorithmState::SlidingLog(SlidingLogState {
                last_ms: 4,
                entries: vec![(1, 2), (3, 4)],
            }),
            AlgorithmState::Concurrency(ConcurrencyState {
                leases: vec![(LeaseToken::from_bytes([1; 16]), 10)],
            }),
        ];
        for state in states {
            let packed = Compact::pack(state.clone());
            assert_eq!(*packed.unpack(), state);
            if let Some(at) = packed.written_at_ms() {
                assert_eq!(Some(at), last_ms(&state), "{state:?}");
            }
        }
        let inline = Compact::pack(AlgorithmState::TokenBucket(TokenBucketState {
            last_ms: 0,
            tokens: 3,
            overdraft: 0,
        }));
        assert!(matches!(inline, Compact::Inline { .. }), "{inline:?}");
    }

    fn last_ms(state: &AlgorithmState) -> Option<u64> {
        match state {
            AlgorithmState::FixedWindow(s) => Some(s.last_ms),
            AlgorithmState::SlidingWindow(s) => Some(s.last_ms),
            AlgorithmState::TokenBucket(s) => Some(s.last_ms),
            AlgorithmState::Gcra(s) => Some(s.last_ms),
            AlgorithmState::SlidingLog(s) => Some(s.last_ms),
            AlgorithmState::Concurrency(_) => None,
        }
    }

    #[test]
    fn a_state_is_three_words() {
        assert_eq!(std::mem::size_of::<Compact>(), 24);
    }
}
