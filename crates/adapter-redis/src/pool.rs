//! The connections of one provider in its topology, and the one way a program is run on them.
//!
//! | topology | connections | where a call goes |
//! | --- | --- | --- |
//! | standalone | `connections` to `url` | there |
//! | sentinel | `connections` to the master Sentinel reports now | there; left on failover |
//! | cluster | `connections` to each master in the slot map | the master of the key's slot |
//!
//! [`Pool::run_script`] is shared by the rate-limit and the gate provider. It sends a program
//! with `EVALSHA`, and sends it again only when the server's reply proves it did not run:
//! `NOSCRIPT` (then `EVAL` of the exact source), `MOVED` (to the named master) or `ASK`
//! (`ASKING` + the program, in one write, to the named node). A timeout, a lost connection or
//! any other reply is final, so every program runs at most once. With `min_replicas_ack` the
//! program's reply is followed by a `WAIT n timeout` shared with the other calls of its
//! connection (group commit, see `connection::AckGroups`), and the reply says how many
//! replicas acknowledged it.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};
use shared_contract::{Deadline, IncompatibleCategory, Readiness, UnavailableCategory};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::acl::Needs;

use crate::background::Tasks;
use crate::cluster::Cluster;
use crate::connection::{Link, Locate, NodeSet, Pick, Setup};
use crate::failure::{self, Failure};
use crate::placement::Placement;
use crate::script::{Script, ScriptArgs};
use crate::sentinel::SentinelMonitor;
use crate::settings::{RedisSettings, Resolved};
use crate::wire::WireError;

/// Redirects followed for one call (a slot moves at most once in a call's lifetime; the
/// second hop covers an `ASK` during a migration that a `MOVED` led to).
const MAX_REDIRECTS: usize = 2;

/// The masters calls go to, by topology.
enum Masters {
    /// Standalone, or Sentinel (the node set follows the monitor).
    Single {
        nodes: NodeSet,
        monitor: Option<Arc<SentinelMonitor>>,
    },
    Cluster(Arc<Cluster>),
}

/// The supervised connections of one provider (rate limits or event gates).
pub(crate) struct Pool {
    masters: Masters,
    /// `WAIT <replicas> <ms>` after each program, when `min_replicas_ack` is set.
    wait: Option<(u32, u64)>,
    /// The `max_in_flight` bound.
    admission: Semaphore,
    /// Whether the connections are spread over serving threads ([`Placement`]).
    placed: bool,
    /// `max_in_flight`, to tell how many calls hold a place.
    max_in_flight: usize,
    _tasks: Tasks,
}

/// A program's reply and, with `min_replicas_ack`, how many replicas acknowledged it.
pub(crate) struct ScriptReply {
    pub(crate) value: Value,
    pub(crate) replicas_acked: Option<u64>,
}

impl ScriptReply {
    /// Whether the writes of this call reached the replicas `min_replicas_ack` asks for
    /// (always true when it is off).
    pub(crate) fn durable(&self, wanted: u32) -> bool {
        self.replicas_acked
            .is_none_or(|acked| acked >= u64::from(wanted))
    }
}

impl Pool {
    /// Starts the connections to the `resolved` topology of `settings` (and the Sentinel
    /// monitor or the cluster map), each preloaded with `scripts` and checked for what the
    /// ACL user `needs`, and waits at most about `connect_timeout` for the first attempts. An
    /// unreachable server is not an error.
    pub(crate) async fn start(
        settings: &RedisSettings,
        resolved: Resolved,
        scripts: Vec<&'static Script>,
        needs: Needs,
        placement: Placement,
    ) -> Self {
        let placed = !placement.is_empty();
        let setup = Arc::new(Setup::new(settings, scripts, needs, placement));
        let wait = (settings.min_replicas_ack > 0).then(|| {
            let ms = (settings.command_timeout / 2).as_millis().max(1);
            (
                settings.min_replicas_ack,
                u64::try_from(ms).unwrap_or(u64::MAX),
            )
        });
        let settle = settings.connect_timeout + Duration::from_millis(100);
        let (masters, tasks) = match resolved {
            Resolved::Standalone(endpoint) => {
                let nodes = NodeSet::start(Locate::Fixed(Arc::new(endpoint)), setup);
                let _ = tokio::time::timeout(settle, nodes.settled()).await;
                (
                    Masters::Single {
                        nodes,
                        monitor: None,
                    },
                    Vec::new(),
                )
            }
            Resolved::Sentinel {
                master_name,
                sentinels,
                access,
            } => {
                let (monitor, task) = SentinelMonitor::start(
                    master_name,
                    sentinels,
                    access,
                    settings.connect_timeout,
                );
                let nodes = NodeSet::start(Locate::Sentinel(monitor.clone()), setup);
                let _ = tokio::time::timeout(settle, nodes.settled()).await;
                (
                    Masters::Single {
                        nodes,
                        monitor: Some(monitor),
                    },
                    vec![task],
                )
            }
            Resolved::Cluster { seeds, access } => {
                let seeds = seeds.into_iter().map(Arc::new).collect();
                let (cluster, task) = Cluster::start(seeds, access, setup).await;
                (Masters::Cluster(cluster), vec![task])
            }
        };
        Self {
            masters,
            wait,
            admission: Semaphore::new(settings.max_in_flight),
            placed,
            max_in_flight: settings.max_in_flight,
            _tasks: Tasks(tasks),
        }
    }

    /// Admits one call that must be answered within `timeout` before `deadline`: the permit
    /// holds its place under `max_in_flight` until dropped. Nothing is sent either way.
    ///
    /// # Errors
    /// `Deadline` when the caller would give up before the command timeout (the provider
    /// does not start a command it may have to abandon), `Admission` when `max_in_flight`
    /// calls are already in flight.
    pub(crate) fn admit(
        &self,
        deadline: Deadline,
        timeout: Duration,
    ) -> Result<SemaphorePermit<'_>, UnavailableCategory> {
        if deadline.remaining_from(std::time::Instant::now()) < timeout {
            return Err(UnavailableCategory::Deadline);
        }
        self.admission
            .try_acquire()
            .map_err(|_| UnavailableCategory::Admission)
    }

    /// How many calls hold a place under `max_in_flight` now (admitted, not yet answered).
    pub(crate) fn in_flight(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.admission.available_permits())
    }

    /// A live connection for a call on `slot` (the slot matters only on a cluster).
    pub(crate) fn pick(&self, slot: u16) -> Pick {
        match &self.masters {
            Masters::Single { nodes, .. } => nodes.pick(),
            Masters::Cluster(cluster) => cluster.pick(slot),
        }
    }

    /// Whether the connections are spread over serving threads, each with its own
    /// ([`Placement`]).
    pub(crate) fn is_placed(&self) -> bool {
        self.placed
    }

    /// Whether calls go to a Redis Cluster (where one call's keys must share a slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.masters, Masters::Cluster(_))
    }

    /// `Ready` when a call can be made now (on a cluster: on every slot).
    pub(crate) async fn readiness(&self, timeout: Duration) -> Readiness {
        match &self.masters {
            Masters::Single { nodes, .. } => nodes.readiness(timeout).await,
            Masters::Cluster(cluster) => cluster.readiness(timeout).await,
        }
    }

    /// The topology may have changed: ask Sentinel or the cluster again soon.
    fn hint(&self) {
        match &self.masters {
            Masters::Single {
                monitor: Some(m), ..
            } => m.nudge(),
            Masters::Single { monitor: None, .. } => {}
            Masters::Cluster(cluster) => cluster.hint(),
        }
    }

    fn link_to(&self, host: &str, port: u16) -> Option<Arc<Link>> {
        match &self.masters {
            Masters::Cluster(cluster) => cluster.link_to(host, port),
            // A standalone or Sentinel master is not a cluster node: nothing to follow.
            Masters::Single { .. } => None,
        }
    }

    /// Runs `script` with `args` on the master of `slot` within `timeout`. See the module
    /// docs for what is sent again. With `min_replicas_ack`, only a reply for which
    /// [`ScriptArgs::needs_ack`] holds waits for the replicas.
    ///
    /// # Errors
    /// What the failure means for the state ([`Failure`]); never `NoScript`.
    pub(crate) async fn run_script(
        &self,
        script: &Script,
        slot: u16,
        args: &dyn ScriptArgs,
        timeout: Duration,
    ) -> Result<ScriptReply, Failure> {
        let mut link = self.link(slot)?;
        let deadline = Instant::now() + timeout;
        let mut eval = false;
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let sent =
                tokio::time::timeout_at(deadline, self.send(&link, script, eval, args, asking))
                    .await;
            let (first, replicas_acked) = match sent {
                Err(_elapsed) => {
                    link.timed_out();
                    return Err(Failure::Indeterminate);
                }
                Ok(Err(e)) => return Err(failure::transport(&e)),
                Ok(Ok(values)) => {
                    link.replied();
                    values
                }
            };
            if let Value::ServerError(e) = &first {
                match e.code() {
                    "MOVED" | "ASK" if redirects < MAX_REDIRECTS => {
                        self.hint();
                        redirects += 1;
                        let target = e.details().and_then(redirect_target);
                        match target.and_then(|(host, port)| self.link_to(host, port)) {
                            Some(next) => {
                                link = next;
                                asking = e.code() == "ASK";
                                continue;
                            }
                            // Not a connected master (yet): nothing ran, try later.
                            None => return Err(Failure::Unavailable(UnavailableCategory::Server)),
                        }
                    }
                    "READONLY" => {
                        // This node was demoted; the supervisor finds the new master.
                        link.retire("the node answered READONLY (no longer a master)");
                        self.hint();
                    }
                    "CLUSTERDOWN" | "TRYAGAIN" => self.hint(),
                    _ => {}
                }
            }
            match failure::of_reply(first) {
                Ok(value) => {
                    return Ok(ScriptReply {
                        value,
                        replicas_acked,
                    });
                }
                Err(Failure::NoScript) if !eval => {
                    tracing::info!(
                        program = script.name,
                        "NOSCRIPT: sending the exact source with EVAL"
                    );
                    eval = true;
                }
                // The server just refused the source it was sent: it cannot run it.
                Err(Failure::NoScript) => {
                    return Err(Failure::Incompatible(IncompatibleCategory::Program));
                }
                Err(f) => return Err(f),
            }
        }
    }

    /// Sends one call of `script` on `link` (preceded by `ASKING` in the same write when
    /// asked); the program's reply and, with `min_replicas_ack`, how many replicas
    /// acknowledged it.
    async fn send(
        &self,
        link: &Link,
        script: &Script,
        eval: bool,
        args: &dyn ScriptArgs,
        asking: bool,
    ) -> Result<(Value, Option<u64>), WireError> {
        let write = |out: &mut Vec<u8>| script.write_call(out, eval, args);
        let value = if asking {
            link.conn
                .call(
                    |out| {
                        out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                        write(out);
                    },
                    1,
                )
                .await?
        } else {
            link.conn.call(write, 0).await?
        };
        let acked = match self.wait {
            // An error reply wrote nothing to wait for.
            Some((replicas, ms))
                if !matches!(value, Value::ServerError(_)) && args.needs_ack(&value) =>
            {
                Some(link.replicas_acked(replicas, ms).await)
            }
            _ => None,
        };
        Ok((value, acked))
    }

    /// Sends one plain command (a read) to the master of `slot` within `timeout`. Nothing is
    /// sent again: a redirect is `Unavailable(server)` (and refreshes the topology).
    ///
    /// # Errors
    /// What the failure means ([`Failure`]).
    pub(crate) async fn run_command(
        &self,
        cmd: &Cmd,
        slot: u16,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let link = self.link(slot)?;
        let call = link.conn.call(|out| cmd.write_packed_command(out), 0);
        match tokio::time::timeout(timeout, call).await {
            Err(_elapsed) => {
                link.timed_out();
                Err(Failure::Indeterminate)
            }
            Ok(Err(e)) => Err(failure::transport(&e)),
            Ok(Ok(value)) => {
                link.replied();
                if let Value::ServerError(e) = &value {
                    match e.code() {
                        "READONLY" => {
                            link.retire("the node answered READONLY (no longer a master)");
                            self.hint();
                        }
                        "MOVED" | "ASK" | "CLUSTERDOWN" | "TRYAGAIN" => self.hint(),
                        _ => {}
                    }
                }
                failure::of_reply(value)
            }
        }
    }

    /// A live link for `slot`, or the failure that says why there is none (nothing sent).
    fn link(&self, slot: u16) -> Result<Arc<Link>, Failure> {
        match self.pick(slot) {
            Pick::Up(link) => Ok(link),
            Pick::Down(_) => {
                self.hint();
                Err(Failure::Unavailable(UnavailableCategory::Connect))
            }
            Pick::Incompatible(_) => Err(Failure::Incompatible(IncompatibleCategory::Program)),
        }
    }
}

/// `MOVED`/`ASK` details: `<slot> <host>:<port>` (an IPv6 host keeps its colons).
fn redirect_target(details: &str) -> Option<(&str, u16)> {
    let (_slot, addr) = details.trim().split_once(' ')?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_targets_parse() {
        assert_eq!(
            redirect_target("3999 127.0.0.1:6381"),
            Some(("127.0.0.1", 6381))
        );
        assert_eq!(redirect_target("1 ::1:7000"), Some(("::1", 7000)));
        assert_eq!(redirect_target("1 [::1]:7000"), Some(("::1", 7000)));
        assert_eq!(redirect_target("garbage"), None);
        assert_eq!(redirect_target("1 host:port"), None);
    }

    #[test]
    fn durability_needs_the_asked_replicas() {
        let reply = |acked| ScriptReply {
            value: Value::Nil,
            replicas_acked: acked,
        };
        assert!(reply(None).durable(1));
        assert!(reply(Some(1)).durable(1));
        assert!(reply(Some(2)).durable(1));
        assert!(!reply(Some(0)).durable(1));
    }
}
