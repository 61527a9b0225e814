//! Sentinel: which node is the master of `master_name` now.
//!
//! One monitor task per provider asks the sentinels `SENTINEL GET-MASTER-ADDR-BY-NAME`, the
//! one that answered last first, every [`POLL`] and at once whenever a data connection fails.
//! Data connections are made only to the address it publishes, and are left as soon as it
//! publishes another. A connection made after a failure waits for a sentinel's answer given
//! *after* the failure ([`SentinelMonitor::fresh_master`]): an answer from before a failover
//! would lead it to the old master's address, where a restarted old master (empty, and still
//! a master until Sentinel demotes it) would take writes and restart every count. Each new connection also checks `ROLE` (a sentinel's answer can lag a
//! failover), so writes never go to a node Sentinel has demoted, and an old master that comes
//! back empty (writable for a while before Sentinel turns it into a replica) is never used.
//!
//! Sentinels authenticate with the credentials in their own URLs; data nodes with the
//! provider's `username`/`password`.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::background::LastError;
use crate::dial::{self, Access, Endpoint};
use crate::resp;
use crate::wire::Conn;

/// How often the sentinels are asked while nothing fails.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// Shortest gap between two queries, however often a failure nudges the monitor.
const MIN_GAP: Duration = Duration::from_millis(50);

/// The master Sentinel reports for one name, kept current by a background task.
pub(crate) struct SentinelMonitor {
    master_name: String,
    sentinels: Vec<Endpoint>,
    data_access: Arc<Access>,
    /// Answers so far (bumped by every answer, changed or not) and the master they name.
    current: watch::Sender<(u64, Option<Arc<Endpoint>>)>,
    last_error: LastError,
    wake: Notify,
    /// Longest wait for a sentinel: its dial, then its answer.
    timeout: Duration,
}

/// The connection to the sentinel that answered last.
struct Cached {
    index: usize,
    conn: Conn,
    driver: JoinHandle<()>,
}

impl Drop for Cached {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl SentinelMonitor {
    /// Starts the monitor task (abort the handle to stop it); each sentinel is given
    /// `timeout` to connect and again to answer.
    pub(crate) fn start(
        master_name: String,
        sentinels: Vec<Endpoint>,
        data_access: Arc<Access>,
        timeout: Duration,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let monitor = Arc::new(Self {
            master_name,
            sentinels,
            data_access,
            current: watch::Sender::new((0, None)),
            last_error: LastError::new("no sentinel asked yet"),
            wake: Notify::new(),
            timeout,
        });
        let task = tokio::spawn(monitor.clone().run());
        (monitor, task)
    }

    /// The master now; when none is known yet, waits at most `wait` for the sentinels.
    ///
    /// # Errors
    /// Why no master is known (what the sentinels answered).
    pub(crate) async fn master(&self, wait: Duration) -> Result<Arc<Endpoint>, String> {
        if let Some(master) = self.current.borrow().1.clone() {
            return Ok(master);
        }
        self.fresh_master(wait).await
    }

    /// The master named by a sentinel answer given after this call began; waits at most
    /// `wait` for one.
    ///
    /// # Errors
    /// Why no master is known (what the sentinels answered).
    pub(crate) async fn fresh_master(&self, wait: Duration) -> Result<Arc<Endpoint>, String> {
        let mut rx = self.current.subscribe();
        let seen = rx.borrow_and_update().0;
        self.nudge();
        let answered = tokio::time::timeout(
            wait,
            rx.wait_for(|(answers, master)| *answers > seen && master.is_some()),
        )
        .await;
        if let Ok(Ok(answer)) = answered
            && let Some(master) = answer.1.clone()
        {
            return Ok(master);
        }
        Err(format!(
            "sentinels name no master for {:?}: {}",
            self.master_name,
            self.last_error.get()
        ))
    }

    /// Resolves when the sentinels report a master other than `endpoint`.
    pub(crate) async fn moved_from(&self, endpoint: &Endpoint) {
        let mut rx = self.current.subscribe();
        let moved = rx
            .wait_for(|(_, m)| matches!(m, Some(m) if !m.is(&endpoint.host, endpoint.port)))
            .await
            .is_ok();
        if !moved {
            // The monitor is gone (the provider is being dropped): never resolve.
            std::future::pending::<()>().await;
        }
    }

    /// Asks the sentinels again soon (a data connection failed).
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }

    async fn run(self: Arc<Self>) {
        let mut cached: Option<Cached> = None;
        let mut failing = false;
        loop {
            match self.ask(&mut cached).await {
                Ok((host, port)) => {
                    failing = false;
                    self.publish(&host, port);
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(master = %self.master_name, %error, "no sentinel answered");
                        failing = true;
                    }
                    self.last_error.set(error);
                }
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    }

    fn publish(&self, host: &str, port: u16) {
        let same = matches!(&self.current.borrow().1, Some(m) if m.is(host, port));
        if same {
            self.current.send_modify(|(answers, _)| *answers += 1);
            return;
        }
        match Endpoint::new(host, port, self.data_access.clone()) {
            Ok(master) => {
                tracing::info!(master_name = %self.master_name, master = %master, "sentinel: master resolved");
                let master = Arc::new(master);
                self.current.send_modify(|(answers, current)| {
                    *answers += 1;
                    *current = Some(master);
                });
            }
            Err(e) => self.last_error.set(e),
        }
    }

    /// The master's address from the first sentinel that answers, starting with the one that
    /// answered last.
    async fn ask(&self, cached: &mut Option<Cached>) -> Result<(String, u16), String> {
        let n = self.sentinels.len();
        let first = cached.as_ref().map_or(0, |c| c.index);
        let mut errors = Vec::new();
        for i in 0..n {
            let index = (first + i) % n;
            let sentinel = &self.sentinels[index];
            if cached.as_ref().is_none_or(|c| c.index != index) {
                *cached = None;
                match dial::dial(sentinel, self.timeout).await {
                    Ok((conn, driver)) => {
                        *cached = Some(Cached {
                            index,
                            conn,
                            driver: tokio::spawn(driver),
                        });
                    }
                    Err(e) => {
                        errors.push(format!("sentinel {sentinel}: {e}"));
                        continue;
                    }
                }
            }
            let Some(c) = cached.as_mut() else { continue };
            let query = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master_name)
                .to_owned();
            let reply = tokio::time::timeout(self.timeout, c.conn.send(&query)).await;
            match reply {
                Ok(Ok(value)) => match parse_master(&value) {
                    Ok(addr) => return Ok(addr),
                    Err(e) => errors.push(format!("sentinel {sentinel}: {e}")),
                },
                Ok(Err(e)) => errors.push(format!("sentinel {sentinel}: {e}")),
                Err(_) => errors.push(format!(
                    "sentinel {sentinel}: no reply within {:?}",
                    self.timeout
                )),
            }
            *cached = None;
        }
        Err(errors.join("; "))
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` answers `[host, port]`, or nil for an unknown name.
fn parse_master(value: &Value) -> Result<(String, u16), String> {
    match value {
        Value::Array(items) if items.len() == 2 => {
            let host = resp::text(&items[0]).filter(|h| !h.is_empty());
            let port = resp::text(&items[1]).and_then(|p| p.parse::<u16>().ok());
            match (host, port) {
                (Some(host), Some(port)) if port != 0 => Ok((host, port)),
                _ => Err(format!("unusable master address {items:?}")),
            }
        }
        Value::Nil => Err("does not monitor this master name".to_owned()),
        Value::ServerError(e) => Err(format!("refused: {e}")),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_addresses_parse_strictly() {
        let ok = Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::BulkString(b"6380".to_vec()),
        ]);
        assert_eq!(parse_master(&ok), Ok(("127.0.0.1".to_owned(), 6380)));
        assert!(parse_master(&Value::Nil).is_err());
        for bad in [
            Value::Array(vec![Value::BulkString(b"h".to_vec())]),
            Value::Array(vec![
                Value::BulkString(b"".to_vec()),
                Value::BulkString(b"6380".to_vec()),
            ]),
            Value::Array(vec![
                Value::BulkString(b"h".to_vec()),
                Value::BulkString(b"70000".to_vec()),
            ]),
            Value::Array(vec![
                Value::BulkString(b"h".to_vec()),
                Value::BulkString(b"0".to_vec()),
            ]),
            Value::Int(1),
        ] {
            assert!(parse_master(&bad).is_err(), "{bad:?}");
        }
    }
}
