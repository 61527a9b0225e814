//! A background worker that limits its own calls to a partner API: the provider comes from a
//! configuration file (any provider: `local` or `redis`), the port is called directly, and
//! every outcome is handled.
//!
//! ```sh
//! cargo run -p app-bootstrap --example worker -- examples/redis.toml   # needs a Redis
//! cargo run -p app-bootstrap --example worker -- examples/local.toml
//! ```

use std::process::ExitCode;
use std::time::Duration;

use app_bootstrap::{RateLimitSettings, Sources};
use shared_contract::{Cost, Deadline, RateLimitOutcome, RateLimitRequest};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: worker CONFIG.toml");
        return ExitCode::from(2);
    };
    // Every problem of the file, with its key path (`rate_limit.policies.api.limit: ...`).
    let settings = match app_bootstrap::load(&Sources {
        file: Some(path.into()),
        env: None,
    }) {
        Ok(s) => s,
        Err(errors) => {
            for problem in &errors.0 {
                eprintln!("{problem}");
            }
            return ExitCode::from(2);
        }
    };
    if matches!(settings.rate_limit, RateLimitSettings::Disabled) {
        eprintln!("rate limiting is disabled in this file; nothing to do");
        return ExitCode::SUCCESS;
    }
    // `None` only for a disabled section (handled above); an unreachable Redis is not an
    // error here: the provider starts and answers `Unavailable` until Redis is up.
    let runtime = match app_bootstrap::build(&settings.rate_limit).await {
        Ok(Some(r)) => r,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot build the provider: {e}");
            return ExitCode::FAILURE;
        }
    };
    let port = runtime.port().clone();
    let policy = port.policies().default_id().clone();
    // The subject ("partner-a") is HMAC-digested with the configured secret: the raw value
    // never reaches the provider.
    let subject = runtime.hasher().digest(b"partner-a");
    for call in 1..=8 {
        let Ok(deadline) = Deadline::within(Duration::from_millis(200)) else {
            return ExitCode::FAILURE;
        };
        let request = RateLimitRequest {
            policy_id: policy.clone(),
            subject,
            cost: Cost::ONE,
            evaluation_id: None,
            deadline,
        };
        match port.evaluate(request).await {
            Ok(RateLimitOutcome::Evaluated(d)) if d.allowed => {
                println!("call {call}: allowed ({} left)", d.remaining);
            }
            Ok(RateLimitOutcome::Evaluated(d)) => {
                println!("call {call}: denied, retry in {} ms", d.retry_after_ms);
            }
            // Known: nothing was consumed. A worker can simply try again later.
            Ok(RateLimitOutcome::Unavailable {
                category,
                retry_after_ms,
                ..
            }) => println!(
                "call {call}: provider unavailable ({}), retry in {retry_after_ms} ms",
                category.as_str()
            ),
            // Sent, result unknown: the quota may have been charged. Treat as not allowed
            // (fail closed), or retry with an evaluation id to learn the first answer.
            Ok(RateLimitOutcome::Indeterminate { .. }) => {
                println!("call {call}: result unknown; not calling the partner");
            }
            Ok(RateLimitOutcome::Incompatible { category, .. }) => {
                eprintln!(
                    "call {call}: stored state or program mismatch ({}); an operator must look",
                    category.as_str()
                );
                return ExitCode::FAILURE;
            }
            // Unknown policy, cost above max_cost: a bug in this worker, nothing consumed.
            Err(e) => {
                eprintln!("call {call}: refused: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
