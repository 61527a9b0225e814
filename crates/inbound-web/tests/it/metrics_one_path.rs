//! The gRPC service and `/v1/evaluate` go through one limiter, so they count alike: the
//! same multi-limit denial sent through both moves every decision series by the same amounts
//! (in a denied evaluation every policy counts `denied`, although one of them would have
//! admitted).

use crate::common;

use common::{App, metrics, sample};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const CONFIG: &str = r#"
[http]
bind = "127.0.0.1:0"

[grpc]
bind = "127.0.0.1:0"

[rate_limit]
enabled = true
provider = "local"
default_policy = "user"

[rate_limit.policies.user]
algorithm = "fixed_window"
limit = 1
window = "1m"

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 5
window = "1m"

[[rls.descriptors]]
domain = "edge"
entries = ["user"]
policy = "user"

[[rls.descriptors]]
domain = "edge"
entries = ["tenant"]
policy = "tenant"
"#;

/// Every decision series of both policies.
fn series() -> Vec<String> {
    let mut out = Vec::new();
    for policy in ["user", "tenant"] {
        for outcome in ["allowed", "denied", "shadow_denied", "unavailable"] {
            out.push(format!(
                "rate_limit_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"}}"
            ));
        }
        out.push(format!(
            "rate_limit_decisions_by_source_total{{policy=\"{policy}\",source=\"local\"}}"
        ));
        out.push(format!(
            "rate_limit_evaluation_duration_seconds_count{{policy=\"{policy}\"}}"
        ));
    }
    out
}

fn snapshot(text: &str) -> Vec<f64> {
    series().iter().map(|s| sample(text, s)).collect()
}

fn delta(before: &[f64], after: &[f64]) -> Vec<(String, f64)> {
    series()
        .into_iter()
        .zip(before.iter().zip(after))
        .map(|(s, (b, a))| (s, a - b))
        .collect()
}

async fn over_http(client: &reqwest::Client, app: &App, user: &str, tenant: &str) -> u16 {
    let body = format!(
        r#"{{"requests":[{{"policy":"user","subject":"{user}"}},{{"policy":"tenant","subject":"{tenant}"}}]}}"#
    );
    let (status, _, _) = common::evaluate(client, app, &body).await;
    status
}

async fn over_grpc(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
    tenant: &str,
) -> Code {
    let descriptor = |key: &str, value: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        ..Default::default()
    };
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor("user", user), descriptor("tenant", tenant)],
        hits_addend: 1,
    };
    let answer = client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner();
    Code::try_from(answer.overall_code).expect("a code")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_limit_denial_moves_the_metrics_alike_through_http_and_grpc() {
    let app = App::start(CONFIG, &[]);
    let http = reqwest::Client::new();
    let mut grpc = RateLimitServiceClient::connect(format!("http://{}", app.grpc_addr()))
        .await
        .expect("gRPC connection");

    // Each entry point: one admitted evaluation uses the user's only request, the next is
    // refused by `user` while `tenant` would admit; the deltas of that refusal are compared.
    assert_eq!(over_http(&http, &app, "u-http", "t-http").await, 200);
    let before = snapshot(&metrics(&http, &app).await);
    assert_eq!(over_http(&http, &app, "u-http", "t-http").await, 429);
    let by_http = delta(&before, &snapshot(&metrics(&http, &app).await));

    assert_eq!(over_grpc(&mut grpc, "u-grpc", "t-grpc").await, Code::Ok);
    let before = snapshot(&metrics(&http, &app).await);
    assert_eq!(
        over_grpc(&mut grpc, "u-grpc", "t-grpc").await,
        Code::OverLimit
    );
    let by_grpc = delta(&before, &snapshot(&metrics(&http, &app).await));

    assert_eq!(
        by_http, by_grpc,
        "HTTP and gRPC count the same denial apart"
    );
    // And what they count is the documented rule.
    let of = |name: &str| by_http.iter().find(|(s, _)| s == name).map(|(_, d)| *d);
    let decisions = |policy: &str, outcome: &str| {
        of(&format!(
            "rate_limit_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(decisions("user", "denied"), Some(1.0));
    assert_eq!(decisions("tenant", "denied"), Some(1.0));
    assert_eq!(decisions("tenant", "allowed"), Some(0.0));
}
