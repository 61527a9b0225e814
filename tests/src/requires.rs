//! Tests that need a tool this machine may lack (podman, promtool, a Python module): skipped,
//! saying so, when it is missing, unless the environment variable that CI sets says it is
//! required, which makes a missing tool a failure.

/// `true` when nothing is `missing`. Otherwise prints why the test is skipped and returns
/// `false`, or panics when `required_by` (an environment variable) is set.
///
/// # Panics
/// When something is missing and `required_by` is set.
pub fn available(test: &str, missing: &[String], required_by: &str) -> bool {
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os(required_by).is_none(),
        "{required_by} is set but {test} lacks: {missing:?}"
    );
    eprintln!("SKIPPED: {test} needs {missing:?} ({required_by}=1 makes this a failure)");
    false
}

/// The name of each command of `commands` that does not answer `--version`.
pub fn missing_commands(commands: &[&str]) -> Vec<String> {
    commands
        .iter()
        .filter(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .map(|c| (*c).to_owned())
        .collect()
}
