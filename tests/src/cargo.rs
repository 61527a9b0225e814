//! Cargo run from inside a test: a build of the workspace's release binary, or of a crate
//! made by the test, the way a user would run it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// `cargo` (the one running the tests) without the variables Cargo sets for the test crate it
/// runs: build scripts (ring's, aws-lc's) track `CARGO_MANIFEST_DIR` and the like, and with
/// this package's values they would run again and rebuild what they built. Its configuration
/// (`CARGO_HOME`, `CARGO_TARGET_DIR`, ...) is kept: the nested build sees it as the outer one
/// did.
pub fn command() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut c = Command::new(cargo);
    for (k, _) in std::env::vars().filter(|(k, _)| set_by_cargo_for_a_crate(k)) {
        c.env_remove(k);
    }
    c
}

/// Whether `name` is one of the variables Cargo sets for a crate it runs (not one of its
/// configuration's `CARGO_*`).
fn set_by_cargo_for_a_crate(name: &str) -> bool {
    const PREFIXES: [&str; 4] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
    ];
    const NAMES: [&str; 4] = [
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// The executable of the target `name` among the messages of a build run with
/// `--message-format=json` (its standard output).
pub fn executable(messages: &[u8], name: &str) -> Option<PathBuf> {
    String::from_utf8_lossy(messages)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}
