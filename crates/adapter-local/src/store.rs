//! Where the local provider keeps algorithm state: a bounded map with expiry, sharded by key,
//! each shard behind its own lock.
//!
//! Why not moka (the design's first choice): measured on this machine, moka's
//! `and_compute_with` (the only moka API that serializes a read-modify-write per key) makes
//! ~0.1-0.5 M decisions/s with a p99 of 30-70 µs, a tenth of governor's keyed throughput,
//! because every allow is a cache write that moka replays through its maintenance queues.
//! docs/performance.md has the figures of both.
//!
//! - **Atomic per key**: the whole read-modify-write of a key (model, write back) runs under
//!   its shard's lock, so evaluations of one key are serialized, including around eviction and
//!   expiry (there is no value that outlives its map entry). The clock is read just before the
//!   lock, and again under it when that reading is behind the key's last write (see
//!   [`Store::update`]).
//! - **Expiry by the provider's clock**: an entry written at `t` is live until
//!   `t + lifetime`; after that it reads as absent (exactly like no state, see the crate docs)
//!   and its slot is reclaimed lazily: reused first by the eviction hand, and swept a couple
//!   of slots per insert. No background thread.
//! - **Bounded**: a provider-wide count holds the number of keys to `max_keys` (shards have
//!   no capacity of their own, so an uneven spread of keys never evicts early). A new key
//!   beyond the bound takes the slot of an expired entry, else of a victim chosen by CLOCK
//!   (second chance) in its shard: an entry read or written since the hand last passed
//!   survives; an entry written once and never seen again goes first, so a flood of one-off
//!   keys displaces one-off keys before active ones. The hand looks at most
//!   [`VICTIM_PROBES`] entries per eviction, so an insert costs a bounded amount of work.
//! - **Hashing**: subject digests are HMAC outputs (uniform and unpredictable without the
//!   secret), so the hash folds their bytes with a per-process random seed instead of running
//!   SipHash over 36 bytes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use shared_contract::Clock;
use shared_contract::model::AlgorithmState;

use crate::compact::Compact;

/// One stored key in 32 bytes: the subject digest XOR the policy slot's [`Mask`], as four
/// words so that comparing and hashing are a few register operations (no `memcmp` call per
/// probe).
///
/// Why a mask instead of the slot number beside the digest: 32 bytes of key and 32 of entry
/// make a bucket of exactly one cache line (a 36-byte key made it 72 bytes, two lines). Two
/// keys of one policy are equal exactly when their digests are. Keys of two policies coincide
/// only when their digests differ by exactly the XOR of the two policies' masks: 256 secret
/// random bits, so about 2^-256 for digests nobody can aim (HMAC outputs under a secret key),
/// far below the 2^-128 at which two subjects' digests coincide at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    words: [u64; 4],
}

impl Key {
    pub fn new(mask: &Mask, subject: &[u8; 32]) -> Self {
        let mut words = mask.0;
        for (w, chunk) in words.iter_mut().zip(subject.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w ^= u64::from_le_bytes(b);
        }
        Self { words }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Two words of the masked digest are plenty of entropy for a map index; equality still
        // compares all 32 bytes.
        state.write_u64(self.words[0]);
        state.write_u64(self.words[1]);
    }
}

/// A policy slot's 256-bit key mask ([`Key`]): SipHash of the slot number under a random key
/// made once per process, so the slot's keys are the same in every provider that shares the
/// store (a reload keeps a slot, and so its keys), and no mask says anything about another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mask([u64; 4]);

impl Mask {
    pub fn of(slot: u32) -> Self {
        static SECRET: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
        let secret = SECRET.get_or_init(RandomState::new);
        let mut words = [0u64; 4];
        for (i, w) in (0u8..).zip(words.iter_mut()) {
            *w = secret.hash_one((slot, i));
        }
        Self(words)
    }
}

/// Folded 128-bit multiply: a fast, well-mixing hash of a few words (as in foldhash).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoldHasher {
    h: u64,
}

const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Keys hash through `write_u64`; bytes come from policy ids (`str`). Whole words are
        // read without a copy, the tail byte by byte: no `memcpy` call on the request path.
        let mut words = bytes.chunks_exact(8);
        for chunk in &mut words {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let w = tail
                .iter()
                .rev()
                .fold(tail.len() as u64, |acc, &b| (acc << 8) | u64::from(b));
            self.write_u64(w);
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v) | 0x100);
    }

    fn write_u64(&mut self, v: u64) {
        let m = u128::from(self.h ^ v) * u128::from(MUL);
        self.h = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.h
    }
}

/// The hasher of the store's maps, seeded per process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeededFold {
    seed: u64,
}

impl SeededFold {
    pub fn new() -> Self {
        Self {
            seed: RandomState::new().hash_one(0x5eed_u64),
        }
    }
}

impl BuildHasher for SeededFold {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher { h: self.seed }
    }
}

/// The state of a held key.
///
/// The key's position is its bucket: the hand and the sweep walk buckets by index.
#[derive(Debug)]
struct Entry {
    /// The state in 24 bytes ([`Compact`]).
    state: Compact,
    /// Provider-clock ms from which the entry reads as absent (below 2^48, like every time
    /// the models accept), and in the top bit whether the key was seen since the CLOCK hand
    /// last passed: one word instead of two keeps a bucket at 64 bytes.
    expiry: u64,
}

/// The top bit of [`Entry::expiry`]: referenced since the hand last passed.
const REFERENCED: u64 = 1 << 63;

impl Entry {
    fn new(state: AlgorithmState, expires_at_ms: u64) -> Self {
        Self {
            state: Compact::pack(state),
            expiry: expires_at_ms & !REFERENCED,
        }
    }

    fn expires_at_ms(&self) -> u64 {
        self.expiry & !REFERENCED
    }

    fn referenced(&self) -> bool {
        self.expiry & REFERENCED != 0
    }

    fn set_referenced(&mut self, referenced: bool) {
        self.expiry = self.expires_at_ms() | if referenced { REFERENCED } else { 0 };
    }

    /// A write: the new state, live until `expires_at_ms`, seen.
    fn write(&mut self, state: AlgorithmState, expires_at_ms: u64) {
        self.state = Compact::pack(state);
        self.expiry = (expires_at_ms & !REFERENCED) | REFERENCED;
    }
}

/// A key and its entry in one cache line: 32 bytes each, aligned to 64, so a probe that finds
/// its key reads one line of buckets (beside hashbrown's control bytes).
#[derive(Debug)]
#[repr(align(64))]
struct Bucket {
    key: Key,
    entry: Entry,
}

/// One lock's worth of keys. The map holds the state inline, so a decision touches one bucket.
/// The CLOCK hand and the sweep walk the table's buckets by index (only inserts use them): a
/// bucket index needs no copy of the key, and a rehash only moves where they look next, which
/// CLOCK's approximation tolerates.
#[derive(Debug)]
struct Shard {
    map: HashTable<Bucket>,
    hasher: SeededFold,
    /// CLOCK hand: the bucket index of the next eviction candidate.
    hand: usize,
    /// Sweep cursor: the next bucket checked for expiry on insert.
    sweep: usize,
}

/// Buckets checked for expiry per insert (about 0.8 keys each at the load the shards are
/// sized for): enough to reclaim expired entries over time at a bounded cost per call.
const SWEEP_PER_INSERT: usize = 3;

/// Most entries the CLOCK hand looks at for one eviction. When all of them were seen
/// recently the last one goes anyway: an unbounded hand would scan a whole shard (thousands of
/// cache misses) whenever every key is active, which is exactly when evictions are frequent.
const VICTIM_PROBES: usize = 8;

/// Most buckets the hand steps over looking for [`VICTIM_PROBES`] entries, so that a sparse
/// table (keys removed, never shrunk) costs a bounded walk too.
const VICTIM_BUCKETS: usize = 64;

/// The provider-wide count of held keys, against `max_keys`.
#[derive(Debug)]
struct Budget {
    held: AtomicU64,
    max: u64,
}

impl Budget {
    /// Takes one key of the budget, if any is left.
    fn take(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self, keys: u64) {
        if keys > 0 {
            self.held.fetch_sub(keys, Ordering::AcqRel);
        }
    }
}

impl Shard {
    fn new(hasher: SeededFold) -> Self {
        Self {
            map: HashTable::new(),
            hasher,
            hand: 0,
            sweep: 0,
        }
    }

    fn hash(&self, key: &Key) -> u64 {
        self.hasher.hash_one(key)
    }

    fn get(&self, key: &Key) -> Option<&Entry> {
        self.map
            .find(self.hash(key), |b| b.key == *key)
            .map(|b| &b.entry)
    }

    fn get_mut(&mut self, key: &Key) -> Option<&mut Entry> {
        self.get_mut_hashed(self.hash(key), key)
    }

    /// [`Self::get_mut`] with the key's hash already made (by the store, which picked the
    /// shard with it: every shard shares the store's hasher).
    fn get_mut_hashed(&mut self, hash: u64, key: &Key) -> Option<&mut Entry> {
        self.map
            .find_mut(hash, |b| b.key == *key)
            .map(|b| &mut b.entry)
    }

    /// Removes the key in bucket `i` when it is expired at `now_ms`; 1 when one was removed.
    fn remove_if_expired(&mut self, i: usize, now_ms: u64) -> u64 {
        match self.map.get_bucket_entry(i) {
            Ok(entry) if entry.get().entry.expires_at_ms() <= now_ms => {
                entry.remove();
                1
            }
            _ => 0,
        }
    }

    /// Checks the next `steps` buckets for expiry and removes the expired keys. Returns the
    /// number removed, whose budget the caller gives back (or reuses).
    fn sweep(&mut self, now_ms: u64, steps: usize) -> u64 {
        let buckets = self.map.num_buckets();
        if self.map.is_empty() {
            return 0;
        }
        let mut removed = 0;
        for _ in 0..steps {
            if self.sweep >= buckets {
                self.sweep = 0;
            }
            removed += self.remove_if_expired(self.sweep, now_ms);
            self.sweep += 1;
        }
        removed
    }

    /// The bucket of the key to evict (the shard is not empty): the first expired key among
    /// the next [`VICTIM_PROBES`] under the hand (it costs nothing to forget), else the first
    /// unreferenced one, else the last of them; any key when the hand found none within
    /// [`VICTIM_BUCKETS`].
    fn victim(&mut self, now_ms: u64) -> usize {
        let buckets = self.map.num_buckets();
        let (mut cold, mut last) = (None, None);
        let mut probes = 0;
        for _ in 0..VICTIM_BUCKETS {
            if self.hand >= buckets {
                self.hand = 0;
            }
            let i = self.hand;
            self.hand += 1;
            let Some(Bucket { entry: e, .. }) = self.map.get_bucket_mut(i) else {
                continue;
            };
            if e.expires_at_ms() <= now_ms {
                return i;
            }
            if e.referenced() {
                e.set_referenced(false);
            } else if cold.is_none() {
                cold = Some(i);
            }
            last = Some(i);
            probes += 1;
            if probes == VICTIM_PROBES {
                break;
            }
        }
        cold.or(last).unwrap_or_else(|| {
            let hasher = self.hasher;
            let key = self.map.iter().next().expect("the shard is not empty").key;
            self.map
                .find_bucket_index(hasher.hash_one(key), |b| b.key == key)
                .expect("a key of the table is found in it")
        })
    }

    fn insert(
        &mut self,
        key: Key,
        state: AlgorithmState,
        expires_at_ms: u64,
        now_ms: u64,
        budget: &Budget,
    ) {
        let swept = self.sweep(now_ms, SWEEP_PER_INSERT);
        // A key the sweep just removed pays for the new one: its budget is kept rather than
        // given back and taken again (one contended atomic operation less, usually two).
        let budgeted = if swept > 0 {
            budget.give_back(swept - 1);
            true
        } else {
            budget.take()
        };
        if !budgeted {
            if self.map.is_empty() {
                // The provider is full and this shard holds nothing to evict: the key is not
                // stored (it will start fresh next time, as if evicted at once).
                return;
            }
            let i = self.victim(now_ms);
            if let Ok(entry) = self.map.get_bucket_entry(i) {
                entry.remove();
            }
        }
        let hasher = self.hasher;
        self.map.insert_unique(
            self.hash(&key),
            Bucket {
                key,
                entry: Entry::new(state, expires_at_ms),
            },
            |b| hasher.hash_one(b.key),
        );
    }
}

/// Expected keys per shard at `max_keys`, so that a shard's map stays below hashbrown's 7/8
/// load factor of 4096 buckets (3,584) and does not double to 8192. Keys spread over shards
/// unevenly (a standard deviation of about 57 at this size): at a mean of 3,584 about 40 % of
/// the shards doubled (204 bytes per key at 1,000,000 keys); at 3,300, five deviations below
/// the threshold, none do.
const SHARD_TARGET: u64 = 3_300;
const MAX_SHARDS: u64 = 4_096;

/// The bounded, expiring state of every key of one provider.
#[derive(Debug)]
pub(crate) struct Store {
    shards: Box<[Mutex<Shard>]>,
    hasher: SeededFold,
    /// Shards have no capacity of their own: the bound is provider-wide, so an unlucky
    /// distribution of keys over shards never evicts before `max_keys` keys are held.
    budget: Budget,
}

impl Store {
    /// A store of at most `max_keys` entries.
    pub fn new(max_keys: u64) -> Self {
        let n = max_keys.div_ceil(SHARD_TARGET).clamp(1, MAX_SHARDS);
        let hasher = SeededFold::new();
        let shards = (0..n).map(|_| Mutex::new(Shard::new(hasher))).collect();
        Self {
            shards,
            hasher,
            budget: Budget {
                held: AtomicU64::new(0),
                max: max_keys,
            },
        }
    }

    fn shard_index(&self, key: &Key) -> usize {
        self.shard_of(self.hasher.hash_one(key))
    }

    /// The shard of a key whose hash is `hash`.
    fn shard_of(&self, hash: u64) -> usize {
        // Bits 16..48 pick the shard (multiply-shift: no modulo bias worth speaking of).
        // Inside the shard hashbrown uses the low bits (bucket) and the top 7 (tag), which
        // therefore stay independent of the shard.
        let h = u64::from((hash >> 16) as u32);
        ((h * self.shards.len() as u64) >> 32) as usize
    }

    /// [`Self::update`] for several distinct keys at once: `f` sees every key's live state
    /// (in `keys` order) and one clock reading, all under the keys' locks, and returns either
    /// one new state per key (all written, each live for the longer of its key's lifetime and
    /// the one returned beside it) or `None` (nothing written). Locks are taken in shard
    /// order, so concurrent calls cannot deadlock.
    pub fn update_many<R>(
        &self,
        keys: &[(Key, u64)],
        clock: &dyn Clock,
        f: impl FnOnce(&[Option<&AlgorithmState>], u64) -> (Option<Vec<(AlgorithmState, u64)>>, R),
    ) -> R {
        let mut order: Vec<usize> = keys.iter().map(|(k, _)| self.shard_index(k)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let now = clock.now_ms();
        let guard_of = |key: &Key| {
            let i = self.shard_index(key);
            order.binary_search(&i).unwrap_or(0)
        };
        let live: Vec<Option<AlgorithmState>> = keys
            .iter()
            .map(|(key, _)| {
                let shard = &guards[guard_of(key)].1;
                shard
                    .get(key)
                    .filter(|e| now < e.expires_at_ms())
                    .map(|e| e.state.unpack().into_owned())
            })
            .collect();
        let refs: Vec<Option<&AlgorithmState>> = live.iter().map(Option::as_ref).collect();
        let (new_states, result) = f(&refs, now);
        for ((key, lifetime_ms), (state, longer)) in
            keys.iter().zip(new_states.into_iter().flatten())
        {
            let expires_at = now.saturating_add((*lifetime_ms).max(longer));
            let shard = &mut guards[guard_of(key)].1;
            if let Some(entry) = shard.get_mut(key) {
                entry.write(state, expires_at);
            } else {
                shard.insert(*key, state, expires_at, now, &self.budget);
            }
        }
        result
    }

    /// Runs `f` on the live state of `key` (`None` when absent or expired, read under the
    /// key's lock) and the clock's time. When `f` returns a new state it is stored, live for
    /// `lifetime_ms`, before the lock is released; `None` leaves the entry as it was (a
    /// denial writes nothing).
    ///
    /// The clock is read before the lock, so the lock is held for the model alone (measured:
    /// 8-10% of a decision). A reading behind the key's last write may only mean that another
    /// thread read the clock later and took the lock first; the clock is then read again under
    /// the lock. So a time behind the stored one is always what the clock said while the key
    /// was held (a real regression, for the model's clock rule), never the order in which two
    /// threads reached the lock.
    pub fn update<R>(
        &self,
        key: Key,
        clock: &dyn Clock,
        lifetime_ms: u64,
        f: impl FnOnce(Option<&AlgorithmState>, u64) -> (Option<AlgorithmState>, R),
    ) -> R {
        let read = clock.now_ms();
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[self.shard_of(hash)].lock();
        if let Some(entry) = shard.get_mut_hashed(hash, &key) {
            let now = match entry.state.written_at_ms() {
                Some(at) if at <= read => read,
                _ => clock.now_ms(),
            };
            let expires_at = now.saturating_add(lifetime_ms);
            let live = now < entry.expires_at_ms();
            let (new_state, result) = {
                let state = entry.state.unpack();
                f(live.then_some(&*state), now)
            };
            match new_state {
                Some(state) => entry.write(state, expires_at),
                None => entry.set_referenced(true),
            }
            return result;
        }
        // No stored time to be behind of: the reading stands.
        let now = read;
        let (new_state, result) = f(None, now);
        if let Some(state) = new_state {
            let expires_at = now.saturating_add(lifetime_ms);
            shard.insert(key, state, expires_at, now, &self.budget);
        }
        result
    }

    /// Reclaims every expired entry, then counts the live ones. Walks the whole map: for
    /// tests and diagnostics, not for the request path.
    pub fn purge_and_count(&self, now_ms: u64) -> u64 {
        let mut live = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.map.len();
            shard.map.retain(|b| b.entry.expires_at_ms() > now_ms);
            self.budget.give_back((before - shard.map.len()) as u64);
            live += shard.map.len() as u64;
        }
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_contract::ManualClock;
    use shared_contract::model::FixedWindowState;

    fn key(n: u64) -> Key {
        let mut subject = [0u8; 32];
        // Spread like a digest: every byte depends on n.
        for (i, b) in subject.iter_mut().enumerate() {
            *b = (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> ((i % 8) * 8)) as u8 ^ (i as u8);
        }
        subject[16..24].copy_from_slice(&n.to_le_bytes());
        Key::new(&Mask::of(0), &subject)
    }

    fn state(count: u64) -> AlgorithmState {
        AlgorithmState::FixedWindow(FixedWindowState {
            last_ms: 0,
            count,
            overdraft: 0,
        })
    }

    fn write(store: &Store, clock: &ManualClock, k: Key, count: u64, lifetime: u64) {
        store.update(k, clock, lifetime, |_, _| (Some(state(count)), ()));
    }

    fn read(store: &Store, clock: &ManualClock, k: Key) -> Option<AlgorithmState> {
        store.update(k, clock, 0, |s, _| (None, s.cloned()))
    }

    /// The budget counts exactly the held keys, within the bound.
    fn assert_consistent(store: &Store) {
        let mut held = 0;
        for shard in store.shards.iter() {
            held += shard.lock().map.len() as u64;
        }
        assert_eq!(store.budget.held.load(Ordering::Acquire), held);
        assert!(held <= store.budget.max);
    }

    /// A clock answering `readings` in turn (the last one from then on), counting reads.
    #[derive(Debug)]
    struct Scripted {
        readings: Vec<u64>,
        reads: AtomicU64,
    }

    impl Scripted {
        fn new(readings: &[u64]) -> Self {
            Self {
                readings: readings.to_vec(),
                reads: AtomicU64::new(0),
            }
        }
    }

    impl Clock for Scripted {
        fn now_ms(&self) -> u64 {
            let i = self.reads.fetch_add(1, Ordering::SeqCst) as usize;
            self.readings[i.min(self.readings.len() - 1)]
        }
    }

    /// The reading before the lock stands unless it is behind the key's last write; then the
    /// time is read again under the lock, and what that says (later, or a real regression)
    /// is what the model sees.
    #[test]
    fn a_reading_behind_the_last_write_is_taken_again_under_the_lock() {
        let store = Store::new(10);
        let k = key(1);
        let written = AlgorithmState::FixedWindow(FixedWindowState {
            last_ms: 1_000,
            count: 1,
            overdraft: 0,
        });
        store.update(k, &ManualClock::new(1_000), 60_000, |_, _| {
            (Some(written), ())
        });
        let seen = |clock: &Scripted| store.update(k, clock, 60_000, |_, now| (None, now));
        // Not behind: one read.
        let clock = Scripted::new(&[1_000, 5]);
        assert_eq!(seen(&clock), 1_000);
        assert_eq!(clock.reads.load(Ordering::SeqCst), 1);
        // Behind, because another thread's later reading won the lock: read again.
        let clock = Scripted::new(&[999, 1_001]);
        assert_eq!(seen(&clock), 1_001);
        assert_eq!(clock.reads.load(Ordering::SeqCst), 2);
        // Behind, and still behind under the lock: the clock went back; the model sees it.
        let clock = Scripted::new(&[900, 950]);
        assert_eq!(seen(&clock), 950);
        // A new key has no time to be behind of.
        let clock = Scripted::new(&[10, 20]);
        assert_eq!(
            store.update(key(2), &clock, 60_000, |_, now| (None, now)),
            10
        );
        assert_eq!(clock.reads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn state_reads_as_absent_from_its_expiry_time() {
        let (store, clock) = (Store::new(10), ManualClock::new(1_000));
        write(&store, &clock, key(1), 3, 100);
        clock.set(1_099);
        assert_eq!(read(&store, &clock, key(1)), Some(state(3)));
        clock.set(1_100);
        assert_eq!(read(&store, &clock, key(1)), None);
        assert_eq!(store.purge_and_count(clock.now_ms()), 0);
    }

    #[test]
    fn a_write_renews_the_lifetime_and_a_read_does_not() {
        let (store, clock) = (Store::new(10), ManualClock::new(0));
        write(&store, &clock, key(1), 1, 100);
        clock.set(90);
        write(&store, &clock, key(1), 2, 100);
        clock.set(150);
        assert_eq!(read(&store, &clock, key(1)), Some(state(2)));
        clock.set(190);
        assert_eq!(read(&store, &clock, key(1)), None);
    }

    #[test]
    fn inserts_beyond_capacity_evict_and_the_bound_holds() {
        for max_keys in [1u64, 7, 100, 5_000, 20_000] {
            let (store, clock) = (Store::new(max_keys), ManualClock::new(0));
            for n in 0..3 * max_keys {
                write(&store, &clock, key(n), 1, 1_000_000);
            }
            assert_consistent(&store);
            let held = store.purge_and_count(0);
            assert!(held <= max_keys, "{held} held, bound {max_keys}");
            assert!(
                held >= max_keys / 2,
                "{held} held of {max_keys}: shards badly unbalanced"
            );
        }
    }

    #[test]
    fn digests_that_hash_alike_are_still_different_keys() {
        let (store, clock) = (Store::new(10), ManualClock::new(0));
        let (mut a, mut b) = ([7u8; 32], [7u8; 32]);
        a[31] = 1;
        b[31] = 2;
        let slot0 = Mask::of(0);
        let (a, b) = (Key::new(&slot0, &a), Key::new(&slot0, &b));
        write(&store, &clock, a, 1, 1_000);
        write(&store, &clock, b, 2, 1_000);
        assert_eq!(read(&store, &clock, a), Some(state(1)));
        assert_eq!(read(&store, &clock, b), Some(state(2)));
        assert_eq!(
            read(&store, &clock, Key::new(&Mask::of(1), &[7u8; 32])),
            None
        );
    }

    #[test]
    fn one_digest_is_a_different_key_in_every_slot() {
        let (store, clock) = (Store::new(10), ManualClock::new(0));
        let subject = [9u8; 32];
        let keys: Vec<Key> = (0..4).map(|s| Key::new(&Mask::of(s), &subject)).collect();
        for (n, k) in (1..).zip(&keys) {
            write(&store, &clock, *k, n, 1_000);
        }
        for (n, k) in (1..).zip(&keys) {
            assert_eq!(read(&store, &clock, *k), Some(state(n)));
        }
        // The same slot always masks alike: a reloaded provider finds its keys again.
        assert_eq!(Key::new(&Mask::of(2), &subject), keys[2]);
    }

    #[test]
    fn a_map_bucket_is_one_cache_line() {
        // Key 32 + entry 32 (state 24, expiry with the reference bit), aligned to 64: the
        // layout docs/performance.md's bytes-per-key figure rests on. A larger bucket spans two
        // lines, a cache miss more per decision.
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }

    #[test]
    fn byte_strings_of_different_length_hash_differently() {
        let h = SeededFold::new();
        let hash = |b: &[u8]| {
            let mut hasher = h.build_hasher();
            hasher.write(b);
            hasher.finish()
        };
        assert_ne!(hash(b"api"), hash(b"api\0"));
        assert_ne!(hash(b"api"), hash(b"apj"));
        assert_ne!(hash(b"abcdefgh"), hash(b"abcdefgh\0"));
        assert_eq!(hash(b"same-policy-id"), hash(b"same-policy-id"));
    }

    #[test]
    fn zero_capacity_stores_nothing() {
        let (store, clock) = (Store::new(0), ManualClock::new(0));
        write(&store, &clock, key(1), 1, 1_000);
        assert_eq!(read(&store, &clock, key(1)), None);
    }

    #[test]
    fn expired_entries_are_evicted_before_live_ones() {
        let (store, clock) = (Store::new(2), ManualClock::new(0));
        write(&store, &clock, key(1), 1, 1_000_000);
        write(&store, &clock, key(2), 2, 10);
        clock.set(20);
        write(&store, &clock, key(3), 3, 1_000_000);
        assert_eq!(read(&store, &clock, key(1)), Some(state(1)));
        assert_eq!(read(&store, &clock, key(3)), Some(state(3)));
    }

    #[test]
    fn keys_seen_again_survive_a_flood_of_one_off_keys() {
        let (store, clock) = (Store::new(100), ManualClock::new(0));
        // One shard (100 < SHARD_TARGET): key 0 is re-read between one-off inserts.
        write(&store, &clock, key(0), 9, 1_000_000);
        for n in 1..1_000 {
            assert_eq!(read(&store, &clock, key(0)), Some(state(9)), "after {n}");
            write(&store, &clock, key(n), 1, 1_000_000);
        }
    }

    #[test]
    fn swept_and_evicted_keys_keep_the_count_consistent() {
        let (store, clock) = (Store::new(50), ManualClock::new(0));
        for round in 0..20u64 {
            for n in 0..80 {
                let k = key(round * 1_000 + n);
                write(&store, &clock, k, n, 5 + n % 7);
                assert_eq!(read(&store, &clock, k), Some(state(n)));
            }
            clock.advance(3);
            assert_consistent(&store);
        }
        assert!(store.purge_and_count(clock.now_ms()) <= 50);
        assert_consistent(&store);
    }
}
