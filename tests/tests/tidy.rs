//! Architecture invariants, checked on every test run (rust-analyzer's `tidy` idea): the
//! dependency direction, and no adapter or runtime detail leaking into the contract.
//!
//! The direction, each arrow pointing at what a crate depends on:
//!
//! ```text
//! inbound-web ──> app-bootstrap ──> adapter-redis, adapter-local ──> shared-contract
//!      │                └──────────> edge-middleware ──────────────> shared-contract
//!      └──────────────────────────> edge-middleware
//! ```
//!
//! Checked twice: on the manifests and `use` lines (direct dependencies), and on the graph
//! `cargo metadata` resolves (normal dependencies, transitively, on every platform), where a
//! crate reached through another one counts too. So the middleware library never reaches
//! Redis, TLS or the configuration layer, and the contract reaches no runtime, driver or
//! serializer, however the crates in between change. Docs and comments point only at what the
//! repository holds.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
    let normal = list(&meta["resolve"]["nodes"])
        .iter()
        .map(|node| {
            let deps = list(&node["deps"])
                .iter()
                .filter(|d| list(&d["dep_kinds"]).iter().any(|k| k["kind"].is_null()))
                .map(|d| text(&d["pkg"]))
                .collect();
            (text(&node["id"]), deps)
        })
        .collect();
    Graph {
        names,
        normal,
        members,
    }
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

/// Text files a reader of the repository opens: sources, docs, manifests and scripts
/// (`target/` and `.git/` left out), each with its text.
fn repo_text_files(root: &Path) -> Vec<(PathBuf, String)> {
    const EXTENSIONS: [&str; 6] = ["rs", "md", "toml", "sh", "lua", "py"];
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && name != ".git" {
                    stack.push(p);
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let known = p
                .extension()
                .is_some_and(|e| EXTENSIONS.iter().any(|x| e == *x));
            // Extensionless scripts (such as `.ci/run`) count too.
            if known || (p.extension().is_none() && text.starts_with("#!")) {
                out.push((p, text));
            }
        }
    }
    out.sort();
    out
}

/// The lines of `text` a reader reads as prose, numbered from 1: every line of a document,
/// manifest or script; only the comments of a Rust source (its string literals are code,
/// such as the patterns of this very check).
fn prose_lines<'a>(path: &Path, text: &'a str) -> Vec<(usize, &'a str)> {
    let rust = path.extension().is_some_and(|e| e == "rs");
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            if !rust || line.trim_start().starts_with("//") {
                return Some((i + 1, line));
            }
            line.find(" // ").map(|at| (i + 1, &line[at..]))
        })
        .collect()
}

/// Characters of a path as docs and comments write one.
fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// Paths below the repository root that `line` mentions (a path starting with one of
/// `ROOTS`), without a trailing `#anchor` or punctuation. A mention that continues with a glob
/// or a placeholder (`lua/rate-*-v1.lua`, `bench/<name>`) names no single file and is left
/// out, as is a path inside a longer one (`adapter-redis/src/...`, a URL).
fn root_path_mentions(line: &str) -> Vec<String> {
    const ROOTS: [&str; 7] = [
        "docs/",
        "lua/",
        "crates/",
        "bench/",
        "examples/",
        "tests/tests/",
        "tests/src/",
    ];
    let mut out = Vec::new();
    for (at, _) in line.char_indices() {
        let rest = &line[at..];
        let Some(prefix) = ROOTS.iter().find(|r| rest.starts_with(*r)) else {
            continue;
        };
        let before = &line[..at];
        let boundary = before.chars().next_back().is_none_or(|c| !is_path_char(c))
            || before.ends_with("$ROOT/");
        if !boundary {
            continue;
        }
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        if rest[end..].starts_with(['*', '<', '{', '$']) {
            continue;
        }
        let path = rest[..end].trim_end_matches(['.', ',', ':', ';']);
        if path.len() > prefix.len() || path == *prefix {
            out.push(path.to_owned());
        }
    }
    out
}

/// Targets of relative markdown links (`[text](path#anchor)`) in `line`, anchors removed.
fn markdown_link_targets(line: &str) -> Vec<String> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or_default();
            let external = target.contains("://") || target.starts_with("mailto:");
            (!external && !target.is_empty()).then(|| target.to_owned())
        })
        .collect()
}

/// The path literal of an `include_str!` / `include_bytes!` in `line`.
fn include_target(line: &str) -> Option<&str> {
    let at = line
        .find("include_str!(\"")
        .map(|i| i + "include_str!(\"".len())
        .or_else(|| {
            line.find("include_bytes!(\"")
                .map(|i| i + "include_bytes!(\"".len())
        })?;
    let rest = &line[at..];
    rest.find('"').map(|end| &rest[..end])
}

/// Mentions of what a reader of the repository cannot open: the external interface page,
/// the shared folder beside the repository, numbered seeds and numbered issues.
fn unopenable_mentions(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let mut out = Vec::new();
    for fixed in ["interface.md", "../shared", "seeds/"] {
        if lower.contains(fixed) {
            out.push(format!("mentions `{fixed}`"));
        }
    }
    for word in ["seed ", "issue "] {
        for (at, _) in lower.match_indices(word) {
            let rest = lower[at + word.len()..].trim_start_matches('#');
            let starts_word = at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric();
            if starts_word && rest.starts_with(|c: char| c.is_ascii_digit()) {
                let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
                out.push(format!("mentions `{word}{n}`"));
            }
        }
    }
    out
}

/// Every reference in `line` of `file` that a reader of the repository at `root` cannot
/// follow, described.
fn dangling_references(root: &Path, file: &Path, line: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(root);
    let mut out = unopenable_mentions(line);
    for path in root_path_mentions(line) {
        if !root.join(&path).exists() {
            out.push(format!("`{path}` is not in the repository"));
        }
    }
    if file.extension().is_some_and(|e| e == "md") {
        for target in markdown_link_targets(line) {
            if !dir.join(&target).exists() {
                out.push(format!(
                    "link to `{target}`, which is not in the repository"
                ));
            }
        }
    }
    if let Some(target) = include_target(line)
        && !dir.join(target).exists()
    {
        out.push(format!(
            "includes `{target}`, which is not in the repository"
        ));
    }
    out
}

/// Docs and comments point only at what a reader of the repository can open: every path
/// they mention, every relative link and every `include_str!` resolves to a file of the
/// repository, and none names the external interface page, a seed or an issue by number.
#[test]
fn docs_and_comments_reference_only_files_in_the_repo() {
    let root = root();
    let mut problems = Vec::new();
    for (path, text) in repo_text_files(&root) {
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        for (n, line) in prose_lines(&path, &text) {
            for p in dangling_references(&root, &path, line) {
                problems.push(format!("{shown}:{n}: {p}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} references a reader of the repository cannot follow:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check above finds what it is meant to find (so that its passing means something).
#[test]
fn the_reference_check_flags_dangling_and_unopenable_references() {
    let root = root();
    let md = root.join("README.md");
    let rs = root.join("tests").join("tests").join("tidy.rs");
    let flagged = |file: &Path, line: &str| dangling_references(&root, file, line).len();
    // Each of these lines holds exactly one problem.
    for line in [
        "see docs/no-such-page.md for more",
        "run `bench/no-such-script.sh 10`",
        "as the [guide](missing.md#top) says",
        "the contract of interface.md",
        "as in ../shared/spec",
        "the fixture of seed 004",
        "asked by issue 3",
        "asked by Issue #12",
    ] {
        assert_eq!(flagged(&md, line), 1, "{line}");
    }
    assert_eq!(
        flagged(&rs, r#"const X: &str = include_str!("../no-such.lua");"#),
        1
    );
    // None of these is a problem.
    for line in [
        "see [the architecture](docs/ARCHITECTURE.md#code-map) and docs/operations.md.",
        "every `lua/rate-*-v1.lua`, `bench/<name>/RESULTS.md`, https://example.com/docs/x.md",
        "crates/adapter-redis/src/ and `examples/local.toml`; cluster seed nodes; the issue's goal",
    ] {
        assert_eq!(flagged(&md, line), 0, "{line}");
    }
}
