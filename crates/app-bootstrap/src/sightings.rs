//! What the global provider last answered for each key, for the fleet-share fallback to start
//! from (see [`crate::fallback`], "Starting from the last answer").
//!
//! A fixed table of slots, one key per slot (the slot a key's hash picks): recording a key
//! whose slot holds another replaces it, so memory stays bounded at any number of keys, and a
//! key whose sighting was replaced falls back to the plain share, as if never seen. One lock
//! per slot: recording costs the request path a hash and an uncontended lock.

use std::hash::BuildHasher;
use std::sync::Mutex;

use shared_contract::{PolicyId, PolicyRevision, SubjectDigest};

/// The most slots a table holds (each about 130 bytes).
pub const MAX_SLOTS: usize = 1 << 16;

/// One answer: `remaining` of `policy` for `subject`, received at `at_ms` (this instance's
/// clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// The policy answered for.
    pub policy: PolicyId,
    /// Its revision (a sighting of another revision is not started from).
    pub revision: PolicyRevision,
    /// The key's subject.
    pub subject: SubjectDigest,
    /// The cost the global provider said was still admissible after its decision.
    pub remaining: u64,
    /// When this instance received the answer.
    pub at_ms: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Sightings {
    slots: Box<[Mutex<Option<Sighting>>]>,
    /// A per-table seed, so that two instances' tables place keys differently.
    seed: u64,
}

impl Sightings {
    /// A table of `capacity` slots (at least 1, at most [`MAX_SLOTS`], rounded up to a power
    /// of two).
    pub fn new(capacity: usize) -> Self {
        let n = capacity.clamp(1, MAX_SLOTS).next_power_of_two();
        Self {
            slots: (0..n).map(|_| Mutex::new(None)).collect(),
            seed: std::hash::RandomState::new().hash_one(n),
        }
    }

    /// The key's slot. A subject digest is already uniform (an HMAC under the edge's secret),
    /// so its first 8 bytes, mixed with the policy id's FNV-1a, place it without hashing 100
    /// bytes per decision; keys that meet in a slot only replace each other's sightings.
    fn slot(&self, policy: &PolicyId, subject: &SubjectDigest) -> &Mutex<Option<Sighting>> {
        let mut h = self.seed ^ 0xcbf2_9ce4_8422_2325;
        for &b in policy.as_str().as_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut first = [0u8; 8];
        first.copy_from_slice(&subject.as_bytes()[..8]);
        let h = h ^ u64::from_le_bytes(first);
        // The length is a power of two.
        &self.slots[(h as usize) & (self.slots.len() - 1)]
    }

    /// Records `sighting`, replacing the key's previous one (or another key's in its slot).
    pub fn record(&self, sighting: Sighting) {
        let slot = self.slot(&sighting.policy, &sighting.subject);
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(sighting);
    }

    /// Takes the key's last sighting out of the table (the fallback starts from it once) and
    /// runs `start` on it before the slot is free again: a caller that finds the sighting gone meanwhile waits until
    /// `start` has done, so it never decides before what the sighting started. (`start`
    /// may take other locks: nothing takes a slot while holding one of them.)
    pub fn take_with<R>(
        &self,
        policy: &PolicyId,
        subject: &SubjectDigest,
        start: impl FnOnce(&Sighting) -> R,
    ) -> Option<R> {
        let mut slot = self
            .slot(policy, subject)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some(s) if s.policy == *policy && s.subject == *subject => Some(start(&s)),
            other => {
                *slot = other;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(table: &Sightings, policy: &PolicyId, subject: &SubjectDigest) -> Option<Sighting> {
        table.take_with(policy, subject, Sighting::clone)
    }

    fn sighting(policy: &str, subject: u8, remaining: u64) -> Sighting {
        Sighting {
            policy: PolicyId::new(policy).expect("valid id"),
            revision: PolicyRevision::new(1).expect("valid revision"),
            subject: SubjectDigest::from_bytes([subject; 32]),
            remaining,
            at_ms: 1_000,
        }
    }

    #[test]
    fn a_sighting_is_taken_once_and_only_by_its_own_key() {
        let table = Sightings::new(1024);
        table.record(sighting("api", 1, 7));
        table.record(sighting("api", 1, 5));
        let key = sighting("api", 1, 0);
        assert_eq!(
            take(&table, &key.policy, &key.subject),
            Some(sighting("api", 1, 5))
        );
        assert_eq!(take(&table, &key.policy, &key.subject), None, "taken once");
        table.record(sighting("api", 2, 3));
        let other = sighting("web", 2, 0);
        assert_eq!(
            take(&table, &other.policy, &other.subject),
            None,
            "another policy"
        );
        assert_eq!(table.slots.len(), 1024);
    }

    #[test]
    fn a_full_table_replaces_and_never_mixes_keys() {
        // One slot: every key shares it; the last recorded wins, and no key gets another's.
        let table = Sightings::new(1);
        table.record(sighting("api", 1, 7));
        table.record(sighting("api", 2, 9));
        let first = sighting("api", 1, 0);
        assert_eq!(take(&table, &first.policy, &first.subject), None);
        let second = sighting("api", 2, 0);
        assert_eq!(
            take(&table, &second.policy, &second.subject),
            Some(sighting("api", 2, 9))
        );
        assert_eq!(Sightings::new(0).slots.len(), 1);
        assert_eq!(Sightings::new(usize::MAX).slots.len(), MAX_SLOTS);
        assert_eq!(Sightings::new(1000).slots.len(), 1024);
    }
}
