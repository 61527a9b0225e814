//! Architecture invariants, checked on every test run (rust-analyzer's `tidy` idea): the
//! dependency direction, and no adapter or runtime detail leaking into the contract.
//!
//! The direction, each arrow pointing at what a crate depends on:
//!
//! ```text
//! inbound-web ──> app-bootstrap ──> adapter-redis, adapter-local ──> shared-contract
//!      │                └──────────> edge-middleware ──────────────> shared-contract
//!      ├──────────────────────────> edge-middleware
//!      ├──> inbound-grpc ──────────> edge-middleware, shared-contract
//!      │         └──> inbound-listener (no workspace crate)
//!      └──> inbound-listener
//! ```
//!
//! Checked twice: on the manifests and `use` lines (direct dependencies), and on the graph
//! `cargo metadata` resolves (normal dependencies, transitively, on every platform), where a
//! crate reached through another one counts too. So the middleware library never reaches
//! Redis, TLS or the configuration layer, and the contract reaches no runtime, driver or
//! serializer, however the crates in between change. Docs and comments point only at what the
//! repository holds.

mod graph;
mod modules;
mod references;
mod sizes;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace root")
        .to_path_buf()
}

/// Dependencies (normal, not dev) of the crate in `crates/<name>`.
fn deps(name: &str) -> BTreeSet<String> {
    let path = root().join("crates").join(name).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let manifest: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeSet::new();
    if let Some(toml::Value::Table(d)) = manifest.get("dependencies") {
        out.extend(d.keys().cloned());
    }
    if let Some(toml::Value::Table(t)) = manifest.get("target") {
        for cfg in t.values() {
            if let Some(toml::Value::Table(d)) = cfg.get("dependencies") {
                out.extend(d.keys().cloned());
            }
        }
    }
    out
}

const WORKSPACE_CRATES: [&str; 6] = [
    "shared-contract",
    "adapter-redis",
    "adapter-local",
    "edge-middleware",
    "app-bootstrap",
    "inbound-web",
];

fn workspace_deps(name: &str) -> BTreeSet<String> {
    deps(name)
        .into_iter()
        .filter(|d| WORKSPACE_CRATES.contains(&d.as_str()))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Every `.rs` file below `crates/<name>/src`, with its text.
fn sources(name: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("crates").join(name).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.push((p, text));
            }
        }
    }
    out
}

fn assert_no_mention(name: &str, forbidden: &[&str]) {
    for (path, text) in sources(name) {
        for line in text.lines() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for f in forbidden {
                assert!(
                    !code.contains(&format!("{f}::")),
                    "{} mentions `{f}::` ({}): {name} must not depend on it",
                    path.display(),
                    code
                );
            }
        }
    }
}

#[test]
fn shared_contract_depends_on_no_workspace_crate_runtime_driver_or_serializer() {
    assert!(workspace_deps("shared-contract").is_empty());
    let forbidden = [
        "tokio",
        "redis",
        "fred",
        "axum",
        "serde",
        "serde_json",
        "moka",
        "hyper",
    ];
    let d = deps("shared-contract");
    for f in forbidden {
        assert!(!d.contains(f), "shared-contract must not depend on {f}");
    }
    assert_no_mention("shared-contract", &forbidden);
}

#[test]
fn adapters_depend_only_on_the_contract() {
    for adapter in ["adapter-redis", "adapter-local"] {
        assert_eq!(
            workspace_deps(adapter),
            set(&["shared-contract"]),
            "{adapter}"
        );
    }
    assert_no_mention(
        "adapter-redis",
        &["adapter_local", "app_bootstrap", "inbound_web"],
    );
    assert_no_mention(
        "adapter-local",
        &["adapter_redis", "app_bootstrap", "inbound_web"],
    );
}

#[test]
fn only_app_bootstrap_names_the_adapters() {
    let d = workspace_deps("app-bootstrap");
    assert!(d.contains("shared-contract"));
    assert!(
        !d.contains("inbound-web"),
        "app-bootstrap must not depend on inbound-web"
    );
}

#[test]
fn inbound_web_never_depends_on_an_adapter_directly() {
    let d = workspace_deps("inbound-web");
    assert!(
        !d.contains("adapter-redis") && !d.contains("adapter-local"),
        "{d:?}"
    );
    assert_no_mention("inbound-web", &["adapter_redis", "adapter_local"]);
}

#[test]
fn every_lua_program_has_a_versioned_name() {
    let dir = root().join("lua");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".lua") {
            let stem = name.trim_end_matches(".lua");
            let version = stem.rsplit('-').next().unwrap_or_default();
            assert!(
                version.starts_with('v') && version[1..].parse::<u32>().is_ok(),
                "lua/{name} must end in -vN.lua"
            );
        }
    }
}
