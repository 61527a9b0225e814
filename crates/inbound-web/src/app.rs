//! The reference app: the API routes, the demo upstream behind `[[routes]]`, and serving
//! with graceful shutdown.
//!
//! ## Error bodies
//!
//! Every error the app answers is `application/problem+json` (RFC 9457): the handlers' own,
//! and those the framework would write otherwise, which [`Hygiene`](crate::hygiene::Hygiene)
//! rewrites: 405 (empty in axum; `Allow` kept), extractor rejections such as 400 for a path
//! parameter that is not UTF-8 (text/plain in axum). The same layer bounds the request body on
//! every route (413 over `http.max_body_bytes`, 408 for a body that stalls; see
//! [`crate::hygiene`]) and the request head, before routing and before the rate limiter: a
//! request target over
//! [`MAX_URI_BYTES`](crate::hygiene::MAX_URI_BYTES) is 414, a header section over
//! [`MAX_HEADER_BYTES`](crate::hygiene::MAX_HEADER_BYTES) is 431, both problem+json and
//! charged nothing.
//!
//! What the app never sees, hyper answers itself with a status line and an empty body: a
//! request target over 65,534 bytes (414), a head over hyper's read buffer of 417,792 bytes or
//! with more than 100 header fields (431), and a request line or header field that does not
//! parse (400). Those limits lie above the app's, so only requests that were refused in any
//! case get an empty body.

use std::net::SocketAddr;
use std::sync::Arc;

use app_bootstrap::{HttpSettings, RouteSettings};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{Extensions, HeaderValue, Request, header};
use axum::response::Response;
use axum::routing::{delete, get, post};
use edge_middleware::{ConcurrencyLayer, RateLimitLayer, problem};
use shared_contract::AlgorithmKind;
use tower::ServiceExt as _;

use crate::api;
use crate::gates::GateApi;
use crate::listener::CurrentRouter;
use crate::state::ApiState;

/// The peer address [`serve`] records for each connection, for `ip` subjects.
fn peer_ip(extensions: &Extensions) -> Option<std::net::IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

/// The demo upstream: 200 `{"ok":true}` on every path below a configured prefix.
fn upstream(
    prefixes: Arc<Vec<String>>,
) -> impl Fn(Request<Body>) -> std::future::Ready<Result<Response, std::convert::Infallible>> + Clone
{
    move |req: Request<Body>| {
        let path = req.uri().path();
        let served = prefixes
            .iter()
            .any(|p| crate::telemetry::lies_under(path, p));
        let r = if served {
            let mut r = Response::new(Body::from(r#"{"ok":true}"#));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        } else {
            problem::not_found()
        };
        std::future::ready(Ok(r))
    }
}

/// The app's router. Rate limiting applies to the demo upstream's `routes` (when enabled);
/// the API routes are never limited by the middleware.
pub fn router(state: Arc<ApiState>, routes: &[RouteSettings]) -> Router {
    router_with_gates(state, routes, Arc::new(GateApi::new(None)))
}

/// [`router`] plus the event-gate routes of `gates`.
pub fn router_with_gates(
    state: Arc<ApiState>,
    routes: &[RouteSettings],
    gates: Arc<GateApi>,
) -> Router {
    let prefixes = Arc::new(
        routes
            .iter()
            .map(|r| r.path_prefix.clone())
            .collect::<Vec<_>>(),
    );
    let demo = tower::service_fn(upstream(prefixes));
    let api = Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", {
            let gates = gates.runtime().cloned();
            get(move |State(s): State<Arc<ApiState>>| api::readyz(s, gates.clone()))
        })
        .route("/metrics", get(api::metrics))
        .route("/openapi.json", get(crate::openapi::document))
        .route("/v1/config", get(crate::api::config))
        .route("/v1/evaluate", post(api::evaluate))
        .route("/v1/leases", post(crate::leases::acquire))
        .route("/v1/leases/{lease_id}", delete(crate::leases::release))
        .route("/v1/reservations", post(crate::reservations::reserve))
        .route(
            "/v1/reservations/{reservation_id}/settle",
            post(crate::reservations::settle),
        )
        .route(
            "/v1/reservations/{reservation_id}",
            delete(crate::reservations::cancel),
        );
    let api = match state.limiter() {
        Some(limiter) => {
            let default = limiter.policies().default_id().clone();
            // Routes naming a concurrency policy hold a lease (outside, so that a lease
            // denial charges no rate limit); the others are rate limits.
            let (leases, rates): (Vec<_>, Vec<_>) =
                routes.iter().map(|r| r.rule(&default)).partition(|rule| {
                    limiter
                        .policies()
                        .get(rule.policy())
                        .is_some_and(|p| p.kind() == AlgorithmKind::Concurrency)
                });
            let layer = RateLimitLayer::new(limiter.clone(), rates).with_peer_ip(peer_ip);
            if leases.is_empty() {
                // No route holds a lease: no lease layer, whose pass-through would still box
                // each request's future.
                return api
                    .fallback_service(tower::ServiceBuilder::new().layer(layer).service(demo))
                    .with_state(state)
                    .merge(crate::gates::router(gates));
            }
            let spawner: edge_middleware::concurrency::Spawner = Arc::new(|task| {
                tokio::spawn(task);
            });
            let concurrency = ConcurrencyLayer::new(limiter.clone(), leases)
                .with_peer_ip(peer_ip)
                .with_spawner(spawner);
            api.fallback_service(
                tower::ServiceBuilder::new()
                    .layer(concurrency)
                    .layer(layer)
                    .service(demo),
            )
        }
        None => api.fallback_service(demo.map_err(|e: std::convert::Infallible| e)),
    };
    api.with_state(state).merge(crate::gates::router(gates))
}

/// Serves `router` on `listener` with the `[http]` limits of `http` (timeouts, connection
/// cap, body limit: [`crate::listener`]; each connection's service is wrapped in
/// [`Hygiene`](crate::hygiene::Hygiene): the head bounds and problem+json for the
/// framework's errors) until `shutdown` resolves, then drains in-flight requests.
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    http: &HttpSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_current(listener, CurrentRouter::new(router), http, shutdown).await
}

/// [`serve`] through `router`, whose router a reload replaces: each request is routed by
/// the one in force when it started.
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve_current(
    listener: tokio::net::TcpListener,
    router: CurrentRouter,
    http: &HttpSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let workers = inbound_listener::Workers::current();
    serve_current_on(listener, router, http, &workers, shutdown).await
}

/// [`serve_current`], each connection served on one of `workers` (thread per core:
/// [`inbound_listener::workers`]).
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve_current_on(
    listener: tokio::net::TcpListener,
    router: CurrentRouter,
    http: &HttpSettings,
    workers: &inbound_listener::Workers,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::listener::serve(listener, router, http.into(), workers, shutdown).await
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on the
/// first of them.
///
/// Installing happens before the server says it is listening: a handler registered lazily,
/// on the future's first poll, would leave a window in which SIGTERM still kills the process
/// with the default action instead of draining it.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
            tracing::info!("shutdown signal received; draining in-flight requests");
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received; draining in-flight requests");
    }
}
