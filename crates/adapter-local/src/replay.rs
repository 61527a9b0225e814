//! Remembered decisions of evaluations that carried an evaluation id, so that a retry of the
//! same limits within the replay window answers the first decision and charges nothing more.
//!
//! Bounded: at most [`MAX_REPLAYS`] live ids per provider. When that many are live, a new id
//! is refused ([`RequestError::EvaluationIdsFull`]) rather than forgetting one that a client
//! may still retry (which would charge that retry again).

use std::collections::HashMap;

use shared_contract::{EvaluationId, MultiDecision, MultiRequest, RequestError};

/// Most live evaluation ids one provider remembers.
pub const MAX_REPLAYS: usize = 100_000;

/// What identifies a retry: the id and every limit (slot, subject, cost) in order. The same
/// id with other limits is another evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReplayKey {
    id: Box<str>,
    limits: Vec<(u32, [u8; 32], u64)>,
}

impl ReplayKey {
    pub fn new(
        id: &EvaluationId,
        request: &MultiRequest,
        slots: impl IntoIterator<Item = u32>,
    ) -> Self {
        Self {
            id: id.as_str().into(),
            limits: request
                .limits
                .iter()
                .zip(slots)
                .map(|(l, slot)| (slot, *l.subject.as_bytes(), l.cost.get()))
                .collect(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Replays {
    entries: HashMap<ReplayKey, (u64, MultiDecision)>,
}

impl Replays {
    /// The first decision of `key`, if it is still remembered at `now_ms`.
    pub fn get(&self, key: &ReplayKey, now_ms: u64) -> Option<MultiDecision> {
        self.entries
            .get(key)
            .filter(|(expires_at, _)| now_ms < *expires_at)
            .map(|(_, d)| MultiDecision {
                replayed: true,
                ..d.clone()
            })
    }

    /// Room for one more id at `now_ms`, reclaiming expired ones when full.
    ///
    /// # Errors
    /// [`RequestError::EvaluationIdsFull`] when [`MAX_REPLAYS`] ids are live.
    pub fn reserve(&mut self, now_ms: u64) -> Result<(), RequestError> {
        if self.entries.len() >= MAX_REPLAYS {
            self.entries
                .retain(|_, (expires_at, _)| now_ms < *expires_at);
        }
        if self.entries.len() >= MAX_REPLAYS {
            return Err(RequestError::EvaluationIdsFull {
                held: self.entries.len(),
            });
        }
        Ok(())
    }

    pub fn insert(&mut self, key: ReplayKey, expires_at_ms: u64, decision: MultiDecision) {
        self.entries.insert(key, (expires_at_ms, decision));
    }
}
