//! The one error type of this crate: what was wrong with the settings handed to
//! [`crate::RedisProvider::connect`] or [`crate::RedisGateProvider::connect`].
//!
//! Each settings type checks itself and names every problem by its key inside its own
//! section ([`SettingsProblem`]), the way `RateLimitPolicy::new` names policy fields: a
//! configuration layer maps them to its key paths, and [`Error`] shows them under the
//! section the crate's settings are documented in.
//!
//! Connection problems are deliberately *not* errors: an unreachable server at start is an
//! operational condition the provider reports as `Unavailable(connect)` (and through
//! `readiness()`) until the server answers, so a service can start before its Redis does.

use std::fmt;

/// One refused setting, named by its key inside its section (`url`, `nodes[1]`,
/// `command_timeout` under `[rate_limit.redis]`). The message never echoes a URL or a
/// password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct SettingsProblem {
    /// The key, relative to the section: `url`, `nodes[1]`, `tls_ca_file`, `publish_batch`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl SettingsProblem {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Every problem of one settings value, so a configuration can be fixed in one pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", Shown { section: None, problems: &self.0 })]
pub struct SettingsProblems(pub Vec<SettingsProblem>);

/// Problems joined by `; `, each key under `section` when there is one.
struct Shown<'a> {
    section: Option<&'a str>,
    problems: &'a [SettingsProblem],
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match self.section {
                Some(section) => write!(f, "{section}.{p}")?,
                None => write!(f, "{p}")?,
            }
        }
        Ok(())
    }
}

/// Why a provider could not be built. Every message names the bad value and where it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Redis settings ([`crate::RedisSettings::validate`]), each problem under
    /// `rate_limit.redis`.
    #[error("{}", Shown { section: Some("rate_limit.redis"), problems: &.0.0 })]
    Settings(SettingsProblems),
    /// The gate provider's tunables ([`crate::RedisGateSettings::validate`]), each problem
    /// under `event_gates.redis`.
    #[error("{}", Shown { section: Some("event_gates.redis"), problems: &.0.0 })]
    GateSettings(SettingsProblems),
}

impl From<SettingsProblem> for Error {
    fn from(p: SettingsProblem) -> Self {
        Error::Settings(SettingsProblems(vec![p]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_shown_under_its_section() {
        let problems = SettingsProblems(vec![
            SettingsProblem::new("url", "not a valid Redis URL"),
            SettingsProblem::new("nodes[1]", "bad"),
        ]);
        assert_eq!(
            problems.to_string(),
            "url: not a valid Redis URL; nodes[1]: bad"
        );
        assert_eq!(
            Error::Settings(problems.clone()).to_string(),
            "rate_limit.redis.url: not a valid Redis URL; rate_limit.redis.nodes[1]: bad"
        );
        assert_eq!(
            Error::GateSettings(SettingsProblems(vec![SettingsProblem::new("x", "y")])).to_string(),
            "event_gates.redis.x: y"
        );
    }
}
