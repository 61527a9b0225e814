//! Dialing one node: TCP, optional TLS, and the handshake (`AUTH`, `SELECT`), within a
//! timeout. Data connections ([`crate::connection`]), the Sentinel monitor and the cluster
//! map's seed queries all dial through [`dial`]; it takes the node and the timeout, nothing
//! else of the settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisConnectionInfo, Value};
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::tls;
use crate::wire::{Conn, Driver, WireError};

/// What every data node of a topology is reached with: credentials and database, and the TLS
/// connector when the topology speaks `rediss://`.
pub(crate) struct Access {
    pub(crate) redis: RedisConnectionInfo,
    pub(crate) tls: Option<TlsConnector>,
}

/// One node's address and how to reach it.
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) access: Arc<Access>,
    /// The name the node's certificate must carry (its host), with TLS.
    server_name: Option<ServerName<'static>>,
}

impl Endpoint {
    /// # Errors
    /// A description when TLS is on and `host` is not a valid certificate name.
    pub(crate) fn new(host: &str, port: u16, access: Arc<Access>) -> Result<Self, String> {
        let server_name = match &access.tls {
            Some(_) => Some(tls::server_name(host)?),
            None => None,
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            access,
            server_name,
        })
    }

    /// Whether this is the node at `host:port`.
    pub(crate) fn is(&self, host: &str, port: u16) -> bool {
        self.port == port && self.host == host
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A connection attempt (dial, then the checks of a new connection) that did not give a
/// usable link.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Not reachable or not usable now; try again.
    Down(String),
    /// Reachable but unusable by this build or these settings.
    Incompatible(String),
}

/// TCP, optional TLS and the handshake (AUTH/SELECT), all within `timeout`. The driver must
/// be polled (spawned) for the connection to make progress.
///
/// # Errors
/// Why there is no connection, naming the node.
pub(crate) async fn dial(endpoint: &Endpoint, timeout: Duration) -> Result<(Conn, Driver), String> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| format!("connect to {endpoint}: {e}"))?;
        // Small requests and replies: do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let (conn, mut driver) = match (&endpoint.access.tls, &endpoint.server_name) {
            (Some(connector), Some(name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| format!("TLS handshake with {endpoint}: {e}"))?;
                Conn::new(stream)
            }
            _ => Conn::tcp(stream),
        };
        // The handshake's replies arrive only while the reader runs.
        let handshake = handshake(&conn, &endpoint.access.redis);
        tokio::select! {
            done = handshake => done.map_err(|e| format!("handshake with {endpoint}: {e}"))?,
            () = &mut driver => {
                return Err(format!("handshake with {endpoint}: the connection closed"));
            }
        }
        Ok((conn, driver))
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| format!("no connection to {endpoint} within {timeout:?}"))?
}

/// `AUTH` and `SELECT` as the connection info asks (RESP2).
async fn handshake(conn: &Conn, info: &RedisConnectionInfo) -> Result<(), String> {
    if let Some(password) = info.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = info.username() {
            auth.arg(user);
        }
        auth.arg(password);
        expect_ok(conn.send(&auth).await, "AUTH")?;
    }
    if info.db() != 0 {
        let select = redis::cmd("SELECT").arg(info.db()).to_owned();
        expect_ok(conn.send(&select).await, "SELECT")?;
    }
    Ok(())
}

/// `OK`, or what `what` got instead (the refusal's code and message, never the password).
fn expect_ok(reply: Result<Value, WireError>, what: &str) -> Result<(), String> {
    match reply {
        Ok(Value::Okay) => Ok(()),
        Ok(Value::ServerError(e)) => Err(format!("{what} refused: {e}")),
        Ok(other) => Err(format!("{what}: unexpected reply {other:?}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(host: &str) -> Endpoint {
        let access = Arc::new(Access {
            redis: RedisConnectionInfo::default(),
            tls: None,
        });
        Endpoint::new(host, 6379, access).expect("no TLS: any host")
    }

    #[test]
    fn endpoints_show_ipv6_hosts_in_brackets() {
        assert_eq!(endpoint("127.0.0.1").to_string(), "127.0.0.1:6379");
        assert_eq!(endpoint("::1").to_string(), "[::1]:6379");
        assert!(endpoint("::1").is("::1", 6379));
        assert!(!endpoint("::1").is("::1", 6380));
    }

    #[test]
    fn a_refused_handshake_names_the_command_and_the_code() {
        let refused = redis::parse_redis_value(b"-WRONGPASS invalid username-password pair\r\n")
            .expect("an error reply");
        let why = expect_ok(Ok(refused), "AUTH").expect_err("refused");
        assert!(why.starts_with("AUTH refused: "), "{why}");
        assert!(why.contains("WRONGPASS"), "{why}");
        assert_eq!(expect_ok(Ok(Value::Okay), "SELECT"), Ok(()));
        let lost = expect_ok(Err(WireError::Lost("reset".into())), "SELECT");
        assert!(lost.expect_err("lost").starts_with("SELECT: "));
    }
}
