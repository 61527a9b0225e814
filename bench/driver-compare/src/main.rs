//! `driver-compare PORT SECONDS CONCURRENCY`: EVALSHA throughput and latency of the token
//! bucket program through `fred` and through `redis` (redis-rs), each with one multiplexed,
//! pipelined connection, `CONCURRENCY` closed-loop tasks, keys drawn from 1,000,000.
//! The numbers decided the driver of adapter-redis (bench/driver-compare/RESULTS.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use hdrhistogram::Histogram;

const SOURCE: &str = include_str!("../../../lua/rate-token-bucket-v2.lua");

/// ARGV[1] of rl-bench's token-bucket policy, packed as the program's header says (unsigned
/// little-endian, format '<I7I4I5I5I7I5I7'): cost 1, revision 1, regression 2000, grace
/// 10000, capacity 1000, scale 1, units_per_ms 1. 40 bytes.
fn packed_args() -> Vec<u8> {
    let fields: [(u64, usize); 7] = [
        (1, 7),
        (1, 4),
        (2000, 5),
        (10_000, 5),
        (1000, 7),
        (1, 5),
        (1, 7),
    ];
    let mut out = Vec::with_capacity(40);
    for (value, width) in fields {
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    }
    out
}

fn key(rng: &mut u64) -> String {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    format!("rl:{{{:06}}}cmp", *rng % 1_000_000)
}

fn report(name: &str, n: u64, elapsed: Duration, h: &Histogram<u64>) {
    println!(
        "{name:<6} {:>8.0} evalsha/s  p50 {:>6.0} us  p99 {:>6.0} us  p99.9 {:>6.0} us",
        n as f64 / elapsed.as_secs_f64(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.value_at_quantile(0.999) as f64 / 1000.0,
    );
}

async fn with_fred(
    port: u16,
    secs: u64,
    c: u64,
    sha: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_url(&format!("redis://127.0.0.1:{port}/0"))?;
    let client = Builder::from_config(config).build()?;
    client.init().await?;
    // One binary value: fred would send a Vec<u8> as one integer argument per byte.
    let args = fred::types::Value::Bytes(fred::bytes::Bytes::from(packed_args()));
    let stop = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..c {
        let (client, sha, args) = (client.clone(), sha.to_owned(), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
            let (mut n, mut rng) = (0u64, 0x9E37_79B9 + i);
            while Instant::now() < stop {
                let t = Instant::now();
                let _: fred::types::Value = client
                    .evalsha(sha.as_str(), vec![key(&mut rng)], args.clone())
                    .await
                    .expect("evalsha");
                h.saturating_record(t.elapsed().as_nanos() as u64);
                n += 1;
            }
            (n, h)
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut n = 0;
    for t in tasks {
        let (k, h) = t.await?;
        n += k;
        total.add(&h)?;
    }
    report("fred", n, start.elapsed(), &total);
    Ok(())
}

async fn with_redis(
    port: u16,
    secs: u64,
    c: u64,
    sha: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0"))?;
    let config = redis::AsyncConnectionConfig::new().set_pipeline_buffer_size(1024);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let stop = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let sha = Arc::new(sha.to_owned());
    let args = Arc::new(packed_args());
    let mut tasks = Vec::new();
    for i in 0..c {
        let (mut conn, sha, args) = (conn.clone(), sha.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
            let (mut n, mut rng) = (0u64, 0x9E37_79B9 + i);
            while Instant::now() < stop {
                let t = Instant::now();
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha.as_str())
                    .arg(1)
                    .arg(key(&mut rng))
                    .arg(args.as_slice());
                let _: redis::Value = conn.send_packed_command(&cmd).await.expect("evalsha");
                h.saturating_record(t.elapsed().as_nanos() as u64);
                n += 1;
            }
            (n, h)
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut n = 0;
    for t in tasks {
        let (k, h) = t.await?;
        n += k;
        total.add(&h)?;
    }
    report("redis", n, start.elapsed(), &total);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args.get(1).ok_or("PORT")?.parse()?;
    let secs: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let c: u64 = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let sha = sha1_smol::Sha1::from(SOURCE).digest().to_string();
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/0"))?
        .get_multiplexed_async_connection()
        .await?;
    let loaded: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SOURCE)
        .query_async(&mut conn)
        .await?;
    assert_eq!(loaded, sha);
    // Alternate the order so neither driver always runs on a warmer server.
    for round in 0..2 {
        if round % 2 == 0 {
            with_redis(port, secs, c, &sha).await?;
            with_fred(port, secs, c, &sha).await?;
        } else {
            with_fred(port, secs, c, &sha).await?;
            with_redis(port, secs, c, &sha).await?;
        }
    }
    Ok(())
}
