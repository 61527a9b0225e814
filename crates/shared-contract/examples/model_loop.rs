//! A local decision's model step alone, in a loop on one key, for instruction counts:
//!
//! ```sh
//! cargo build --release -p shared-contract --example model_loop
//! valgrind --tool=callgrind target/release/examples/model_loop token_bucket 100000
//! ```
//!
//! Run it with two counts (e.g. 100,000 and 200,000): the difference of the two totals,
//! divided by the difference of the counts, is one evaluation without the process's start.
//! The clock steps 1 ms per call against 2,000 per second: every call is an allow (the path
//! that writes).

use std::hint::black_box;
use std::time::Duration;

use shared_contract::model::{self, AlgorithmState};
use shared_contract::{Cost, RateLimitPolicy};

fn main() {
    let mut args = std::env::args().skip(1);
    let algorithm = args.next().unwrap_or_else(|| "token_bucket".into());
    let count: u64 = args.next().map_or(100_000, |n| n.parse().expect("a count"));
    let per = Duration::from_secs(1);
    let builder = match algorithm.as_str() {
        "fixed_window" => RateLimitPolicy::fixed_window("p", 2_000),
        "sliding_window" => RateLimitPolicy::sliding_window("p", 2_000),
        "sliding_log" => RateLimitPolicy::sliding_log("p", 2_000),
        "token_bucket" => RateLimitPolicy::token_bucket("p", 2_000),
        "gcra" => RateLimitPolicy::gcra("p", 2_000),
        other => panic!("unknown algorithm {other}"),
    };
    let policy = builder.per(per).build().expect("a valid policy");
    let mut state: Option<AlgorithmState> = None;
    let mut now = 1_765_000_000_000u64;
    let mut allowed = 0u64;
    for _ in 0..count {
        now += 1;
        let mut e = model::decide(
            black_box(&policy),
            state.as_ref(),
            black_box(now),
            Cost::ONE,
        )
        .expect("a valid step");
        if let Some(s) = e.new_state.take() {
            allowed += 1;
            state = Some(s);
        }
        black_box(&e);
    }
    println!("{algorithm}: {allowed} of {count} allowed");
}
