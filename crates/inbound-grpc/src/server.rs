//! The gRPC server: `RateLimitService` and the standard health service on one HTTP/2 listener,
//! with the listener limits of `[grpc]` ([`Limits`]) and graceful shutdown.
//!
//! The listener is `inbound-listener`'s accept loop (the one the HTTP port uses) serving hyper's
//! HTTP/2 connections, not tonic's transport server, which sets no connection cap and no
//! handshake or idle timeout: with it, idle TCP connections that never sent a byte stayed open
//! forever and took every descriptor of the process. Here:
//!
//! - at most `max_connections` connections at once; at the cap the oldest connection that has
//!   not sent its handshake is closed to make room, otherwise further ones wait in the listen
//!   backlog;
//!   accept failures (out of descriptors) are retried after a backoff, logged once per 10 s;
//! - a connection must send the HTTP/2 preface and its first SETTINGS frame within
//!   `handshake_timeout`, or it is dropped;
//! - a connection with no call in flight for `idle_timeout` is sent GOAWAY (calls in flight
//!   finish) and dropped if it is still open one `idle_timeout` later;
//! - the server pings each connection every `keepalive_interval` and drops it when the ping is
//!   not answered within `keepalive_timeout` (a peer that vanished without closing);
//! - at most `max_concurrent_streams` calls in flight per connection, request headers of at
//!   most [`MAX_HEADER_LIST_BYTES`], and messages of at most `max_message_bytes`.
//!
//! The rate-limit method is served by this module rather than by the generated server of
//! `envoy-types` for one reason: the generated one decodes with a codec that reports a message
//! it cannot parse (a string that is not UTF-8, a truncated field) as `INTERNAL`, and one over
//! the size limit as `OUT_OF_RANGE`; both are the client's fault, so here both are
//! `INVALID_ARGUMENT`. Routing by path is a `match` (tonic's router would bring in a web
//! framework for two paths).

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use inbound_listener::{Activity, Admission, Handshake, IdleBy, Timeouts, Tracked};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Status};

use crate::service::RlsService;

/// The gRPC service name of Envoy's rate-limit service.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The path of its one method.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The largest request message accepted by default (bytes); larger is `INVALID_ARGUMENT`.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The largest request header list (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`): an RLS call's
/// headers are a few hundred bytes.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// The client connection preface (24 bytes) and the frame header of its first SETTINGS frame
/// (9 bytes): what a connection must send within the handshake timeout.
const HANDSHAKE_BYTES: u64 = 24 + 9;
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A fatal I/O error of the listener (failed accepts are retried, not returned).
    #[error("gRPC server: {0}")]
    Io(#[from] std::io::Error),
}

/// The listener limits of `[grpc]` (see the module docs for what each does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `grpc.max_connections`: connections served at once.
    pub max_connections: usize,
    /// `grpc.handshake_timeout`: how long a new connection has to send the HTTP/2 preface and first
    /// SETTINGS frame.
    pub handshake_timeout: Duration,
    /// `grpc.idle_timeout`: how long a connection may go without a call before it is sent GOAWAY.
    pub idle_timeout: Duration,
    /// `grpc.keepalive_interval`: how often each connection is pinged.
    pub keepalive_interval: Duration,
    /// `grpc.keepalive_timeout`: how long an unanswered ping waits before the connection is
    /// dropped.
    pub keepalive_timeout: Duration,
    /// `grpc.max_concurrent_streams`: calls in flight at once on one connection.
    pub max_concurrent_streams: u32,
    /// `grpc.max_message_bytes`: the largest request message; larger is `INVALID_ARGUMENT`.
    pub max_message_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_concurrent_streams: 128,
            max_message_bytes: MAX_MESSAGE_BYTES,
        }
    }
}

/// A prost codec whose decode errors are `INVALID_ARGUMENT`.
#[derive(Debug)]
struct RlsCodec<E, D>(PhantomData<(E, D)>);

impl<E, D> Default for RlsCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

#[derive(Debug)]
struct RlsEncoder<E>(PhantomData<E>);

#[derive(Debug)]
struct RlsDecoder<D>(PhantomData<D>);

impl<E: prost::Message + Send + 'static, D: prost::Message + Default + Send + 'static> Codec
    for RlsCodec<E, D>
{
    type Encode = E;
    type Decode = D;
    type Encoder = RlsEncoder<E>;
    type Decoder = RlsDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        RlsEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RlsDecoder(PhantomData)
    }
}

impl<E: prost::Message> Encoder for RlsEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("cannot encode the response: {e}")))
    }
}

impl<D: prost::Message + Default> Decoder for RlsDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed RateLimitRequest: {e}")))
    }
}

/// The unary method.
#[derive(Debug, Clone)]
struct ShouldRateLimit(RlsService);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<Self::Response>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let answer = service
                .should_rate_limit_from(request.get_ref(), request.metadata().as_ref())
                .await?;
            Ok(tonic::Response::new(answer))
        })
    }
}

type HealthServer =
    tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>;

/// Both services behind one `tower::Service`, by path.
#[derive(Debug, Clone)]
pub struct Routes {
    rls: RlsService,
    health: HealthServer,
    max_message_bytes: usize,
}

impl NamedService for Routes {
    const NAME: &'static str = SERVICE_NAME;
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower_service::Service<http::Request<Body>> for Routes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> BoxFuture {
        let path = request.uri().path();
        let (rls, health) = (path == SHOULD_RATE_LIMIT, path.starts_with(HEALTH_PREFIX));
        if rls {
            let method = ShouldRateLimit(self.rls.clone());
            let max_message_bytes = self.max_message_bytes;
            return Box::pin(async move {
                let mut grpc =
                    Grpc::new(RlsCodec::<RateLimitResponse, RateLimitRequest>::default())
                        // A larger message is refused by tonic before it is read (OUT_OF_RANGE,
                        // rewritten below).
                        .apply_max_message_size_config(Some(max_message_bytes), None);
                Ok(invalid_argument_for_oversize(
                    grpc.unary(method, request).await,
                ))
            });
        }
        if health {
            return tower_service::Service::call(&mut self.health, request);
        }
        let status = Status::unimplemented(format!("no method {:?}", request.uri().path()));
        Box::pin(async move { Ok(status.into_http()) })
    }
}

/// tonic refuses a message over the size limit with `OUT_OF_RANGE`; for this server it is a
/// bad request.
fn invalid_argument_for_oversize(mut response: http::Response<Body>) -> http::Response<Body> {
    let out_of_range = http::HeaderValue::from(Code::OutOfRange as i32);
    let headers = response.headers_mut();
    if headers.get(Status::GRPC_STATUS) == Some(&out_of_range) {
        headers.insert(
            Status::GRPC_STATUS,
            http::HeaderValue::from(Code::InvalidArgument as i32),
        );
    }
    response
}

/// The routes of `rls`, with a health service that reports the rate-limit service (and the
/// server, `""`) serving, refusing messages over [`MAX_MESSAGE_BYTES`].
pub async fn routes(rls: RlsService) -> Routes {
    routes_with(rls, MAX_MESSAGE_BYTES).await
}

/// [`routes`], refusing messages over `max_message_bytes`.
pub async fn routes_with(rls: RlsService, max_message_bytes: usize) -> Routes {
    let reporter = tonic_health::server::HealthReporter::new();
    reporter
        .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let health = HealthServer::new(tonic_health::server::HealthService::from_health_reporter(
        reporter,
    ));
    Routes {
        rls,
        health,
        max_message_bytes,
    }
}

/// Serves `rls` on `listener` with the default [`Limits`] until `shutdown` completes, then
/// lets calls in flight finish.
///
/// # Errors
/// [`ServeError`] when the server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    rls: RlsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_with(listener, rls, Limits::default(), shutdown).await
}

/// Serves `rls` on `listener` with `limits` until `shutdown` completes, then stops accepting,
/// sends every connection GOAWAY and returns once their calls in flight have finished.
///
/// # Errors
/// [`ServeError`] when the server fails.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    rls: RlsService,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let workers = inbound_listener::Workers::current();
    serve_on(listener, rls, limits, &workers, shutdown).await
}

/// [`serve_with`], each connection (and its calls) served on one of `workers` (thread per
/// core: [`inbound_listener::workers`]).
///
/// # Errors
/// [`ServeError`] when the server fails.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    rls: RlsService,
    limits: Limits,
    workers: &inbound_listener::Workers,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let routes = routes_with(rls, limits.max_message_bytes).await;
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    let h2 = Arc::new(h2);
    let admission = Admission {
        name: "grpc",
        max_connections: limits.max_connections,
        handshake_bytes: HANDSHAKE_BYTES,
    };
    inbound_listener::serve_on(
        listener,
        admission,
        workers,
        shutdown,
        move |stream, peer, a, stop| {
            connection(stream, peer, routes.clone(), h2.clone(), limits, a, stop)
        },
    )
    .await?;
    Ok(())
}

/// Serves one HTTP/2 connection until it ends, shutdown asks it to, or a timer closes it.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    routes: Routes,
    h2: Arc<http2::Builder<TokioExecutor>>,
    limits: Limits,
    activity: Arc<Activity>,
    stop: inbound_listener::Stop,
) {
    // Calls are small and answered at once: no Nagle delay.
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(Tracked::new(stream, activity.clone()));
    let calls = activity.clone();
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let call = calls.call();
        let mut routes = routes.clone();
        let answer = tower_service::Service::call(&mut routes, request.map(Body::new));
        async move {
            let answer = answer.await;
            drop(call);
            answer
        }
    });
    let conn = h2.serve_connection(io, service);
    let timeouts = Timeouts {
        handshake: Some(Handshake {
            within: limits.handshake_timeout,
            bytes: HANDSHAKE_BYTES,
        }),
        idle: limits.idle_timeout,
        idle_by: IdleBy::Calls,
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
