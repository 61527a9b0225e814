//! The exact local denial cache: a repeated denial answered without a program call.
//!
//! An entry remembers what one denial proved ([`DenialBound`]): for one (policy, revision,
//! subject digest), no cost `>= cost` is admitted until `retry_after` after the denial's
//! server time, whatever other instances do. It is timed on this process's monotonic clock
//! from `sent`, a moment taken before the program call was written (so never later than the
//! server's reading), and ends [`margin_ms`] early: 1 ms because the programs read Redis
//! `TIME` truncated to the millisecond, plus 1/1000 of `retry_after` for the rates of the two
//! clocks drifting apart (NTP slews a clock by at most 500 ppm). An entry therefore never
//! outlives the denial it stands for, and every answer is one the shared state would give.
//!
//! Bounded: at most `max_entries` entries in [`SHARDS`] shards, each an array of sets of
//! [`WAYS`] slots allocated at its first insert and never grown. A full set evicts its entry
//! that ends first (counted). A lookup hashes the key, locks one shard and compares at most
//! [`WAYS`] slots: no allocation, no global lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge};
use shared_contract::model::DenialBound;
use shared_contract::{
    Cost, MultiDecision, PolicyId, PolicyRevision, RateLimitDecision, RateLimitPolicy, Source,
    SubjectDigest,
};

/// Metric names, as `/metrics` shows them (hits are
/// `rate_limit_decisions_by_source_total{source="local_cache"}`).
pub mod names {
    /// Gauge: entries held, at most `deny_cache_max_entries`.
    pub const ENTRIES: &str = "rate_limit_deny_cache_entries";
    /// Live entries evicted from a full set to make room for another key.
    pub const EVICTIONS: &str = "rate_limit_deny_cache_evictions_total";
}

/// Shards, each behind its own lock.
pub const SHARDS: usize = 64;
/// Slots per set: a key lives in one set, so a lookup compares at most this many keys.
pub const WAYS: usize = 8;
/// The largest `deny_cache_max_entries` accepted (about 1.3 GB of entries).
pub const MAX_ENTRIES: usize = 10_000_000;

/// How much earlier than `retry_after` an entry ends (see the module docs).
pub fn margin_ms(retry_after_ms: u64) -> u64 {
    1 + retry_after_ms.div_ceil(1000)
}

/// One remembered denial.
#[derive(Debug)]
struct Entry {
    policy: PolicyId,
    revision: PolicyRevision,
    subject: SubjectDigest,
    /// When the bound stops holding, on the monotonic clock, margin included.
    ends: Instant,
    bound: DenialBound,
}

impl Entry {
    fn is(&self, policy: &PolicyId, revision: PolicyRevision, subject: &SubjectDigest) -> bool {
        self.revision == revision && self.subject == *subject && self.policy == *policy
    }
}

#[derive(Debug, Default)]
struct Shard {
    /// `sets * WAYS` slots once the shard is first written; empty before.
    slots: Vec<Option<Entry>>,
}

/// What [`DenyCache::record`] did, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A new entry, in a free slot.
    Added,
    /// A new entry in place of a live one of another key (the set was full).
    Evicted,
    /// The key's entry was replaced or kept, whichever covers more.
    Merged,
    /// Nothing to keep: the bound ends before its margin, or already ended.
    Skipped,
}

/// The exact denial cache of one provider and the providers a reload makes from it.
#[derive(Debug)]
pub struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    ways: usize,
    /// Sets in all shards; set `i` lives in shard `i % SHARDS`.
    sets: usize,
    entries: AtomicUsize,
    evictions: AtomicU64,
    /// [`names::ENTRIES`], set after each write; [`names::EVICTIONS`].
    entries_gauge: Gauge,
    evictions_counter: Counter,
}

impl DenyCache {
    /// A cache of at most `max_entries` entries (rounded down to whole sets; at least one).
    pub fn new(max_entries: usize) -> Self {
        let max_entries = max_entries.clamp(1, MAX_ENTRIES);
        let ways = WAYS.min(max_entries);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            ways,
            sets: max_entries / ways,
            entries: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            entries_gauge: metrics::gauge!(names::ENTRIES),
            evictions_counter: metrics::counter!(names::EVICTIONS),
        }
    }

    /// Entries it can hold at once.
    pub fn capacity(&self) -> usize {
        self.sets * self.ways
    }

    /// Slots holding an entry (an ended entry is cleared when its set is next touched).
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether no slot holds an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live entries evicted to make room for another key, since the start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The denial the cache answers for `cost` of `subject` under `policy` at `now`, if an
    /// entry of the policy's revision covers it: `source = local_cache`, `retry_after` the
    /// entry's remaining whole milliseconds.
    pub fn lookup(
        &self,
        policy: &RateLimitPolicy,
        subject: &SubjectDigest,
        cost: Cost,
        now: Instant,
    ) -> Option<RateLimitDecision> {
        let (id, revision) = (policy.id(), policy.revision());
        let (mut shard, range) = self.set(id, revision, subject);
        let slots = shard.slots.get_mut(range)?;
        let slot = slots
            .iter_mut()
            .find(|s| s.as_ref().is_some_and(|e| e.is(id, revision, subject)))?;
        let entry = slot.as_ref()?;
        let left = whole_ms(entry.ends, now);
        if left == 0 {
            *slot = None;
            self.entries.fetch_sub(1, Ordering::Relaxed);
            drop(shard);
            self.publish();
            return None;
        }
        // `left <= retry_after - margin`, so the elapsed time given is at least the margin.
        let elapsed = entry.bound.retry_after_ms.saturating_sub(left);
        entry
            .bound
            .answer(policy, elapsed, cost, Source::LocalCache)
    }

    /// The answer to a multi-limit evaluation of `members` when a member's denial is cached
    /// (members whose policy `cached` refuses are not looked up): the whole evaluation is
    /// denied, nothing is charged. A member without a covering entry did not decide it and
    /// is reported `allowed: true` with its limit and unknown figures (`remaining`,
    /// `reset_at_ms` 0). A miss allocates nothing.
    pub fn lookup_all<'a>(
        &self,
        members: impl Iterator<Item = (&'a RateLimitPolicy, &'a SubjectDigest, Cost)> + Clone,
        cached: impl Fn(&RateLimitPolicy) -> bool,
        now: Instant,
    ) -> Option<MultiDecision> {
        let look = |(p, s, c): (&RateLimitPolicy, &SubjectDigest, Cost)| {
            cached(p).then(|| self.lookup(p, s, c, now)).flatten()
        };
        let (first, hit) = members
            .clone()
            .enumerate()
            .find_map(|(i, m)| look(m).map(|d| (i, d)))?;
        let mut hit = Some(hit);
        let decisions = members
            .enumerate()
            .map(|(i, m)| match i {
                // Already looked up: the members before it missed, it hit.
                _ if i == first => hit.take().unwrap_or_else(|| undecided(m.0)),
                _ if i < first => undecided(m.0),
                _ => look(m).unwrap_or_else(|| undecided(m.0)),
            })
            .collect();
        Some(MultiDecision {
            allowed: false,
            decisions,
            replayed: false,
        })
    }

    /// Remembers `bound`, proved by a denial of `policy` for `subject` whose call was written
    /// after `sent`; `now` is when its reply arrived. A key keeps one entry: the one of the
    /// smaller cost, or of the same cost that ends later; an ended entry is always replaced.
    pub fn record(
        &self,
        policy: &RateLimitPolicy,
        subject: &SubjectDigest,
        bound: DenialBound,
        sent: Instant,
        now: Instant,
    ) -> Recorded {
        let lasts = bound
            .retry_after_ms
            .saturating_sub(margin_ms(bound.retry_after_ms));
        let ends = sent + Duration::from_millis(lasts);
        if lasts == 0 || ends <= now {
            return Recorded::Skipped;
        }
        let entry = Entry {
            policy: policy.id().clone(),
            revision: policy.revision(),
            subject: *subject,
            ends,
            bound,
        };
        let recorded = self.insert(entry, now);
        if recorded == Recorded::Evicted {
            self.evictions_counter.increment(1);
        }
        // Ended entries of the set were cleared as well.
        self.publish();
        recorded
    }

    /// Puts `entry` in its set (see [`Self::record`]).
    fn insert(&self, entry: Entry, now: Instant) -> Recorded {
        let subject = &entry.subject;
        let (mut shard, range) = self.set(&entry.policy, entry.revision, subject);
        if shard.slots.is_empty() {
            // Allocated once, at the shard's first entry: all of its sets.
            let index = self.shard_of(&entry.policy, entry.revision, subject);
            let sets_here = self.sets / SHARDS + usize::from(index < self.sets % SHARDS);
            shard.slots.resize_with(sets_here * self.ways, || None);
        }
        let slots = &mut shard.slots[range];
        // Clear what has ended, so that the set's free slots and the count stay true.
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|e| e.ends <= now) {
                *slot = None;
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if let Some(slot) = slots.iter_mut().find(|s| {
            s.as_ref()
                .is_some_and(|e| e.is(&entry.policy, entry.revision, subject))
        }) {
            let old = slot.as_ref().map(|e| (e.bound.cost, e.ends));
            if old.is_some_and(|(cost, ends)| {
                entry.bound.cost < cost || (entry.bound.cost == cost && entry.ends > ends)
            }) {
                *slot = Some(entry);
            }
            return Recorded::Merged;
        }
        if let Some(free) = slots.iter_mut().find(|s| s.is_none()) {
            *free = Some(entry);
            self.entries.fetch_add(1, Ordering::Relaxed);
            return Recorded::Added;
        }
        let victim = slots
            .iter_mut()
            .min_by_key(|s| s.as_ref().map(|e| e.ends))
            .expect("a set has at least one slot");
        *victim = Some(entry);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        Recorded::Evicted
    }

    /// Sets the entries gauge to the count now.
    fn publish(&self) {
        #[allow(clippy::cast_precision_loss)] // at most MAX_ENTRIES, exact in an f64
        self.entries_gauge.set(self.len() as f64);
    }

    /// Drops the entry of `policy` for `subject`, if any: a refund (a reservation settled
    /// below its estimate, or cancelled) freed what its denial proved was used.
    pub fn forget(&self, policy: &RateLimitPolicy, subject: &SubjectDigest) {
        let (id, revision) = (policy.id(), policy.revision());
        let (mut shard, range) = self.set(id, revision, subject);
        if shard.slots.is_empty() {
            return;
        }
        for slot in &mut shard.slots[range] {
            if slot.as_ref().is_some_and(|e| e.is(id, revision, subject)) {
                *slot = None;
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(shard);
        self.publish();
    }

    /// Drops every entry whose policy and revision `keep` refuses (a reload that removed a
    /// policy, changed its revision or stopped caching it).
    pub fn retain(&self, keep: impl Fn(&PolicyId, PolicyRevision) -> bool) {
        for shard in &*self.shards {
            let mut shard = lock(shard);
            for slot in &mut shard.slots {
                if slot.as_ref().is_some_and(|e| !keep(&e.policy, e.revision)) {
                    *slot = None;
                    self.entries.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        self.publish();
    }

    /// The key's set, among all shards' sets.
    fn set_of(
        &self,
        policy: &PolicyId,
        revision: PolicyRevision,
        subject: &SubjectDigest,
    ) -> usize {
        // The remainder is below `sets`, a usize.
        (hash(policy, revision, subject) % self.sets as u64) as usize
    }

    /// The shard that holds the key's set.
    fn shard_of(
        &self,
        policy: &PolicyId,
        revision: PolicyRevision,
        subject: &SubjectDigest,
    ) -> usize {
        self.set_of(policy, revision, subject) % SHARDS
    }

    /// The locked shard of the key's set and the set's slots in it.
    fn set(
        &self,
        policy: &PolicyId,
        revision: PolicyRevision,
        subject: &SubjectDigest,
    ) -> (MutexGuard<'_, Shard>, std::ops::Range<usize>) {
        let set = self.set_of(policy, revision, subject);
        let shard = lock(&self.shards[set % SHARDS]);
        let start = set / SHARDS * self.ways;
        (shard, start..start + self.ways)
    }
}

/// A member of a multi-limit evaluation another member's cached denial decided.
fn undecided(policy: &RateLimitPolicy) -> RateLimitDecision {
    RateLimitDecision {
        allowed: true,
        limit: policy.algorithm().limit(),
        remaining: 0,
        retry_after_ms: 0,
        reset_at_ms: 0,
        policy_id: policy.id().clone(),
        revision: policy.revision(),
        source: Source::LocalCache,
        certainty: policy.kind().certainty(),
        fleet: None,
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a slot half-written (each is one store).
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whole milliseconds from `now` until `ends` (0 once it has passed).
fn whole_ms(ends: Instant, now: Instant) -> u64 {
    u64::try_from(ends.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
}

/// The key's set: the subject digest is already a keyed hash (its secret is the service's),
/// so its first bytes spread keys evenly and cannot be aimed at one set; the policy and
/// revision are mixed in (FNV-1a) so that one subject's policies spread too.
fn hash(policy: &PolicyId, revision: PolicyRevision, subject: &SubjectDigest) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in policy.as_str().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= u64::from(revision.get()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut first = [0u8; 8];
    first.copy_from_slice(&subject.as_bytes()[..8]);
    h ^ u64::from_le_bytes(first)
}

#[cfg(test)]
mod tests;
