//! A private Redis Sentinel topology per test group: one master, one replica (or more, see
//! [`SentinelOptions::replicas`]) and three sentinels (quorum 2), all on free loopback ports,
//! no persistence.
//!
//! Failover tests need a real Sentinel to decide, not a simulation: the provider must resolve
//! the master through Sentinel, ride out the ~2-3 s without a writable master, and never
//! trust an old master that comes back (it restarts as an *empty, writable master* until
//! Sentinel demotes it). Every process runs under the guard of [`crate::process`], so a
//! topology in a `static` or a crashed test leaks nothing.
//!
//! Timing (`down-after-milliseconds 1000`, `failover-timeout 3000`) is the one the recipes
//! measured. Sentinel's internal periods are not configurable in `sentinel.conf`; by default
//! the harness shortens two of them at run time with `SENTINEL DEBUG` (hello messages every
//! 250 ms instead of 2 s, `INFO` every 1 s instead of 10 s). That leaves failure detection
//! and the failover itself as configured, but lets sentinels learn about each other, about
//! replicas and about a new configuration in well under a second, and cuts the window in
//! which a restarted old master stays a writable master from ~11 s to ~2 s.
//! [`SentinelOptions::redis_default_timers`] keeps Redis's own periods instead.
//!
//! The `redis-sentinel` binary is not needed: sentinels run as `redis-server <conf>
//! --sentinel`, and each has its own writable config file (Sentinel rewrites it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::eventually::poll_blocking;
use crate::probe::{self, poll_until};
use crate::process::{Guarded, Node, free_ports, spawn_guarded};
use crate::redis_server::{check_binary, log_tail, server_args};

/// The name under which the sentinels monitor the master.
const MASTER_NAME: &str = "mymaster";
/// Sentinels in the topology, and how many must agree that the master is down.
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// How long bring-up may take (processes answering, then the whole topology ready).
const READY_DEADLINE: Duration = Duration::from_secs(20);
/// How long a single process may take to answer `PING`.
const PING_DEADLINE: Duration = Duration::from_secs(10);
/// A write command that changes nothing: refused with READONLY on a replica, so an integer
/// reply proves that a node accepts writes without planting a key in the test's data.
const WRITE_PROBE: [&str; 2] = ["DEL", "harness:sentinel:write-probe"];

/// How [`RedisSentinel::start_with`] builds the topology.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    data_args: Vec<String>,
    password: Option<String>,
    fast_timers: bool,
    replicas: usize,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            data_args: Vec::new(),
            password: None,
            fast_timers: true,
            replicas: 1,
        }
    }
}

impl SentinelOptions {
    /// The defaults: no extra arguments, no password, shortened Sentinel periods.
    pub fn new() -> Self {
        Self::default()
    }

    /// Extra `redis-server` arguments for both data nodes (`["--user", "limiter", ...]`),
    /// also used when a node is restarted.
    pub fn data_args(mut self, args: &[&str]) -> Self {
        self.data_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Protects the data nodes with `requirepass` (the replica and the sentinels are given
    /// the password, `masterauth` and `sentinel auth-pass`); the sentinels stay open.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Replicas of the master (default 1, at least 1).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// Keeps Redis's own Sentinel periods (hello every 2 s, `INFO` every 10 s): bring-up and
    /// agreement after a failover are slower, and a restarted old master stays a writable
    /// master for ~11 s, as in production.
    pub fn redis_default_timers(mut self) -> Self {
        self.fast_timers = false;
        self
    }
}

/// A running Sentinel topology owned by the test; Drop kills every process.
#[derive(Debug)]
pub struct RedisSentinel {
    options: SentinelOptions,
    /// The two data nodes: the first master, then its replica (their roles change).
    data: Vec<Node>,
    sentinels: Vec<Node>,
    dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts a master, a replica and three sentinels with [`SentinelOptions::default`] and
    /// waits until the topology is ready: the replica linked, every sentinel agreeing on the
    /// master, seeing one healthy replica and two other sentinels, and `SENTINEL CKQUORUM`
    /// OK.
    ///
    /// # Panics
    /// When `redis-server` is missing, a process does not start (its log tail is in the
    /// message), or the topology is not ready within 20 s (the message says what is
    /// missing).
    pub fn start() -> Self {
        Self::start_with(SentinelOptions::default())
    }

    /// As [`Self::start`], built as `options` says.
    ///
    /// # Panics
    /// As [`Self::start`].
    pub fn start_with(options: SentinelOptions) -> Self {
        check_binary();
        let deadline = Instant::now() + READY_DEADLINE;
        let mut last_error = String::new();
        // A port picked as free may be taken before the process binds it; start afresh then.
        for _ in 0..3 {
            match Self::try_start(options.clone(), deadline) {
                Ok(topology) => return topology,
                Err(e) => last_error = e,
            }
        }
        panic!("the Sentinel topology did not start: {last_error}");
    }

    fn try_start(options: SentinelOptions, deadline: Instant) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let replicas = options.replicas;
        let ports = free_ports(1 + replicas + SENTINELS);
        let mut topology = RedisSentinel {
            options,
            data: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        let master = ports[0];
        topology.spawn_data(master, &[])?;
        for &replica in &ports[1..=replicas] {
            topology.spawn_data(replica, &["--replicaof", "127.0.0.1", &master.to_string()])?;
        }
        // Sentinels discover replicas from the master's INFO: link the replicas first, so the
        // very first INFO lists them.
        for &replica in &ports[1..=replicas] {
            poll_until(deadline, || topology.replica_linked(replica, master))?;
        }
        for &port in &ports[1 + replicas..] {
            topology.spawn_sentinel(port, master)?;
        }
        poll_until(deadline, || topology.ready())?;
        Ok(topology)
    }

    /// The name the sentinels monitor the master under (`mymaster`).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis://127.0.0.1:PORT` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinel_ports().into_iter().map(probe::url).collect()
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|n| n.port).collect()
    }

    /// The ports of both data nodes (killed ones included), the first master first.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|n| n.port).collect()
    }

    /// The URL of the data node on `port`, with the password (percent-encoded) when there
    /// is one.
    pub fn data_url(&self, port: u16) -> String {
        match &self.options.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{port}", percent_encode(pw)),
            None => probe::url(port),
        }
    }

    /// The master's port as the first sentinel that answers reports it (which may be a
    /// dead master until Sentinel has failed it over).
    ///
    /// # Panics
    /// When no sentinel answers.
    pub fn master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| reported_master(s.port))
            .expect("a sentinel that reports the master")
    }

    /// A new connection to the node on `port`: a data node (authenticated when the options
    /// set a password) or a sentinel.
    ///
    /// # Panics
    /// When `port` is not one of this topology's, or no connection is made within 5 s.
    pub fn connection(&self, port: u16) -> redis::Connection {
        if self.sentinels.iter().any(|n| n.port == port) {
            probe::connection(&probe::url(port))
        } else {
            probe::connection(&self.data_url(self.data_node(port).port))
        }
    }

    /// SIGKILLs the current master (as [`Self::master_port`] reports it); returns its port.
    ///
    /// # Panics
    /// As [`Self::master_port`], or when that node is already killed.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        self.kill_node(port);
        port
    }

    /// SIGKILLs the data node on `port`; it stays down until [`Self::restart_node`].
    ///
    /// # Panics
    /// When `port` is not a data node of this topology or is already killed.
    pub fn kill_node(&mut self, port: u16) {
        let node = self.data_node_mut(port);
        assert!(
            node.process.is_some(),
            "data node :{port} is already killed"
        );
        node.kill();
    }

    /// Waits until every live sentinel reports the same master, other than `old_port`, and
    /// that master accepts writes; returns its port.
    ///
    /// # Panics
    /// When that does not happen within `timeout`; the message says what each sentinel and
    /// node reports.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> u16 {
        let what = format!("no failover away from :{old_port}");
        self.wait_for(&what, timeout, || {
            let port = self.agreed_master()?;
            if port == old_port {
                return Err(format!("the sentinels still report :{old_port}"));
            }
            self.accepts_writes(port)?;
            Ok(port)
        })
    }

    /// Starts the data node on `port` again (killing it first if it runs), on the same port,
    /// empty and without `--replicaof`: it comes back as a writable master of its own until
    /// Sentinel demotes it (see [`Self::wait_until_replica`]).
    ///
    /// # Panics
    /// When `port` is not a data node of this topology, or it does not answer within 10 s.
    pub fn restart_node(&mut self, port: u16) {
        self.data_node_mut(port).kill();
        // The kernel may keep the port briefly after the kill.
        poll_blocking(PING_DEADLINE, Duration::from_millis(50), || {
            self.spawn_data(port, &[])
        })
        .unwrap_or_else(|e| panic!("data node :{port} did not restart: {e}"));
    }

    /// Waits until the data node on `port` is a replica of the master the sentinels agree
    /// on, linked and synced, and the whole topology is ready again (as after start), so a
    /// further failover can happen.
    ///
    /// # Panics
    /// When that does not happen within `timeout`; the message says what is missing.
    pub fn wait_until_replica(&self, port: u16, timeout: Duration) {
        let what = format!(":{port} did not become a ready replica");
        self.wait_for(&what, timeout, || {
            let master = self.agreed_master()?;
            if master == port {
                return Err(format!(":{port} is the master the sentinels agree on"));
            }
            self.replica_linked(port, master)?;
            self.ready()
        });
    }

    /// Waits until the topology is ready as after [`Self::start`] (every data node live and
    /// linked, every sentinel agreeing).
    ///
    /// # Panics
    /// When that does not happen within `timeout`.
    pub fn wait_until_ready(&self, timeout: Duration) {
        self.wait_for("the Sentinel topology is not ready", timeout, || {
            self.ready()
        });
    }

    /// Freezes the node on `port` (SIGSTOP), a data node or a sentinel: its connections stay
    /// open and nothing answers. A sentinel frozen for more than 2 s enters TILT mode for
    /// 30 s after [`Self::resume_node`] and starts no failover meanwhile.
    ///
    /// # Panics
    /// When `port` is not a live node of this topology.
    pub fn pause_node(&self, port: u16) {
        self.live_process(port).pause();
    }

    /// Thaws a node frozen by [`Self::pause_node`] (SIGCONT).
    ///
    /// # Panics
    /// When `port` is not a live node of this topology.
    pub fn resume_node(&self, port: u16) {
        self.live_process(port).resume();
    }

    /// Polls `check` until it is `Ok`; panics after `timeout` with `failure`, the last
    /// reason and what every node says.
    fn wait_for<T>(
        &self,
        failure: &str,
        timeout: Duration,
        check: impl FnMut() -> Result<T, String>,
    ) -> T {
        poll_until(Instant::now() + timeout, check).unwrap_or_else(|why| {
            panic!("{failure} within {timeout:?}: {why}\n{}", self.describe())
        })
    }

    fn data_node(&self, port: u16) -> &Node {
        self.data
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!(":{port} is not a data node of this topology"))
    }

    fn data_node_mut(&mut self, port: u16) -> &mut Node {
        self.data
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!(":{port} is not a data node of this topology"))
    }

    fn live_process(&self, port: u16) -> &Guarded {
        self.data
            .iter()
            .chain(&self.sentinels)
            .find(|n| n.port == port)
            .and_then(|n| n.process.as_ref())
            .unwrap_or_else(|| panic!(":{port} is not a live node of this topology"))
    }

    fn node_dir(&self, name: &str) -> Result<PathBuf, String> {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// Starts (or restarts) the data node on `port` and waits for its PONG; records it.
    fn spawn_data(&mut self, port: u16, role_args: &[&str]) -> Result<(), String> {
        let dir = self.node_dir(&port.to_string())?;
        let log = dir.join("redis.log");
        let mut args = server_args(port, &dir, &log);
        if let Some(pw) = &self.options.password {
            args.extend(["--requirepass", pw, "--masterauth", pw].map(str::to_owned));
        }
        args.extend(self.options.data_args.iter().cloned());
        args.extend(role_args.iter().map(|s| s.to_string()));
        let process = spawn_guarded("redis-server", &args)?;
        let url = self.data_url(port);
        answer_ping(&process, &url, &log)?;
        match self.data.iter_mut().find(|n| n.port == port) {
            Some(node) => node.process = Some(process),
            None => self.data.push(Node {
                port,
                process: Some(process),
            }),
        }
        Ok(())
    }

    /// Writes the sentinel's own config file, starts it, waits for its PONG, shortens its
    /// periods when the options say so; records it.
    fn spawn_sentinel(&mut self, port: u16, master: u16) -> Result<(), String> {
        let dir = self.node_dir(&format!("sentinel-{port}"))?;
        let log = dir.join("sentinel.log");
        let conf = dir.join("sentinel.conf");
        let mut text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             dir {dir:?}\n\
             logfile {log:?}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master} {QUORUM}\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n"
        );
        if let Some(pw) = &self.options.password {
            text.push_str(&format!("sentinel auth-pass {MASTER_NAME} {pw:?}\n"));
        }
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let conf = conf.display().to_string();
        let process = spawn_guarded("redis-server", &[conf.as_str(), "--sentinel"])?;
        let url = probe::url(port);
        answer_ping(&process, &url, &log)?;
        if self.options.fast_timers {
            let args = [
                "SENTINEL",
                "DEBUG",
                "publish-period",
                "250",
                "info-period",
                "1000",
            ];
            probe::try_query(&url, &args)
                .map_err(|e| format!("sentinel :{port} refused SENTINEL DEBUG: {e}"))?;
        }
        self.sentinels.push(Node {
            port,
            process: Some(process),
        });
        Ok(())
    }

    /// The master every live sentinel reports, when they all report the same one.
    fn agreed_master(&self) -> Result<u16, String> {
        let mut agreed = None;
        for s in self.sentinels.iter().filter(|s| s.process.is_some()) {
            let port = reported_master(s.port)
                .ok_or_else(|| format!("sentinel :{} reports no master", s.port))?;
            match agreed {
                Some(a) if a != port => {
                    return Err(format!("sentinels disagree: :{a} and :{port}"));
                }
                _ => agreed = Some(port),
            }
        }
        agreed.ok_or_else(|| "no live sentinel".to_owned())
    }

    fn accepts_writes(&self, port: u16) -> Result<(), String> {
        match probe::try_query(&self.data_url(port), &WRITE_PROBE) {
            Ok(redis::Value::Int(_)) => Ok(()),
            Ok(other) => Err(format!(":{port} answered a write with {other:?}")),
            Err(e) => Err(format!(":{port} refuses writes: {e}")),
        }
    }

    /// Ok when the node on `port` replicates `master`, linked and done syncing.
    fn replica_linked(&self, port: u16, master: u16) -> Result<(), String> {
        let info = probe::query_text(&self.data_url(port), &["INFO", "replication"])
            .ok_or_else(|| format!(":{port} does not answer INFO"))?;
        let field = |name| probe::info_field(&info, name).unwrap_or("?");
        let linked = field("role") == "slave"
            && field("master_port") == master.to_string()
            && field("master_link_status") == "up"
            && field("master_sync_in_progress") == "0";
        if linked {
            Ok(())
        } else {
            Err(format!(
                ":{port} is role {}, of :{}, link {}: not yet a synced replica of :{master}",
                field("role"),
                field("master_port"),
                field("master_link_status")
            ))
        }
    }

    /// Ok when the topology is as after start: every sentinel agrees on a writable master,
    /// sees every other data node as a healthy replica and every other sentinel, and
    /// `CKQUORUM` is OK; every other data node is a synced replica of that master.
    fn ready(&self) -> Result<(), String> {
        let master = self.agreed_master()?;
        self.accepts_writes(master)?;
        let replicas = self.data.len() - 1;
        for s in &self.sentinels {
            let url = probe::url(s.port);
            let m = probe::query(&url, &["SENTINEL", "MASTER", MASTER_NAME])
                .and_then(fields)
                .ok_or_else(|| format!("sentinel :{} gives no SENTINEL MASTER", s.port))?;
            let get = |k: &str| m.get(k).map(String::as_str).unwrap_or("?");
            if get("flags") != "master"
                || get("num-slaves") != replicas.to_string()
                || get("num-other-sentinels") != (SENTINELS - 1).to_string()
            {
                return Err(format!(
                    "sentinel :{} sees flags {}, {} replicas, {} other sentinels",
                    s.port,
                    get("flags"),
                    get("num-slaves"),
                    get("num-other-sentinels")
                ));
            }
            let listed = match probe::query(&url, &["SENTINEL", "REPLICAS", MASTER_NAME]) {
                Some(redis::Value::Array(items)) => items,
                other => return Err(format!("sentinel :{} replicas: {other:?}", s.port)),
            };
            for replica in listed.into_iter().filter_map(fields) {
                let flags = replica.get("flags").map(String::as_str).unwrap_or("?");
                if flags != "slave" {
                    return Err(format!("sentinel :{} sees a replica {flags}", s.port));
                }
            }
            let quorum = probe::try_query(&url, &["SENTINEL", "CKQUORUM", MASTER_NAME])
                .map_err(|e| format!("sentinel :{} CKQUORUM: {e}", s.port))?;
            if !probe::text(quorum).is_some_and(|t| t.starts_with("OK")) {
                return Err(format!("sentinel :{} CKQUORUM is not OK", s.port));
            }
        }
        for node in self.data.iter().filter(|n| n.port != master) {
            self.replica_linked(node.port, master)?;
        }
        probe::replicas_streaming(
            &self.data_url(master),
            "harness:replication-probe",
            replicas,
        )
    }

    /// What each sentinel and data node says right now, for panic messages.
    fn describe(&self) -> String {
        let mut out = String::from("topology now:");
        for s in &self.sentinels {
            let master = reported_master(s.port).map_or("-".to_owned(), |p| p.to_string());
            out.push_str(&format!(
                "\n  sentinel :{} reports master :{master}",
                s.port
            ));
        }
        for n in &self.data {
            let state = match &n.process {
                None => "killed".to_owned(),
                Some(_) => probe::query_text(&self.data_url(n.port), &["INFO", "replication"])
                    .map_or("no answer".to_owned(), |info| {
                        let f = |k| probe::info_field(&info, k).unwrap_or("-").to_owned();
                        format!(
                            "role {} (master :{}, link {})",
                            f("role"),
                            f("master_port"),
                            f("master_link_status")
                        )
                    }),
            };
            out.push_str(&format!("\n  data :{} {state}", n.port));
        }
        out
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // Sentinels first, so none of them reacts to the data nodes going away.
        for node in self.sentinels.iter_mut().chain(self.data.iter_mut()) {
            node.kill();
        }
    }
}

/// Waits until the process answers PING on `url`; reports its log otherwise (the caller
/// drops, and so kills, the process).
fn answer_ping(process: &Guarded, url: &str, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + PING_DEADLINE;
    let exited = poll_until(deadline, || {
        if !process.is_running() {
            // Exited at once: its port was taken, or an argument was refused.
            return Ok(true);
        }
        match probe::query_text(url, &["PING"]).as_deref() {
            Some("PONG") => Ok(false),
            _ => Err("no PONG".to_owned()),
        }
    });
    match exited {
        Ok(false) => Ok(()),
        Ok(true) => Err(format!(
            "{url} exited at start; log:\n{}",
            log_tail(log, 10)
        )),
        Err(_) => Err(format!(
            "no PONG from {url} within {PING_DEADLINE:?}; log:\n{}",
            log_tail(log, 10)
        )),
    }
}

/// The master port `SENTINEL GET-MASTER-ADDR-BY-NAME` gives on the sentinel at `port`.
fn reported_master(port: u16) -> Option<u16> {
    let reply = probe::query(
        &probe::url(port),
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
    )?;
    let redis::Value::Array(addr) = reply else {
        return None;
    };
    probe::text(addr.get(1)?.clone())?.parse().ok()
}

/// `text` with every byte but ASCII letters, digits and `-._~` percent-encoded, as a URL's
/// userinfo needs.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A flat `[field, value, ...]` reply (`SENTINEL MASTER`) as a map.
fn fields(value: redis::Value) -> Option<HashMap<String, String>> {
    let redis::Value::Array(items) = value else {
        return None;
    };
    let mut out = HashMap::new();
    let mut items = items.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        out.insert(probe::text(k)?, probe::text(v)?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_field_lists_become_maps() {
        let bulk = |s: &str| redis::Value::BulkString(s.as_bytes().to_vec());
        let reply = redis::Value::Array(vec![
            bulk("name"),
            bulk("mymaster"),
            bulk("flags"),
            bulk("master"),
        ]);
        let m = fields(reply).expect("a field list");
        assert_eq!(m.get("flags").map(String::as_str), Some("master"));
        assert_eq!(m.len(), 2);
        assert_eq!(fields(redis::Value::Int(1)), None);
    }

    #[test]
    fn passwords_are_percent_encoded_in_urls() {
        assert_eq!(percent_encode("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(percent_encode("p@ss w/rd:%"), "p%40ss%20w%2Frd%3A%25");
        let url = format!("redis://:{}@127.0.0.1:1", percent_encode("p@ss w/rd:%"));
        let info =
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).expect("a valid URL");
        assert_eq!(info.redis_settings().password(), Some("p@ss w/rd:%"));
    }
}
