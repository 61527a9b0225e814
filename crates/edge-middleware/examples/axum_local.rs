//! An axum service limited in process: the middleware over the in-memory provider, built in
//! code (no configuration file; neither Redis nor TLS is compiled). Two limits apply to
//! `/api`: 5 per 10 s per API key, and 20 per 10 s per tenant; a request is admitted only
//! when both admit, and a denied one charges neither.
//!
//! ```sh
//! cargo run -p edge-middleware --example axum_local
//! curl -i -H 'x-api-key: k1' -H 'x-tenant: acme' http://127.0.0.1:3000/api/hello
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use axum::extract::ConnectInfo;
use edge_middleware::{Limiter, RateLimitLayer, Rule, SubjectSource};
use shared_contract::{PolicySet, RateLimitPolicy, SystemClock};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let ten_seconds = Duration::from_secs(10);
    let user = RateLimitPolicy::fixed_window("user", 5)
        .per(ten_seconds)
        .build()?;
    let tenant = RateLimitPolicy::fixed_window("tenant", 20)
        .per(ten_seconds)
        .build()?;
    let rules = vec![
        Rule::new(
            "/api",
            user.id().clone(),
            SubjectSource::Header("x-api-key".into()),
        ),
        Rule::new(
            "/api",
            tenant.id().clone(),
            SubjectSource::Header("x-tenant".into()),
        ),
    ];
    let policies = PolicySet::new([user.clone(), tenant], user.id().clone())?;
    let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
    // One process: the builder's random subject secret is fine (instances sharing a Redis
    // need the same one: `.secret(...)`); each policy says how it fails (fail_closed here).
    let limiter = Limiter::builder(Arc::new(port))
        .budget(Duration::from_millis(100))
        .build();
    let layer = RateLimitLayer::new(Arc::new(limiter), rules)
        .with_peer_ip(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let app = axum::Router::new()
        .route("/api/hello", axum::routing::get(|| async { "hello\n" }))
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
