//! The gRPC server: `RateLimitService` and the standard health service on one HTTP/2 listener,
//! with graceful shutdown.
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
use std::task::{Context, Poll};

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
/// The largest request message accepted (bytes); larger is `INVALID_ARGUMENT`.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
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
            return Box::pin(async move {
                let mut grpc =
                    Grpc::new(RlsCodec::<RateLimitResponse, RateLimitRequest>::default())
                        // A larger message is refused by tonic before it is read (OUT_OF_RANGE,
                        // rewritten below).
                        .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), None);
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
/// server, `""`) serving.
pub async fn routes(rls: RlsService) -> Routes {
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
    Routes { rls, health }
}

/// Serves `rls` on `listener` until `shutdown` completes, then lets calls in flight finish.
///
/// # Errors
/// [`ServeError`] when the server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    rls: RlsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let routes = routes(rls).await;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(routes, incoming, shutdown)
        .await?;
    Ok(())
}
