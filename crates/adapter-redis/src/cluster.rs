//! Redis Cluster: which master serves each of the 16384 slots, and connections to each.
//!
//! Every key a program touches carries one hash tag (the subject's for rate limits, the gate
//! id for gates), so every program call has exactly one slot and goes to that slot's master
//! (no cross-slot call exists). The slot map comes from `CLUSTER SLOTS`, asked of a connected
//! master (or, when none is connected, of the configured seed nodes) at start, every
//! [`REFRESH`], and soon after anything suggests it changed: a `MOVED`/`ASK` redirect, a
//! `CLUSTERDOWN`/`TRYAGAIN`, a slot whose master is not connected. Each master gets a
//! [`NodeSet`] of its own (same supervision, checks and program preload as a standalone
//! server); a master that left the map is dropped with its connections.
//!
//! Redirects themselves are followed by the caller (`pool.rs`): a `MOVED` or `ASK` reply means
//! the program did not run, so sending it to the named node keeps "at most once".

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::Value;
use shared_contract::Readiness;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::background::LastError;
use crate::connection::{Link, Locate, NodeSet, Pick, Setup};
use crate::dial::{self, Access, Endpoint};
use crate::resp;
use crate::wire::Conn;

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;
/// How often the slot map is asked for while nothing suggests a change.
const REFRESH: Duration = Duration::from_secs(2);
/// Shortest gap between two refreshes, however often they are asked for.
const MIN_GAP: Duration = Duration::from_millis(100);
/// A slot no known master serves.
const UNSERVED: u16 = u16::MAX;

/// One master and the connections to it.
struct Shard {
    endpoint: Arc<Endpoint>,
    nodes: NodeSet,
}

/// The slot map: `owner[slot]` indexes `shards`.
struct Routing {
    owner: Box<[u16]>,
    shards: Vec<Arc<Shard>>,
}

impl Routing {
    fn empty() -> Self {
        Self {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            shards: Vec::new(),
        }
    }

    fn unserved(&self) -> usize {
        self.owner.iter().filter(|&&o| o == UNSERVED).count()
    }
}

/// The cluster as this provider sees it, kept current by a background task.
pub(crate) struct Cluster {
    seeds: Vec<Arc<Endpoint>>,
    access: Arc<Access>,
    setup: Arc<Setup>,
    routing: RwLock<Arc<Routing>>,
    /// Bumped after every applied map (start waits for the first).
    generation: watch::Sender<u64>,
    last_error: LastError,
    wake: Notify,
}

impl Cluster {
    /// Starts the refresh task (abort the handle to stop it) and waits at most
    /// `connect_timeout` (plus a little) for a first map and its masters' first connection
    /// attempts. An unreachable cluster is not an error: calls are then
    /// `Unavailable(connect)` until it answers.
    pub(crate) async fn start(
        seeds: Vec<Arc<Endpoint>>,
        access: Arc<Access>,
        setup: Arc<Setup>,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let wait = setup.connect_timeout + Duration::from_millis(100);
        let cluster = Arc::new(Self {
            seeds,
            access,
            setup,
            routing: RwLock::new(Arc::new(Routing::empty())),
            generation: watch::Sender::new(0),
            last_error: LastError::new("no slot map yet"),
            wake: Notify::new(),
        });
        let task = tokio::spawn(cluster.clone().run());
        let first = async {
            let mut generation = cluster.generation.subscribe();
            if generation.wait_for(|&g| g > 0).await.is_ok() {
                let routing = cluster.routing();
                for shard in &routing.shards {
                    shard.nodes.settled().await;
                }
            }
        };
        let _ = tokio::time::timeout(wait, first).await;
        (cluster, task)
    }

    fn routing(&self) -> Arc<Routing> {
        match self.routing.read() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// A live connection to the master of `slot`.
    pub(crate) fn pick(&self, slot: u16) -> Pick {
        let routing = match self.routing.read() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        match routing.owner.get(usize::from(slot)) {
            Some(&owner) if owner != UNSERVED => match routing.shards.get(usize::from(owner)) {
                Some(shard) => shard.nodes.pick(),
                None => Pick::Down("slot map is inconsistent".into()),
            },
            _ => {
                drop(routing);
                self.hint();
                Pick::Down(format!("no known master serves slot {slot}").into())
            }
        }
    }

    /// A live connection to the master at `host:port` (a redirect's target), if it is one of
    /// the masters in the map and connected.
    pub(crate) fn link_to(&self, host: &str, port: u16) -> Option<Arc<Link>> {
        let routing = self.routing();
        let shard = routing.shards.iter().find(|s| s.endpoint.is(host, port))?;
        match shard.nodes.pick() {
            Pick::Up(link) => Some(link),
            _ => None,
        }
    }

    /// Asks for a new slot map soon.
    pub(crate) fn hint(&self) {
        self.wake.notify_one();
    }

    /// `Ready` when every slot has a master and every master answers `PING`.
    pub(crate) async fn readiness(&self, timeout: Duration) -> Readiness {
        let routing = self.routing();
        if routing.shards.is_empty() {
            return Readiness::NotReady(format!("redis cluster: {}", self.last_error.get()));
        }
        let unserved = routing.unserved();
        if unserved > 0 {
            return Readiness::NotReady(format!(
                "redis cluster: {unserved} of {SLOTS} slots have no known master"
            ));
        }
        for shard in &routing.shards {
            if let Readiness::NotReady(why) = shard.nodes.readiness(timeout).await {
                return Readiness::NotReady(format!("master {}: {why}", shard.endpoint));
            }
        }
        Readiness::Ready
    }

    async fn run(self: Arc<Self>) {
        let mut failing = false;
        loop {
            match self.fetch().await {
                Ok(ranges) => {
                    failing = false;
                    self.apply(&ranges);
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "redis cluster: no slot map");
                        failing = true;
                    }
                    self.last_error.set(error);
                }
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(REFRESH) => {}
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    }

    /// `CLUSTER SLOTS` from a connected master, else from the seeds (new connections).
    async fn fetch(&self) -> Result<Vec<SlotRange>, String> {
        let mut errors = Vec::new();
        let timeout = self.setup.connect_timeout;
        let routing = self.routing();
        for shard in &routing.shards {
            if let Pick::Up(link) = shard.nodes.pick() {
                match ask_slots(&link.conn, &shard.endpoint, timeout).await {
                    Ok(ranges) => return Ok(ranges),
                    Err(e) => errors.push(e),
                }
            }
        }
        for seed in &self.seeds {
            match dial::dial(seed, timeout).await {
                Ok((conn, driver)) => {
                    let driver = tokio::spawn(driver);
                    let asked = ask_slots(&conn, seed, timeout).await;
                    driver.abort();
                    match asked {
                        Ok(ranges) => return Ok(ranges),
                        Err(e) => errors.push(e),
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    /// Installs a new map, keeping the connections of masters that stay.
    fn apply(&self, ranges: &[SlotRange]) {
        let old = self.routing();
        let mut shards: Vec<Arc<Shard>> = Vec::new();
        let mut index: HashMap<(String, u16), u16> = HashMap::new();
        let mut owner = vec![UNSERVED; SLOTS].into_boxed_slice();
        for range in ranges {
            let key = (range.host.clone(), range.port);
            let i = match index.get(&key) {
                Some(&i) => i,
                None => {
                    let shard = match old
                        .shards
                        .iter()
                        .find(|s| s.endpoint.is(&range.host, range.port))
                    {
                        Some(s) => s.clone(),
                        None => match Endpoint::new(&range.host, range.port, self.access.clone()) {
                            Ok(endpoint) => {
                                let endpoint = Arc::new(endpoint);
                                tracing::info!(master = %endpoint, "redis cluster: connecting to a master");
                                Arc::new(Shard {
                                    nodes: NodeSet::start(
                                        Locate::Fixed(endpoint.clone()),
                                        self.setup.clone(),
                                    ),
                                    endpoint,
                                })
                            }
                            Err(e) => {
                                self.last_error.set(e);
                                continue;
                            }
                        },
                    };
                    // At most 16384 masters (one slot each), so the index fits in u16.
                    let i = u16::try_from(shards.len()).unwrap_or(UNSERVED - 1);
                    shards.push(shard);
                    index.insert(key, i);
                    i
                }
            };
            for slot in range.start..=range.end {
                if let Some(o) = owner.get_mut(usize::from(slot)) {
                    *o = i;
                }
            }
        }
        let changed = old.shards.len() != shards.len()
            || old.owner != owner
            || old
                .shards
                .iter()
                .zip(&shards)
                .any(|(a, b)| !Arc::ptr_eq(a, b));
        if changed {
            let routing = Routing { owner, shards };
            tracing::info!(
                masters = routing.shards.len(),
                unserved_slots = routing.unserved(),
                "redis cluster: slot map updated"
            );
            match self.routing.write() {
                Ok(mut r) => *r = Arc::new(routing),
                Err(p) => *p.into_inner() = Arc::new(routing),
            }
        }
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Slots `start..=end` served by the master at `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub(crate) start: u16,
    pub(crate) end: u16,
    pub(crate) host: String,
    pub(crate) port: u16,
}

async fn ask_slots(
    conn: &Conn,
    asked: &Endpoint,
    timeout: Duration,
) -> Result<Vec<SlotRange>, String> {
    let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
    match tokio::time::timeout(timeout, conn.send(&cmd)).await {
        Ok(Ok(value)) => parse_slots(&value, &asked.host).map_err(|e| format!("{asked}: {e}")),
        Ok(Err(e)) => Err(format!("{asked}: CLUSTER SLOTS: {e}")),
        Err(_) => Err(format!(
            "{asked}: no CLUSTER SLOTS reply within {timeout:?}"
        )),
    }
}

/// Parses `CLUSTER SLOTS`: `[[start, end, [host, port, id, ...], replica...], ...]`. An
/// empty host means "the node you asked" (`asked_host`).
pub(crate) fn parse_slots(value: &Value, asked_host: &str) -> Result<Vec<SlotRange>, String> {
    let items = match value {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(format!("CLUSTER SLOTS refused: {e}")),
        other => return Err(format!("CLUSTER SLOTS answered {other:?}")),
    };
    let slot = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok().filter(|&s| usize::from(s) < SLOTS),
        _ => None,
    };
    let mut ranges = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(fields) = item else {
            return Err(format!("CLUSTER SLOTS entry {item:?}"));
        };
        let (Some(start), Some(end)) =
            (fields.first().and_then(slot), fields.get(1).and_then(slot))
        else {
            return Err(format!("CLUSTER SLOTS range {fields:?}"));
        };
        if start > end {
            return Err(format!("CLUSTER SLOTS range {start}-{end}"));
        }
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(format!("CLUSTER SLOTS master of {start}-{end}"));
        };
        let host = master.first().and_then(resp::text);
        let port = match master.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok().filter(|&p| p != 0),
            _ => None,
        };
        let (Some(host), Some(port)) = (host, port) else {
            return Err(format!("CLUSTER SLOTS master of {start}-{end}: {master:?}"));
        };
        // "?" is an unknown endpoint (cluster-preferred-endpoint-type unknown-endpoint).
        if host == "?" {
            return Err(format!("slots {start}-{end}: master endpoint unknown"));
        }
        let host = if host.is_empty() {
            asked_host.to_owned()
        } else {
            host
        };
        ranges.push(SlotRange {
            start,
            end,
            host,
            port,
        });
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slot_maps_parse_with_replicas_and_empty_hosts() {
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id0")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id3")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk(""), Value::Int(7001), bulk("id1")]),
            ]),
        ]);
        let ranges = parse_slots(&v, "10.0.0.9").expect("parses");
        assert_eq!(
            ranges,
            vec![
                SlotRange {
                    start: 0,
                    end: 5460,
                    host: "127.0.0.1".into(),
                    port: 7000
                },
                SlotRange {
                    start: 5461,
                    end: 16383,
                    host: "10.0.0.9".into(),
                    port: 7001
                },
            ]
        );
    }

    #[test]
    fn malformed_slot_maps_are_refused() {
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(10),
                Value::Int(5),
                Value::Array(vec![bulk("h"), Value::Int(1)]),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(16384),
                Value::Array(vec![bulk("h"), Value::Int(1)]),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("h"), Value::Int(0)]),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("?"), Value::Int(7000)]),
            ])]),
        ] {
            assert!(parse_slots(&bad, "h").is_err(), "{bad:?}");
        }
    }
}
