//! The checks of a new connection before it is used: the server's version, its role (a
//! master), its eviction policy, and the preload of the programs. (The ACL user's permissions
//! are checked right after, by [`crate::acl`].) Each failure says whether to try again
//! ([`Attempt::Down`]) or that this server cannot run the programs ([`Attempt::Incompatible`]).
//!
//! A least-privilege ACL user may be refused `INFO`, `ROLE`, `CONFIG GET` or `SCRIPT LOAD`:
//! each check is then skipped, never a reason to refuse the server.

use redis::Value;

use crate::dial::{Attempt, Endpoint};
use crate::resp;
use crate::script::{MIN_REDIS_VERSION, Script};
use crate::wire::Conn;

/// Every check, in order: version, role, eviction policy (refused with `strict_eviction`, a
/// warning otherwise), then `SCRIPT LOAD` of `scripts`.
///
/// # Errors
/// The first check that failed, as an [`Attempt`].
pub(crate) async fn server(
    conn: &Conn,
    endpoint: &Endpoint,
    scripts: &[&Script],
    strict_eviction: bool,
) -> Result<(), Attempt> {
    check_version(conn, scripts).await?;
    check_role(conn, endpoint).await?;
    check_eviction_policy(conn, strict_eviction).await?;
    preload(conn, scripts).await
}

/// Refuses servers older than the programs' minimum. A least-privilege ACL user may not be
/// allowed `INFO`; the check is then skipped (the programs still refuse to run on a server
/// that lacks what they use, which surfaces as `Incompatible(program)`).
async fn check_version(conn: &Conn, scripts: &[&Script]) -> Result<(), Attempt> {
    let refused = |code: &str| {
        tracing::warn!(
            code,
            "INFO refused (ACL?); skipping the server version check"
        );
        Ok(())
    };
    let info = match conn.send(redis::cmd("INFO").arg("server")).await {
        Ok(Value::ServerError(e)) => return refused(e.code()),
        Err(e) => return Err(Attempt::Down(format!("INFO server: {e}"))),
        Ok(info) => info,
    };
    let Some(text) = resp::text(&info) else {
        return Err(Attempt::Down(format!("INFO server answered {info:?}")));
    };
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("unknown")
        .to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(Attempt::Incompatible(format!(
                "unknown server version {version:?}"
            )));
        }
    };
    let needed = scripts
        .iter()
        .map(|s| s.min_redis_version)
        .max()
        .unwrap_or(MIN_REDIS_VERSION);
    if (major, minor) < needed {
        return Err(Attempt::Incompatible(format!(
            "server version {version} is older than {}.{}, the programs' minimum",
            needed.0, needed.1
        )));
    }
    Ok(())
}

/// Refuses a node that is not a master: limiter state is written, and a replica would answer
/// every program with `READONLY`. After a failover a client may still be pointed at the old
/// master, now a replica (Sentinel's answer can lag), so this is checked on every connection.
/// Where `ROLE` is not permitted (ACL) the check is skipped: a replica then answers
/// `READONLY`, which retires the connection.
async fn check_role(conn: &Conn, endpoint: &Endpoint) -> Result<(), Attempt> {
    match conn.send(&redis::cmd("ROLE")).await {
        Ok(Value::Array(items)) => match items.first().and_then(resp::text).as_deref() {
            Some("master") => Ok(()),
            Some(role) => Err(Attempt::Down(format!(
                "{endpoint} is a {role}, not a master (writes would be refused); waiting for a master"
            ))),
            None => Err(Attempt::Down(format!(
                "{endpoint}: ROLE answered {items:?}"
            ))),
        },
        Err(e) => Err(Attempt::Down(format!("ROLE: {e}"))),
        Ok(_) => {
            tracing::debug!("ROLE refused or unexpected (ACL?); role not checked");
            Ok(())
        }
    }
}

/// An `allkeys-*` eviction policy may drop limiter state under memory pressure: a dropped
/// counter starts again from zero and admits beyond the limit. `noeviction` is safe (writes are
/// refused with `OOM`, classified `Unavailable`), `volatile-*` may still evict (every limiter
/// key has a TTL) but only under pressure and nearest-expiry first. Where `CONFIG` is not
/// permitted the check is skipped.
async fn check_eviction_policy(conn: &Conn, strict: bool) -> Result<(), Attempt> {
    let reply = conn
        .send(redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"))
        .await;
    let policy = match reply {
        Ok(Value::Array(items)) | Ok(Value::Set(items)) if items.len() == 2 => match &items[1] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            _ => return Ok(()),
        },
        Ok(Value::Map(pairs)) => match pairs.first() {
            Some((_, Value::BulkString(b))) => String::from_utf8_lossy(b).into_owned(),
            _ => return Ok(()),
        },
        Err(e) => {
            return Err(Attempt::Down(format!("CONFIG GET maxmemory-policy: {e}")));
        }
        Ok(_) => {
            tracing::info!("CONFIG GET refused or unexpected (ACL?); eviction policy not checked");
            return Ok(());
        }
    };
    if policy.starts_with("allkeys-") {
        let why = format!(
            "maxmemory-policy is {policy}: under memory pressure Redis evicts limiter state \
             silently, counts restart from zero and requests are admitted beyond their limits; \
             use noeviction (or volatile-ttl)"
        );
        if strict {
            return Err(Attempt::Incompatible(format!(
                "{why} (refused: strict_eviction_policy = true)"
            )));
        }
        tracing::warn!("{why}");
    }
    Ok(())
}

/// `SCRIPT LOAD` of every program, so the first `EVALSHA` finds it. A server that forbids
/// `SCRIPT` (ACL) is fine: `NOSCRIPT` then triggers `EVAL`. A server that answers another
/// SHA1 than ours has hashed something else: unusable.
async fn preload(conn: &Conn, scripts: &[&Script]) -> Result<(), Attempt> {
    for script in scripts {
        let (name, sha1) = (script.name, script.sha1());
        match conn
            .send(redis::cmd("SCRIPT").arg("LOAD").arg(script.source))
            .await
        {
            Ok(Value::BulkString(sha)) if sha == sha1.as_bytes() => {}
            Ok(Value::BulkString(sha)) => {
                return Err(Attempt::Incompatible(format!(
                    "{}: server hashed it to {}, this build to {}",
                    name,
                    String::from_utf8_lossy(&sha),
                    sha1
                )));
            }
            Ok(Value::ServerError(e)) => {
                tracing::warn!(
                    program = name,
                    code = e.code(),
                    "SCRIPT LOAD refused; relying on EVAL"
                );
            }
            Ok(other) => {
                return Err(Attempt::Incompatible(format!(
                    "{}: SCRIPT LOAD answered {other:?}",
                    name
                )));
            }
            Err(e) => return Err(Attempt::Down(format!("SCRIPT LOAD: {e}"))),
        }
    }
    Ok(())
}
