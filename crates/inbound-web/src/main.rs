//! `inbound-web [--config PATH] [--check]`: the reference app.
//!
//! Exit status: 0 when served and shut down cleanly (or, with `--check`, when the
//! configuration is valid); 2 for an invalid configuration, one line per problem on stderr;
//! 1 for any other start-up failure (the port cannot be bound, ...).
//! `inbound-web --probe URL` GETs a running app's URL and exits 0 on 200, 1 otherwise (the
//! container image's health check).

mod probe;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use edge_middleware::limiter::names;
use inbound_web::reload;
use inbound_web::telemetry::{self, Export};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// The process's allocator (the `mimalloc` feature, on by default): a request allocates its
/// body, its JSON and its futures, and glibc's malloc and free were a tenth of the sidecar's
/// CPU per request. Libraries of this workspace never choose an allocator; embedders do.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The rate-limit reference app: the middleware in front of a demo upstream, and the
/// `/v1/evaluate` sidecar API.
#[derive(Debug, Parser)]
#[command(name = "inbound-web", version)]
struct Args {
    /// TOML configuration file (default: built-in defaults plus `APP_*` environment).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Validate the configuration, print the effective settings (secrets redacted), exit.
    #[arg(long)]
    check: bool,
    /// GET this URL of a running app (`http://127.0.0.1:8080/healthz`) and exit 0 on 200,
    /// 1 otherwise: a health check for images without curl. Reads no configuration.
    #[arg(long, value_name = "URL", conflicts_with_all = ["config", "check"])]
    probe: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(url) = &args.probe {
        return match probe::probe(url) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let sources = app_bootstrap::Sources {
        file: args.config.clone(),
        env: None,
    };
    let settings = match app_bootstrap::load(&sources) {
        Ok(s) => s,
        Err(errors) => {
            for p in &errors.0 {
                eprintln!("{p}");
            }
            return ExitCode::from(2);
        }
    };
    if args.check {
        print!("{}", settings.render());
        return ExitCode::SUCCESS;
    }
    // Thread per core (inbound_listener::workers): this thread's runtime accepts, runs the
    // background tasks and the provider's connections, and serves connections like the
    // other workers.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let serving = settings.http.serving_threads();
    let threads = match inbound_listener::WorkerThreads::start(serving, runtime.handle().clone()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot start {serving} serving threads (http.worker_threads): {e}");
            return ExitCode::FAILURE;
        }
    };
    // The exporter's task and channel live on the runtime, so it is built inside it.
    let export = match runtime.block_on(async { Export::start(&settings.otlp) }) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // After the configuration (its problems go to stderr as plain lines, whatever the
    // format), before anything that logs.
    init_log(settings.log.format, export.as_ref());
    let code = runtime.block_on(run(settings, sources, export, threads.workers()));
    threads.shutdown();
    // A blocking task still running (an export past its timeout) does not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// The log on stderr, at `RUST_LOG`'s levels (default `info`), as text or JSON lines; and,
/// with `export`, the spans sent over OTLP (the log's level does not filter them).
fn init_log(format: app_bootstrap::LogFormat, export: Option<&Export>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let log = match format {
        app_bootstrap::LogFormat::Text => fmt
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        app_bootstrap::LogFormat::Json => fmt
            .json()
            .flatten_event(false)
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(log)
        .with(export.map(Export::layer))
        .init();
}

/// The Prometheus recorder and its upkeep task; `None` (logged) when it cannot be installed.
fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(names::LATENCY.to_owned()),
            &[
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 1.0,
            ],
        )
        .and_then(PrometheusBuilder::install_recorder);
    match prometheus {
        Ok(h) => {
            let upkeep = h.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    upkeep.run_upkeep();
                }
            });
            Some(h)
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
            None
        }
    }
}

async fn run(
    settings: app_bootstrap::Settings,
    sources: app_bootstrap::Sources,
    export: Option<Export>,
    workers: inbound_listener::Workers,
) -> ExitCode {
    let code = serve(&settings, sources, export.is_some(), &workers).await;
    if let Some(export) = export {
        // After the servers drained, so the last requests' spans go out too.
        export.shutdown().await;
    }
    code
}

/// Builds and serves the app on `workers` until a signal drained it; `traced`: whether spans
/// are exported (then each request gets a server span, and gRPC calls join their caller's
/// trace).
async fn serve(
    settings: &app_bootstrap::Settings,
    sources: app_bootstrap::Sources,
    traced: bool,
    workers: &inbound_listener::Workers,
) -> ExitCode {
    let prometheus = install_metrics();

    // The provider's Redis connections, one per serving thread (each thread's requests use
    // their own).
    let runtime = match app_bootstrap::build_on(&settings.rate_limit, workers.runtimes()).await {
        Ok(Some(runtime)) => Some(runtime),
        Ok(None) => {
            tracing::info!("rate limiting disabled: no provider, connection or task was created");
            None
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let gates = match app_bootstrap::build_gates(settings).await {
        Ok(g) => g.map(Arc::new),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let observers = gates
        .as_ref()
        .map(inbound_web::gates::metrics::spawn)
        .unwrap_or_default();
    let gate_api = Arc::new(inbound_web::gates::GateApi::new(gates));
    let view = inbound_web::config_view::ConfigView::new(settings, sources.file.as_deref());
    let state = reload::app_state(runtime.as_ref(), prometheus.clone(), &view);
    // The gRPC service asks the HTTP edge's limiter: one path, one set of metrics.
    let rls = settings
        .grpc
        .bind
        .zip(state.limiter())
        .map(|(bind, limiter)| (bind, rls_service(settings, limiter.clone(), traced)));
    let router = inbound_web::listener::CurrentRouter::new(reload::build_router(
        state,
        settings,
        gate_api.clone(),
        traced,
    ));
    let reloader = Arc::new(reload::Reloader::new(reload::Parts {
        sources,
        settings: settings.clone(),
        runtime,
        prometheus,
        gates: gate_api,
        observers,
        router: router.clone(),
        rls: rls.as_ref().map(|(_, service)| service.clone()),
        view,
        traced,
    }));
    let reloads = reloader.start();
    let (listener, addr) = match bind_http(settings.http.bind).await {
        Ok(bound) => bound,
        Err(code) => return code,
    };
    // One signal stops both servers: the HTTP one waits on it, the gRPC one on a watch of it.
    let (stop_grpc, grpc_stopped) = tokio::sync::watch::channel(false);
    let stop_grpc = Arc::new(stop_grpc);
    let stop_on_signal = stop_grpc.clone();
    let grpc_listener = match &rls {
        Some((bind, _)) => match bind_grpc(*bind).await {
            Ok(l) => Some(l),
            Err(code) => return code,
        },
        None => None,
    };
    let (http, grpc_limits) = fit_descriptors(settings, grpc_listener.is_some());
    let grpc = rls.zip(grpc_listener).map(|((_, rls), listener)| {
        start_grpc(listener, rls, grpc_limits, workers.clone(), grpc_stopped)
    });
    let shutdown = inbound_web::app::shutdown_signal();
    tracing::info!("listening on http://{addr}");
    let served = inbound_web::app::serve_current_on(listener, router, &http, workers, async move {
        shutdown.await;
        let _ = stop_on_signal.send(true);
    })
    .await;
    // Also when the HTTP server ended without a signal (an error).
    let _ = stop_grpc.send(true);
    for task in &reloads {
        task.abort();
    }
    if let Some(task) = grpc {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
        }
    }
    // Open streams end with the server; the publisher stops after its current call.
    reloader.shutdown_gates().await;
    match served {
        Ok(()) => {
            tracing::info!("drained; exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("server error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The Envoy rate-limit service over the HTTP edge's limiter; `traced`: calls join their
/// caller's trace.
fn rls_service(
    settings: &app_bootstrap::Settings,
    limiter: Arc<edge_middleware::Limiter>,
    traced: bool,
) -> inbound_grpc::RlsService {
    let service = inbound_grpc::RlsService::new(
        limiter,
        settings.rls.clone(),
        settings.grpc.unknown_descriptor,
    );
    if traced {
        service.with_trace_parent(telemetry::join_caller_trace)
    } else {
        service
    }
}

/// Descriptors kept aside, beyond those open at start and the provider's reserve, for what
/// the process opens now and then: the configuration file a reload reads, the OTLP exporter's
/// connection, name lookups.
const DESCRIPTOR_HEADROOM: u64 = 32;

/// The `[http]` settings and the gRPC limits with their connection caps fitted under the
/// open-file limit (`inbound_listener::Budget`): descriptors open now, the provider's
/// reserve for reconnects and [`DESCRIPTOR_HEADROOM`] are kept aside, and the rest is
/// shared between the listeners so that neither can take the other's share. A cap lowered
/// is logged once.
fn fit_descriptors(
    settings: &app_bootstrap::Settings,
    grpc_on: bool,
) -> (app_bootstrap::HttpSettings, inbound_grpc::Limits) {
    let g = &settings.grpc;
    let mut grpc = inbound_grpc::Limits {
        max_connections: g.max_connections,
        handshake_timeout: g.handshake_timeout,
        idle_timeout: g.idle_timeout,
        keepalive_interval: g.keepalive_interval,
        keepalive_timeout: g.keepalive_timeout,
        max_concurrent_streams: u32::try_from(g.max_concurrent_streams).unwrap_or(u32::MAX),
        max_message_bytes: g.max_message_bytes,
    };
    let mut http = settings.http.clone();
    let (Some(limit), Some(open)) = (
        inbound_listener::open_file_limit(),
        inbound_listener::open_descriptors(),
    ) else {
        return (http, grpc);
    };
    let budget = inbound_listener::Budget {
        limit,
        reserved: open + settings.provider_descriptor_reserve() + DESCRIPTOR_HEADROOM,
    };
    let caps: &[usize] = if grpc_on {
        &[http.max_connections, grpc.max_connections]
    } else {
        &[http.max_connections]
    };
    let fit = budget.fit(caps);
    if fit[..] != caps[..] {
        tracing::warn!(
            open_file_limit = limit,
            reserved = budget.reserved,
            http_max_connections = fit[0],
            grpc_max_connections = fit.get(1).copied(),
            "the open-file limit cannot hold http.max_connections and grpc.max_connections \
             beside the descriptors kept for Redis and the process; serving fewer connections \
             at once (raise the limit, e.g. `ulimit -n`, to serve more)"
        );
    }
    http.max_connections = fit[0];
    if let Some(&n) = fit.get(1) {
        grpc.max_connections = n;
    }
    (http, grpc)
}

/// Binds the HTTP listener; with the address it is bound to, for the log.
async fn bind_http(
    bind: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, String), ExitCode> {
    let listener = tokio::net::TcpListener::bind(bind).await.map_err(|e| {
        eprintln!("http.bind: cannot listen on {bind}: {e}");
        ExitCode::FAILURE
    })?;
    let addr = listener
        .local_addr()
        .map_or_else(|_| bind.to_string(), |a| a.to_string());
    Ok((listener, addr))
}

/// Binds the gRPC listener.
async fn bind_grpc(bind: std::net::SocketAddr) -> Result<tokio::net::TcpListener, ExitCode> {
    tokio::net::TcpListener::bind(bind).await.map_err(|e| {
        eprintln!("grpc.bind: cannot listen on {bind}: {e}");
        ExitCode::FAILURE
    })
}

/// Serves the rate-limit service on `listener` with `limits` until `stopped` turns true.
fn start_grpc(
    listener: tokio::net::TcpListener,
    service: inbound_grpc::RlsService,
    limits: inbound_grpc::Limits,
    workers: inbound_listener::Workers,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), inbound_grpc::ServeError>> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    tracing::info!("gRPC rate-limit service listening on {addr}");
    tokio::spawn(async move {
        inbound_grpc::serve_on(listener, service, limits, &workers, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })
        .await
    })
}
