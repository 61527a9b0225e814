//! `[otlp]`: OpenTelemetry trace export over OTLP/gRPC, opt-in.
//!
//! With an endpoint configured, [`Export::start`] builds the OTLP exporter and a batch span
//! processor on the Tokio runtime, and [`Export::layer`] is the `tracing` layer that turns the
//! app's spans into OpenTelemetry spans: the server span of each HTTP request
//! ([`server_span`]), the rate-limit evaluations under it (`rate_limit.evaluate`,
//! `rate_limit.evaluate_all`, from the edge's limiter) and each gRPC `ShouldRateLimit`
//! (`rls.should_rate_limit`). Only spans are exported, never log events, and no span
//! carries a subject: the edge records policy ids, costs and outcomes; the server span
//! records the method, the route template (or the configured `[[routes]]` prefix) and the
//! status, never the path itself.
//!
//! A caller's W3C `traceparent` (and `tracestate`) is honoured: the server span joins the
//! caller's trace, and the sampler is parent-based, so a sampled caller is always kept.
//!
//! Without an endpoint nothing here runs: no exporter, no task, and the router gets no
//! per-request span layer, so a request costs what it did before.

use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::OtlpSettings;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// How long shutdown waits for the last batch to be exported before the process exits
/// anyway (an unreachable collector must not hold the exit).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The crates whose spans are exported: the app's, the edge's and the gRPC service's.
const TARGETS: &[&str] = &["inbound_web", "edge_middleware", "inbound_grpc"];

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built.
    #[error("otlp.endpoint: cannot build the OTLP exporter for {endpoint:?}: {source}")]
    Exporter {
        /// The configured `otlp.endpoint`.
        endpoint: String,
        /// Why the exporter was not built.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// A running exporter: the tracer provider whose batch processor sends spans.
#[derive(Debug)]
pub struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// The exporter of `settings`, or `None` when no endpoint is configured (then nothing is
    /// built). Call it inside the Tokio runtime: the processor's task and the gRPC channel
    /// are spawned on it.
    ///
    /// # Errors
    /// [`TelemetryError::Exporter`] when the endpoint is refused by the transport.
    pub fn start(settings: &OtlpSettings) -> Result<Option<Self>, TelemetryError> {
        let Some(endpoint) = &settings.endpoint else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|source| TelemetryError::Exporter {
                endpoint: endpoint.clone(),
                source,
            })?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer exporting the spans of the `TARGETS` crates (at every level: the edge's spans are
    /// `debug`, so the log's `RUST_LOG` level does not decide what is exported).
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let spans_only = tracing_subscriber::filter::filter_fn(|m| {
            m.is_span()
                && TARGETS.iter().any(|t| {
                    m.target()
                        .strip_prefix(t)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
                })
        });
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("inbound-web"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(spans_only)
    }

    /// Exports what is still queued and stops the processor, waiting at most
    /// [`SHUTDOWN_TIMEOUT`]; a failure is logged (there is nothing else to do at exit).
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The processor's shutdown blocks until its task answered: off the runtime's workers.
        let done = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(SHUTDOWN_TIMEOUT, done).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "trace export did not shut down cleanly"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace export shutdown failed"),
            Err(_) => tracing::warn!(
                "trace export did not finish within {SHUTDOWN_TIMEOUT:?}; the last spans may be lost"
            ),
        }
    }
}

/// Joins `span` to the trace that `headers` carry (`traceparent`, `tracestate`); without them
/// it stays a root span. For the gRPC service too ([`inbound_grpc::TraceParent`]).
pub fn join_caller_trace(headers: &axum::http::HeaderMap, span: &tracing::Span) {
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    // Fails only when the span is disabled, and then there is nothing to join.
    let _ = span.set_parent(parent);
}

struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// The configured `[[routes]]` prefixes, for naming a request of the demo upstream (which
/// no route template matches) by its rule rather than by its path.
#[derive(Debug, Clone, Default)]
pub struct RoutePrefixes(Arc<Vec<String>>);

impl RoutePrefixes {
    /// The prefixes (`path_prefix` of each `[[routes]]`) requests are named by.
    pub fn new(prefixes: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(prefixes.into_iter().collect()))
    }

    /// The longest configured prefix that `path` lies under, segment-wise.
    fn of(&self, path: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|p| lies_under(path, p))
            .max_by_key(|p| p.len())
            .map(String::as_str)
    }
}

/// The server span of one request (`otel.kind = server`): named `METHOD route`, with
/// `http.request.method`, `http.route` (the route template, or the `[[routes]]` prefix for
/// the demo upstream; absent otherwise) and `http.response.status_code`. Mounted only when
/// traces are exported.
pub async fn server_span(
    State(prefixes): State<RoutePrefixes>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().as_str().to_owned();
    let route = match request.extensions().get::<MatchedPath>() {
        Some(m) => Some(m.as_str().to_owned()),
        None => prefixes.of(request.uri().path()).map(str::to_owned),
    };
    let name = match &route {
        Some(r) => format!("{method} {r}"),
        None => method.clone(),
    };
    let span = tracing::debug_span!(
        "http.request",
        otel.name = name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
    );
    join_caller_trace(request.headers(), &span);
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    response
}

/// Whether `path` lies under the route prefix `prefix`, segment-wise: `/api` (or `/api/`)
/// holds `/api` and `/api/x`, not `/apix`.
pub(crate) fn lies_under(path: &str, prefix: &str) -> bool {
    let p = prefix.trim_end_matches('/');
    p.is_empty()
        || path
            .strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::RoutePrefixes;

    #[test]
    fn a_demo_request_is_named_by_its_longest_configured_prefix_never_its_path() {
        let p = RoutePrefixes::new(["/api".to_owned(), "/api/admin/".to_owned()]);
        assert_eq!(p.of("/api/users/alice"), Some("/api"));
        assert_eq!(p.of("/api/admin/x"), Some("/api/admin/"));
        assert_eq!(p.of("/api"), Some("/api"));
        assert_eq!(p.of("/apix"), None);
        assert_eq!(p.of("/other/alice"), None);
    }
}
