//! The gRPC server end to end over loopback, with the generated Envoy client: the local
//! provider for decisions, a failing test double for the failure mapping.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use edge_middleware::descriptors::{DescriptorRule, DescriptorRules, EntryMatcher};
use edge_middleware::{Limiter, SubjectHasher, SubjectSecret};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use inbound_grpc::{Limits, RlsService, UnknownDescriptor};
use metrics_exporter_prometheus::PrometheusBuilder;
use shared_contract::testing::ScriptedPort;
use shared_contract::{
    AlgorithmSpec, EdgeRateLimitPort, FailurePolicy, PolicyId, PolicyRevision, PolicySet,
    PolicySpec, RateLimitPolicy, SystemClock,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// The `[grpc]` listener limits, end to end over raw TCP and the client.
mod listener;

type Client = RateLimitServiceClient<Channel>;

fn policy(id: &str, limit: u64, max_cost: u64, failure: FailurePolicy) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit,
            window: Duration::from_secs(60),
        },
        max_cost,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy: failure,
    })
    .expect("valid policy")
}

fn rules() -> DescriptorRules {
    let rule = |entries: &[&str], policy: &str| {
        DescriptorRule::new(
            "edge".into(),
            entries
                .iter()
                .map(|e| EntryMatcher::parse(e).expect("valid entry"))
                .collect(),
            PolicyId::new(policy).expect("valid id"),
        )
        .expect("valid rule")
    };
    DescriptorRules::new([
        rule(&["remote_address"], "ip"),
        rule(&["tenant"], "tenant"),
        rule(&["user"], "user"),
        rule(&["llm_user"], "tokens").charging_after(),
    ])
    .expect("valid rules")
}

fn policies(failure: FailurePolicy) -> PolicySet {
    let ip = policy("ip", 1, 1, failure);
    PolicySet::new(
        [
            ip,
            policy("tenant", 5, 3, failure),
            policy("user", 100, 100, failure),
            policy("tokens", 1_000, 1_000, failure),
        ],
        PolicyId::new("ip").expect("valid id"),
    )
    .expect("valid policy set")
}

/// The edge's limiter over `port`, as the app builds it (one-second deadlines).
fn limiter(port: Arc<dyn EdgeRateLimitPort>) -> Arc<Limiter> {
    let hasher = SubjectHasher::new(&SubjectSecret::new(vec![9; 32], "test").expect("32 bytes"));
    Arc::new(Limiter::new(
        port,
        hasher,
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    ))
}

/// A server on a free loopback port; dropping the guard shuts it down.
struct Server {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn start(port: Arc<dyn EdgeRateLimitPort>, unknown: UnknownDescriptor) -> Server {
    start_with(port, unknown, None).await
}

/// [`start`] with `limits` (`None`: `inbound_grpc::serve`'s defaults).
async fn start_with(
    port: Arc<dyn EdgeRateLimitPort>,
    unknown: UnknownDescriptor,
    limits: Option<Limits>,
) -> Server {
    let service = RlsService::new(limiter(port), rules(), unknown);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    match limits {
        None => tokio::spawn(inbound_grpc::serve(listener, service, stopped)),
        Some(l) => tokio::spawn(inbound_grpc::serve_with(listener, service, l, stopped)),
    };
    Server { addr, _stop: stop }
}

fn local_port() -> Arc<dyn EdgeRateLimitPort> {
    Arc::new(LocalProvider::new(
        policies(FailurePolicy::FailClosed),
        Arc::new(SystemClock),
        LocalSettings::default(),
    ))
}

async fn local(unknown: UnknownDescriptor) -> Server {
    start(local_port(), unknown).await
}

async fn local_with(limits: Limits) -> Server {
    start_with(local_port(), UnknownDescriptor::Allow, Some(limits)).await
}

async fn channel(server: &Server) -> Channel {
    Channel::from_shared(format!("http://{}", server.addr))
        .expect("valid uri")
        .connect()
        .await
        .expect("connect")
}

async fn client(server: &Server) -> Client {
    RateLimitServiceClient::connect(format!("http://{}", server.addr))
        .await
        .expect("connect")
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: hits,
    }
}

async fn ask(c: &mut Client, r: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(r)
        .await
        .map(tonic::Response::into_inner)
}

fn header<'r>(r: &'r RateLimitResponse, key: &str) -> Option<&'r str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(key))
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn a_descriptor_is_allowed_up_to_its_limit_then_over_limit_with_status_and_headers() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let one = || request(vec![descriptor(&[("remote_address", "10.0.0.1")])], 0);
    let ok = ask(&mut c, one()).await.expect("answered");
    assert_eq!(ok.overall_code, Code::Ok as i32);
    let status = &ok.statuses[0];
    assert_eq!(status.code, Code::Ok as i32);
    assert_eq!(status.limit_remaining, 0);
    let limit = status.current_limit.as_ref().expect("a limit");
    assert_eq!((limit.requests_per_unit, limit.name.as_str()), (1, "ip"));
    assert_eq!(limit.unit, 2, "per minute");
    assert!(status.duration_until_reset.is_some());
    assert_eq!(header(&ok, "ratelimit-policy"), Some("\"ip\";q=1;w=60"));
    assert!(header(&ok, "retry-after").is_none());

    let over = ask(&mut c, one()).await.expect("answered");
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    assert!(header(&over, "ratelimit").is_some_and(|v| v.starts_with("\"ip\";r=0;t=")));
    let retry: u64 = header(&over, "retry-after")
        .expect("retry-after when over limit")
        .parse()
        .expect("whole seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    // Another address has its own counter.
    let other = request(vec![descriptor(&[("remote_address", "10.0.0.2")])], 0);
    assert_eq!(
        ask(&mut c, other).await.expect("answered").overall_code,
        Code::Ok as i32
    );
}

#[tokio::test]
async fn descriptors_of_one_request_are_all_or_nothing() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let both = || {
        request(
            vec![
                descriptor(&[("remote_address", "a")]),
                descriptor(&[("tenant", "t1")]),
            ],
            1,
        )
    };
    let first = ask(&mut c, both()).await.expect("answered");
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses[1].limit_remaining, 4);
    let second = ask(&mut c, both()).await.expect("answered");
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert_eq!(second.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(
        second.statuses[1].code,
        Code::Ok as i32,
        "tenant would admit"
    );
    assert_eq!(
        header(&second, "ratelimit-policy"),
        Some("\"ip\";q=1;w=60, \"tenant\";q=5;w=60")
    );
    // The denied request charged the tenant nothing: 4 left before this one, 3 after.
    let tenant = request(vec![descriptor(&[("tenant", "t1")])], 1);
    let after = ask(&mut c, tenant).await.expect("answered");
    assert_eq!(after.statuses[0].limit_remaining, 3);
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_zero_means_one() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let tenant = |hits| request(vec![descriptor(&[("tenant", "t2")])], hits);
    let r = ask(&mut c, tenant(3)).await.expect("answered");
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let r = ask(&mut c, tenant(0)).await.expect("answered");
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let over = ask(&mut c, tenant(4)).await.expect_err("above max_cost");
    assert_eq!(over.code(), tonic::Code::InvalidArgument);
    assert!(over.message().contains("max_cost 3"), "{}", over.message());
}

#[tokio::test]
async fn descriptors_sharing_a_limit_above_max_cost_are_named_with_their_summed_cost() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    // `tenant` has max_cost 3: 2 + 2 on one limit (same policy, same values) is 4.
    let twice = request(
        vec![
            descriptor(&[("tenant", "t9")]),
            descriptor(&[("tenant", "t9")]),
        ],
        2,
    );
    let e = ask(&mut c, twice)
        .await
        .expect_err("summed cost above max_cost");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let m = e.message();
    assert!(
        m.contains("descriptors[0] and descriptors[1]") && m.contains("summed cost 4"),
        "{m}"
    );
    assert!(m.contains("max_cost 3") && m.contains("tenant"), "{m}");
    // Three descriptors of one limit, another limit between them, the last one crossing (own
    // hits_addend 2): all three are named.
    let addend = |value| Some(envoy_types::pb::google::protobuf::UInt64Value { value });
    let mut user = descriptor(&[("user", "u9")]);
    user.hits_addend = addend(1);
    let mut last = descriptor(&[("tenant", "t9")]);
    last.hits_addend = addend(2);
    let thrice = request(
        vec![
            descriptor(&[("tenant", "t9")]),
            user,
            descriptor(&[("tenant", "t9")]),
            last,
        ],
        1,
    );
    let e = ask(&mut c, thrice)
        .await
        .expect_err("summed cost above max_cost");
    let m = e.message();
    assert!(
        m.contains("descriptors[0], descriptors[2] and descriptors[3]")
            && m.contains("summed cost 4"),
        "{m}"
    );
    // Nothing was charged.
    let r = ask(&mut c, request(vec![descriptor(&[("tenant", "t9")])], 1))
        .await
        .expect("answered");
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn unknown_descriptors_are_allowed_or_deny_the_whole_request_as_configured() {
    let unknown = || {
        request(
            vec![
                descriptor(&[("tenant", "t3")]),
                descriptor(&[("nothing", "x")]),
            ],
            1,
        )
    };
    let allow = local(UnknownDescriptor::Allow).await;
    let mut c = client(&allow).await;
    let r = ask(&mut c, unknown()).await.expect("answered");
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    assert!(r.statuses[1].current_limit.is_none());
    let mut other_domain = unknown();
    other_domain.domain = "elsewhere".into();
    let r = ask(&mut c, other_domain).await.expect("answered");
    assert_eq!(r.overall_code, Code::Ok as i32);

    let deny = local(UnknownDescriptor::Deny).await;
    let mut c = client(&deny).await;
    let r = ask(&mut c, unknown()).await.expect("answered");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    // Nothing was charged for the known descriptor of the denied request.
    let tenant = request(vec![descriptor(&[("tenant", "t3")])], 1);
    assert_eq!(
        ask(&mut c, tenant).await.expect("answered").statuses[0].limit_remaining,
        4
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_and_charge_nothing() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let user = || descriptor(&[("user", "u1")]);
    let many_users: Vec<_> = (0..9)
        .map(|i| descriptor(&[("user", &format!("u{i}"))]))
        .collect();
    let cases = [
        (
            "empty domain",
            RateLimitRequest {
                domain: String::new(),
                ..request(vec![user()], 1)
            },
        ),
        ("no descriptors", request(vec![], 1)),
        (
            "empty key",
            request(vec![user(), descriptor(&[("", "v")])], 1),
        ),
        (
            "empty value",
            request(vec![user(), descriptor(&[("user", "")])], 1),
        ),
        ("no entries", request(vec![user(), descriptor(&[])], 1)),
        ("1,000 descriptors", request(vec![user(); 1000], 1)),
        ("9 matched descriptors", request(many_users, 1)),
        (
            "a long value",
            request(vec![user(), descriptor(&[("user", &"v".repeat(300))])], 1),
        ),
        (
            "oversize message",
            request(vec![descriptor(&[("k", &"v".repeat(70_000))])], 1),
        ),
        (
            "a refund (is_negative_hits)",
            request(
                vec![RateLimitDescriptor {
                    is_negative_hits: true,
                    ..user()
                }],
                1,
            ),
        ),
    ];
    for (what, r) in cases {
        let e = ask(&mut c, r).await.expect_err(what);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(!e.message().is_empty(), "{what}");
    }
    // None of them charged u1 (or u0..u8).
    let r = ask(&mut c, request(vec![user()], 1))
        .await
        .expect("answered");
    assert_eq!(r.statuses[0].limit_remaining, 99);
}

/// A request whose domain is not UTF-8, sent with a message type that declares it bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RateLimitDescriptor>,
}

#[tokio::test]
async fn a_request_that_is_not_utf_8_is_invalid_argument() {
    let server = local(UnknownDescriptor::Allow).await;
    let channel = channel(&server).await;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let raw = RawRequest {
        domain: vec![0xff, 0xfe],
        descriptors: vec![descriptor(&[("user", "u1")])],
    };
    let path = http::uri::PathAndQuery::from_static(inbound_grpc::server::SHOULD_RATE_LIMIT);
    let codec = tonic_prost::ProstCodec::<RawRequest, RateLimitResponse>::default();
    let e = grpc
        .unary(tonic::Request::new(raw), path, codec)
        .await
        .expect_err("not UTF-8");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}

/// A port that can never decide: every call's result is unknown (one descriptor is a single
/// evaluation, several one multi-limit evaluation failing at its first limit; both answer alike).
fn down(policies: PolicySet) -> ScriptedPort {
    ScriptedPort::indeterminate(policies, 1000)
}

#[tokio::test]
async fn provider_failures_follow_the_policies_failure_policy() {
    let one = || request(vec![descriptor(&[("user", "u")])], 1);
    let closed = start(
        Arc::new(down(policies(FailurePolicy::FailClosed))),
        UnknownDescriptor::Allow,
    )
    .await;
    let e = ask(&mut client(&closed).await, one())
        .await
        .expect_err("fail_closed is an error status");
    assert_eq!(e.code(), tonic::Code::Unknown, "indeterminate: {e:?}");

    let open = start(
        Arc::new(down(policies(FailurePolicy::FailOpen))),
        UnknownDescriptor::Allow,
    )
    .await;
    let r = ask(&mut client(&open).await, one())
        .await
        .expect("fail_open answers");
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn a_mixed_failure_names_the_first_fail_closed_policy_as_http_does() {
    // `user` fails open and comes first (the double names it: the first limit); `tenant`
    // fails closed. The strictest failure policy decides, and the answer names `tenant`, as
    // the HTTP list form and the middleware do (`edge_middleware::failure`).
    let policies = PolicySet::new(
        [
            policy("ip", 1, 1, FailurePolicy::FailClosed),
            policy("tenant", 5, 3, FailurePolicy::FailClosed),
            policy("user", 100, 100, FailurePolicy::FailOpen),
        ],
        PolicyId::new("ip").expect("valid id"),
    )
    .expect("valid policy set");
    let server = start(Arc::new(down(policies)), UnknownDescriptor::Allow).await;
    let mixed = request(
        vec![descriptor(&[("user", "u")]), descriptor(&[("tenant", "t")])],
        1,
    );
    let e = ask(&mut client(&server).await, mixed)
        .await
        .expect_err("fail_closed wins over fail_open");
    assert_eq!(e.code(), tonic::Code::Unknown, "indeterminate: {e:?}");
    assert!(e.message().contains("policy tenant"), "{}", e.message());
    assert!(!e.message().contains("policy user"), "{}", e.message());
}

#[tokio::test]
async fn the_health_service_reports_serving() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let server = local(UnknownDescriptor::Allow).await;
    let channel = channel(&server).await;
    let mut h = HealthClient::new(channel);
    for service in ["", inbound_grpc::SERVICE_NAME] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers")
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn a_shadow_policy_is_charged_never_over_limit_and_every_decision_counted_by_source() {
    // The service registers its metrics with this recorder (a current-thread runtime: the
    // test's thread builds it).
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recording = ::metrics::set_default_local_recorder(&recorder);
    // ip (1 per minute) in shadow mode, tenant (5 per minute) enforced.
    let set = PolicySet::new(
        [
            policy("ip", 1, 1, FailurePolicy::FailClosed).with_shadow(true),
            policy("tenant", 5, 3, FailurePolicy::FailClosed),
            policy("user", 100, 100, FailurePolicy::FailClosed),
        ],
        PolicyId::new("ip").expect("valid id"),
    )
    .expect("valid policy set");
    let port = LocalProvider::new(set, Arc::new(SystemClock), LocalSettings::default());
    let server = start(Arc::new(port), UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let both = || {
        request(
            vec![
                descriptor(&[("remote_address", "a")]),
                descriptor(&[("tenant", "t1")]),
            ],
            1,
        )
    };
    for (i, tenant_left) in [4, 3, 2].into_iter().enumerate() {
        let r = ask(&mut c, both()).await.expect("answered");
        assert_eq!(
            r.overall_code,
            Code::Ok as i32,
            "request {i}: shadow never denies"
        );
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
        assert_eq!(r.statuses[0].limit_remaining, 0, "ip charged");
        assert_eq!(
            r.statuses[1].limit_remaining, tenant_left,
            "request {i}: the shadow denial does not keep tenant from being charged"
        );
        assert!(header(&r, "retry-after").is_none());
    }
    // ip: one allow, two shadow denials; tenant: three allows; all the local provider's.
    let text = handle.render();
    for policy in ["ip", "tenant"] {
        let line = format!(
            "rate_limit_decisions_by_source_total{{policy=\"{policy}\",source=\"local\"}} 3"
        );
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[tokio::test]
async fn a_replaced_configuration_answers_the_next_requests_on_the_same_connection() {
    let port: Arc<dyn EdgeRateLimitPort> = Arc::new(LocalProvider::new(
        policies(FailurePolicy::FailClosed),
        Arc::new(SystemClock),
        LocalSettings::default(),
    ));
    let limiter = limiter(port);
    let service = RlsService::new(limiter.clone(), rules(), UnknownDescriptor::Allow);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(inbound_grpc::serve(listener, service.clone(), async move {
        let _ = stopped.await;
    }));
    let server = Server { addr, _stop: stop };
    let mut c = client(&server).await;
    let tenant = || request(vec![descriptor(&[("tenant", "t-1")])], 1);
    let before = ask(&mut c, tenant()).await.expect("answered");
    assert_eq!(before.overall_code, Code::Ok as i32);
    assert_eq!(before.statuses[0].limit_remaining, 4);

    // The reload: no rule for `tenant` any more, and unknown descriptors deny.
    let only_ip = DescriptorRules::new([DescriptorRule::new(
        "edge".into(),
        vec![EntryMatcher::parse("remote_address").expect("valid entry")],
        PolicyId::new("ip").expect("valid id"),
    )
    .expect("valid rule")])
    .expect("valid rules");
    service.replace_with(&RlsService::new(limiter, only_ip, UnknownDescriptor::Deny));
    let after = ask(&mut c, tenant()).await.expect("answered");
    assert_eq!(after.overall_code, Code::OverLimit as i32, "{after:?}");
}

/// A descriptor of the rule that charges after the work, with its own `hits_addend`.
fn tokens(user: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: hits.map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
        ..descriptor(&[("llm_user", user)])
    }
}

#[tokio::test]
async fn a_rule_that_charges_after_checks_at_0_and_charges_the_stream_done_cost_past_the_limit() {
    let server = local(UnknownDescriptor::Allow).await;
    let mut c = client(&server).await;
    let code_and_left = |r: &RateLimitResponse| (r.overall_code, r.statuses[0].limit_remaining);
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    // Request time: an explicit 0 is a check (a cost of 1 would leave 999); nothing charged.
    let check = ask(&mut c, request(vec![tokens("t1", Some(0))], 0))
        .await
        .expect("answered");
    assert_eq!(code_and_left(&check), (ok, 999));
    // Stream done: the tokens the answer used, charged.
    let done = ask(&mut c, request(vec![tokens("t1", Some(700))], 0))
        .await
        .expect("answered");
    assert_eq!(code_and_left(&done), (ok, 300));
    // More than what is left is charged anyway (the work is done): the budget is spent.
    let done = ask(&mut c, request(vec![tokens("t1", Some(700))], 0))
        .await
        .expect("answered");
    assert_eq!(code_and_left(&done), (ok, 0));
    // The next request-time check is refused; without a descriptor addend, the request's 0
    // is a check too, and the other limits of a refused request are not charged.
    let check = ask(&mut c, request(vec![tokens("t1", Some(0))], 0))
        .await
        .expect("answered");
    assert_eq!(check.overall_code, over);
    let mixed = ask(
        &mut c,
        request(vec![descriptor(&[("user", "t1")]), tokens("t1", None)], 0),
    )
    .await
    .expect("answered");
    assert_eq!(mixed.overall_code, over);
    assert_eq!(mixed.statuses[1].code, over);
    let user = ask(&mut c, request(vec![descriptor(&[("user", "t1")])], 1))
        .await
        .expect("answered");
    assert_eq!(
        user.statuses[0].limit_remaining, 99,
        "the refused request charged nothing"
    );
    // Another user's budget is its own; above max_cost is refused (and so lost).
    let other = ask(&mut c, request(vec![tokens("t2", Some(0))], 0))
        .await
        .expect("answered");
    assert_eq!(code_and_left(&other), (ok, 999));
    let e = ask(&mut c, request(vec![tokens("t2", Some(1_001))], 0))
        .await
        .expect_err("above max_cost");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}
