//! An axum service limited in process: the middleware over the in-memory provider, built in
//! code (no configuration file; neither Redis nor TLS is compiled). `/search` is limited to
//! 5 requests per 10 s per API key; `/reports` to 10 per minute per user AND 30 per minute
//! per tenant: a request is admitted only when both admit, and a denied one charges neither.
//! `/healthz` is not limited.
//!
//! ```sh
//! cargo run -p edge-middleware --example axum_local
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:3000/search
//! curl -i -H 'x-user: ada' -H 'x-tenant: acme' http://127.0.0.1:3000/reports
//! ```

use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use axum::Router;
use axum::routing::get;
use edge_middleware::{Limiter, RateLimitLayer, SubjectSource as Subject};
use shared_contract::{PolicySet, RateLimitPolicy as Policy, SystemClock};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // The service's whole rate-limit setup, 13 lines: three policies, the limiter, two routes.
    let (minute, ten_seconds) = (Duration::from_secs(60), Duration::from_secs(10));
    let api = Policy::token_bucket("api", 5).per(ten_seconds).build()?;
    let user = Policy::fixed_window("user", 10).per(minute).build()?;
    let tenant = Policy::fixed_window("tenant", 30).per(minute).build()?;
    let policies = PolicySet::new([api.clone(), user, tenant], api.id().clone())?;
    let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
    // One process: the builder's random subject secret is fine (instances sharing a Redis
    // need the same one: `.secret(...)`); each policy says how it fails (fail_closed here).
    let limiter = Arc::new(Limiter::builder(Arc::new(port)).build());
    let per_key = RateLimitLayer::for_policies(&limiter, [("api", Subject::header("x-api-key"))])?;
    let (by_user, by_tenant) = (Subject::header("x-user"), Subject::header("x-tenant"));
    let both = RateLimitLayer::for_policies(&limiter, [("user", by_user), ("tenant", by_tenant)])?;
    let app = Router::new()
        .route("/search", get(search).route_layer(per_key))
        .route("/reports", get(reports).route_layer(both))
        .route("/healthz", get(|| async { "ok\n" }));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

async fn search() -> &'static str {
    "results\n"
}

async fn reports() -> &'static str {
    "report\n"
}
