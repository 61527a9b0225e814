//! `rl-bench`: a load generator that drives [`EdgeRateLimitPort`] directly and reports
//! decisions per second and latency percentiles (p50, p99, p99.9) from an HDR histogram.
//!
//! ```text
//! rl-bench --provider redis|local|grpc [--redis-url URL] [--grpc-addr HOST:PORT] --algorithm NAME --keys N --concurrency C
//!          --duration 10s [--hot-key-share 0.0..1.0] [--json]
//!          [--topology standalone|sentinel|cluster] [--master-name NAME] [--connections N]
//!          [--min-replicas-ack N] [--policies 1..8] [--deny-cache on|off] [--limit N]
//!          [--batch-max 1..64]
//! ```
//!
//! With `--topology cluster`, `--redis-url` is a comma-separated list of seed nodes; with
//! `--topology sentinel`, of sentinels (and `--master-name` names the master).
//!
//! The key design decision: **rl-bench is a composition root, like `app-bootstrap`.** It
//! builds a provider itself (naming `adapter-redis` and `adapter-local` directly) instead of
//! going through the configuration layer, because its figure must be the provider's alone:
//! no HTTP, no figment, no middleware, no fallback decorator. Like `app-bootstrap` it sits at
//! the top of the dependency graph (nothing depends on it), so naming adapters here does not
//! bend the dependency direction of the libraries.
//!
//! Load: `concurrency` tasks, each issuing one evaluation at a time (closed loop) for
//! `duration`. Each request goes to the hot key (key 0) with probability `hot_key_share`,
//! otherwise to a key drawn uniformly from `0..keys`. Keys are subject digests made by hashing
//! the key number, so Redis sees the same key shapes production does.
//!
//! Policies (one per algorithm, cost 1): limit/capacity/burst 1000 per second (sliding log:
//! 100 per second, its state holds one entry per admitted request), or `--limit` per second.
//! With `--deny-cache on` they have `deny_cache` (the Redis provider's exact denial cache);
//! the report counts the decisions the cache answered (`local_cache`). A hot key is therefore
//! mostly denied, a spread of many keys mostly allowed; both are decisions. With
//! `--policies N` (N > 1) each decision is one multi-limit evaluation (`evaluate_all`) of N
//! such policies (`bench`, `bench-2`, ...) for the key's subject; a decision then counts
//! once however many limits it holds.
//!
//! The Redis provider runs with a 500 ms command timeout and an admission bound of
//! `max(1024, concurrency)`, so neither caps the figure; any outcome that is not a decision
//! (unavailable, indeterminate, incompatible, refused request) is counted in `errors`.
//! `bench/rl-bench/compare.sh` runs it side by side with `redis-benchmark` (docs/performance.md).
//! `--provider grpc` drives a running gRPC rate-limit service instead of a port ([`grpc`]).

pub mod grpc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use adapter_local::{LocalProvider, LocalSettings};
use adapter_redis::{RedisProvider, RedisSettings};
use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use sha2::{Digest as _, Sha256};
use shared_contract::{
    AlgorithmKind, AlgorithmSpec, Cost, Deadline, EdgeRateLimitPort, FailurePolicy, Limit, Limits,
    MultiOutcome, MultiRequest, PolicyId, PolicyRevision, PolicySet, PolicySpec, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, Readiness, Source, SubjectDigest,
    SystemClock,
};

/// Which provider to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    Redis,
    Local,
    /// A running gRPC rate-limit service at `--grpc-addr` ([`grpc`]).
    Grpc,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Redis => "redis",
            ProviderKind::Local => "local",
            ProviderKind::Grpc => "grpc",
        }
    }
}

/// The command line (shown in the crate docs; scripts in `bench/` call these flags).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "rl-bench",
    about = "Drive a rate-limit provider directly and report decisions/s and latency"
)]
pub struct Args {
    /// The provider to measure.
    #[arg(long, value_enum)]
    pub provider: ProviderKind,
    /// Redis server for `--provider redis`.
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,
    /// fixed_window | sliding_window | token_bucket | gcra | sliding_log
    #[arg(long, value_parser = parse_algorithm)]
    pub algorithm: AlgorithmKind,
    /// Distinct keys (subjects), >= 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Concurrent requests in flight, >= 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub concurrency: u64,
    /// How long to run (humantime: 10s, 500ms, 1m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Share of requests sent to one hot key, 0.0..=1.0.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub hot_key_share: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// standalone (default) | sentinel | cluster; the two last take a comma-separated
    /// `--redis-url` list (sentinels, or cluster seed nodes).
    #[arg(long, default_value = "standalone", value_parser = ["standalone", "sentinel", "cluster"])]
    pub topology: String,
    /// The master name the sentinels monitor (`--topology sentinel`).
    #[arg(long, default_value = "mymaster")]
    pub master_name: String,
    /// Multiplexed connections per master.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub connections: u64,
    /// Replicas that must acknowledge each decision's writes (`WAIT`); 0 is off.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub min_replicas_ack: u32,
    /// Limits per decision, 1..=8: above 1, each decision is one multi-limit evaluation
    /// (`evaluate_all`) of that many policies of `--algorithm` for one subject.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub policies: u64,
    /// The gRPC rate-limit service for `--provider grpc` (host:port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub grpc_addr: String,
    /// on | off (default): the policies' `deny_cache` (the Redis provider's exact denial
    /// cache; the local provider ignores it).
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    pub deny_cache: String,
    /// What each policy admits per second (default 1000; sliding log 100). A denial lasts
    /// until the quota is back: a lower rate makes denials longer, which the deny cache needs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub limit: Option<u64>,
    /// The Redis provider's `batch_max`: evaluations ready at the same moment for one node
    /// leave as one batch call of at most this many (1: one program call per decision).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub batch_max: u64,
}

impl Args {
    /// Whether `--deny-cache on`.
    pub fn deny_cache_on(&self) -> bool {
        self.deny_cache == "on"
    }
}

fn parse_algorithm(s: &str) -> Result<AlgorithmKind, String> {
    // The bench evaluates per request: a concurrency policy is acquired, never evaluated.
    AlgorithmKind::parse(s)
        .filter(|k| AlgorithmKind::RATE.contains(k))
        .ok_or_else(|| {
            let names: Vec<_> = AlgorithmKind::RATE.iter().map(|k| k.as_str()).collect();
            format!("unknown algorithm {s:?}; one of {}", names.join(", "))
        })
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("must be a number between 0.0 and 1.0, got {s:?}")),
    }
}

/// The algorithm `kind` admitting `limit` per `span`: a window of `limit` per `span`, a
/// token bucket of capacity `limit` refilled by `limit` per `span`, a GCRA of `limit` per
/// `span` with a burst of `limit`. `None` for an algorithm this function does not know.
pub fn spec_admitting(kind: AlgorithmKind, limit: u64, span: Duration) -> Option<AlgorithmSpec> {
    Some(match kind {
        AlgorithmKind::FixedWindow => AlgorithmSpec::FixedWindow {
            limit,
            window: span,
        },
        AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow {
            limit,
            window: span,
        },
        AlgorithmKind::TokenBucket => AlgorithmSpec::TokenBucket {
            capacity: limit,
            refill_amount: limit,
            refill_interval: span,
        },
        AlgorithmKind::Gcra => AlgorithmSpec::Gcra {
            limit,
            period: span,
            burst: limit,
        },
        AlgorithmKind::SlidingLog => AlgorithmSpec::SlidingLog {
            limit,
            window: span,
        },
        _ => return None,
    })
}

/// The policy measured for `kind`.
///
/// # Errors
/// Never for the built-in parameters; the `Result` carries the contract's validation.
pub fn bench_policy(kind: AlgorithmKind) -> anyhow::Result<RateLimitPolicy> {
    bench_policy_with_id(kind, "bench", None)
}

/// The `n` policies of a `--policies n` run: [`bench_policy`] (admitting `limit` per
/// second when given), then the same under the ids `bench-2`, `bench-3`, ...
///
/// # Errors
/// When the contract refuses the parameters.
pub fn bench_policies(
    kind: AlgorithmKind,
    n: u64,
    limit: Option<u64>,
) -> anyhow::Result<Vec<RateLimitPolicy>> {
    (1..=n)
        .map(|i| match i {
            1 => bench_policy_with_id(kind, "bench", limit),
            _ => bench_policy_with_id(kind, &format!("bench-{i}"), limit),
        })
        .collect()
}

fn bench_policy_with_id(
    kind: AlgorithmKind,
    id: &str,
    limit: Option<u64>,
) -> anyhow::Result<RateLimitPolicy> {
    // The sliding log's state holds one entry per admitted request: a smaller limit.
    let limit = limit.unwrap_or(if kind == AlgorithmKind::SlidingLog {
        100
    } else {
        1000
    });
    let Some(algorithm) = spec_admitting(kind, limit, Duration::from_secs(1)) else {
        bail!("rl-bench has no policy for {kind}");
    };
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id)?,
        revision: PolicyRevision::new(1)?,
        algorithm,
        max_cost: 1,
        cleanup_grace: Duration::from_secs(10),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .map_err(|e| anyhow::anyhow!("bench policy: {e}"))
}

/// The subject digest of key number `n`.
pub fn subject(n: u64) -> SubjectDigest {
    let mut h = Sha256::new();
    h.update(b"rl-bench-subject");
    h.update(n.to_be_bytes());
    SubjectDigest::from_bytes(h.finalize().into())
}

/// SplitMix64: a tiny, fast, seedable generator (no external crate needed).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The key of the next request.
pub fn pick_key(rng: &mut SplitMix, keys: u64, hot_key_share: f64) -> u64 {
    if hot_key_share > 0.0 && rng.next_f64() < hot_key_share {
        0
    } else {
        // Multiply-shift instead of modulo: unbiased enough for load and branch free.
        ((u128::from(rng.next_u64()) * u128::from(keys)) >> 64) as u64
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub provider: ProviderKind,
    pub algorithm: AlgorithmKind,
    pub keys: u64,
    pub concurrency: u64,
    /// Limits per decision (`--policies`).
    pub policies: u64,
    /// `--deny-cache on`.
    pub deny_cache: bool,
    /// `--batch-max`.
    pub batch_max: u64,
    pub elapsed: Duration,
    pub allowed: u64,
    pub denied: u64,
    pub unavailable: u64,
    pub indeterminate: u64,
    pub incompatible: u64,
    pub refused: u64,
    /// Decisions answered by the exact denial cache (`"source":"local_cache"`).
    pub local_cache: u64,
    pub latency_ns: Histogram<u64>,
}

impl Report {
    pub fn decisions(&self) -> u64 {
        self.allowed + self.denied
    }

    pub fn errors(&self) -> u64 {
        self.unavailable + self.indeterminate + self.incompatible + self.refused
    }

    pub fn decisions_per_s(&self) -> f64 {
        self.decisions() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn quantile_us(&self, q: f64) -> f64 {
        self.latency_ns.value_at_quantile(q) as f64 / 1000.0
    }

    /// The `--json` object: counts, rate, latency percentiles in µs, and the run's parameters
    /// (a stable shape: the scripts in `bench/` read it).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "decisions": self.decisions(),
            "decisions_per_s": self.decisions_per_s(),
            "allowed": self.allowed,
            "denied": self.denied,
            "errors": self.errors(),
            "p50_us": self.quantile_us(0.50),
            "p99_us": self.quantile_us(0.99),
            "p999_us": self.quantile_us(0.999),
            "provider": self.provider.as_str(),
            "algorithm": self.algorithm.as_str(),
            "keys": self.keys,
            "concurrency": self.concurrency,
            "policies": self.policies,
            "deny_cache": if self.deny_cache { "on" } else { "off" },
            "batch_max": self.batch_max,
            "local_cache": self.local_cache,
        })
    }

    /// The human table.
    pub fn table(&self) -> String {
        let rows = [
            ("provider", self.provider.as_str().to_owned()),
            ("algorithm", self.algorithm.as_str().to_owned()),
            ("keys", self.keys.to_string()),
            ("concurrency", self.concurrency.to_string()),
            ("policies", self.policies.to_string()),
            (
                "deny cache",
                if self.deny_cache { "on" } else { "off" }.to_owned(),
            ),
            ("batch max", self.batch_max.to_string()),
            ("elapsed", format!("{:.2} s", self.elapsed.as_secs_f64())),
            ("decisions", self.decisions().to_string()),
            ("decisions/s", format!("{:.0}", self.decisions_per_s())),
            ("allowed", self.allowed.to_string()),
            ("denied", self.denied.to_string()),
            ("local cache", self.local_cache.to_string()),
            (
                "errors",
                format!(
                    "{} (unavailable {}, indeterminate {}, incompatible {}, refused {})",
                    self.errors(),
                    self.unavailable,
                    self.indeterminate,
                    self.incompatible,
                    self.refused
                ),
            ),
            ("p50", format!("{:.1} us", self.quantile_us(0.50))),
            ("p99", format!("{:.1} us", self.quantile_us(0.99))),
            ("p99.9", format!("{:.1} us", self.quantile_us(0.999))),
            (
                "max",
                format!("{:.1} us", self.latency_ns.max() as f64 / 1000.0),
            ),
        ];
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<12} {v}\n"));
        }
        out
    }
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 ns .. 60 s at 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("latency histogram")
}

/// Builds the provider of `args`.
///
/// # Errors
/// When the Redis settings are refused or the server is not ready within a few seconds.
pub async fn provider(
    args: &Args,
    policies: PolicySet,
) -> anyhow::Result<Arc<dyn EdgeRateLimitPort>> {
    Ok(match args.provider {
        ProviderKind::Local => Arc::new(LocalProvider::new(
            policies,
            Arc::new(SystemClock),
            LocalSettings {
                max_keys: args.keys.max(1_000_000),
            },
        )),
        ProviderKind::Redis => {
            let urls: Vec<String> = args
                .redis_url
                .split(',')
                .map(|u| u.trim().to_owned())
                .collect();
            let mut settings = match args.topology.as_str() {
                "cluster" => RedisSettings::cluster(urls),
                "sentinel" => RedisSettings::sentinel(args.master_name.clone(), urls),
                _ => RedisSettings::new(args.redis_url.clone()),
            };
            settings.connections = usize::try_from(args.connections)?;
            settings.min_replicas_ack = args.min_replicas_ack;
            settings.batch_max = usize::try_from(args.batch_max)?;
            // Generous bounds: the bench measures throughput, so neither the admission bound
            // nor the timeout should be what limits it (errors are counted if they happen).
            settings.max_in_flight = usize::try_from(args.concurrency)?.max(1024);
            settings.command_timeout = Duration::from_millis(500);
            let p = RedisProvider::connect(settings, policies)
                .await
                .context("redis settings")?;
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match p.readiness().await {
                    Readiness::Ready => break,
                    Readiness::NotReady(why) if Instant::now() > deadline => {
                        bail!("redis provider not ready: {why}")
                    }
                    Readiness::NotReady(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            Arc::new(p)
        }
        ProviderKind::Grpc => {
            bail!("--provider grpc drives a running service, not a port (see the grpc module)")
        }
    })
}

#[derive(Debug)]
pub(crate) struct Tally {
    allowed: u64,
    denied: u64,
    unavailable: u64,
    indeterminate: u64,
    incompatible: u64,
    refused: u64,
    local_cache: u64,
    latency_ns: Histogram<u64>,
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            allowed: 0,
            denied: 0,
            unavailable: 0,
            indeterminate: 0,
            incompatible: 0,
            refused: 0,
            local_cache: 0,
            latency_ns: histogram()?,
        })
    }

    fn add(&mut self, t: &Tally) -> anyhow::Result<()> {
        self.allowed += t.allowed;
        self.denied += t.denied;
        self.unavailable += t.unavailable;
        self.indeterminate += t.indeterminate;
        self.incompatible += t.incompatible;
        self.refused += t.refused;
        self.local_cache += t.local_cache;
        self.latency_ns
            .add(&t.latency_ns)
            .context("merging histograms")
    }
}

/// One decision of every policy in `policy_ids` for `key`: a single evaluation for one
/// policy, else one multi-limit evaluation; (allowed, denied, unavailable, indeterminate,
/// incompatible, refused, answered by the denial cache) as 0/1.
async fn decide(
    port: &dyn EdgeRateLimitPort,
    policy_ids: &[PolicyId],
    key: u64,
    deadline: Deadline,
) -> anyhow::Result<[u64; 7]> {
    if let [policy_id] = policy_ids {
        let request = RateLimitRequest {
            policy_id: policy_id.clone(),
            subject: subject(key),
            cost: Cost::ONE,
            evaluation_id: None,
            deadline,
        };
        return Ok(match port.evaluate(request).await {
            Ok(RateLimitOutcome::Evaluated(d)) if d.allowed => [1, 0, 0, 0, 0, 0, 0],
            Ok(RateLimitOutcome::Evaluated(d)) => [0, 1, 0, 0, 0, 0, cached(&d)],
            Ok(RateLimitOutcome::Unavailable { .. }) => [0, 0, 1, 0, 0, 0, 0],
            Ok(RateLimitOutcome::Indeterminate { .. }) => [0, 0, 0, 1, 0, 0, 0],
            Ok(RateLimitOutcome::Incompatible { .. }) => [0, 0, 0, 0, 1, 0, 0],
            Err(_) => [0, 0, 0, 0, 0, 1, 0],
        });
    }
    let limits = policy_ids
        .iter()
        .map(|policy_id| Limit {
            policy_id: policy_id.clone(),
            subject: subject(key),
            cost: Cost::ONE,
        })
        .collect();
    let request = MultiRequest {
        limits: Limits::new(limits)?,
        evaluation_id: None,
        deadline,
    };
    Ok(match port.evaluate_all(request).await {
        Ok(MultiOutcome::Evaluated(d)) if d.allowed => [1, 0, 0, 0, 0, 0, 0],
        Ok(MultiOutcome::Evaluated(d)) => [0, 1, 0, 0, 0, 0, cached(&d.decisions[0])],
        Ok(MultiOutcome::Unavailable { .. }) => [0, 0, 1, 0, 0, 0, 0],
        Ok(MultiOutcome::Indeterminate { .. }) => [0, 0, 0, 1, 0, 0, 0],
        Ok(MultiOutcome::Incompatible { .. }) => [0, 0, 0, 0, 1, 0, 0],
        Err(_) => [0, 0, 0, 0, 0, 1, 0],
    })
}

/// 1 when the exact denial cache answered `d`.
fn cached(d: &RateLimitDecision) -> u64 {
    u64::from(d.source == Source::LocalCache)
}

async fn worker(
    port: Arc<dyn EdgeRateLimitPort>,
    policy_ids: Arc<Vec<PolicyId>>,
    args: Arc<Args>,
    seed: u64,
    stop: Instant,
) -> anyhow::Result<Tally> {
    let mut rng = SplitMix::new(seed);
    let mut t = Tally::new()?;
    let budget = Duration::from_secs(5);
    loop {
        let key = pick_key(&mut rng, args.keys, args.hot_key_share);
        let deadline = Deadline::within(budget)?;
        let started = Instant::now();
        if started >= stop {
            return Ok(t);
        }
        let [a, d, u, i, c, r, l] = decide(&*port, &policy_ids, key, deadline).await?;
        let ns = started.elapsed().as_nanos().clamp(1, 60_000_000_000) as u64;
        t.latency_ns.saturating_record(ns);
        t.allowed += a;
        t.denied += d;
        t.unavailable += u;
        t.indeterminate += i;
        t.incompatible += c;
        t.refused += r;
        t.local_cache += l;
    }
}

/// Runs the load of `args` and measures it.
///
/// # Errors
/// When the provider cannot be built, or a worker task fails.
pub async fn run(args: Args) -> anyhow::Result<Report> {
    let args = Arc::new(args);
    if args.provider == ProviderKind::Grpc {
        let started = Instant::now();
        let total = grpc::run(args.clone(), started + args.duration).await?;
        return Ok(report(&args, started, total));
    }
    let all: Vec<_> = bench_policies(args.algorithm, args.policies, args.limit)?
        .into_iter()
        .map(|p| p.with_deny_cache(args.deny_cache_on()))
        .collect();
    let policy_ids: Arc<Vec<PolicyId>> = Arc::new(all.iter().map(|p| p.id().clone()).collect());
    let policies = PolicySet::new(all, policy_ids[0].clone())?;
    let port = provider(&args, policies).await?;
    let started = Instant::now();
    let stop = started + args.duration;
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|i| {
            tokio::spawn(worker(
                port.clone(),
                policy_ids.clone(),
                args.clone(),
                0x5EED_0000 + i,
                stop,
            ))
        })
        .collect();
    let mut total = Tally::new()?;
    for task in tasks {
        total.add(&task.await.context("worker task")??)?;
    }
    Ok(report(&args, started, total))
}

fn report(args: &Args, started: Instant, total: Tally) -> Report {
    Report {
        provider: args.provider,
        algorithm: args.algorithm,
        keys: args.keys,
        concurrency: args.concurrency,
        policies: args.policies,
        deny_cache: args.deny_cache_on(),
        batch_max: args.batch_max,
        elapsed: started.elapsed(),
        allowed: total.allowed,
        denied: total.denied,
        unavailable: total.unavailable,
        indeterminate: total.indeterminate,
        incompatible: total.incompatible,
        refused: total.refused,
        local_cache: total.local_cache,
        latency_ns: total.latency_ns,
    }
}

#[cfg(test)]
mod tests;
