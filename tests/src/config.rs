//! Reading a configuration in a test: the settings of a valid one, the problems of an
//! invalid one, and the problem at one key path.

use app_bootstrap::Settings;
use app_bootstrap::config::{self, ConfigErrors};

/// The problems of `toml`, failing the test when it is valid.
pub fn errors(toml: &str) -> ConfigErrors {
    match config::from_toml(toml) {
        Ok(s) => panic!("expected configuration errors, got {s:?}"),
        Err(e) => e,
    }
}

/// The settings of `toml`, failing the test with every problem when it is invalid.
pub fn ok(toml: &str) -> Settings {
    config::from_toml(toml).unwrap_or_else(|e| panic!("expected a valid configuration:\n{e}"))
}

/// The problem on `path`, failing the test with all problems when there is none.
pub fn problem_at(e: &ConfigErrors, path: &str) -> String {
    e.0.iter()
        .find(|p| p.path == path)
        .map(|p| p.problem.clone())
        .unwrap_or_else(|| panic!("no problem named {path}; got:\n{e}"))
}
