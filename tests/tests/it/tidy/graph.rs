//! The dependency rules on the graph `cargo metadata` resolves: transitive, every platform.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::OnceLock;

use super::{root, set};

/// The workspace's dependency graph as `cargo metadata` resolves it: normal dependencies only
/// (not dev, not build), on every platform (no `--filter-platform`: a dependency behind a
/// `cfg` counts everywhere).
#[derive(Debug)]
struct Graph {
    /// Package name by package id.
    names: HashMap<String, String>,
    /// Normal dependencies (package ids) by package id.
    normal: HashMap<String, Vec<String>>,
    /// Package id of each workspace member, by name.
    members: HashMap<String, String>,
}

/// The graph, read once per test run.
fn graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(read_graph)
}

fn read_graph() -> Graph {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let text = |v: &serde_json::Value| v.as_str().expect("a string").to_owned();
    let list = |v: &serde_json::Value| v.as_array().cloned().unwrap_or_default();
    let names: HashMap<String, String> = list(&meta["packages"])
        .iter()
        .map(|p| (text(&p["id"]), text(&p["name"])))
        .collect();
    let members = list(&meta["workspace_members"])
        .iter()
        .map(|id| (names[&text(id)].clone(), text(id)))
        .collect();
    let packages: HashMap<String, &serde_json::Value> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (text(&p["id"]), p))
        .collect();
    let normal = list(&meta["resolve"]["nodes"])
        .iter()
        .map(|node| {
            let id = text(&node["id"]);
            let deps = list(&node["deps"])
                .iter()
                .filter(|d| list(&d["dep_kinds"]).iter().any(|k| k["kind"].is_null()))
                .map(|d| text(&d["pkg"]))
                .filter(|dep| activated(packages[&id], node, &names[dep]))
                .collect();
            (id, deps)
        })
        .collect();
    Graph {
        names,
        normal,
        members,
    }
}

/// Whether `node` (a package of `package`) really uses its dependency named `dep`: always
/// for a required one; for an optional one, only when an enabled feature turns it on.
/// `cargo metadata` also lists an optional dependency that only a weak feature (`dep?/x`)
/// names, which compiles nothing.
fn activated(package: &serde_json::Value, node: &serde_json::Value, dep: &str) -> bool {
    let declared = package["dependencies"].as_array().into_iter().flatten();
    let optional: Vec<&str> = declared
        .filter(|d| d["name"] == dep && d["kind"].is_null())
        .filter(|d| d["optional"] == true)
        .map(|d| d["rename"].as_str().or(d["name"].as_str()).unwrap_or(dep))
        .collect();
    if optional.is_empty() {
        return true;
    }
    let enabled: Vec<&str> = node["features"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str())
        .collect();
    optional.iter().any(|key| {
        enabled.contains(key)
            || enabled.iter().any(|f| {
                package["features"][*f]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .any(|v| v == format!("dep:{key}") || v.starts_with(&format!("{key}/")))
            })
    })
}

impl Graph {
    fn member(&self, name: &str) -> &str {
        self.members
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a workspace member"))
    }

    /// The names of the normal dependencies of the member `name`.
    fn direct(&self, name: &str) -> BTreeSet<String> {
        self.normal[self.member(name)]
            .iter()
            .map(|id| self.names[id].clone())
            .collect()
    }

    /// The names of every package the member `name` reaches through normal dependencies,
    /// without passing through the members `avoiding`.
    fn reaches(&self, name: &str, avoiding: &[&str]) -> BTreeSet<String> {
        let avoided: BTreeSet<&str> = avoiding.iter().map(|a| self.member(a)).collect();
        let mut seen = BTreeSet::new();
        let mut stack = vec![self.member(name)];
        while let Some(id) = stack.pop() {
            for dep in self.normal.get(id).into_iter().flatten() {
                if !avoided.contains(dep.as_str()) && seen.insert(dep.as_str()) {
                    stack.push(dep);
                }
            }
        }
        seen.iter().map(|id| self.names[*id].clone()).collect()
    }
}

/// Asserts that the member `name` reaches no package of the `forbidden` families: named so,
/// or with it as one `-`/`_`-separated part of the name (`rustls` catches `tokio-rustls`,
/// `serde` catches `serde_json`, `hyper` does not catch `hyperloglog`).
fn assert_reaches_none(name: &str, forbidden: &[&str]) {
    let of_family = |package: &str, family: &str| {
        package.split(['-', '_']).any(|part| part == family)
            || (family.contains('-') && package.contains(family))
    };
    let found: Vec<String> = graph()
        .reaches(name, &[])
        .into_iter()
        .filter(|package| forbidden.iter().any(|f| of_family(package, f)))
        .collect();
    assert!(found.is_empty(), "{name} reaches {found:?}");
}

#[test]
fn edge_middleware_never_reaches_redis_tls_configuration_runtime_or_framework() {
    // Redis, TLS and the configuration layer are what the library split exists to avoid;
    // the runtime and the web framework are what its crate docs promise it does without.
    let forbidden = [
        "redis",
        "rustls",
        "figment",
        "tokio",
        "async-std",
        "axum",
        "hyper",
    ];
    assert_reaches_none("edge-middleware", &forbidden);
}

#[test]
fn shared_contract_reaches_no_runtime_driver_or_serializer() {
    let forbidden = [
        "tokio",
        "async-std",
        "redis",
        "fred",
        "serde",
        "axum",
        "hyper",
        "moka",
    ];
    assert_reaches_none("shared-contract", &forbidden);
}

#[test]
fn edge_middleware_depends_on_no_workspace_crate_but_the_contract() {
    let g = graph();
    let workspace = |names: BTreeSet<String>| -> BTreeSet<String> {
        names
            .into_iter()
            .filter(|n| g.members.contains_key(n))
            .collect()
    };
    let contract = set(&["shared-contract"]);
    assert_eq!(workspace(g.direct("edge-middleware")), contract);
    assert_eq!(workspace(g.reaches("edge-middleware", &[])), contract);
}

#[test]
fn inbound_web_reaches_the_adapters_only_through_app_bootstrap() {
    // By package name, so a renamed dependency (`local = { package = "adapter-local" }`)
    // counts as well.
    let g = graph();
    let adapters = ["adapter-redis", "adapter-local"];
    let direct = g.direct("inbound-web");
    assert!(
        adapters.iter().all(|a| !direct.contains(*a)),
        "inbound-web depends on an adapter directly: {direct:?}"
    );
    let around = g.reaches("inbound-web", &["app-bootstrap"]);
    let found: Vec<_> = adapters.iter().filter(|a| around.contains(**a)).collect();
    assert!(
        found.is_empty(),
        "inbound-web reaches {found:?} other than through app-bootstrap"
    );
}

#[test]
fn inbound_grpc_never_reaches_redis_tls_configuration_or_web_framework() {
    // The gateway's entry point needs the contract, the edge and the gRPC stack: a provider,
    // TLS, the configuration layer or axum (which tonic's router would bring) is a mistake.
    let forbidden = ["redis", "rustls", "figment", "axum", "fred", "moka"];
    assert_reaches_none("inbound-grpc", &forbidden);
}

#[test]
fn inbound_grpc_depends_on_no_workspace_crate_but_the_contract_the_edge_and_the_listener() {
    let g = graph();
    let workspace: BTreeSet<String> = g
        .reaches("inbound-grpc", &[])
        .into_iter()
        .filter(|n| g.members.contains_key(n))
        .collect();
    assert_eq!(
        workspace,
        set(&["shared-contract", "edge-middleware", "inbound-listener"])
    );
}

#[test]
fn inbound_listener_depends_on_no_workspace_crate() {
    // The accept loop under both servers knows no protocol, provider or configuration.
    let g = graph();
    let workspace: BTreeSet<String> = g
        .reaches("inbound-listener", &[])
        .into_iter()
        .filter(|n| g.members.contains_key(n))
        .collect();
    assert!(workspace.is_empty(), "{workspace:?}");
    let forbidden = ["hyper", "axum", "tonic", "redis", "figment"];
    assert_reaches_none("inbound-listener", &forbidden);
}
