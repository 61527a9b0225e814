//! A service outside the workspace, made as a new user makes one: a fresh crate in a
//! temporary directory that depends on the crates by path, whose `main` is the config-driven
//! axum example (`crates/app-bootstrap/examples/axum_config.rs`) and whose configuration is
//! the example's file. Built, started, and asked: the 6th request of one API key is 429.
//!
//! The crate gets the workspace's lockfile (the same dependency versions, so the build needs
//! no registry when its cache holds them; without, it fetches) and builds into the
//! workspace's target directory under the same dev profile, so that units it shares with the
//! workspace are not compiled twice.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use acceptance_tests::eventually::eventually;
use acceptance_tests::process::{free_ports, spawn_guarded};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root")
}

/// A new user's manifest: path dependencies, and crates.io for the rest.
fn manifest(root: &Path) -> String {
    let krate = |name: &str| root.join("crates").join(name).display().to_string();
    format!(
        r#"[package]
name = "fresh-embedder"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
app-bootstrap = {{ path = {app:?} }}
edge-middleware = {{ path = {edge:?} }}
axum = "0.8"
tokio = {{ version = "1", features = ["macros", "rt-multi-thread", "net"] }}
toml = "0.9"

[profile.dev]
debug = "line-tables-only"

[workspace]
"#,
        app = krate("app-bootstrap"),
        edge = krate("edge-middleware"),
    )
}

/// Builds the crate in `dir` and returns its executable.
fn build(dir: &Path, root: &Path) -> PathBuf {
    let run = |offline: bool| {
        let mut c = acceptance_tests::cargo::command();
        c.args(["build", "--message-format=json"])
            .env("CARGO_TARGET_DIR", root.join("target"))
            .current_dir(dir)
            .stderr(Stdio::inherit());
        if offline {
            c.arg("--offline");
        }
        c.output().expect("run cargo build")
    };
    let mut out = run(true);
    if !out.status.success() {
        eprintln!("the offline build failed (a dependency not in the cache?); trying online");
        out = run(false);
    }
    assert!(out.status.success(), "the fresh crate does not build");
    acceptance_tests::cargo::executable(&out.stdout, "fresh-embedder")
        .expect("cargo names the executable")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_crate_with_path_dependencies_runs_the_config_driven_example() {
    // Its build takes both cores: no other heavy test beside it.
    let _heavy = crate::heavy().await;
    let root = root();
    let dir = tempfile::tempdir().expect("a temp dir");
    let examples = root.join("crates/app-bootstrap/examples");
    std::fs::create_dir(dir.path().join("src")).expect("src/");
    std::fs::write(dir.path().join("Cargo.toml"), manifest(&root)).expect("manifest");
    std::fs::copy(root.join("Cargo.lock"), dir.path().join("Cargo.lock")).expect("lockfile");
    std::fs::copy(
        examples.join("axum_config.rs"),
        dir.path().join("src/main.rs"),
    )
    .expect("main");
    let config = dir.path().join("service.toml");
    std::fs::copy(examples.join("axum_config.toml"), &config).expect("config");

    let exe = build(dir.path(), &root);
    let bind = format!("127.0.0.1:{}", free_ports(1)[0]);
    // `env`: the variables of the service's own prefix; ORDERS_ENV is the service's business.
    let args = [
        format!("ORDERS_BIND={bind}"),
        "ORDERS_ENV=prod".into(),
        exe.display().to_string(),
        config.display().to_string(),
    ];
    let service = spawn_guarded("env", &args).expect("the service starts");

    let client = reqwest::Client::new();
    let base = format!("http://{bind}");
    let healthz = format!("{base}/healthz");
    eventually(
        "the service answers /healthz",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || client.get(&healthz).send().await.map(|r| r.status()),
    )
    .await;
    let search = async |key: &str| {
        let r = client
            .get(format!("{base}/search"))
            .header("x-api-key", key);
        r.send().await.expect("an answer").status().as_u16()
    };
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(search("k1").await);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    // Another key has its own quota; /healthz has none.
    assert_eq!(search("k2").await, 200);
    for _ in 0..10 {
        let r = client.get(&healthz).send().await.expect("an answer");
        assert_eq!(r.status().as_u16(), 200);
    }
    assert!(service.is_running(), "the service is still up");
}
