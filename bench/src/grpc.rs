//! `--provider grpc`: the same closed loop, but each evaluation is a `ShouldRateLimit` call to
//! a running gRPC rate-limit service (`inbound-web` with `[grpc] bind`) at `--grpc-addr`: one
//! descriptor `("key", "<key number>")` of domain `bench`, `hits_addend` 1, over
//! `--connections` HTTP/2 connections shared round-robin by the workers. The figure is then
//! the service's whole path (gRPC, descriptor matching, digest, provider), to set beside the
//! HTTP sidecar's `/v1/evaluate` (`bench/rl-bench/grpc-compare.sh`).
//!
//! `OK` counts as allowed, `OVER_LIMIT` as denied, a gRPC error status as unavailable.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::{Args, SplitMix, Tally, pick_key};

/// The domain every request names (the server's `[[rls.descriptors]]` must map it).
pub const DOMAIN: &str = "bench";
/// The descriptor key every request carries.
pub const KEY: &str = "key";

async fn worker(
    mut client: RateLimitServiceClient<Channel>,
    args: Arc<Args>,
    seed: u64,
    stop: Instant,
) -> anyhow::Result<Tally> {
    let mut rng = SplitMix::new(seed);
    let mut t = Tally::new()?;
    loop {
        let key = pick_key(&mut rng, args.keys, args.hot_key_share);
        let request = RateLimitRequest {
            domain: DOMAIN.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: KEY.into(),
                    value: key.to_string(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let started = Instant::now();
        if started >= stop {
            return Ok(t);
        }
        let answer = client.should_rate_limit(request).await;
        let ns = started.elapsed().as_nanos().clamp(1, 60_000_000_000) as u64;
        t.latency_ns.saturating_record(ns);
        match answer.map(|r| r.into_inner().overall_code) {
            Ok(c) if c == Code::Ok as i32 => t.allowed += 1,
            Ok(c) if c == Code::OverLimit as i32 => t.denied += 1,
            Ok(_) => t.incompatible += 1,
            Err(_) => t.unavailable += 1,
        }
    }
}

/// Runs the load of `args` against the gRPC service at `args.grpc_addr`.
///
/// # Errors
/// When the service cannot be reached, or a worker task fails.
pub(crate) async fn run(args: Arc<Args>, stop: Instant) -> anyhow::Result<Tally> {
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        let channel = Channel::from_shared(format!("http://{}", args.grpc_addr))
            .context("--grpc-addr")?
            .connect()
            .await
            .with_context(|| format!("connecting to {}", args.grpc_addr))?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let client = clients[i as usize % clients.len()].clone();
            tokio::spawn(worker(client, args.clone(), 0x5EED_0000 + i, stop))
        })
        .collect();
    let mut total = Tally::new()?;
    for task in tasks {
        total.add(&task.await.context("worker task")??)?;
    }
    Ok(total)
}
