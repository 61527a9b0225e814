//! Key placement on a real Redis Cluster (3 masters + 3 replicas, started by the harness).
//!
//! - Every rate-limit program, sent to the master owning its key exactly as the provider
//!   sends it (`EVAL source 1 key cost args...`), gives a well-formed reply: no CROSSSLOT, no
//!   "non local key". The same call on another master is redirected (MOVED), so the routing
//!   asserted here is really the cluster's.
//! - Every gate program, with the eight KEYS the gate provider passes (all in one slot),
//!   runs on the owning master and gives a reply the gate reply parsers accept.
//! - One subject's keys under different policies share one slot, so a multi-key script over
//!   them is not refused.
//! - 10 000 random subjects spread over the masters within 28%..39% each.
//! - After the owning master is SIGKILLed, its replica takes over and the program runs there.

use std::sync::OnceLock;
use std::time::Duration;

use acceptance_tests::cluster::RedisCluster;
use acceptance_tests::rate::TestPolicy;
use adapter_redis::gate::keys::GateKeys;
use adapter_redis::gate::programs as gate_programs;
use adapter_redis::gate::reply as gate_reply;
use adapter_redis::keys::{PolicyKeys, hash_slot};
use adapter_redis::{programs, reply};
use redis::Value;
use shared_contract::gate::{EventId, GateClock, GateId, GateMode, GateSettings, GateSpec};
use shared_contract::{AlgorithmKind, RateLimitPolicy, SubjectDigest};

/// One cluster for the read-mostly tests of this binary (killed when the binary exits).
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 1))
}

/// Ten at once, recovering over 10 s; a request may cost all ten.
fn policy(id: &str, kind: AlgorithmKind) -> RateLimitPolicy {
    TestPolicy::of(id, kind, 10, Duration::from_secs(10))
        .max_cost(10)
        .build()
}

/// Deterministic pseudo-random subject digests (splitmix64), so a failure reproduces.
fn subject(n: u64) -> SubjectDigest {
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_be_bytes());
    }
    SubjectDigest::from_bytes(bytes)
}

/// `EVAL source 1 key packed-arguments`: the provider's call with EVAL.
fn eval_rate(
    con: &mut redis::Connection,
    policy: &RateLimitPolicy,
    key: &str,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(programs::program(policy.kind()).script.source)
        .arg(1)
        .arg(key);
    let mut packed = programs::pack_cost(1).to_vec();
    packed.extend(programs::arguments(policy));
    cmd.arg(packed);
    cmd.query(con)
}

/// The slot the cluster computes for `key`, checked against the crate's own computation.
fn slot_of(c: &RedisCluster, key: &str) -> u16 {
    let slot = c.keyslot(key);
    assert_eq!(slot, hash_slot(key.as_bytes()), "{key}");
    slot
}

#[test]
fn every_rate_program_runs_on_the_master_owning_its_key() {
    let c = cluster();
    assert_eq!(c.masters().len(), 3);
    assert_eq!(c.nodes().len(), 6);
    for (i, kind) in AlgorithmKind::RATE.into_iter().enumerate() {
        let policy = policy("api", kind);
        let key = PolicyKeys::new("rl", &policy)
            .expect("valid prefix")
            .state_key(&subject(i as u64));
        let owner = c.master_for_slot(slot_of(c, &key));
        let value = eval_rate(&mut c.connection(owner), &policy, &key)
            .unwrap_or_else(|e| panic!("{kind} on :{owner} for {key}: {e}"));
        let parsed = reply::parse(&value);
        assert!(parsed.is_ok(), "{kind}: {value:?} -> {parsed:?}");
        // Another master refuses it with a redirection: this is a real cluster.
        let other = *c
            .masters()
            .iter()
            .find(|&&p| p != owner)
            .expect("3 masters");
        let err = eval_rate(&mut c.connection(other), &policy, &key)
            .expect_err("a key on another shard is not served here");
        let text = err.to_string();
        assert!(
            text.to_uppercase().contains("MOVED") && text.contains(&format!(":{owner}")),
            "{kind}: {text}"
        );
    }
}

fn run_gate(
    con: &mut redis::Connection,
    program: &adapter_redis::script::Script,
    keys: &GateKeys,
    args: &[&str],
) -> Value {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(program.source).arg(keys.all().len());
    for k in keys.all() {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(con)
        .unwrap_or_else(|e| panic!("{} refused: {e}", program.name))
}

#[test]
fn every_gate_program_runs_on_the_master_owning_its_keys() {
    let c = cluster();
    let gate = GateSettings::new(GateSpec::new(
        GateId::new("orders").expect("valid id"),
        GateMode::StrictlyOnce,
        Duration::from_millis(300),
    ))
    .expect("valid gate");
    let keys = GateKeys::new("rl", gate.id()).expect("valid prefix");
    let slots: Vec<u16> = keys.all().iter().map(|k| slot_of(c, k)).collect();
    assert!(slots.iter().all(|&s| s == slots[0]), "{slots:?}");
    let mut con = c.connection(c.master_for_slot(slots[0]));

    // The arguments each call of the gate provider builds, in its order.
    let [mode, duration, regression] = gate_programs::common_arguments(&gate);
    let (max_events, max_len) = (gate.max_events().to_string(), "100000".to_owned());
    let (retention, batch) = (gate.retention_ms().to_string(), "16");
    let id = EventId::new("e-1").expect("valid id");
    let common = [mode.as_str(), &duration, &regression];

    let args = [&common[..], &[&max_events, &max_len, "k-1", id.as_str()]].concat();
    let v = run_gate(&mut con, &gate_programs::SUBMIT, &keys, &args);
    let r = gate_reply::submit(&v, &gate, &id);
    assert!(r.is_ok(), "submit: {v:?} -> {r:?}");

    let args = [&common[..], &[batch, &max_len]].concat();
    let v = run_gate(&mut con, &gate_programs::PUBLISH, &keys, &args);
    let r = gate_reply::publish(&v, 16);
    assert!(r.is_ok(), "publish: {v:?} -> {r:?}");

    let args = [&common[..], &[&retention, batch]].concat();
    let v = run_gate(&mut con, &gate_programs::SWEEP, &keys, &args);
    let r = gate_reply::sweep(&v, 16);
    assert!(r.is_ok(), "sweep: {v:?} -> {r:?}");

    let v = run_gate(&mut con, &gate_programs::SNAPSHOT, &keys, &common[..2]);
    let r = gate_reply::snapshot(&v);
    assert!(r.is_ok(), "snapshot: {v:?} -> {r:?}");

    let v = run_gate(&mut con, &gate_programs::UPDATES, &keys, &["0", batch]);
    let r = gate_reply::updates(&v, GateClock::ZERO, 16);
    assert!(r.is_ok(), "updates: {v:?} -> {r:?}");
}

#[test]
fn one_subjects_keys_under_different_policies_share_a_slot() {
    let c = cluster();
    let s = subject(7);
    let keys: Vec<String> = ["api", "login", "export"]
        .into_iter()
        .flat_map(|id| AlgorithmKind::RATE.map(|kind| (id, kind)))
        .map(|(id, kind)| {
            PolicyKeys::new("rl", &policy(id, kind))
                .expect("valid prefix")
                .state_key(&s)
        })
        .collect();
    let slots: Vec<u16> = keys.iter().map(|k| slot_of(c, k)).collect();
    assert!(slots.iter().all(|&x| x == slots[0]), "{slots:?}");
    assert_eq!(
        keys.iter().collect::<std::collections::HashSet<_>>().len(),
        keys.len()
    );
    // So one script may touch all of them (a later multi-policy check) without CROSSSLOT.
    let mut cmd = redis::cmd("EVAL");
    cmd.arg("return redis.call('EXISTS', unpack(KEYS))")
        .arg(keys.len());
    for k in &keys {
        cmd.arg(k);
    }
    let n: i64 = cmd
        .query(&mut c.connection(c.master_for_slot(slots[0])))
        .expect("a multi-key script over one subject's keys runs");
    assert!(n >= 0);
}

#[test]
fn subjects_spread_evenly_over_the_masters() {
    const SUBJECTS: u64 = 10_000;
    let c = cluster();
    let owners = c.slot_owners();
    let masters = c.masters();
    let keys =
        PolicyKeys::new("rl", &policy("api", AlgorithmKind::TokenBucket)).expect("valid prefix");
    let mut counts = vec![0u64; masters.len()];
    for n in 0..SUBJECTS {
        let key = keys.state_key(&subject(1_000_000 + n));
        let owner = owners[usize::from(hash_slot(key.as_bytes()))];
        let i = masters.iter().position(|&m| m == owner).expect("a master");
        counts[i] += 1;
    }
    let slots: Vec<usize> = masters
        .iter()
        .map(|m| owners.iter().filter(|&&o| o == *m).count())
        .collect();
    let shares: Vec<f64> = counts
        .iter()
        .map(|&k| 100.0 * k as f64 / SUBJECTS as f64)
        .collect();
    eprintln!(
        "{SUBJECTS} subjects over {} masters: keys {counts:?}, shares {shares:.2?} %, slots {slots:?}",
        masters.len()
    );
    for (m, share) in masters.iter().zip(&shares) {
        assert!((28.0..=39.0).contains(share), ":{m} got {share:.2}%");
    }
}

#[test]
fn a_killed_master_is_replaced_and_its_keys_served_by_the_replica() {
    // Its own cluster: this test kills a node.
    let mut c = RedisCluster::start(3, 1);
    let policy = policy("api", AlgorithmKind::FixedWindow);
    let key = PolicyKeys::new("rl", &policy)
        .expect("valid prefix")
        .state_key(&subject(99));
    let slot = slot_of(&c, &key);
    let before = eval_rate(&mut c.connection(c.master_for_slot(slot)), &policy, &key)
        .expect("runs before the kill");
    assert!(reply::parse(&before).is_ok());
    let started = std::time::Instant::now();
    let old = c.kill_master_of_slot(slot);
    let new = c.wait_for_failover(slot, Duration::from_secs(15));
    eprintln!(
        "master :{old} killed, replica :{new} serves slot {slot} after {:?}",
        started.elapsed()
    );
    assert_ne!(old, new);
    assert!(c.nodes().iter().all(|(_, p)| *p != old));
    let after = eval_rate(&mut c.connection(new), &policy, &key).expect("runs after failover");
    assert!(reply::parse(&after).is_ok(), "{after:?}");
    c.stop();
    assert!(c.nodes().is_empty());
}
