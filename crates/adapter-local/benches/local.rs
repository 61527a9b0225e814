//! Throughput, latency and memory of the local provider, side by side with governor's keyed
//! limiter on the same keys (32-byte subject digests).
//!
//! Three parts, all in one run of `cargo bench -p adapter-local`:
//! 1. criterion throughput groups: one hot key and 1,000,000 keys, on 1 and 2 threads, for the
//!    provider's sync path (`evaluate_now`), the async port (its future polled once: the
//!    provider never waits), `governor::DefaultKeyedRateLimiter::check_key`, and the design
//!    this crate replaced (the same model under moka's `and_compute_with`);
//! 2. a latency table: every single call timed with `Instant`, p50/p99/p99.9 from a histogram;
//! 3. bytes per key at 1,000,000 keys: the RSS growth of a child process that inserts them
//!    (a child per limiter, so memory freed by one cannot be reused by the other).
//!
//! Both limiters run GCRA with a rate high enough that every decision is an allow: the allow
//! path is the one that writes, so it is the expensive one for both.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use adapter_local::{LocalProvider, LocalSettings};
use criterion::{BenchmarkId, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use hdrhistogram::Histogram;
use moka::ops::compute::Op;
use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::{
    AlgorithmSpec, Clock, Cost, Deadline, EdgeRateLimitPort, FailurePolicy, PolicyId,
    PolicyRevision, PolicySet, PolicySpec, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    SubjectDigest, SystemClock,
};

const MANY_KEYS: usize = 1_000_000;
const MEMORY_CHILD_ENV: &str = "ADAPTER_LOCAL_BENCH_MEMORY";

/// 1e9 per second with a burst of 1e6: never denies at the rates reached here.
const RATE_PER_S: u32 = 1_000_000_000;
const BURST: u32 = 1_000_000;

fn keys(n: usize) -> Vec<[u8; 32]> {
    // A splitmix64 stream: distinct, well spread, the same on every run.
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

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("bench").expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::Gcra {
            limit: u64::from(RATE_PER_S),
            period: Duration::from_secs(1),
            burst: u64::from(BURST),
        },
        max_cost: 1,
        cleanup_grace: Duration::from_secs(60),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy")
}

fn local(max_keys: u64) -> LocalProvider {
    let p = policy();
    let id = p.id().clone();
    LocalProvider::new(
        PolicySet::new([p], id).expect("valid set"),
        Arc::new(SystemClock),
        LocalSettings { max_keys },
    )
}

fn governor() -> DefaultKeyedRateLimiter<[u8; 32]> {
    let rate = NonZeroU32::new(RATE_PER_S).expect("non-zero");
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
}

fn request(subject: [u8; 32]) -> RateLimitRequest {
    RateLimitRequest {
        policy_id: PolicyId::new("bench").expect("valid id"),
        subject: SubjectDigest::from_bytes(subject),
        cost: Cost::ONE,
        evaluation_id: None,
        deadline: Deadline::within(Duration::from_secs(10)).expect("valid deadline"),
    }
}

/// One limiter under test, called with a key.
trait Limiter: Sync {
    fn call(&self, key: &[u8; 32], template: &mut RateLimitRequest) -> bool;
}

/// The provider's sync path: the same code the port runs, without the boxed future.
struct LocalSync(LocalProvider);
/// The async port, its boxed future polled once with a no-op waker.
struct LocalPort(LocalProvider);
struct Governor(DefaultKeyedRateLimiter<[u8; 32]>);
/// The first design: the model under moka's per-key `and_compute_with`, expiring after the
/// policy's state lifetime.
struct MokaCompute {
    policy: RateLimitPolicy,
    cache: moka::sync::Cache<[u8; 32], AlgorithmState>,
}

impl MokaCompute {
    fn new(max_keys: u64) -> Self {
        let policy = policy();
        let ttl = Duration::from_millis(policy.state_lifetime_ms());
        Self {
            policy,
            cache: moka::sync::Cache::builder()
                .max_capacity(max_keys)
                .time_to_live(ttl)
                .build(),
        }
    }
}

impl Limiter for MokaCompute {
    fn call(&self, key: &[u8; 32], _template: &mut RateLimitRequest) -> bool {
        let mut allowed = false;
        self.cache.entry(*key).and_compute_with(|entry| {
            let state = entry.as_ref().map(|e| e.value());
            match model::evaluate(&self.policy, state, SystemClock.now_ms(), Cost::ONE) {
                Ok(mut evaluation) => {
                    allowed = evaluation.verdict == Verdict::Allowed;
                    match evaluation.new_state.take() {
                        Some(state) => Op::Put(state),
                        None => Op::Nop,
                    }
                }
                Err(_) => Op::Nop,
            }
        });
        allowed
    }
}

fn allowed(outcome: &RateLimitOutcome) -> bool {
    matches!(outcome, RateLimitOutcome::Evaluated(d) if d.allowed)
}

impl Limiter for LocalSync {
    fn call(&self, key: &[u8; 32], template: &mut RateLimitRequest) -> bool {
        template.subject = SubjectDigest::from_bytes(*key);
        matches!(self.0.evaluate_now(template), Ok(ref o) if allowed(o))
    }
}

impl Limiter for LocalPort {
    fn call(&self, key: &[u8; 32], template: &mut RateLimitRequest) -> bool {
        // What a caller of the port pays: a request by value (the policy id is cloned) and
        // the boxed future of `async_trait`.
        let mut r = template.clone();
        r.subject = SubjectDigest::from_bytes(*key);
        let mut future = pin!(self.0.evaluate(r));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(ref o)) => allowed(o),
            Poll::Ready(Err(_)) | Poll::Pending => false,
        }
    }
}

impl Limiter for Governor {
    fn call(&self, key: &[u8; 32], _template: &mut RateLimitRequest) -> bool {
        self.0.check_key(key).is_ok()
    }
}

/// Calls `limiter` `iters` times on `threads` threads (split evenly), walking `keys` from a
/// different offset per thread; returns the wall time from a common start.
fn run(limiter: &dyn Limiter, keys: &[[u8; 32]], threads: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(threads + 1);
    let per_thread = iters / threads as u64;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let barrier = &barrier;
            scope.spawn(move || {
                let mut template = request(keys[0]);
                let mut i = (t * keys.len() / threads) % keys.len();
                barrier.wait();
                for _ in 0..per_thread {
                    black_box(limiter.call(&keys[i], &mut template));
                    i += 1;
                    if i == keys.len() {
                        i = 0;
                    }
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

/// Every key called once, so the many-keys runs measure a full map, not its filling.
fn prefill(limiter: &dyn Limiter, keys: &[[u8; 32]]) {
    let mut template = request(keys[0]);
    for k in keys {
        black_box(limiter.call(k, &mut template));
    }
}

struct Scenario {
    name: &'static str,
    keys: Vec<[u8; 32]>,
    limiters: Vec<(&'static str, Box<dyn Limiter>)>,
}

fn scenarios() -> Vec<Scenario> {
    let hot = keys(1);
    let many = keys(MANY_KEYS);
    let build = |keys: &[[u8; 32]]| -> Vec<(&'static str, Box<dyn Limiter>)> {
        let limiters: Vec<(&'static str, Box<dyn Limiter>)> = vec![
            (
                "local_sync",
                Box::new(LocalSync(local(LocalSettings::default().max_keys))),
            ),
            (
                "local_port",
                Box::new(LocalPort(local(LocalSettings::default().max_keys))),
            ),
            ("governor_keyed", Box::new(Governor(governor()))),
            (
                "moka_compute",
                Box::new(MokaCompute::new(LocalSettings::default().max_keys)),
            ),
        ];
        for (_, l) in &limiters {
            prefill(l.as_ref(), keys);
        }
        limiters
    };
    vec![
        Scenario {
            name: "hot_key",
            limiters: build(&hot),
            keys: hot,
        },
        Scenario {
            name: "1m_keys",
            limiters: build(&many),
            keys: many,
        },
    ]
}

fn throughput(c: &mut Criterion, scenarios: &[Scenario]) {
    for s in scenarios {
        for threads in [1usize, 2] {
            let mut group = c.benchmark_group(format!("{}/{}_thread", s.name, threads));
            group.throughput(Throughput::Elements(1));
            for (name, limiter) in &s.limiters {
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| run(limiter.as_ref(), &s.keys, threads, iters.max(2)))
                });
            }
            group.finish();
        }
    }
}

/// Times `calls` single calls on `threads` threads into `into`; returns decisions/s.
fn timed_calls(
    limiter: &dyn Limiter,
    keys: &[[u8; 32]],
    threads: usize,
    calls: u64,
    round: usize,
    into: &mut Histogram<u64>,
) -> f64 {
    let per_thread = calls / threads as u64;
    let barrier = Barrier::new(threads);
    let started = Instant::now();
    let histograms: Vec<Histogram<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 100_000_000, 3)
                        .expect("valid histogram bounds");
                    let mut template = request(keys[0]);
                    // Each round and thread starts elsewhere in the keys.
                    let mut i = (t * keys.len() / threads + round * 7_919) % keys.len();
                    barrier.wait();
                    for _ in 0..per_thread {
                        let t0 = Instant::now();
                        black_box(limiter.call(&keys[i], &mut template));
                        let ns = t0.elapsed().as_nanos() as u64;
                        h.saturating_record(ns.max(1));
                        i += 1;
                        if i == keys.len() {
                            i = 0;
                        }
                    }
                    h
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    for h in &histograms {
        into.add(h).expect("same bounds");
    }
    (per_thread * threads as u64) as f64 / elapsed
}

/// Rounds per latency scenario. The limiters take turns round by round, so a change in the
/// machine's load (it is shared) hits all of them alike.
const ROUNDS: usize = 7;
const CALLS_PER_ROUND: u64 = 200_000;

fn latency_table(scenarios: &[Scenario]) {
    println!();
    println!(
        "Single calls, each timed with Instant (includes ~30-60 ns of timer cost); limiters take \
         turns over {ROUNDS} rounds of {CALLS_PER_ROUND} calls; decisions/s is the median round"
    );
    println!(
        "{:<10} {:>7} {:<16} {:>14} {:>11} {:>9} {:>9} {:>9}",
        "keys", "threads", "limiter", "decisions/s", "vs governor", "p50 ns", "p99 ns", "p99.9 ns"
    );
    for s in scenarios {
        for threads in [1usize, 2] {
            let n = s.limiters.len();
            let mut rates = vec![Vec::new(); n];
            let mut hists: Vec<Histogram<u64>> = (0..n)
                .map(|_| Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds"))
                .collect();
            for round in 0..ROUNDS {
                for (j, (_, limiter)) in s.limiters.iter().enumerate() {
                    // Moka is ~10x slower: fewer calls keep the run short.
                    let calls = if s.limiters[j].0 == "moka_compute" {
                        CALLS_PER_ROUND / 5
                    } else {
                        CALLS_PER_ROUND
                    };
                    let rate = timed_calls(
                        limiter.as_ref(),
                        &s.keys,
                        threads,
                        calls,
                        round,
                        &mut hists[j],
                    );
                    rates[j].push(rate);
                }
            }
            let medians: Vec<f64> = rates
                .iter_mut()
                .map(|r| {
                    r.sort_by(f64::total_cmp);
                    r[r.len() / 2]
                })
                .collect();
            let governor = s
                .limiters
                .iter()
                .position(|(name, _)| *name == "governor_keyed")
                .map_or(f64::NAN, |g| medians[g]);
            for (j, (name, _)) in s.limiters.iter().enumerate() {
                let h = &hists[j];
                println!(
                    "{:<10} {:>7} {:<16} {:>14.0} {:>10.2}x {:>9} {:>9} {:>9}",
                    s.name,
                    threads,
                    name,
                    medians[j],
                    medians[j] / governor,
                    h.value_at_quantile(0.50),
                    h.value_at_quantile(0.99),
                    h.value_at_quantile(0.999)
                );
            }
        }
    }
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

/// In a child process: the RSS growth of inserting `MANY_KEYS` keys, per key.
fn memory_child(which: &str) {
    let keys = keys(MANY_KEYS);
    let mut template = request(keys[0]);
    let before = rss_bytes();
    let (stored, after) = match which {
        "local" => {
            let l = LocalSync(local(LocalSettings::default().max_keys));
            for k in &keys {
                black_box(l.call(k, &mut template));
            }
            (l.0.stored_keys(), rss_bytes())
        }
        "moka" => {
            let m = MokaCompute::new(LocalSettings::default().max_keys);
            for k in &keys {
                black_box(m.call(k, &mut template));
            }
            m.cache.run_pending_tasks();
            (m.cache.entry_count(), rss_bytes())
        }
        _ => {
            let g = Governor(governor());
            for k in &keys {
                black_box(g.call(k, &mut template));
            }
            (g.0.len() as u64, rss_bytes())
        }
    };
    println!(
        "{which} {stored} {:.1}",
        (after.saturating_sub(before)) as f64 / MANY_KEYS as f64
    );
}

fn memory_table() {
    println!();
    println!("Memory at {MANY_KEYS} keys (RSS growth of a fresh child process / keys)");
    println!(
        "{:<16} {:>12} {:>14}",
        "limiter", "keys held", "bytes per key"
    );
    for which in ["local", "governor", "moka"] {
        let out = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .env(MEMORY_CHILD_ENV, which)
                .output()
        });
        match out {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout);
                let mut f = text.split_whitespace();
                let (_, held, bytes) = (f.next(), f.next(), f.next());
                println!(
                    "{:<16} {:>12} {:>14}",
                    which,
                    held.unwrap_or("?"),
                    bytes.unwrap_or("?")
                );
            }
            Err(e) => println!("{which}: cannot run the memory child: {e}"),
        }
    }
}

/// `ADAPTER_LOCAL_BENCH_PROFILE=hot|many[,governor][,2]`: only loop `local_sync` (or
/// governor's keyed limiter) for `ADAPTER_LOCAL_BENCH_SECS` (10) s, on one thread (or two):
/// for `perf`, and for quick comparisons that take turns (`bench/adapter-local/ab.sh`).
fn profile(which: &str) {
    let parts: Vec<&str> = which.split(',').collect();
    let keys = keys(if parts.contains(&"many") {
        MANY_KEYS
    } else {
        1
    });
    let threads = if parts.contains(&"2") { 2 } else { 1 };
    let l: Box<dyn Limiter> = if parts.contains(&"governor") {
        Box::new(Governor(governor()))
    } else {
        Box::new(LocalSync(local(LocalSettings::default().max_keys)))
    };
    prefill(l.as_ref(), &keys);
    let secs = std::env::var("ADAPTER_LOCAL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        run(l.as_ref(), &keys, threads, 200_000);
        n += 200_000;
    }
    println!(
        "{which}: {:.0} decisions/s",
        n as f64 / start.elapsed().as_secs_f64()
    );
}

fn main() {
    if let Ok(which) = std::env::var("ADAPTER_LOCAL_BENCH_PROFILE") {
        profile(&which);
        return;
    }
    if let Ok(which) = std::env::var(MEMORY_CHILD_ENV) {
        memory_child(&which);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();
    let scenarios = scenarios();
    throughput(&mut c, &scenarios);
    c.final_summary();
    latency_table(&scenarios);
    drop(scenarios);
    memory_table();
}
