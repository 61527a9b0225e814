//! The HTTP/1.1 listener: its own accept loop on hyper, with the `[http]` limits.
//!
//! - **Header-read timeout**: a connection that has not sent a complete request head
//!   `header_read_timeout` after it was accepted, or after its previous response, is closed
//!   (hyper's HTTP/1 timer; slowloris clients hold a descriptor for that long at most).
//! - **Idle timeout**: a connection with no byte read or written for `idle_timeout` (checked
//!   every quarter of it) is shut down gracefully: at once when no request is in flight, after
//!   its response otherwise; if it is still open and silent one more `idle_timeout` later, it
//!   is dropped.
//! - **Connection cap**: at most `max_connections` connections are served at once. At the
//!   cap, the oldest connection that has not sent a byte is closed to make room for the next
//!   client; when all have spoken, the loop accepts the next one only when one has closed, so
//!   further clients wait in the kernel's listen backlog (queued, not refused) and the loop
//!   never spins on them.
//! - **Out of descriptors**: an `accept` that fails (EMFILE and the like) is retried after
//!   [`inbound_listener::ACCEPT_BACKOFF`]; the connections already open keep being served;
//!   the failure is logged at most once per [`inbound_listener::LOG_INTERVAL`], with the
//!   count of failures since the last line.
//!
//! The accept loop and the timers are `inbound-listener`'s, shared with the gRPC listener;
//! this module is the HTTP/1 part (hyper's connection, the router, the hygiene layer with the
//! body limit).
//!
//! WebSocket upgrades work as with `axum::serve`: an upgraded connection leaves the
//! listener (and its cap and timers) once the upgrade is done. On shutdown the loop stops
//! accepting, every connection is shut down gracefully (in-flight requests finish), and
//! [`serve`] returns once all are closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::HttpSettings;
use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use inbound_listener::{Activity, Admission, IdleBy, Stop, Timeouts, Tracked, Workers};
use tokio::net::TcpStream;
use tower::{Layer as _, Service as _};

use crate::hygiene::{AtHead, HygieneLayer};

/// The router in force: the hygiene layer takes it when a request's head arrives
/// ([`crate::hygiene::AtHead`]), so each request is routed by the router in force when it
/// started. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CurrentRouter(Arc<ArcSwap<Router>>);

impl CurrentRouter {
    /// A current router with `router` in force.
    pub fn new(router: Router) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(router)))
    }

    /// The router in force now.
    pub fn in_force(&self) -> Router {
        Router::clone(&self.0.load())
    }

    /// Puts `router` in force for the requests that start from now on.
    pub fn replace(&self, router: Router) {
        self.0.store(Arc::new(router));
    }
}

impl AtHead for CurrentRouter {
    fn at_head(&self) -> Router {
        self.in_force()
    }
}

/// The listener limits of `[http]`: timeouts, the connection cap, and the body limit that
/// [`HygieneLayer`] applies to every route.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `http.header_read_timeout`: how long a connection has to send a request head, and a body
    /// from the end of its head.
    pub header_read_timeout: Duration,
    /// `http.idle_timeout`: how long a connection may stay silent before it is shut down.
    pub idle_timeout: Duration,
    /// `http.max_connections`: connections served at once.
    pub max_connections: usize,
    /// `http.max_body_bytes`: the largest request body read; larger is 413.
    pub max_body_bytes: usize,
}

impl From<&HttpSettings> for Limits {
    fn from(s: &HttpSettings) -> Self {
        Self {
            header_read_timeout: s.header_read_timeout,
            idle_timeout: s.idle_timeout,
            max_connections: s.max_connections,
            max_body_bytes: s.max_body_bytes,
        }
    }
}

/// Serves `router` on `listener` with `limits` until `shutdown` resolves, then drains; each
/// connection on one of `workers` ([`inbound_listener::workers`]).
///
/// # Errors
/// None today (accept failures are retried); the type leaves room for fatal ones.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: CurrentRouter,
    limits: Limits,
    workers: &Workers,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let admission = Admission {
        name: "http",
        max_connections: limits.max_connections,
        // A connection that has sent a byte has begun its request: it is not closed to make
        // room (hyper's header-read timeout bounds it).
        handshake_bytes: 1,
    };
    inbound_listener::serve_on(
        listener,
        admission,
        workers,
        shutdown,
        move |stream, peer, a, stop| connection(stream, peer, router.clone(), limits, a, stop),
    )
    .await
}

/// Serves one connection until it ends, shutdown asks it to, or it stays silent too long.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: CurrentRouter,
    limits: Limits,
    activity: Arc<Activity>,
    stop: Stop,
) {
    let io = TokioIo::new(Tracked::new(stream, activity.clone()));
    // Wrapped once per connection, not per request: a `Router::layer` would box and clone
    // each route's service on every request.
    let app = HygieneLayer::new(limits.max_body_bytes, limits.header_read_timeout).layer(router);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        // The router boxes the body the same way on its own; done here once instead.
        app.clone().call(req.map(Body::new))
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(io, service)
        .with_upgrades();
    let timeouts = Timeouts {
        // hyper's header-read timeout is the handshake of HTTP/1.
        handshake: None,
        idle: limits.idle_timeout,
        idle_by: IdleBy::Io,
    };
    inbound_listener::supervise(
        conn,
        |c| c.graceful_shutdown(),
        peer,
        &activity,
        timeouts,
        stop,
    )
    .await;
}
