//! Where the local provider keeps algorithm state: a bounded [`moka`] cache keyed by
//! (policy slot, subject digest), one entry per key, each read-modify-write serialized per key.
//!
//! Why `and_compute_with` and not values behind a `Mutex`: moka runs the closure under a
//! key-level lock and writes its result before the lock is released, so two evaluations of
//! one key never interleave, even around an eviction or an expiry. A `Mutex` inside the value
//! would be serialized only while the same value stays in the cache: a task still holding an
//! evicted value and a task that inserted a fresh one would both admit.

use std::time::Duration;

use moka::sync::Cache;
use shared_contract::model::AlgorithmState;

/// One stored key: the policy's slot in this provider (which fixes policy id and revision) and
/// the subject digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub slot: u32,
    pub subject: [u8; 32],
}

/// Per-slot time to live of an entry after its last write.
#[derive(Debug)]
struct SlotExpiry {
    lifetimes: Box<[Duration]>,
}

impl SlotExpiry {
    fn lifetime(&self, key: &Key) -> Option<Duration> {
        // A slot outside the table cannot be built by the provider; no expiry is the safe
        // reading of it (the entry is still bounded by `max_keys`).
        self.lifetimes.get(key.slot as usize).copied()
    }
}

impl moka::Expiry<Key, AlgorithmState> for SlotExpiry {
    fn expire_after_create(
        &self,
        key: &Key,
        _value: &AlgorithmState,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        self.lifetime(key)
    }

    fn expire_after_update(
        &self,
        key: &Key,
        _value: &AlgorithmState,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        // The lifetime counts from the last write (an allow); reads (denials) do not extend it.
        self.lifetime(key)
    }
}

/// The bounded, expiring state of every key of one provider.
#[derive(Debug)]
pub(crate) struct Store {
    cache: Cache<Key, AlgorithmState>,
}

impl Store {
    /// A store of at most `max_keys` entries; an entry of slot `i` expires `lifetimes[i]` after
    /// its last write.
    pub fn new(max_keys: u64, lifetimes: Vec<Duration>) -> Self {
        let cache = Cache::builder()
            .max_capacity(max_keys)
            .expire_after(SlotExpiry {
                lifetimes: lifetimes.into_boxed_slice(),
            })
            .build();
        Self { cache }
    }

    /// Runs `f` on the state of `key` with the key locked. When `f` returns a new state it is
    /// stored before the lock is released; `None` leaves the entry as it was (a denial writes
    /// nothing). `None` only if moka did not run `f`, which its contract rules out; callers
    /// treat it as a failure rather than trusting it.
    pub fn update<R>(
        &self,
        key: Key,
        f: impl FnOnce(Option<&AlgorithmState>) -> (Option<AlgorithmState>, R),
    ) -> Option<R> {
        let mut out = None;
        self.cache.entry(key).and_compute_with(|entry| {
            let (new_state, result) = f(entry.as_ref().map(|e| e.value()));
            out = Some(result);
            match new_state {
                Some(state) => moka::ops::compute::Op::Put(state),
                None => moka::ops::compute::Op::Nop,
            }
        });
        out
    }

    /// Entries held now, after moka's pending maintenance (evictions, expiries) has run.
    pub fn len(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }
}
