use clap::Parser as _;

use super::*;

#[test]
fn the_documented_command_line_parses() {
    let a = Args::try_parse_from([
        "rl-bench",
        "--provider",
        "redis",
        "--redis-url",
        "redis://127.0.0.1:7000/0",
        "--algorithm",
        "token_bucket",
        "--keys",
        "1000000",
        "--concurrency",
        "64",
        "--duration",
        "10s",
        "--hot-key-share",
        "0.5",
        "--json",
    ])
    .expect("valid arguments");
    assert_eq!(a.provider, ProviderKind::Redis);
    assert_eq!(a.algorithm, AlgorithmKind::TokenBucket);
    assert_eq!((a.keys, a.concurrency), (1_000_000, 64));
    assert_eq!(a.duration, Duration::from_secs(10));
    assert!(a.json && (a.hot_key_share - 0.5).abs() < f64::EPSILON);
    assert_eq!(a.topology, "standalone");
    assert_eq!((a.connections, a.min_replicas_ack), (1, 0));
}

#[test]
fn topology_options_parse_and_bad_ones_are_refused() {
    let base = [
        "rl-bench",
        "--provider",
        "redis",
        "--algorithm",
        "gcra",
        "--keys",
        "10",
        "--concurrency",
        "4",
        "--duration",
        "1s",
    ];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        Args::try_parse_from(v)
    };
    let a = with(&[
        "--topology",
        "cluster",
        "--redis-url",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
        "--connections",
        "2",
        "--min-replicas-ack",
        "1",
    ])
    .expect("valid arguments");
    assert_eq!(a.topology, "cluster");
    assert_eq!((a.connections, a.min_replicas_ack), (2, 1));
    assert!(with(&["--topology", "ring"]).is_err());
    assert!(with(&["--connections", "0"]).is_err());
    assert!(with(&["--min-replicas-ack", "17"]).is_err());
}

#[test]
fn bad_values_are_refused() {
    let base = ["rl-bench", "--provider", "local", "--algorithm", "gcra"];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        Args::try_parse_from(v)
    };
    let ok = ["--keys", "1", "--concurrency", "1", "--duration", "1s"];
    assert!(with(&ok).is_ok());
    assert!(with(&["--keys", "0", "--concurrency", "1", "--duration", "1s"]).is_err());
    assert!(with(&["--keys", "1", "--concurrency", "0", "--duration", "1s"]).is_err());
    assert!(with(&["--keys", "1", "--concurrency", "1", "--duration", "soon"]).is_err());
    let mut hot = ok.to_vec();
    hot.extend(["--hot-key-share", "1.5"]);
    assert!(with(&hot).is_err());
    assert!(parse_algorithm("leaky_bucket").is_err());
}

#[test]
fn every_algorithm_has_a_valid_bench_policy() {
    for kind in AlgorithmKind::RATE {
        assert_eq!(bench_policy(kind).map(|p| p.kind()).ok(), Some(kind));
    }
}

#[test]
fn hot_key_share_sends_that_share_to_key_zero() {
    let mut rng = SplitMix::new(1);
    let n = 100_000;
    let hot = (0..n)
        .filter(|_| pick_key(&mut rng, 1_000_000, 0.3) == 0)
        .count();
    let share = hot as f64 / n as f64;
    assert!((share - 0.3).abs() < 0.01, "{share}");
    let all_in_range = (0..n).all(|_| pick_key(&mut rng, 10, 0.0) < 10);
    assert!(all_in_range);
}

#[test]
fn json_has_the_documented_fields() {
    let mut latency_ns = histogram().expect("histogram");
    latency_ns.record(50_000).expect("in range");
    let r = Report {
        provider: ProviderKind::Local,
        algorithm: AlgorithmKind::Gcra,
        keys: 10,
        concurrency: 2,
        policies: 1,
        deny_cache: true,
        batch_max: 16,
        elapsed: Duration::from_secs(2),
        allowed: 3,
        denied: 1,
        unavailable: 1,
        indeterminate: 0,
        incompatible: 0,
        refused: 0,
        local_cache: 1,
        latency_ns,
    };
    let j = r.to_json();
    let obj = j.as_object().expect("an object");
    let mut keys: Vec<_> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "algorithm",
            "allowed",
            "batch_max",
            "concurrency",
            "decisions",
            "decisions_per_s",
            "denied",
            "deny_cache",
            "errors",
            "keys",
            "local_cache",
            "p50_us",
            "p999_us",
            "p99_us",
            "policies",
            "provider"
        ]
    );
    assert_eq!(j["decisions"], 4);
    assert_eq!(j["errors"], 1);
    assert_eq!(j["decisions_per_s"], 2.0);
    assert_eq!(j["provider"], "local");
    assert_eq!(j["algorithm"], "gcra");
    assert_eq!(
        (j["deny_cache"].as_str(), j["local_cache"].as_u64()),
        (Some("on"), Some(1))
    );
    assert_eq!(j["batch_max"], 16);
    assert!((j["p50_us"].as_f64().unwrap_or(0.0) - 50.0).abs() < 0.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_local_run_reports_decisions() {
    for policies in ["1", "3"] {
        let args = Args::try_parse_from([
            "rl-bench",
            "--provider",
            "local",
            "--algorithm",
            "fixed_window",
            "--keys",
            "1",
            "--concurrency",
            "2",
            "--duration",
            "200ms",
            "--policies",
            policies,
        ])
        .expect("valid arguments");
        let r = run(args).await.expect("a run");
        // One hot key with limit 1000 per second (each policy): 1000 allowed in the first
        // window at most (two windows can be touched in 200 ms), the rest denied.
        assert!(r.decisions() > 1000, "{}", r.table());
        assert!(r.allowed <= 2000 && r.denied > 0, "{}", r.table());
        assert_eq!(r.errors(), 0);
        assert_eq!(r.policies.to_string(), policies);
    }
    assert!(
        Args::try_parse_from([
            "rl-bench",
            "--provider",
            "local",
            "--algorithm",
            "gcra",
            "--keys",
            "1",
            "--concurrency",
            "1",
            "--duration",
            "1s",
            "--policies",
            "9",
        ])
        .is_err(),
        "more than 8 limits per decision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_run_with_the_deny_cache_answers_most_denials_locally() {
    let server = acceptance_tests::redis_server::RedisServer::start();
    let mut counts = Vec::new();
    for cache in ["on", "off"] {
        let args = Args::try_parse_from([
            "rl-bench",
            "--provider",
            "redis",
            "--redis-url",
            server.url(),
            "--algorithm",
            "fixed_window",
            "--limit",
            "100",
            "--keys",
            "1",
            "--concurrency",
            "4",
            "--duration",
            "300ms",
            "--deny-cache",
            cache,
        ])
        .expect("valid arguments");
        let r = run(args).await.expect("a run");
        assert_eq!(r.errors(), 0, "{}", r.table());
        counts.push((r.denied, r.local_cache));
    }
    let [(denied_on, local_on), (_, local_off)] = counts[..] else {
        panic!("two runs");
    };
    assert!(local_on > denied_on / 2, "{counts:?}");
    assert_eq!(local_off, 0, "{counts:?}");
}
