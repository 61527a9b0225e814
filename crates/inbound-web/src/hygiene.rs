//! The app's outermost layer: bounds the request head and body, and turns the framework's own
//! error responses (axum's empty 405, its text/plain extractor rejections) into problem+json.
//!
//! It is a plain tower service with a nameable future, put around each connection's service
//! by the listener (`crate::listener`) rather than through `Router::layer` or
//! `axum::middleware::from_fn` and `map_response`: those box a future and clone a service per
//! request. As
//! `from_fn`/`map_response` the two checks cost 1.16x the server CPU per `/v1/evaluate`
//! request; as a `Router::layer`, 3 allocations and about 1,900 instructions per request
//! (callgrind). Around the connection they add a header walk and a status check; only a
//! response it rewrites allocates.
//!
//! ## The body limit, on every route
//!
//! `http.max_body_bytes` holds for every route, the limited ones (the middleware over the
//! demo upstream, which never reads a body) as much as the API's, and is checked here, before
//! routing, the lease layer and the rate limiter, so that a refused body is charged nothing:
//!
//! - a declared `Content-Length` over the limit is 413 at once, from the head, without
//!   waiting for a byte of the body;
//! - any other body (a `Content-Length` within the limit, or chunked) is read here, in full,
//!   before the request goes on: more bytes than the limit is 413 as soon as they arrive;
//!   a body not complete [`Hygiene`]'s body timeout after the head (the listener passes
//!   `http.header_read_timeout`: a head and then a body get the same bound each) is 408;
//!   a body that fails to arrive (the client reset) is 400. All three are problem+json with
//!   `Connection: close` (the rest of the body is not read).
//!
//! A request without a body (`GET`, `Content-Length: 0`) passes as before, at no cost; one
//! with a body costs a boxed future and, unless it arrived in one piece, a copy: bodies are
//! at most `max_body_bytes` (64 KiB by default), and every API route reads its body whole
//! anyway.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use edge_middleware::problem;
use futures::StreamExt as _;
use futures::future::{BoxFuture, Either, FutureExt as _, Map};
use tower::{Layer, Service};

/// Longest request target (path and query) the app reads; longer is 414. As nginx's default
/// (`large_client_header_buffers 4 8k`).
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Largest header section the app reads (names, values and 4 bytes of `: ` and CRLF per
/// field); larger is 431. As nginx's default: four buffers of 8 KiB.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Most bytes of a framework error's text kept as the problem's `detail`.
const DETAIL_BYTES: usize = 1024;

/// The layer; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct HygieneLayer {
    max_body_bytes: usize,
    body_timeout: Duration,
}

impl HygieneLayer {
    /// Bodies of at most `max_body_bytes`, complete within `body_timeout` of the head.
    pub fn new(max_body_bytes: usize, body_timeout: Duration) -> Self {
        Self {
            max_body_bytes,
            body_timeout,
        }
    }
}

impl<S> Layer<S> for HygieneLayer {
    type Service = Hygiene<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Hygiene {
            inner,
            limits: *self,
        }
    }
}

/// The service of [`HygieneLayer`].
#[derive(Debug, Clone)]
pub struct Hygiene<S> {
    inner: S,
    limits: HygieneLayer,
}

type Answer = Result<Response, Infallible>;
type Checked<F> = Map<F, fn(Answer) -> Answer>;
/// The service a request is handed to: the router under the body limit of extractors.
type Limited = <DefaultBodyLimit as Layer<Router>>::Service;
type LimitedFuture = <Limited as Service<Request<Body>>>::Future;

/// Where requests go: the router that serves a request is taken when its head has arrived,
/// before its body is read, so that a reload landing while the body arrives does not change
/// it (each request is routed by the router in force when it started).
pub trait AtHead {
    /// The router for a request whose head has just arrived.
    fn at_head(&self) -> Router;
}

impl AtHead for Router {
    fn at_head(&self) -> Router {
        self.clone()
    }
}

impl<S: AtHead> Service<Request<Body>> for Hygiene<S> {
    type Response = Response;
    type Error = Infallible;
    /// At once (a refusal), the inner service's (no body), or the body read first.
    type Future = Either<Ready<Answer>, Either<Checked<LimitedFuture>, BoxFuture<'static, Answer>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The service of each request is taken in `call`, and is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if let Some(refusal) = refused_head(&req) {
            return Either::Left(ready(Ok(refusal)));
        }
        let max = self.limits.max_body_bytes;
        // Extractors get the same limit (their own default is 2 MB).
        let mut service = DefaultBodyLimit::max(max).layer(self.inner.at_head());
        let body = req.body();
        if body.is_end_stream() {
            return Either::Right(Either::Left(
                service.call(req).map(check_response as fn(_) -> _),
            ));
        }
        // A declared length (hyper's exact hint from `Content-Length`) over the limit.
        let declared = body.size_hint().lower();
        if declared > max as u64 {
            return Either::Left(ready(Ok(too_large(&format!(
                "the body is {declared} bytes (Content-Length), at most {max} are read"
            )))));
        }
        let timeout = self.limits.body_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        Either::Right(Either::Right(Box::pin(async move {
            let (parts, body) = req.into_parts();
            let read = tokio::time::timeout_at(deadline, read_body(body, max)).await;
            let body = match read {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(refusal)) => return Ok(refusal),
                Err(_) => {
                    return Ok(closing(problem::about_blank(
                        StatusCode::REQUEST_TIMEOUT,
                        None,
                        Some(&format!(
                            "the body was not complete {} after the request head",
                            humantime::format_duration(timeout)
                        )),
                    )));
                }
            };
            let answer = service
                .call(Request::from_parts(parts, Body::from(body)))
                .await;
            check_response(answer)
        })))
    }
}

/// `body` whole, or the refusal: 413 once more than `max` bytes arrived, 400 when it could
/// not be read.
async fn read_body(body: Body, max: usize) -> Result<Bytes, Response> {
    let mut chunks = body.into_data_stream();
    // The usual body arrives in one chunk, which is kept as it is; more are copied into one.
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            closing(problem::about_blank(
                StatusCode::BAD_REQUEST,
                None,
                Some(&format!("the body could not be read: {e}")),
            ))
        })?;
        total = total.saturating_add(chunk.len());
        if total > max {
            return Err(too_large(&format!(
                "the body is longer than the limit of {max} bytes"
            )));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(chunk),
            Some(earlier) => {
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&chunk);
            }
            None => joined.extend_from_slice(&chunk),
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// 413 problem+json (`content_too_large`), closing the connection.
fn too_large(detail: &str) -> Response {
    closing(problem::about_blank(
        StatusCode::PAYLOAD_TOO_LARGE,
        None,
        Some(detail),
    ))
}

/// `response` with `Connection: close`: the rest of the request's body is never read.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The refusal of a request whose head is over the app's bounds, if it is.
fn refused_head(req: &Request<Body>) -> Option<Response> {
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_URI_BYTES {
        let detail =
            format!("the request target is {target} bytes, at most {MAX_URI_BYTES} are read");
        return Some(problem::about_blank(
            StatusCode::URI_TOO_LONG,
            None,
            Some(&detail),
        ));
    }
    let head: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if head > MAX_HEADER_BYTES {
        let detail =
            format!("the header section is {head} bytes, at most {MAX_HEADER_BYTES} are read");
        return Some(problem::about_blank(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            None,
            Some(&detail),
        ));
    }
    None
}

/// Passes a response on, or rewrites one the framework wrote (an error status with no content
/// type, or text/plain) as problem+json.
fn check_response(answer: Answer) -> Answer {
    let Ok(response) = answer;
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    if (status.is_client_error() || status.is_server_error()) && plain {
        Ok(framework_problem(response))
    } else {
        Ok(response)
    }
}

/// The framework's error `response` as problem+json of the same status, its text as `detail`,
/// its other headers (`Allow`, ...) kept. The framework's error bodies are whole strings in
/// memory, so the text is taken without waiting; a body that is not ready at once (none the
/// framework writes) gives no `detail`. Staying synchronous keeps the layer's future free of
/// a boxed `dyn Future`.
fn framework_problem(response: Response) -> Response {
    let status = response.status();
    let (mut parts, body) = response.into_parts();
    // Rejection texts are one line; a longer body is not one, and is dropped.
    let text = axum::body::to_bytes(body, DETAIL_BYTES)
        .now_or_never()
        .and_then(Result::ok)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let detail = Some(text.trim()).filter(|t| !t.is_empty());
    let problem: Response = problem::about_blank(status, None, detail);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(problem::CONTENT_TYPE),
    );
    Response::from_parts(parts, problem.into_body())
}
