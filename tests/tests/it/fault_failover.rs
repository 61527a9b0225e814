//! Failover under load, on servers the harness starts: a master is SIGKILLed while workers
//! evaluate, and the run is summarized (`--nocapture` prints the figures that
//! docs/operations.md reports):
//!
//! - the outage: from the kill until the first decision after the last failure;
//! - what was answered meanwhile: only `Unavailable`/`Indeterminate` or decisions, never
//!   `Incompatible`, and never an allow the provider did not read from a reply;
//! - over-admission per key (a token bucket of `LIMIT` refilling `LIMIT` per day: no whole
//!   token comes back during a run, so each subject may be admitted `LIMIT` times in all; a
//!   fixed window would roll over at the top of the hour and admit everything again), with
//!   and without `min_replicas_ack`.
//!
//! Two faults. `Kill`: the master is SIGKILLed. On loopback its replicas are microseconds
//! behind, so this loses (next to) nothing. `LagThenKill` makes the replicas lag first, as a
//! slow network or a busy replica would: they are frozen (SIGSTOP) and cut off
//! (`CLIENT KILL TYPE replica`) for `LAG`, the master keeps answering, then it is killed
//! and the replicas thawed. What the master admitted in between is lost with it: without
//! `min_replicas_ack` those admissions are repeated after the failover (the test asserts
//! that it sees some, so the measurement can fail); with `min_replicas_ack = 1` no allow is
//! reported that a replica did not acknowledge, so nothing is over-admitted. That needs more
//! replicas than acks asked for: after a failover the new master must still have
//! `min_replicas_ack` replicas, or every allow stays `Indeterminate` (fail closed) until one
//! returns.
//!
//! One topology runs at a time (a lock), so the figures are not those of six topologies
//! sharing two cores.

use std::sync::Arc;
use std::time::Duration;

use acceptance_tests::cluster::RedisCluster;
use acceptance_tests::eventually::eventually;
use acceptance_tests::failover::{Answer, Load, Record, Summary, summarize};
use acceptance_tests::sentinel::{RedisSentinel, SentinelOptions};
use acceptance_tests::{conformance, rate};
use adapter_redis::keys::hash_slot;
use adapter_redis::{RedisProvider, RedisSettings};
use shared_contract::{
    AlgorithmKind, Cost, Deadline, EdgeRateLimitPort, PolicyId, PolicySet, RateLimitOutcome,
    RateLimitRequest, SubjectDigest,
};

/// Admissions per subject for the whole run.
const LIMIT: u64 = 20;
const SUBJECTS: usize = 150;
const CONCURRENCY: usize = 16;
/// Generous for two shared cores; a killed master's calls fail fast (connection reset).
const COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
/// How long the replicas lag behind before the master dies (`Fault::LagThenKill`).
const LAG: Duration = Duration::from_millis(300);

/// What happens to the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    LagThenKill,
}

/// Freezes the replicas on `replicas` and cuts them off their master on `master` (writes made
/// from now on reach no replica), then waits `LAG`.
async fn lag(master: redis::Connection, pause: impl Fn()) {
    pause();
    let mut master = master;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master)
        .expect("CLIENT KILL TYPE replica");
    tokio::time::sleep(LAG).await;
}

fn policies() -> PolicySet {
    rate::policy_set(vec![conformance::policy(
        AlgorithmKind::TokenBucket,
        1,
        LIMIT,
        86_400_000,
        1,
    )])
}

fn subjects() -> Arc<Vec<SubjectDigest>> {
    Arc::new((0..SUBJECTS).map(|_| rate::fresh_subject()).collect())
}

/// Evaluates fresh subjects (outside the load's) until one is allowed: recovery seen from
/// outside the load. An allow, not any decision: with `min_replicas_ack` a decision may come
/// back before the new master's replicas acknowledge again.
async fn wait_for_allow(port: &dyn EdgeRateLimitPort, policy: &PolicyId, timeout: Duration) {
    eventually("an allow", timeout, Duration::from_millis(20), async || {
        let outcome = port
            .evaluate(RateLimitRequest {
                policy_id: policy.clone(),
                subject: rate::fresh_subject(),
                cost: Cost::ONE,
                evaluation_id: None,
                deadline: Deadline::within(Duration::from_secs(2)).expect("deadline"),
            })
            .await
            .expect("a valid request");
        match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => Ok(()),
            other => Err(other),
        }
    })
    .await;
}

/// Checks what must hold whatever the topology, and that the run consumed every watched
/// subject's quota after the outage (so over-admission was really measured).
fn check(summary: &Summary, records: &[Record], fault: Duration, watched: &[usize]) {
    assert_eq!(summary.incompatible, 0, "{summary}");
    let outage = summary.outage.unwrap_or_else(|| {
        let failures: Vec<(u128, Answer)> = records
            .iter()
            .filter(|r| r.at >= fault && !r.answer.is_decision())
            .map(|r| ((r.at - fault).as_millis(), r.answer))
            .collect();
        panic!(
            "no decision after the last failure: {summary}; run ends {:?} after the fault; \
             failures after the fault (ms, answer), last 10: {:?}",
            records.last().map(|r| r.at.saturating_sub(fault)),
            &failures[failures.len().saturating_sub(10)..]
        )
    });
    assert!(outage < Duration::from_secs(20), "{summary}");
    let recovered = fault + outage;
    for &s in watched {
        assert!(
            records
                .iter()
                .any(|r| r.subject == s && r.at >= recovered && r.answer == Answer::Denied),
            "subject {s} never reached its limit after the outage: the run was too short"
        );
    }
}

/// One provider under load: its policy, the subjects, the load, and when the fault came.
struct Run {
    provider: Arc<RedisProvider>,
    policy: PolicyId,
    subjects: Arc<Vec<SubjectDigest>>,
    load: Load,
}

impl Run {
    /// A provider on `settings` (with this file's timeout and `min_replicas_ack`) under load,
    /// once a third of the quota is used.
    async fn start(mut settings: RedisSettings, min_replicas_ack: u32) -> Self {
        settings.command_timeout = COMMAND_TIMEOUT;
        settings.min_replicas_ack = min_replicas_ack;
        let policies = policies();
        let policy = policies.default_id().clone();
        let provider = Arc::new(
            RedisProvider::connect(settings, policies)
                .await
                .expect("valid settings"),
        );
        let subjects = subjects();
        let load = Load::start(
            provider.clone(),
            policy.clone(),
            subjects.clone(),
            CONCURRENCY,
            Duration::from_secs(2),
        );
        load.wait_allowed(LIMIT * SUBJECTS as u64 / 3, Duration::from_secs(30))
            .await;
        Self {
            provider,
            policy,
            subjects,
            load,
        }
    }

    /// After the fault: waits for an allow, then until every watched subject's quota is used
    /// up; every record.
    async fn finish(self, watched: impl Fn(usize) -> bool) -> Vec<Record> {
        wait_for_allow(
            self.provider.as_ref(),
            &self.policy,
            Duration::from_secs(20),
        )
        .await;
        self.load
            .wait_exhausted(self.load.elapsed(), watched, Duration::from_secs(30))
            .await;
        self.load.stop().await
    }
}

/// A 3-master cluster with `replicas` replicas each; kills the master of a third of the
/// subjects.
async fn cluster_failover(
    replicas: usize,
    min_replicas_ack: u32,
    fault_kind: Fault,
) -> (Summary, Summary) {
    // One topology at a time, and nothing else heavy beside it.
    let _heavy = crate::heavy().await;
    let mut cluster = tokio::task::block_in_place(|| RedisCluster::start(3, replicas));
    let run = Run::start(RedisSettings::cluster(cluster.urls()), min_replicas_ack).await;
    let slots: Vec<u16> = run
        .subjects
        .iter()
        .map(|s| {
            let key = run
                .provider
                .state_key(&run.policy, s)
                .expect("known policy");
            hash_slot(key.as_bytes())
        })
        .collect();
    let victim = cluster.master_for_slot(slots[0]);
    let owners = cluster.slot_owners();
    let hit: Vec<bool> = slots
        .iter()
        .map(|&s| owners[usize::from(s)] == victim)
        .collect();
    let watched: Vec<usize> = (0..SUBJECTS).filter(|&i| hit[i]).collect();
    let fault = run.load.elapsed();
    let victims_replicas = cluster.replicas_of(victim);
    if fault_kind == Fault::LagThenKill {
        lag(cluster.connection(victim), || {
            for &r in &victims_replicas {
                cluster.pause_node(r);
            }
        })
        .await;
    }
    tokio::task::block_in_place(|| {
        cluster.kill_master_of_slot(slots[0]);
        for &r in &victims_replicas {
            cluster.resume_node(r);
        }
        cluster.wait_for_failover(slots[0], Duration::from_secs(30));
    });
    let records = run.finish(|i| hit[i]).await;
    let on_victim = summarize(&records, fault, LIMIT, SUBJECTS, |i| hit[i]);
    let elsewhere = summarize(&records, fault, LIMIT, SUBJECTS, |i| !hit[i]);
    check(&on_victim, &records, fault, &watched);
    (on_victim, elsewhere)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_under_load() {
    let (victim, others) = cluster_failover(1, 0, Fault::Kill).await;
    println!("cluster, master killed: killed shard: {victim}");
    println!("cluster, master killed: other shards: {others}");
    // Replicas on loopback are microseconds behind: at most about one admission per request
    // in flight can be lost.
    assert!(victim.over_admitted <= CONCURRENCY as u64, "{victim}");
    assert_eq!(others.over_admitted, 0, "{others}");
    assert_eq!(others.incompatible, 0, "{others}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lagging_replica_loses_admissions_without_replica_acks() {
    let (victim, others) = cluster_failover(1, 0, Fault::LagThenKill).await;
    println!(
        "cluster, replica lagging {LAG:?} then master killed, min_replicas_ack = 0: killed shard: {victim}"
    );
    assert!(
        victim.over_admitted > 0,
        "admissions the lagging replica never saw must be repeated: {victim}"
    );
    assert_eq!(others.over_admitted, 0, "{others}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lagging_replica_with_replica_acks_over_admits_nothing() {
    // Two replicas per master: after the failover the new master still has one to
    // acknowledge (with one, every allow would stay Indeterminate until a replica returns).
    let (victim, others) = cluster_failover(2, 1, Fault::LagThenKill).await;
    println!(
        "cluster, replicas lagging {LAG:?} then master killed, min_replicas_ack = 1: killed shard: {victim}"
    );
    println!(
        "cluster, replicas lagging {LAG:?} then master killed, min_replicas_ack = 1: other shards: {others}"
    );
    assert_eq!(victim.over_admitted, 0, "{victim}");
    assert_eq!(others.over_admitted, 0, "{others}");
}

/// Master, `replicas` replicas, three sentinels: the master is killed and Sentinel promotes a
/// replica.
async fn sentinel_failover(replicas: usize, min_replicas_ack: u32, fault_kind: Fault) -> Summary {
    // One topology at a time, and nothing else heavy beside it.
    let _heavy = crate::heavy().await;
    let mut topology = tokio::task::block_in_place(|| {
        RedisSentinel::start_with(SentinelOptions::new().replicas(replicas))
    });
    let run = Run::start(
        RedisSettings::sentinel(topology.master_name(), topology.sentinel_urls()),
        min_replicas_ack,
    )
    .await;
    let fault = run.load.elapsed();
    let master = topology.master_port();
    let replica_ports: Vec<u16> = topology
        .data_ports()
        .into_iter()
        .filter(|&p| p != master)
        .collect();
    if fault_kind == Fault::LagThenKill {
        lag(topology.connection(master), || {
            for &r in &replica_ports {
                topology.pause_node(r);
            }
        })
        .await;
    }
    tokio::task::block_in_place(|| {
        let old = topology.kill_master();
        for &r in &replica_ports {
            topology.resume_node(r);
        }
        topology.wait_for_failover(old, Duration::from_secs(30));
    });
    let records = run.finish(|_| true).await;
    let summary = summarize(&records, fault, LIMIT, SUBJECTS, |_| true);
    let all: Vec<usize> = (0..SUBJECTS).collect();
    check(&summary, &records, fault, &all);
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_killed_under_load() {
    let summary = sentinel_failover(1, 0, Fault::Kill).await;
    println!("sentinel, master killed: {summary}");
    assert!(summary.over_admitted <= CONCURRENCY as u64, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_lagging_replica_loses_admissions_without_replica_acks() {
    let summary = sentinel_failover(1, 0, Fault::LagThenKill).await;
    println!(
        "sentinel, replica lagging {LAG:?} then master killed, min_replicas_ack = 0: {summary}"
    );
    assert!(
        summary.over_admitted > 0,
        "admissions the lagging replica never saw must be repeated: {summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_lagging_replica_with_replica_acks_over_admits_nothing() {
    // Two replicas: after the failover the new master still has one to acknowledge (with
    // one, every allow would stay Indeterminate until a replica returns).
    let summary = sentinel_failover(2, 1, Fault::LagThenKill).await;
    println!(
        "sentinel, replica lagging {LAG:?} then master killed, min_replicas_ack = 1: {summary}"
    );
    assert_eq!(summary.over_admitted, 0, "{summary}");
}
