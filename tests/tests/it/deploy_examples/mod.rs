//! The deployment examples in `deploy/` (the Kubernetes objects of `deploy/kubernetes`, the
//! Envoy bootstrap of `deploy/envoy`) checked against what they deploy: the image that
//! `deploy/image/build.sh` builds (its command, user and ports), the app's own configuration
//! loader, and the release `inbound-web` started the way the Deployment starts it.
//!
//! There is no cluster here: each check compares a value of an example with the value of the
//! thing it must agree with, so an example that drifts from the image, the app or another
//! example fails here. The pod's file system is rebuilt under a temporary directory from the
//! Deployment's volumes (the ConfigMap's keys, the Secret's items, at their mount paths), so
//! the configuration's relative secret path is resolved exactly as in the pod.
//!
//! The binary is the release build the image holds: `BIN` when set, else what
//! `cargo build --release --locked -p inbound-web` gives (CI builds it before the tests, so
//! there that is a freshness check).

mod examples;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use acceptance_tests::eventually::{eventually_blocking, poll_blocking};
use acceptance_tests::redis_server::RedisServer;
use app_bootstrap::{ProviderSettings, RateLimitSettings};
use serde_norway::Value;

use examples::{
    Kube, Pod, at, documents, envoy, envoy_descriptors, image, labels, list, number,
    ratelimit_filter, root, text,
};

/// The release `inbound-web`, the binary the image holds (module docs).
fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("BIN") {
            return PathBuf::from(bin);
        }
        // A release build takes both cores for minutes when stale: no heavy test beside it.
        let _heavy = crate::heavy_blocking();
        let mut build = acceptance_tests::cargo::command();
        let out = build
            .args(["build", "--release", "--locked", "-p", "inbound-web"])
            .args(["--bin", "inbound-web", "--message-format=json"])
            .current_dir(root())
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build --release -p inbound-web failed"
        );
        acceptance_tests::cargo::executable(&out.stdout, "inbound-web")
            .expect("cargo names the inbound-web executable")
    })
}

/// The binary with the Deployment's arguments (in `pod`) and `extra`, and of the machine's
/// environment none of the `APP_` variables.
fn inbound_web(pod: &Pod, kube: &Kube, extra: &[&str]) -> Command {
    let mut c = Command::new(binary());
    c.args(pod.args(kube)).args(extra).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().to_ascii_uppercase().starts_with("APP_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn every_example_is_yaml_and_the_kustomization_lists_every_object_file() {
    let kube = Kube::read();
    let mut objects = BTreeSet::new();
    for (file, doc) in &kube.docs {
        assert!(at(doc, "apiVersion").is_string(), "{file}: apiVersion");
        if text(doc, "kind") != "Kustomization" {
            assert!(
                !text(doc, "metadata.name").is_empty(),
                "{file}: metadata.name"
            );
            objects.insert(file.clone());
        }
    }
    let listed: BTreeSet<String> = list(kube.object("Kustomization"), "resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_owned())
        .collect();
    assert_eq!(listed, objects, "kustomization.yaml resources");
    let envoy = documents("envoy");
    assert!(
        envoy
            .iter()
            .any(|(_, d)| d.get("static_resources").is_some()),
        "deploy/envoy has an Envoy bootstrap"
    );
}

#[test]
fn the_deployment_runs_the_images_command_as_the_images_user_read_only() {
    let kube = Kube::read();
    let image = image();
    let c = kube.container();
    assert_eq!(text(c, "image"), image.tag, "the image build.sh tags");
    assert!(c.get("command").is_none(), "the image's entrypoint is kept");
    let args: Vec<&str> = list(c, "args").iter().filter_map(Value::as_str).collect();
    assert_eq!(args, image.cmd, "args are the image's CMD");
    let config = args
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| args.get(i + 1))
        .expect("--config PATH");
    assert_eq!(*config, kube.config_path(), "the ConfigMap's mount path");
    assert_eq!(
        (
            kube.security("runAsUser").as_u64(),
            kube.security("runAsGroup").as_u64()
        ),
        (Some(image.user.0), Some(image.user.1)),
        "the image's USER"
    );
    assert_eq!(kube.security("runAsNonRoot").as_bool(), Some(true));
    assert_eq!(
        kube.security("readOnlyRootFilesystem").as_bool(),
        Some(true)
    );
    assert_eq!(
        kube.security("allowPrivilegeEscalation").as_bool(),
        Some(false)
    );
    let dropped: Vec<&str> = list(kube.security("capabilities"), "drop")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(dropped, ["ALL"]);
    for m in list(c, "volumeMounts") {
        assert_eq!(
            at(m, "readOnly").as_bool(),
            Some(true),
            "{} read-only",
            text(m, "name")
        );
    }
    let ports: BTreeSet<u64> = kube.container_ports().into_values().collect();
    assert_eq!(
        ports, image.exposed,
        "container ports are the image's EXPOSE"
    );
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            at(c, &format!("resources.{kind}.{resource}"));
        }
    }
    assert!(
        number(
            kube.deployment(),
            "spec.template.spec.terminationGracePeriodSeconds"
        ) > 0
    );
}

#[test]
fn the_configmaps_config_loads_in_the_pods_layout_on_the_container_ports() {
    let kube = Kube::read();
    let pod = kube.pod();
    let s = pod.settings(&kube);
    let ports = kube.container_ports();
    let any = |port: u64| {
        let port = u16::try_from(port).expect("a port number");
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    };
    assert_eq!(s.http.bind, any(ports["http"]), "http.bind");
    assert_eq!(s.grpc.bind, Some(any(ports["grpc"])), "grpc.bind");
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        panic!("the ConfigMap must enable rate limiting");
    };
    let ProviderSettings::Redis(r) = &e.provider else {
        panic!("the ConfigMap must use the Redis provider");
    };
    assert!(
        r.redis.url.starts_with("redis://redis:"),
        "the Service redis: {}",
        r.redis.url
    );
    // The secret came from the Secret's file, resolved as in the pod.
    let volume = list(kube.container(), "volumeMounts")
        .iter()
        .find(|m| kube.volume(text(m, "name")).get("secret").is_some())
        .expect("a Secret mounted");
    let item = text(
        &list(kube.volume(text(volume, "name")), "secret.items")[0],
        "path",
    );
    let mounted = pod.path(&format!("{}/{item}", text(volume, "mountPath")));
    let read = e.subject_secret_file.as_ref().expect("subject_secret_file");
    assert_eq!(
        read.canonicalize().expect("the secret file"),
        mounted.canonicalize().expect("the mounted Secret")
    );
    assert!(e.subject_secret.is_some());
    for probe in ["livenessProbe", "readinessProbe"] {
        let port = kube.resolve_port(at(kube.container(), &format!("{probe}.httpGet.port")));
        assert_eq!(
            port,
            u64::from(s.http.bind.port()),
            "{probe} on http.bind's port"
        );
    }
}

#[test]
fn the_envoy_descriptors_are_the_configmaps_rules() {
    let kube = Kube::read();
    let s = kube.pod().settings(&kube);
    let (domain, descriptors) = envoy_descriptors(&envoy());
    let rules: BTreeSet<(String, Vec<String>)> = s
        .rls
        .iter()
        .map(|r| {
            let entries = r.entries().iter().map(|e| match e.value() {
                Some(v) => format!("{}={v}", e.key()),
                None => e.key().to_owned(),
            });
            (r.domain().to_owned(), entries.collect())
        })
        .collect();
    let envoy: BTreeSet<(String, Vec<String>)> = descriptors
        .iter()
        .map(|d| (domain.clone(), d.clone()))
        .collect();
    assert_eq!(envoy, rules, "Envoy's descriptors and [[rls.descriptors]]");
    // And the app's own matcher finds a rule for each, with values Envoy would send.
    for d in &descriptors {
        let entries = d.iter().map(|k| (k.as_str(), "some-value"));
        assert!(s.rls.find(&domain, entries).is_some(), "{domain} {d:?}");
    }
}

#[test]
fn the_envoy_rate_limit_cluster_is_the_services_grpc_port_over_http2() {
    let kube = Kube::read();
    let s = kube.pod().settings(&kube);
    let bootstrap = &envoy();
    let (_, filter) = ratelimit_filter(bootstrap);
    let name = text(
        filter,
        "typed_config.rate_limit_service.grpc_service.envoy_grpc.cluster_name",
    );
    let cluster = list(bootstrap, "static_resources.clusters")
        .iter()
        .find(|c| text(c, "name") == name)
        .unwrap_or_else(|| panic!("no cluster {name}"));
    // gRPC needs HTTP/2 to the upstream (the key has dots: looked up whole).
    let options = at(cluster, "typed_extension_protocol_options")
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
        .expect("the cluster's HttpProtocolOptions");
    at(options, "explicit_http_config.http2_protocol_options");
    let address = at(
        cluster,
        "load_assignment.endpoints.0.lb_endpoints.0.endpoint.address.socket_address",
    );
    let service = kube.object("Service");
    let host = text(address, "address");
    assert_eq!(
        host.split('.').next(),
        Some(text(service, "metadata.name")),
        "the Service's name: {host}"
    );
    let grpc = list(service, "spec.ports")
        .iter()
        .find(|p| text(p, "name") == "grpc")
        .expect("the Service's grpc port");
    assert_eq!(number(address, "port_value"), number(grpc, "port"));
    let target = kube.resolve_port(at(grpc, "targetPort"));
    assert_eq!(Some(target), s.grpc.bind.map(|b| u64::from(b.port())));
    // fail_closed there, failure_mode_deny here: closed end to end (docs/envoy.md).
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        panic!("rate limiting enabled");
    };
    assert_eq!(
        at(filter, "typed_config.failure_mode_deny").as_bool(),
        Some(e.failure_policy == shared_contract::FailurePolicy::FailClosed)
    );
}

#[test]
fn the_service_and_the_disruption_budget_select_the_deployments_pods() {
    let kube = Kube::read();
    let deployment = kube.deployment();
    let pods = labels(deployment, "spec.template.metadata.labels");
    let service = kube.object("Service");
    let pdb = kube.object("PodDisruptionBudget");
    for (what, selector) in [
        (
            "the Deployment",
            labels(deployment, "spec.selector.matchLabels"),
        ),
        ("the Service", labels(service, "spec.selector")),
        (
            "the PodDisruptionBudget",
            labels(pdb, "spec.selector.matchLabels"),
        ),
    ] {
        assert!(!selector.is_empty(), "{what} selects something");
        for (k, v) in &selector {
            assert_eq!(pods.get(k), Some(v), "{what} selects the pods by {k}");
        }
    }
    let served: BTreeMap<String, u64> = list(service, "spec.ports")
        .iter()
        .map(|p| {
            let target = kube.resolve_port(at(p, "targetPort"));
            assert_eq!(
                number(p, "port"),
                target,
                "the Service's port is the container's"
            );
            (text(p, "name").to_owned(), target)
        })
        .collect();
    assert_eq!(served, kube.container_ports());
    let replicas = number(deployment, "spec.replicas");
    let unavailable = number(pdb, "spec.maxUnavailable");
    assert!(
        (1..replicas).contains(&unavailable),
        "a drain may take {unavailable} of {replicas} replicas: some, never all"
    );
}

#[test]
fn the_binary_accepts_the_deployments_args_and_checks_the_configmaps_config() {
    let kube = Kube::read();
    let pod = kube.pod();
    let out = inbound_web(&pod, &kube, &["--check"])
        .output()
        .expect("run inbound-web");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inbound-web {:?} --check: {}",
        pod.args(&kube),
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, port) in kube.container_ports() {
        assert!(
            printed.contains(&format!("bind = \"0.0.0.0:{port}\"")),
            "--check prints a bind on the {name} port {port}:\n{printed}"
        );
    }
}

/// A started `inbound-web`, killed on drop when it is still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Status of `GET path` on a new connection.
fn get(addr: &str, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect to the app");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn the_probes_answer_200_on_the_app_started_as_the_pod_starts_it_and_sigterm_exits_0() {
    let kube = Kube::read();
    let pod = kube.pod();
    let redis = RedisServer::start();
    // The pod's configuration and arguments; only the addresses differ: free loopback ports
    // instead of 8080 and 8081, this test's Redis instead of the Service redis.
    let mut cmd = inbound_web(&pod, &kube, &[]);
    cmd.env("APP_HTTP__BIND", "127.0.0.1:0")
        .env("APP_GRPC__BIND", "127.0.0.1:0")
        .env("APP_RATE_LIMIT__REDIS__URL", redis.url())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut app = Running(cmd.spawn().expect("start inbound-web"));
    let stderr = app.0.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = String::new();
    let (mut http, mut grpc) = (None, None);
    while http.is_none() || grpc.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("inbound-web did not start; its log:\n{log}"));
        let after = |marker: &str| {
            let rest = line.split(marker).nth(1)?;
            Some(
                rest.split(['"', ' '])
                    .next()
                    .unwrap_or(rest)
                    .trim()
                    .to_owned(),
            )
        };
        http = http.or_else(|| after("listening on http://"));
        grpc = grpc.or_else(|| after("gRPC rate-limit service listening on "));
        log.push_str(&line);
        log.push('\n');
    }
    let (http, grpc) = (http.expect("http"), grpc.expect("grpc"));
    TcpStream::connect(&grpc).expect("the gRPC port accepts");
    for probe in ["livenessProbe", "readinessProbe"] {
        let path = text(kube.container(), &format!("{probe}.httpGet.path"));
        // Readiness waits for the first Redis connection.
        eventually_blocking(
            &format!("{probe} {path} answers 200"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || match get(&http, path) {
                200 => Ok(()),
                other => Err(other),
            },
        );
    }
    let grace = number(
        kube.deployment(),
        "spec.template.spec.terminationGracePeriodSeconds",
    );
    let pid = app.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let exited = poll_blocking(
        Duration::from_secs(grace),
        Duration::from_millis(20),
        || app.0.try_wait().expect("wait").ok_or(()),
    );
    let status = exited.unwrap_or_else(|()| panic!("no exit within the {grace} s grace period"));
    assert!(status.success(), "SIGTERM: {status}");
}
