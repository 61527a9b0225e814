//! A private Redis Cluster per test group: `masters` shards with `replicas_per_master`
//! replicas each, on free loopback ports, no persistence.
//!
//! Same guard as [`crate::redis_server`] ([`crate::process`]): every node is started by a
//! shell that kills it when this test process's stdin pipe to it closes, so a cluster in a `static` (never dropped) or
//! a crashed test leaks no server. The cluster bus port is chosen explicitly (the default,
//! port + 10000, may fall outside the usable range), and `--repl-diskless-sync-delay 0`
//! makes replicas sync in ~0.1 s instead of ~6 s.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::eventually::poll_blocking;
use crate::probe;
use crate::process::{Node, free_ports, spawn_guarded};
use crate::redis_server::{log_tail, server_args};

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// How long bring-up (nodes answering, then the whole cluster ok) may take.
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// Small, so a killed master is failed over in about two seconds.
const NODE_TIMEOUT_MS: &str = "1000";

/// A running cluster owned by the test; Drop kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

/// One command on one node, with a short timeout; `None` when the node does not answer.
fn query(port: u16, args: &[&str]) -> Option<redis::Value> {
    probe::query(&probe::url(port), args)
}

fn query_text(port: u16, args: &[&str]) -> Option<String> {
    probe::query_text(&probe::url(port), args)
}

/// One line of `CLUSTER NODES`: who, which role, which slots.
#[derive(Debug)]
struct NodeLine {
    port: u16,
    master: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // id addr flags master ping pong epoch link slot...
            if f.len() < 8 {
                return None;
            }
            let port = f[1]
                .split(['@', ','])
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('[')) // slots being migrated
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail"),
                slots,
            })
        })
        .collect()
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, creates the cluster with
    /// `redis-cli --cluster create` and waits until every node reports `cluster_state:ok`
    /// with all 16384 slots ok, no node flagged failed, and every replica synced.
    ///
    /// # Panics
    /// When `redis-server`/`redis-cli` are missing, `masters < 3` (Redis refuses fewer), a
    /// node does not start, `--cluster create` fails (its output is in the message), or the
    /// cluster is not ready within 30 s.
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        assert!(
            masters >= 3,
            "Redis Cluster needs at least 3 masters, got {masters}"
        );
        let dir = tempfile::tempdir().expect("a temporary directory for the cluster");
        let n = masters * (1 + replicas_per_master);
        let ports = free_ports(2 * n);
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(n),
            dir,
        };
        for i in 0..n {
            let (port, bus) = (ports[2 * i], ports[2 * i + 1]);
            let node_dir = cluster.dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("a node directory");
            let node = spawn(port, bus, &node_dir).unwrap_or_else(|e| panic!("{e}"));
            cluster.nodes.push(node);
        }
        let deadline = Instant::now() + READY_DEADLINE;
        for node in &cluster.nodes {
            let pong = || match query_text(node.port, &["PING"]).as_deref() {
                Some("PONG") => Ok(()),
                _ => Err(()),
            };
            let within = deadline.saturating_duration_since(Instant::now());
            if poll_blocking(within, Duration::from_millis(20), pong).is_err() {
                panic!(
                    "cluster node :{} gave no PONG; log:\n{}",
                    node.port,
                    cluster.log_tail(node.port)
                );
            }
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        // `timeout` bounds a create that would wait forever for nodes to agree.
        let out = Command::new("timeout")
            .arg("60")
            .arg("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes")
            .output()
            .expect("`redis-cli` (Debian's redis-tools) on PATH");
        if !out.status.success() {
            panic!(
                "redis-cli --cluster create failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if let Err(why) = probe::poll_until(deadline, || cluster.ready(&[])) {
            panic!("cluster not ready within {READY_DEADLINE:?}: {why}");
        }
        cluster
    }

    /// Seed addresses of every live node (`127.0.0.1`, port); URL `redis://127.0.0.1:PORT`.
    pub fn nodes(&self) -> Vec<(String, u16)> {
        self.live_ports()
            .map(|p| ("127.0.0.1".to_owned(), p))
            .collect()
    }

    /// Seed URLs of every live node.
    pub fn urls(&self) -> Vec<String> {
        self.live_ports()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// Ports of the masters that serve slots, as the live nodes see it, sorted.
    pub fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = self
            .view()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        m.sort_unstable();
        m
    }

    /// `owners[slot]` = port of the master serving `slot`.
    ///
    /// # Panics
    /// When a slot has no live master (the cluster is not ready).
    pub fn slot_owners(&self) -> Vec<u16> {
        self.slot_owners_checked().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The port of the master serving `slot`.
    pub fn master_for_slot(&self, slot: u16) -> u16 {
        self.slot_owners()[usize::from(slot % SLOTS)]
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.live_ports().next().expect("a live node");
        match query(port, &["CLUSTER", "KEYSLOT", key]) {
            Some(redis::Value::Int(s)) => u16::try_from(s).expect("a slot below 16384"),
            other => panic!("CLUSTER KEYSLOT {key} answered {other:?}"),
        }
    }

    /// A connection to the node on `port`.
    pub fn connection(&self, port: u16) -> redis::Connection {
        probe::connection(&probe::url(port))
    }

    /// SIGKILLs the master serving `slot`; returns its port.
    pub fn kill_master_of_slot(&mut self, slot: u16) -> u16 {
        let port = self.master_for_slot(slot);
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("the master is one of our nodes");
        node.kill();
        port
    }

    /// Waits until a live replica has taken over `slot` and every live node is ok again;
    /// returns the new master's port.
    ///
    /// # Panics
    /// When that does not happen within `timeout`.
    pub fn wait_for_failover(&self, slot: u16, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        let dead: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.process.is_none())
            .map(|n| n.port)
            .collect();
        if let Err(why) = probe::poll_until(deadline, || self.ready(&dead)) {
            panic!("no failover of slot {slot} within {timeout:?}: {why}");
        }
        let port = self.master_for_slot(slot);
        assert!(!dead.contains(&port), "slot {slot} still on dead :{port}");
        port
    }

    /// Ports of the replicas of the master on `port`, as its `INFO replication` lists them.
    ///
    /// # Panics
    /// When the master does not answer.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let info = query_text(port, &["INFO", "replication"])
            .unwrap_or_else(|| panic!("master :{port} gave no INFO replication"));
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("ip="))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix("port="))
                    .and_then(|p| p.parse().ok())
            })
            .collect()
    }

    /// Freezes the node on `port` (SIGSTOP): its connections stay open, nothing answers, and a
    /// replica stops applying its master's writes.
    ///
    /// # Panics
    /// When `port` is not a live node of this cluster.
    pub fn pause_node(&self, port: u16) {
        self.live_process(port).pause();
    }

    /// Thaws a node frozen by [`Self::pause_node`] (SIGCONT).
    ///
    /// # Panics
    /// When `port` is not a live node of this cluster.
    pub fn resume_node(&self, port: u16) {
        self.live_process(port).resume();
    }

    fn live_process(&self, port: u16) -> &crate::process::Guarded {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.process.as_ref())
            .unwrap_or_else(|| panic!(":{port} is not a live node of this cluster"))
    }

    /// Kills every node (SIGKILL).
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    fn live_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.process.is_some())
            .map(|n| n.port)
    }

    /// `CLUSTER NODES` from the first live node that answers.
    fn view(&self) -> Vec<NodeLine> {
        self.live_ports()
            .find_map(|p| query_text(p, &["CLUSTER", "NODES"]))
            .map(|t| parse_nodes(&t))
            .unwrap_or_default()
    }

    /// Ok when every live node reports state ok and all slots ok, sees no failed node other
    /// than those in `dead`, and every live replica is synced.
    fn ready(&self, dead: &[u16]) -> Result<(), String> {
        for port in self.live_ports() {
            let info = query_text(port, &["CLUSTER", "INFO"]).ok_or(format!(":{port} silent"))?;
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                let state: Vec<&str> = info
                    .lines()
                    .filter(|l| l.starts_with("cluster_state") || l.starts_with("cluster_slots"))
                    .collect();
                return Err(format!(":{port} {state:?}"));
            }
            let nodes = query_text(port, &["CLUSTER", "NODES"]).unwrap_or_default();
            for n in parse_nodes(&nodes) {
                let live_failed = n.failed && !dead.contains(&n.port);
                let dead_master = n.master && dead.contains(&n.port) && !n.slots.is_empty();
                if live_failed || dead_master {
                    return Err(format!(":{port} sees :{} failed or still serving", n.port));
                }
            }
            if nodes.contains("handshake") || nodes.contains("noaddr") {
                return Err(format!(":{port} sees a node in handshake"));
            }
            let repl = query_text(port, &["INFO", "replication"]).unwrap_or_default();
            if repl.contains("role:slave")
                && !(repl.contains("master_link_status:up")
                    && repl.contains("master_sync_in_progress:0"))
            {
                return Err(format!("replica :{port} not synced"));
            }
        }
        let owners = self.slot_owners_checked()?;
        for master in self.masters() {
            let replicas = self.replicas_of(master).len();
            if replicas > 0 {
                let key = probe_key(&owners, master)
                    .ok_or_else(|| format!("no probe key for :{master}"))?;
                probe::replicas_streaming(&probe::url(master), &key, replicas)?;
            }
        }
        Ok(())
    }

    /// `owners[slot]` = port of the master serving `slot`, or why not every slot has one.
    fn slot_owners_checked(&self) -> Result<Vec<u16>, String> {
        let mut owners = vec![0u16; usize::from(SLOTS)];
        for n in self.view().into_iter().filter(|n| n.master && !n.failed) {
            for &(a, b) in &n.slots {
                for s in a..=b.min(SLOTS - 1) {
                    owners[usize::from(s)] = n.port;
                }
            }
        }
        match owners.iter().position(|&p| p == 0) {
            Some(s) => Err(format!("slot {s} has no live master")),
            None => Ok(owners),
        }
    }

    fn log_tail(&self, port: u16) -> String {
        log_tail(
            &self.dir.path().join(port.to_string()).join("redis.log"),
            10,
        )
    }
}

/// A key of the harness's own (`harness:probe:{n}`) in a slot `master` serves.
fn probe_key(owners: &[u16], master: u16) -> Option<String> {
    (0..100_000u32)
        .map(|n| format!("harness:probe:{{{n}}}"))
        .find(|k| {
            owners.get(usize::from(adapter_redis::keys::hash_slot(k.as_bytes()))) == Some(&master)
        })
}

fn spawn(port: u16, bus: u16, dir: &Path) -> Result<Node, String> {
    let mut args = server_args(port, dir, &dir.join("redis.log"));
    args.extend(
        [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus.to_string(),
            "--cluster-config-file",
            &dir.join("nodes.conf").display().to_string(),
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
        ]
        .map(str::to_owned),
    );
    Ok(Node {
        port,
        process: Some(spawn_guarded("redis-server", &args)?),
    })
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
a1 127.0.0.1:40001@40002,host master - 0 0 1 connected 0-5460 7000 [5461->-b2]
b2 127.0.0.1:40003@40004 slave,fail a1 0 0 1 connected
c3 127.0.0.1:40005@40006 myself,master - 0 0 2 connected 5461-10922";
        let n = parse_nodes(text);
        assert_eq!(n.len(), 3);
        assert_eq!((n[0].port, n[0].master, n[0].failed), (40001, true, false));
        assert_eq!(n[0].slots, vec![(0, 5460), (7000, 7000)]);
        assert_eq!((n[1].port, n[1].master, n[1].failed), (40003, false, true));
        assert!(n[1].slots.is_empty());
        assert_eq!(n[2].slots, vec![(5461, 10922)]);
    }
}
