//! The app's outermost layer: bounds the request head, and turns the framework's own error
//! responses (axum's empty 405, its text/plain extractor rejections) into problem+json.
//!
//! It is a plain tower service with a nameable future, put around each connection's service
//! by the listener (`crate::listener`) rather than through `Router::layer` or
//! `axum::middleware::from_fn` and `map_response`: those box a future and clone a service per
//! request. As
//! `from_fn`/`map_response` the two checks cost 1.16x the server CPU per `/v1/evaluate`
//! request; as a `Router::layer`, 3 allocations and about 1,900 instructions per request
//! (callgrind). Around the connection they add a header walk and a status check; only a
//! response it rewrites allocates.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use edge_middleware::problem;
use futures::future::{Either, FutureExt as _, Map};
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
#[derive(Debug, Clone, Copy, Default)]
pub struct HygieneLayer;

impl<S> Layer<S> for HygieneLayer {
    type Service = Hygiene<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Hygiene { inner }
    }
}

/// The service of [`HygieneLayer`].
#[derive(Debug, Clone)]
pub struct Hygiene<S> {
    inner: S,
}

type Answer = Result<Response, Infallible>;

impl<S> Service<Request<Body>> for Hygiene<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Answer>, Map<S::Future, fn(Answer) -> Answer>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match refused_head(&req) {
            Some(refusal) => Either::Left(ready(Ok(refusal))),
            None => Either::Right(self.inner.call(req).map(check_response as fn(_) -> _)),
        }
    }
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
