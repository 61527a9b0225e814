//! The Sentinel harness itself: a private master, replica and three sentinels come up ready,
//! replicate, fail over when the master is killed, and take the restarted old master back as
//! a replica; with a password, data nodes are still monitored and refuse anonymous clients.
//! Run with `--nocapture` to see the bring-up, failover and rejoin times.

use std::time::{Duration, Instant};

use acceptance_tests::sentinel::{RedisSentinel, SentinelOptions};
use redis::Commands;

#[test]
fn sentinel_topology_fails_over_and_takes_the_old_master_back_as_a_replica() {
    let started = Instant::now();
    let mut topology = RedisSentinel::start();
    println!("sentinel topology ready in {:?}", started.elapsed());
    assert_eq!(topology.master_name(), "mymaster");
    assert_eq!(topology.sentinel_urls().len(), 3);

    let master = topology.master_port();
    assert!(topology.data_ports().contains(&master));
    let replica = *topology
        .data_ports()
        .iter()
        .find(|&&p| p != master)
        .expect("a replica");

    // The reported master takes writes and the replica receives them.
    let mut con = topology.connection(master);
    let _: () = con
        .set("harness:k", "v")
        .expect("the master accepts a write");
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut con)
        .expect("WAIT");
    let mut on_replica = topology.connection(replica);
    let got: Option<String> = on_replica.get("harness:k").expect("GET on the replica");
    assert_eq!(got.as_deref(), Some("v"));
    let refused: redis::RedisResult<()> = on_replica.set("harness:k", "w");
    assert!(refused.is_err(), "the replica must refuse writes");

    // Kill the master: the sentinels promote the replica.
    let killed_at = Instant::now();
    let old = topology.kill_master();
    assert_eq!(old, master);
    let new = topology.wait_for_failover(old, Duration::from_secs(15));
    let failover = killed_at.elapsed();
    println!("failover: master :{old} killed -> :{new} agreed and writable in {failover:?}");
    assert_eq!(new, replica);
    assert_eq!(topology.master_port(), new);
    let got: Option<String> = topology
        .connection(new)
        .get("harness:k")
        .expect("GET on the new master");
    assert_eq!(
        got.as_deref(),
        Some("v"),
        "the promoted replica kept the data"
    );

    // The old master comes back empty, and Sentinel demotes it to a replica of the new one.
    let restarted_at = Instant::now();
    topology.restart_node(old);
    topology.wait_until_replica(old, Duration::from_secs(20));
    println!(
        "rejoin: :{old} a synced replica of :{new} after {:?}",
        restarted_at.elapsed()
    );
    let got: Option<String> = topology
        .connection(old)
        .get("harness:k")
        .expect("GET on the rejoined node");
    assert_eq!(
        got.as_deref(),
        Some("v"),
        "the rejoined node synced from the new master"
    );
}

#[test]
fn password_protected_data_nodes_are_monitored_and_refuse_anonymous_clients() {
    let topology = RedisSentinel::start_with(SentinelOptions::new().password("p@ss w/rd"));
    let master = topology.master_port();
    let mut con = topology.connection(master);
    let _: () = con.set("harness:k", "v").expect("an authenticated write");
    let anonymous: redis::RedisResult<Option<String>> =
        redis::Client::open(format!("redis://127.0.0.1:{master}"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .and_then(|mut c| c.get("harness:k"));
    let err = anonymous.expect_err("no data without the password");
    assert_eq!(err.code(), Some("NOAUTH"), "{err:?}");
}
