//! `limitador-sidecar`: the HTTP check endpoint of limitador-server in its default redis mode
//! (`limitador-server LIMITS_FILE redis URL`), rebuilt thinly over the `limitador` library so
//! that `run.sh` can measure it beside inbound-web's `POST /v1/evaluate` on the same machine
//! in the same run (its runs: bench/limitador-compare/RESULTS.md).
//!
//! What is the same as limitador-server's redis mode:
//! - storage: `AsyncRedisStorage::new(url)` (one redis-rs `ConnectionManager`, i.e. one
//!   multiplexed connection, no local cache: the cache is `redis_cached`, not `redis`), wrapped
//!   in `AsyncStorage::with_counter_storage` and an `AsyncRateLimiterBuilder`;
//! - runtime: `#[actix_rt::main]`, the storage built on the main system runtime (so its
//!   connection task runs there), then an actix-web `HttpServer` with its default worker count;
//! - endpoint: `POST /check_and_report` with the body `{"namespace", "values", "delta"}`, the
//!   values bound as the CEL list `descriptors` (`descriptors[0]` is the `values` map), then
//!   `check_rate_limited_and_update`; 200 with `null` when admitted, 429 when limited, 500 on
//!   a storage error.
//!
//! What is left out, each of which costs limitador-server CPU per request, so this sidecar is,
//! if anything, faster than the real one: the paperclip OpenAPI wrapper, the tracing subscriber
//! and its metrics layer, the Prometheus counters per request, the request-logging middleware,
//! the idle Envoy RLS gRPC server and the limits-file watcher.
//!
//! Usage: `limitador-sidecar BIND REDIS_URL [SECONDS]`. `LIMITADOR_SIDECAR_WORKERS=N` sets
//! actix-web's worker count (unset or empty: actix's default, one per physical core), so that
//! run.sh can give limitador the worker count it gives inbound-web. One limit is configured:
//! namespace `api`, `max_value` 10^12 (every request is admitted), a window of `SECONDS`
//! (default 60), one variable `descriptors[0].subject`.

use std::collections::HashMap;

use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context as _;
use limitador::limit::{Context, Expression, Limit, Namespace};
use limitador::storage::AsyncStorage;
use limitador::storage::redis::AsyncRedisStorage;
use limitador::{AsyncRateLimiter, AsyncRateLimiterBuilder};
use serde::Deserialize;

/// The body of limitador-server's `/check`, `/report` and `/check_and_report`
/// (`response_headers` is accepted by the real server; unknown fields are ignored here).
#[derive(Deserialize)]
struct CheckAndReportInfo {
    namespace: String,
    values: HashMap<String, String>,
    delta: u64,
}

async fn check_and_report(
    limiter: web::Data<AsyncRateLimiter>,
    request: web::Json<CheckAndReportInfo>,
) -> HttpResponse {
    let CheckAndReportInfo {
        namespace,
        values,
        delta,
    } = request.into_inner();
    let namespace = Namespace::from(namespace);
    let mut ctx = Context::default();
    ctx.list_binding("descriptors".to_string(), vec![values]);
    match limiter
        .check_rate_limited_and_update(&namespace, &ctx, delta)
        .await
    {
        Ok(result) if result.limited => HttpResponse::TooManyRequests().json(()),
        Ok(_) => HttpResponse::Ok().json(()),
        Err(_) => HttpResponse::InternalServerError().json(()),
    }
}

async fn status() -> HttpResponse {
    HttpResponse::Ok().json(())
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: limitador-sidecar BIND REDIS_URL [SECONDS]";
    let bind = args.next().context(usage)?;
    let redis_url = args.next().context(usage)?;
    let seconds: u64 = match args.next() {
        Some(s) => s.parse().context("SECONDS must be a whole number")?,
        None => 60,
    };

    let storage = AsyncRedisStorage::new(&redis_url)
        .await
        .with_context(|| format!("connecting to Redis at {redis_url}"))?;
    let limiter =
        AsyncRateLimiterBuilder::new(AsyncStorage::with_counter_storage(Box::new(storage))).build();
    let subject = Expression::parse("descriptors[0].subject")
        .map_err(|e| anyhow::anyhow!("parsing the limit variable: {e:?}"))?;
    let limit = Limit::new("api", 1_000_000_000_000, seconds, [], [subject]);
    limiter
        .configure_with([limit])
        .await
        .map_err(|e| anyhow::anyhow!("configuring the limit: {e}"))?;

    let limiter = web::Data::new(limiter);
    eprintln!("limitador-sidecar on {bind}, redis {redis_url}, window {seconds}s");
    let server = HttpServer::new(move || {
        App::new()
            .app_data(limiter.clone())
            .route("/status", web::get().to(status))
            .route("/check_and_report", web::post().to(check_and_report))
    });
    let server = match std::env::var("LIMITADOR_SIDECAR_WORKERS") {
        Ok(n) if !n.is_empty() => server.workers(
            n.parse()
                .context("LIMITADOR_SIDECAR_WORKERS must be a whole number")?,
        ),
        _ => server,
    };
    server
        .bind(&bind)
        .with_context(|| format!("binding {bind}"))?
        .run()
        .await?;
    Ok(())
}
