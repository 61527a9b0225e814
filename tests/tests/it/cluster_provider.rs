//! The Redis provider on a real Redis Cluster (3 masters + 3 replicas started by the harness):
//!
//! - the conformance suite, every case for every algorithm;
//! - calls reach every master (one subject's keys share a slot, subjects spread);
//! - a slot migrated between masters while the provider runs: `ASK` during the migration
//!   and `MOVED` after it are followed, and the count carries over with the key.
//!
//! Failover under load is in `fault_failover.rs` (it kills masters, so it has clusters of its own).

use std::sync::OnceLock;
use std::time::Duration;

use acceptance_tests::cluster::RedisCluster;
use acceptance_tests::redis_target::RedisTarget;
use acceptance_tests::{conformance, rate};
use adapter_redis::keys::hash_slot;
use adapter_redis::{RedisProvider, RedisSettings};
use redis::Value;
use shared_contract::{
    AlgorithmKind, Deadline, EdgeRateLimitPort, PolicySet, Readiness, SubjectDigest,
};

/// One cluster for this binary (killed when the binary exits).
fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 1))
}

fn settings() -> RedisSettings {
    let mut settings = RedisSettings::cluster(cluster().urls());
    // Many cases run in parallel on two shared cores: a generous timeout keeps a slow
    // scheduler from turning a decision into `Indeterminate`.
    settings.command_timeout = Duration::from_secs(2);
    settings
}

async fn provider(policies: PolicySet) -> RedisProvider {
    RedisProvider::connect(settings(), policies)
        .await
        .expect("valid cluster settings")
}

mod cluster_conformance {
    use super::*;
    acceptance_tests::conformance_tests!(RedisTarget::new(settings));
}

mod cluster_lease_conformance {
    use super::*;
    acceptance_tests::lease_conformance_tests!(RedisTarget::new(settings));
}

fn query(port: u16, args: &[&str]) -> Value {
    let mut con = cluster().connection(port);
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut con)
        .unwrap_or_else(|e| panic!(":{port} {args:?}: {e}"))
}

fn text(v: Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b).expect("utf-8"),
        Value::SimpleString(s) => s,
        Value::VerbatimString { text, .. } => text,
        other => panic!("not text: {other:?}"),
    }
}

fn key_count(port: u16) -> i64 {
    match query(port, &["DBSIZE"]) {
        Value::Int(n) => n,
        other => panic!("DBSIZE answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_every_master_and_the_provider_is_ready() {
    let policy = conformance::policy(AlgorithmKind::TokenBucket, 1, 10, 60_000, 1);
    let policies = rate::policy_set(vec![policy.clone()]);
    let p = provider(policies.clone()).await;
    assert_eq!(p.readiness().await, Readiness::Ready);
    let masters = cluster().masters();
    let before: Vec<i64> = masters.iter().map(|&m| key_count(m)).collect();
    for _ in 0..300 {
        assert!(rate::allowed(&p, &policy, rate::fresh_subject()).await);
    }
    for (m, b) in masters.iter().zip(before) {
        let grown = key_count(*m) - b;
        // 300 subjects over 3 masters: about 100 each.
        assert!(grown >= 50, "master :{m} got only {grown} of 300 keys");
    }
}

/// A subject whose key under the default policy lands in `slot`, found by trying random
/// subjects (a slot is hit about once in 16384 tries; each try is two hashes).
fn subject_in_slot(p: &RedisProvider, policies: &PolicySet, slot: u16) -> (SubjectDigest, String) {
    for _ in 0..2_000_000 {
        let s = rate::fresh_subject();
        let key = p
            .state_key(policies.default_id(), &s)
            .expect("a known policy");
        if hash_slot(key.as_bytes()) == slot {
            return (s, key);
        }
    }
    panic!("no subject found for slot {slot}");
}

fn node_id(port: u16) -> String {
    text(query(port, &["CLUSTER", "MYID"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_is_followed_through_ask_and_moved_and_counts_carry_over() {
    // A token bucket refilling over a day: nothing comes back during the test (a fixed
    // window would roll over at its boundary).
    let policy = conformance::policy(AlgorithmKind::TokenBucket, 1, 5, 86_400_000, 1);
    let policies = rate::policy_set(vec![policy.clone()]);
    let p = provider(policies.clone()).await;
    // A subject with state on its master, and a second subject in the same slot without.
    let first = rate::fresh_subject();
    let key = p
        .state_key(policies.default_id(), &first)
        .expect("a known policy");
    let slot = hash_slot(key.as_bytes());
    let (second, second_key) = subject_in_slot(&p, &policies, slot);
    let source = cluster().master_for_slot(slot);
    let target = *cluster()
        .masters()
        .iter()
        .find(|&&m| m != source)
        .expect("another master");
    for _ in 0..2 {
        assert!(rate::allowed(&p, &policy, first).await);
    }

    // Migration starts: the source still serves keys it has, and answers ASK for the others.
    let (source_id, target_id) = (node_id(source), node_id(target));
    let slot_s = slot.to_string();
    query(
        target,
        &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &source_id],
    );
    query(
        source,
        &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &target_id],
    );
    assert!(rate::allowed(&p, &policy, first).await);
    // `second` has no key on the source: ASK, and the provider runs it on the target.
    assert!(rate::allowed(&p, &policy, second).await);
    // The importing master answers for the slot only after ASKING.
    let on_target: i64 = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(&second_key)
        .query::<(i64,)>(&mut cluster().connection(target))
        .expect("ASKING + EXISTS")
        .0;
    assert_eq!(
        on_target, 1,
        "the ASK-redirected call ran on the importing master"
    );
    // The migrating master does not have it (for a key it lacks, it redirects with ASK).
    let on_source: redis::RedisResult<i64> = redis::cmd("EXISTS")
        .arg(&second_key)
        .query(&mut cluster().connection(source));
    assert!(
        matches!(&on_source, Err(e) if e.code() == Some("ASK")),
        "{on_source:?}"
    );

    // The key moves, the slot is assigned to the target: the source answers MOVED.
    query(
        source,
        &[
            "MIGRATE",
            "127.0.0.1",
            &target.to_string(),
            "",
            "0",
            "5000",
            "KEYS",
            &key,
        ],
    );
    for m in cluster().masters() {
        query(m, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &target_id]);
    }
    // Three allowed before (limit 5): two more, then denied, wherever the key now lives.
    let after: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(rate::allowed(&p, &policy, first).await);
        }
        v
    };
    assert_eq!(after, vec![true, true, false]);
    assert_eq!(query(target, &["EXISTS", &key]), Value::Int(1));
}

/// The event-gate provider on the cluster: a gate's eight keys share its slot, so each
/// program goes to that slot's master; a submission, its duplicate and the lookup agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_provider_submits_and_looks_up_on_the_gates_master() {
    use shared_contract::gate::{
        EventGatePort, EventId, EventKey, GateId, GateMode, GateOutcome, GateSet, GateSettings,
        GateSpec, SubmitOutcome, SubmitRequest,
    };
    let gate = GateId::new("orders-cluster").expect("gate id");
    let spec = GateSpec::new(gate.clone(), GateMode::OnlyOnce, Duration::from_secs(60));
    let gates = GateSet::new(vec![GateSettings::new(spec).expect("gate")]).expect("gate set");
    let p = adapter_redis::RedisGateProvider::connect(
        settings(),
        gates,
        adapter_redis::RedisGateSettings::default(),
    )
    .await
    .expect("valid settings");
    let submit = |id: &'static str| {
        p.submit(SubmitRequest {
            gate: gate.clone(),
            key: EventKey::new("taco").expect("key"),
            id: EventId::new(id).expect("id"),
            deadline: Deadline::within(Duration::from_secs(10)).expect("deadline"),
        })
    };
    let first = submit("e-1").await.expect("known gate");
    assert!(
        matches!(
            first,
            GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
        ),
        "{first:?}"
    );
    let second = submit("e-2").await.expect("known gate");
    assert!(
        matches!(&second, GateOutcome::Evaluated(SubmitOutcome::Rejected { conflicts_with, .. }) if conflicts_with.as_str() == "e-1"),
        "{second:?}"
    );
    let found = p
        .event(
            &gate,
            &EventId::new("e-1").expect("id"),
            Deadline::within(Duration::from_secs(10)).expect("deadline"),
        )
        .await
        .expect("known gate");
    assert!(
        matches!(&found, GateOutcome::Evaluated(Some(r)) if r.key.as_str() == "taco"),
        "{found:?}"
    );
    let keys = p.keys(&gate).expect("known gate");
    let owner = cluster().master_for_slot(hash_slot(keys[0].as_bytes()));
    assert_eq!(query(owner, &["EXISTS", &keys[2]]), Value::Int(1));
    p.shutdown().await;
}

/// Batching on a cluster is per slot: requests ready at once for one subject (one slot) leave
/// as one batch call (after the first, which finds nothing in flight and goes alone); those of other subjects, spread over slots and masters, leave alone.
/// Every one is decided (a batch spanning slots would be refused by the cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_batched_per_slot() {
    let policy = conformance::policy(AlgorithmKind::FixedWindow, 1, 5, 60_000, 1);
    let p = provider(rate::policy_set(vec![policy.clone()])).await;
    let hot = rate::fresh_subject();
    let subjects: Vec<SubjectDigest> = (0..16)
        .map(|i| {
            if i % 2 == 0 {
                hot
            } else {
                rate::fresh_subject()
            }
        })
        .collect();
    let before = p.batch_stats();
    let outcomes =
        futures::future::join_all(subjects.iter().map(|s| rate::outcome(&p, &policy, *s))).await;
    let after = p.batch_stats();
    let allowed: Vec<bool> = outcomes
        .into_iter()
        .map(|o| match o {
            shared_contract::RateLimitOutcome::Evaluated(d) => d.allowed,
            other => panic!("expected a decision, got {other:?}"),
        })
        .collect();
    // The hot subject: its first five of eight admitted; every other subject once.
    let hot_allowed: Vec<bool> = allowed.iter().step_by(2).copied().collect();
    assert_eq!(
        hot_allowed,
        [true, true, true, true, true, false, false, false]
    );
    assert!(allowed.iter().skip(1).step_by(2).all(|a| *a));
    assert!(
        after.calls > before.calls && after.members - before.members >= 7,
        "the hot subject's requests after its first were not batched: {before:?} -> {after:?}"
    );
}

mod cluster_charges {
    use super::*;
    acceptance_tests::charge_conformance_tests!(RedisTarget::new(settings));
}

mod cluster_reservations {
    use super::*;
    acceptance_tests::reservation_conformance_tests!(RedisTarget::new(settings));
}
