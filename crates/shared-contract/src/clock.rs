//! Injected time. Providers that own their clock (the local provider) read it through
//! [`Clock`], so time-based behaviour is tested by advancing a [`ManualClock`], never by
//! sleeping. For Redis the invariant is different: the server's `TIME` is the clock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock, read through the CPU's time-stamp counter.
///
/// `SystemTime::now` costs about 45 ns on the benchmark machine, a quarter of a local
/// decision; the counter (`quanta`, calibrated against the OS monotonic clock once per
/// process, in under a millisecond) costs about 15 ns. The counter's time is anchored on the
/// OS wall clock and re-anchored every [`SystemClock::REANCHOR_MS`] milliseconds, so it stays
/// within microseconds of the OS clock (the calibration's drift over one interval) and follows
/// a step of the OS clock (NTP, an operator) within one interval. Where the CPU has no
/// invariant counter, `quanta` reads the OS monotonic clock instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// How often the counter's time is anchored again on the OS wall clock.
    pub const REANCHOR_MS: u64 = 100;
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        static WALL: OnceLock<CounterWall> = OnceLock::new();
        WALL.get_or_init(CounterWall::new).now_ms()
    }
}

/// The process's one counter clock and its last anchor on the OS wall clock.
struct CounterWall {
    counter: quanta::Clock,
    /// The counter's raw value at start; times are nanoseconds since it.
    base: u64,
    /// OS Unix nanoseconds minus counter nanoseconds, at the last anchor.
    offset_ns: AtomicI64,
    /// Counter nanoseconds at which to anchor again.
    next_anchor_ns: AtomicU64,
}

impl CounterWall {
    fn new() -> Self {
        let counter = quanta::Clock::new();
        let base = counter.raw();
        Self {
            counter,
            base,
            offset_ns: AtomicI64::new(0),
            // Anchored on the first read.
            next_anchor_ns: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        let since = self.counter.delta_as_nanos(self.base, self.counter.raw());
        let since_i = i64::try_from(since).unwrap_or(i64::MAX);
        // Threads racing here each store an anchor of their own read: all are within
        // nanoseconds of each other, and a reader seeing a new deadline with an older offset
        // is off by at most one interval's drift.
        if since >= self.next_anchor_ns.load(Ordering::Relaxed) {
            self.offset_ns
                .store(os_unix_ns().saturating_sub(since_i), Ordering::Relaxed);
            self.next_anchor_ns.store(
                since.saturating_add(SystemClock::REANCHOR_MS * 1_000_000),
                Ordering::Relaxed,
            );
        }
        let unix_ns = since_i.saturating_add(self.offset_ns.load(Ordering::Relaxed));
        // A clock before 1970 is a broken host; 0 then makes every model see a regression
        // beyond any threshold rather than a fresh window.
        u64::try_from(unix_ns).map_or(0, |ns| ns / 1_000_000)
    }
}

/// The OS wall clock in Unix nanoseconds; 0 before 1970.
fn os_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ms` (Unix ms) until set or advanced.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Sets the time to `ms` (Unix ms); it may go back, as a real clock can.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms` milliseconds.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// Across several anchors, every reading lies between the OS clock's readings just before
    /// and just after it (give or take the millisecond a floor can fall on either side).
    #[test]
    fn system_clock_follows_the_os_clock() {
        let start = std::time::Instant::now();
        let mut reads = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(3 * SystemClock::REANCHOR_MS) {
            let before = os_ms();
            let now = SystemClock.now_ms();
            let after = os_ms();
            assert!(
                before.saturating_sub(1) <= now && now <= after + 1,
                "{before} <= {now} <= {after}"
            );
            reads += 1;
        }
        assert!(reads > 1_000, "only {reads} reads");
    }

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(10);
        let b = a.clone();
        a.advance(5);
        assert_eq!(b.now_ms(), 15);
        b.set(3);
        assert_eq!(a.now_ms(), 3);
    }
}
