//! Concurrent map candidates for the local provider's store, side by side with governor's keyed
//! limiter, on governor's kind of benchmark: one keyed GCRA check per call.
//!
//! Why: the store (`src/store.rs`, sharded `HashMap`s behind `parking_lot::Mutex`) reaches
//! 0.55-0.74x governor's keyed throughput and holds 202 bytes per key against governor's 86
//! (`benches/local.rs`). Before the store is redesigned, this bench measures the maps it
//! could be built on, each doing exactly what governor does per call and nothing more: no
//! policy lookup, no model, no eviction. The gap between a candidate and governor is then the
//! map's own cost, and the candidate's figure is what an inline-state store on it could reach.
//!
//! Every candidate does the same per call: read `now` from one shared `quanta` clock (the
//! clock governor reads), turn the 32-byte digest into four words, and run one
//! read-modify-write of a 16-byte GCRA cell (theoretical arrival time and expiry, in ns) held
//! inline in the map: no allocation per call once the key exists (except `papaya_compute`,
//! whose map stores immutable values: every update allocates a new entry). Rate 1e9/s, burst
//! 1e6: every call is an allow, the path that writes. Every candidate that takes a
//! `BuildHasher` hashes by folding two words with a per-process seed, like the store's
//! `FoldHasher`; governor's `DefaultKeyedRateLimiter` cannot take one (SipHash over the array).
//!
//! Two measurements, all in one run of `cargo bench -p adapter-local --bench maps`:
//! 1. throughput and latency: one hot key and 1,000,000 keys walked in order (every map filled
//!    with all keys first), on 1 and 2 threads (the second starts half-way in the keys). The
//!    1M-key scenario runs twice: filled in the walk's order (as `benches/local.rs` does),
//!    and filled in a shuffled order. The second is the fair one for maps that keep entries
//!    out of line (papaya's allocations, quick_cache's slab): filled in the walk's order,
//!    their entries lie in memory in the order they are then read. The
//!    candidates take turns over 7 rounds; in each round every candidate runs 200,000 untimed
//!    calls per thread (decisions/s: the median round is reported) and 200,000 calls each
//!    timed with `Instant` into an HDR histogram (p50/p99, which include the timer's own cost,
//!    printed beside the tables);
//! 2. bytes per key at 1,000,000 keys: the RSS growth of a child process per candidate (this
//!    binary re-executed with [`MEMORY_CHILD_ENV`] set), so memory freed by one map cannot be
//!    reused by the next.

use std::hash::{BuildHasher, Hash, Hasher};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use hdrhistogram::Histogram;
use parking_lot::{Mutex, RwLock};
use quick_cache::UnitWeighter;
use quick_cache::sync::{Cache, DefaultLifecycle, EntryAction, EntryResult};

const MANY_KEYS: usize = 1_000_000;
const MEMORY_CHILD_ENV: &str = "ADAPTER_LOCAL_MAPS_MEMORY";
const ROUNDS: usize = 7;
const CALLS_PER_ROUND: u64 = 200_000;

/// GCRA at 1e9 per second with a burst of 1e6: the emission interval is 1 ns and the
/// tolerance 1e6 ns, so no call made here is ever denied.
const RATE_PER_S: u32 = 1_000_000_000;
const BURST: u32 = 1_000_000;
const INTERVAL_NS: u64 = 1_000_000_000 / RATE_PER_S as u64;
const TOLERANCE_NS: u64 = INTERVAL_NS * BURST as u64;

/// The store's shard count at its default bound of 1,000,000 keys (`store.rs`:
/// `max_keys.div_ceil(SHARD_TARGET)` with `SHARD_TARGET` = 3,584).
const STORE_SHARDS: usize = 1_000_000_usize.div_ceil(3_584);

/// The digests: a splitmix64 stream (the same as `benches/local.rs`), distinct, well spread,
/// the same on every run.
fn keys(n: usize) -> Vec<[u8; 32]> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..n)
        .map(|_| {
            let mut k = [0u8; 32];
            for c in k.chunks_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
            k
        })
        .collect()
}

/// A stored key: the digest as four words, compared whole and hashed by two of them (the
/// store's `Key` without its policy slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest([u64; 4]);

impl Digest {
    fn new(bytes: &[u8; 32]) -> Self {
        let mut words = [0u64; 4];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        Self(words)
    }
}

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0[0]);
        state.write_u64(self.0[1]);
    }
}

/// The store's `FoldHasher`: a folded 128-bit multiply per word.
#[derive(Debug, Clone, Copy)]
struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Digests hash through `write_u64`; this path only serves other key types.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        let m = u128::from(self.0 ^ v) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The maps' hasher, seeded per process.
#[derive(Debug, Clone, Copy)]
struct SeededFold(u64);

impl SeededFold {
    fn new() -> Self {
        Self(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
    }
}

impl BuildHasher for SeededFold {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(self.0)
    }
}

/// The one clock of every candidate but governor (which reads its own `quanta` clock):
/// nanoseconds since the bench started, from the TSC.
#[derive(Debug)]
struct NsClock {
    clock: quanta::Clock,
    start: u64,
}

impl NsClock {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Self { clock, start }
    }

    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }
}

/// The GCRA state of a key, inline in the map.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    /// Theoretical arrival time, ns. A new key starts at 0, which reads as a full burst.
    tat: u64,
    /// From when the cell says nothing a missing one would not (a full burst again): what an
    /// expiring store sweeps by. Written on every allow, as the store does.
    expires: u64,
}

/// One GCRA check on a cell: allows (advancing the arrival time) when the key's backlog is
/// within the tolerance, else leaves the cell untouched.
fn gcra(cell: &mut Cell, now: u64) -> bool {
    let tat = cell.tat.max(now);
    if tat - now > TOLERANCE_NS {
        return false;
    }
    cell.tat = tat + INTERVAL_NS;
    cell.expires = cell.tat + TOLERANCE_NS;
    true
}

/// The cell for maps that hand out shared references: the arrival time is updated by
/// compare-and-swap (what governor does inside dashmap), the expiry stored after it (it only
/// has to be an upper bound for a sweep, so it needs no atomicity with the arrival time).
#[derive(Debug, Default)]
struct AtomicCell {
    tat: AtomicU64,
    expires: AtomicU64,
}

fn gcra_atomic(cell: &AtomicCell, now: u64) -> bool {
    let mut current = cell.tat.load(Ordering::Acquire);
    loop {
        let tat = current.max(now);
        if tat - now > TOLERANCE_NS {
            return false;
        }
        let next = tat + INTERVAL_NS;
        match cell
            .tat
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                cell.expires.store(next + TOLERANCE_NS, Ordering::Relaxed);
                return true;
            }
            Err(seen) => current = seen,
        }
    }
}

/// One candidate map, doing one keyed GCRA check per call.
trait Candidate: Sync {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool;
    /// Keys held.
    fn len(&self) -> usize;
}

/// Governor's keyed limiter: dashmap of `[u8; 32]` (SipHash) to an `AtomicU64`, updated by
/// compare-and-swap under the shard's read lock; its own quanta clock.
struct Governor(DefaultKeyedRateLimiter<[u8; 32]>);

impl Candidate for Governor {
    fn check(&self, key: &[u8; 32], _clock: &NsClock) -> bool {
        self.0.check_key(key).is_ok()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// dashmap with the cell inline, `entry` (the shard's write lock) for the read-modify-write.
struct DashEntry(DashMap<Digest, Cell, SeededFold>);

impl Candidate for DashEntry {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        gcra(&mut self.0.entry(Digest::new(key)).or_default(), now)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Governor's own design with the store's key and hasher: `get` (read lock) and a CAS.
struct DashAtomic(DashMap<Digest, AtomicCell, SeededFold>);

impl Candidate for DashAtomic {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let key = Digest::new(key);
        if let Some(cell) = self.0.get(&key) {
            return gcra_atomic(&cell, now);
        }
        gcra_atomic(&self.0.entry(key).or_default(), now)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A papaya map that finishes each resize at once ([`papaya::ResizeMode::Blocking`]). With
/// the default incremental mode, the filled 1M-key maps ran at 0.25-0.36x governor and held
/// 74 bytes per key: a resize left part-way (lookups going through the old table as well).
fn papaya_map<V>() -> papaya::HashMap<Digest, V, SeededFold> {
    papaya::HashMap::builder()
        .hasher(SeededFold::new())
        .resize_mode(papaya::ResizeMode::Blocking)
        .build()
}

/// papaya's `compute`: atomic per key, but values are immutable, so every allow allocates a
/// new entry (reclaimed through papaya's epochs).
struct PapayaCompute(papaya::HashMap<Digest, Cell, SeededFold>);

impl Candidate for PapayaCompute {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let map = self.0.pin();
        let result = map.compute(Digest::new(key), |entry| {
            let mut cell = entry.map_or_else(Cell::default, |(_, c)| *c);
            if gcra(&mut cell, now) {
                papaya::Operation::Insert(cell)
            } else {
                papaya::Operation::Abort(())
            }
        });
        !matches!(result, papaya::Compute::Aborted(()))
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// papaya (lock-free reads) with an atomic cell: `get` and a CAS, no allocation per call.
struct PapayaAtomic(papaya::HashMap<Digest, AtomicCell, SeededFold>);

impl Candidate for PapayaAtomic {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let map = self.0.pin();
        let key = Digest::new(key);
        if let Some(cell) = map.get(&key) {
            return gcra_atomic(cell, now);
        }
        gcra_atomic(map.get_or_insert_with(key, AtomicCell::default), now)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// scc's `HashMap`: `update_sync` (the bucket's write lock) in place, `entry_sync` to insert.
struct Scc(scc::HashMap<Digest, Cell, SeededFold>);

impl Candidate for Scc {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let key = Digest::new(key);
        if let Some(allowed) = self.0.update_sync(&key, |_, cell| gcra(cell, now)) {
            return allowed;
        }
        gcra(self.0.entry_sync(key).or_default().get_mut(), now)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

type QuickCache = Cache<Digest, Cell, UnitWeighter, SeededFold, DefaultLifecycle<Digest, Cell>>;

/// quick_cache (a bounded cache, CLOCK-Pro-like eviction): `entry` mutates in place under the
/// shard's write lock, a vacant key is inserted through the placeholder guard it returns.
struct Quick(QuickCache);

impl Quick {
    fn new() -> Self {
        // Room for every key: a cache at exactly its bound would evict on this walk.
        let items = MANY_KEYS + MANY_KEYS / 10;
        Self(Cache::with(
            items,
            items as u64,
            UnitWeighter,
            SeededFold::new(),
            DefaultLifecycle::default(),
        ))
    }
}

impl Candidate for Quick {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let key = Digest::new(key);
        match self
            .0
            .entry(&key, None, |_, cell| EntryAction::Retain(gcra(cell, now)))
        {
            EntryResult::Retained(allowed) => allowed,
            EntryResult::Vacant(guard) => {
                let mut cell = Cell::default();
                let allowed = gcra(&mut cell, now);
                allowed && guard.insert(cell).is_ok()
            }
            EntryResult::Removed(..) | EntryResult::Replaced(..) | EntryResult::Timeout => false,
        }
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Picks a shard the way the store does: bits 16..48 of the hash, multiply-shift.
fn shard_of(hasher: &SeededFold, key: &Digest, shards: usize) -> usize {
    let h = u64::from((hasher.hash_one(key) >> 16) as u32);
    ((h * shards as u64) >> 32) as usize
}

/// The store's layout, minimal: [`STORE_SHARDS`] std (hashbrown) maps behind
/// `parking_lot::Mutex`, the cell inline; no ring, no budget, no eviction.
struct ShardedMutex {
    shards: Box<[Mutex<std::collections::HashMap<Digest, Cell, SeededFold>>]>,
    hasher: SeededFold,
}

impl ShardedMutex {
    fn new() -> Self {
        let hasher = SeededFold::new();
        let shards = (0..STORE_SHARDS)
            .map(|_| Mutex::new(std::collections::HashMap::with_hasher(hasher)))
            .collect();
        Self { shards, hasher }
    }
}

impl Candidate for ShardedMutex {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let key = Digest::new(key);
        let mut shard = self.shards[shard_of(&self.hasher, &key, self.shards.len())].lock();
        gcra(shard.entry(key).or_default(), now)
    }
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// The store's shards behind `parking_lot::RwLock` with atomic cells: an existing key needs
/// only the read lock and a CAS (two threads on one shard do not wait for each other).
struct ShardedRwAtomic {
    shards: Box<[RwLock<std::collections::HashMap<Digest, AtomicCell, SeededFold>>]>,
    hasher: SeededFold,
}

impl ShardedRwAtomic {
    fn new() -> Self {
        let hasher = SeededFold::new();
        let shards = (0..STORE_SHARDS)
            .map(|_| RwLock::new(std::collections::HashMap::with_hasher(hasher)))
            .collect();
        Self { shards, hasher }
    }
}

impl Candidate for ShardedRwAtomic {
    fn check(&self, key: &[u8; 32], clock: &NsClock) -> bool {
        let now = clock.now_ns();
        let key = Digest::new(key);
        let shard = &self.shards[shard_of(&self.hasher, &key, self.shards.len())];
        if let Some(cell) = shard.read().get(&key) {
            return gcra_atomic(cell, now);
        }
        gcra_atomic(shard.write().entry(key).or_default(), now)
    }
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }
}

/// The candidates' names, in table order; governor first (the reference).
const NAMES: [&str; 9] = [
    "governor_keyed",
    "dashmap_entry",
    "dashmap_atomic",
    "papaya_compute",
    "papaya_atomic",
    "scc_update",
    "quick_cache_entry",
    "sharded_mutex",
    "sharded_rw_atomic",
];

/// A new, empty candidate. No map is pre-sized (the store is not either): they grow while
/// they are filled, so memory reflects each map's own growth policy.
fn candidate(name: &str) -> Box<dyn Candidate> {
    match name {
        "governor_keyed" => {
            let rate = NonZeroU32::new(RATE_PER_S).expect("non-zero");
            let burst = NonZeroU32::new(BURST).expect("non-zero");
            Box::new(Governor(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            )))
        }
        "dashmap_entry" => Box::new(DashEntry(DashMap::with_hasher(SeededFold::new()))),
        "dashmap_atomic" => Box::new(DashAtomic(DashMap::with_hasher(SeededFold::new()))),
        "papaya_compute" => Box::new(PapayaCompute(papaya_map())),
        "papaya_atomic" => Box::new(PapayaAtomic(papaya_map())),
        "scc_update" => Box::new(Scc(scc::HashMap::with_hasher(SeededFold::new()))),
        "quick_cache_entry" => Box::new(Quick::new()),
        "sharded_mutex" => Box::new(ShardedMutex::new()),
        "sharded_rw_atomic" => Box::new(ShardedRwAtomic::new()),
        other => unreachable!("no candidate {other}"),
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// One thread's share of a pass: `calls` checks walking `keys` from `i`, each timed into `h`
/// when `TIMED`. Returns the number of allows.
fn walk<const TIMED: bool>(
    c: &dyn Candidate,
    clock: &NsClock,
    keys: &[[u8; 32]],
    mut i: usize,
    calls: u64,
    h: &mut Histogram<u64>,
) -> u64 {
    let mut allowed = 0;
    for _ in 0..calls {
        if TIMED {
            let t0 = Instant::now();
            allowed += u64::from(black_box(c.check(&keys[i], clock)));
            h.saturating_record((t0.elapsed().as_nanos() as u64).max(1));
        } else {
            allowed += u64::from(black_box(c.check(&keys[i], clock)));
        }
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

/// One pass of `calls` checks per thread on `threads` threads (thread `t` starts `t/threads`
/// of the way into the keys, shifted by `offset`). Returns decisions/s from a common start to
/// the last thread's end, the denials, and the merged histogram when `timed`.
///
/// Denials are expected to be 0, but are counted rather than asserted: a thread that reads
/// the clock and is then descheduled for more than the 1 ms tolerance (2 shared cores) comes
/// back with a stale `now` behind an arrival time the other thread has advanced, and is
/// denied. Governor reads its clock outside the CAS loop too.
fn pass(
    c: &dyn Candidate,
    clock: &NsClock,
    keys: &[[u8; 32]],
    threads: usize,
    offset: usize,
    timed: bool,
) -> (f64, u64, Histogram<u64>) {
    let barrier = Barrier::new(threads + 1);
    let (elapsed, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut h = new_histogram();
                    let i = (t * keys.len() / threads + offset) % keys.len();
                    barrier.wait();
                    let allowed = if timed {
                        walk::<true>(c, clock, keys, i, CALLS_PER_ROUND, &mut h)
                    } else {
                        walk::<false>(c, clock, keys, i, CALLS_PER_ROUND, &mut h)
                    };
                    barrier.wait();
                    (allowed, h)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        let elapsed = start.elapsed().as_secs_f64();
        let results: Vec<(u64, Histogram<u64>)> = handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread"))
            .collect();
        (elapsed, results)
    });
    let mut merged = new_histogram();
    let mut allowed = 0;
    for (a, h) in &results {
        allowed += a;
        merged.add(h).expect("same bounds");
    }
    let calls = CALLS_PER_ROUND * threads as u64;
    (calls as f64 / elapsed, calls - allowed, merged)
}

/// `1234567.8` as `1,234,568`.
fn thousands(v: f64) -> String {
    let digits = format!("{v:.0}");
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The cost of the per-call timer itself: an empty `Instant::now()` / `elapsed()` pair.
fn timer_cost() -> (u64, u64) {
    let mut h = new_histogram();
    for _ in 0..1_000_000 {
        let t0 = Instant::now();
        h.saturating_record((black_box(t0).elapsed().as_nanos() as u64).max(1));
    }
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
}

/// A fixed permutation of `0..n` (Fisher-Yates on a xorshift stream).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// Every candidate filled with every key (in the keys' order, or in a shuffled one), in table
/// order.
fn filled(keys: &[[u8; 32]], shuffle: bool, clock: &NsClock) -> Vec<Box<dyn Candidate>> {
    let order = if shuffle {
        shuffled(keys.len())
    } else {
        (0..keys.len()).collect()
    };
    NAMES
        .iter()
        .map(|name| {
            let c = candidate(name);
            for &i in &order {
                black_box(c.check(&keys[i], clock));
            }
            assert_eq!(c.len(), keys.len(), "{name} holds every key");
            c
        })
        .collect()
}

/// The throughput and latency table of one key set: the candidates take turns, round by
/// round, on 1 and then 2 threads. `shuffle` fills the maps in another order than the walk.
fn scenario(label: &str, keys: &[[u8; 32]], shuffle: bool, clock: &NsClock) {
    let started = Instant::now();
    let candidates = filled(keys, shuffle, clock);
    eprintln!(
        "{label}: filled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for threads in [1usize, 2] {
        let n = candidates.len();
        let mut rates = vec![Vec::new(); n];
        let mut denied = vec![0u64; n];
        let mut hists: Vec<Histogram<u64>> = (0..n).map(|_| new_histogram()).collect();
        for round in 0..ROUNDS {
            for (j, c) in candidates.iter().enumerate() {
                // Each round starts elsewhere in the keys; the timed pass follows the untimed.
                let offset = round * 2 * CALLS_PER_ROUND as usize;
                let (rate, d, _) = pass(c.as_ref(), clock, keys, threads, offset, false);
                rates[j].push(rate);
                denied[j] += d;
                let offset = offset + CALLS_PER_ROUND as usize;
                let (_, d, h) = pass(c.as_ref(), clock, keys, threads, offset, true);
                hists[j].add(&h).expect("same bounds");
                denied[j] += d;
            }
        }
        let medians: Vec<f64> = rates.into_iter().map(median).collect();
        println!();
        println!("{label}, {threads} thread(s):");
        println!();
        println!(
            "| candidate | decisions/s (median of {ROUNDS}) | vs governor | p50 ns | p99 ns | denied |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for (j, name) in NAMES.iter().enumerate() {
            println!(
                "| {name} | {} | {:.2} | {} | {} | {} |",
                thousands(medians[j]),
                medians[j] / medians[0],
                hists[j].value_at_quantile(0.50),
                hists[j].value_at_quantile(0.99),
                denied[j],
            );
        }
    }
    let dropping = Instant::now();
    drop(candidates);
    eprintln!(
        "{label}: dropped in {:.1} s",
        dropping.elapsed().as_secs_f64()
    );
}

/// Resident set size of this process in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// In a child process: the RSS growth of filling one candidate with `MANY_KEYS` keys, per key.
fn memory_child(name: &str) {
    let keys = keys(MANY_KEYS);
    let clock = NsClock::new();
    let before = rss_bytes();
    let c = candidate(name);
    for k in &keys {
        black_box(c.check(k, &clock));
    }
    let after = rss_bytes();
    println!(
        "{name} {} {:.1}",
        c.len(),
        after.saturating_sub(before) as f64 / MANY_KEYS as f64
    );
}

fn memory_table() {
    println!();
    println!("Memory at {MANY_KEYS} keys (RSS growth of a fresh child process / keys):");
    println!();
    println!("| candidate | keys held | bytes per key |");
    println!("| --- | ---: | ---: |");
    for name in NAMES {
        let out = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .env(MEMORY_CHILD_ENV, name)
                .output()
        });
        match out {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout);
                let mut f = text.split_whitespace().skip(1);
                let (held, bytes) = (f.next(), f.next());
                println!(
                    "| {name} | {} | {} |",
                    held.unwrap_or("?"),
                    bytes.unwrap_or("?")
                );
            }
            Err(e) => println!("| {name} | cannot run the memory child: {e} | |"),
        }
    }
}

fn main() {
    if let Ok(name) = std::env::var(MEMORY_CHILD_ENV) {
        memory_child(&name);
        return;
    }
    // `cargo bench` passes `--bench`; any other argument is a filter this bench has none of.
    let clock = NsClock::new();
    let (timer_p50, timer_p99) = timer_cost();
    println!(
        "Keyed GCRA check per call, {ROUNDS} rounds, candidates taking turns; decisions/s from \
         {CALLS_PER_ROUND} untimed calls per thread per round (median round), p50/p99 from as \
         many calls each timed with Instant (the timer alone: p50 {timer_p50} ns, p99 \
         {timer_p99} ns)."
    );
    scenario("1 hot key", &keys(1), false, &clock);
    let many = keys(MANY_KEYS);
    scenario("1,000,000 keys", &many, false, &clock);
    scenario(
        "1,000,000 keys, filled in shuffled order",
        &many,
        true,
        &clock,
    );
    memory_table();
}
