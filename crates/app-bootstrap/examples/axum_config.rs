//! An axum service whose limits come from its own configuration file: a `[rate_limit]` table
//! beside the service's keys (`axum_config.toml`), `local` or `redis` by one key. `/search` is
//! limited per API key; `/reports` per user AND per tenant, all or nothing; `/healthz` not at
//! all.
//!
//! ```sh
//! cargo run -p app-bootstrap --example axum_config -- crates/app-bootstrap/examples/axum_config.toml
//! for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: k1' localhost:3000/search; done
//! ORDERS_RATE_LIMIT__PROVIDER=redis cargo run -p app-bootstrap --example axum_config -- ...  # with a Redis
//! ```

use std::sync::Arc;

use app_bootstrap::RateLimitSection;
use axum::Router;
use axum::routing::{MethodRouter, get};
use edge_middleware::{RateLimitLayer, SubjectSource};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: axum_config CONFIG.toml")?;
    // The service's own key, from the same file. `ORDERS_BIND` overrides it.
    let file: toml::Table = std::fs::read_to_string(&path)?.parse()?;
    let bind = match std::env::var("ORDERS_BIND") {
        Ok(bind) => bind,
        Err(_) => file["server"]["bind"]
            .as_str()
            .ok_or("server.bind")?
            .to_owned(),
    };

    // Every problem of [rate_limit] at once, each with its key path; ORDERS_RATE_LIMIT__*
    // variables override the file, other ORDERS_ variables are the service's.
    let settings = RateLimitSection::file(&path).env_prefix("ORDERS_").load()?;
    // `None` when the file disables rate limiting: the routes are then served unlimited.
    let limiter = app_bootstrap::build(&settings)
        .await?
        .map(|r| Arc::new(r.into_limiter()));
    let layer = |limits: &[(&str, &str)]| match &limiter {
        Some(limiter) => {
            let limits = limits.iter().map(|(p, h)| (*p, SubjectSource::header(h)));
            RateLimitLayer::for_policies(limiter, limits).map(Some)
        }
        None => Ok(None),
    };
    let app = Router::new()
        .route(
            "/search",
            limited(get(search), layer(&[("api", "x-api-key")])?),
        )
        .route(
            "/reports",
            limited(
                get(reports),
                layer(&[("user", "x-user"), ("tenant", "x-tenant")])?,
            ),
        )
        .route("/healthz", get(|| async { "ok\n" }));

    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// `route` behind `layer`, or as it is when rate limiting is disabled.
fn limited(route: MethodRouter, layer: Option<RateLimitLayer>) -> MethodRouter {
    match layer {
        Some(layer) => route.route_layer(layer),
        None => route,
    }
}

async fn search() -> &'static str {
    "results\n"
}

async fn reports() -> &'static str {
    "report\n"
}
