//! The rate-limit section of an embedding service's own configuration: the `[rate_limit]`
//! table of the service's file, whose other keys are the service's, overridden by variables
//! of a prefix the service chooses.

use std::path::{Path, PathBuf};

use super::reader::Check;
use super::{ConfigErrors, env, merged, rate_limit};
use crate::settings::RateLimitSettings;

/// Where an embedding service's rate limiting is configured: the `[rate_limit]` table of the
/// service's own TOML file, and optionally environment variables with the service's prefix.
///
/// The reference app reads a whole file of its own ([`super::load`]): unknown top-level keys
/// are errors there, and its `[http]`, `[routes]` and other sections configure its listener.
/// Here only `[rate_limit]` (with its tables: `policies`, `redis`, `local`,
/// `circuit_breaker`) is read; every other key of the file, and every variable outside the
/// section, is the service's own and left alone. Inside the section nothing is relaxed:
/// unknown keys are errors, and every problem is reported at once with its key path
/// (`rate_limit.policies.api.limit: ...`). Without a `[rate_limit]` table rate limiting is
/// disabled, as in the reference app.
///
/// ```
/// # fn main() -> Result<(), app_bootstrap::ConfigErrors> {
/// # let dir = std::env::temp_dir().join(format!("rl-section-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let path = dir.join("service.toml");
/// # std::fs::write(&path, r#"
/// # [server]
/// # port = 3000
/// # [rate_limit]
/// # enabled = true
/// # provider = "local"
/// # default_policy = "api"
/// # [rate_limit.policies.api]
/// # algorithm = "token_bucket"
/// # capacity = 5
/// # refill_amount = 5
/// # refill_interval = "10s"
/// # "#).unwrap();
/// use app_bootstrap::{RateLimitSection, RateLimitSettings};
///
/// // `MYSVC_RATE_LIMIT__PROVIDER=redis` overrides `rate_limit.provider`; `MYSVC_PORT` and
/// // the file's `[server]` are the service's and not read here.
/// let settings = RateLimitSection::file(&path).env_prefix("MYSVC_").load()?;
/// assert!(matches!(settings, RateLimitSettings::Enabled(_)));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct RateLimitSection {
    file: Option<PathBuf>,
    env_prefix: Option<String>,
    env: Option<Vec<(String, String)>>,
}

/// The table this reads.
const TABLE: &str = rate_limit::P;

impl RateLimitSection {
    /// The `[rate_limit]` table of the TOML file at `path`. Relative paths in it
    /// (`subject_secret_file`, Redis TLS and password files) are resolved against the file's
    /// directory.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            file: Some(path.into()),
            ..Self::default()
        }
    }

    /// No file: the defaults (disabled), or what the environment variables set.
    pub fn without_file() -> Self {
        Self::default()
    }

    /// Also read environment variables named `prefix` + the key path in upper case, nested by
    /// `__`: with `"MYSVC_"`, `MYSVC_RATE_LIMIT__PROVIDER=redis` sets `rate_limit.provider`
    /// and `MYSVC_RATE_LIMIT__REDIS__URL` sets `rate_limit.redis.url`, over the file. Only
    /// variables under `RATE_LIMIT` are read (`MYSVC_ENV=prod` is the service's). Without
    /// this call no variable is read.
    #[must_use]
    pub fn env_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.env_prefix = Some(prefix.into());
        self
    }

    /// Read `vars` instead of the process's environment (tests, or a service that gathers its
    /// variables itself). Takes effect with [`Self::env_prefix`].
    #[must_use]
    pub fn env_vars(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env = Some(vars.into_iter().collect());
        self
    }

    /// Reads and validates the section.
    ///
    /// # Errors
    /// [`ConfigErrors`] with every problem of the section, each with its key path (an
    /// unreadable file or a TOML syntax error is one problem named by the file's path).
    pub fn load(&self) -> Result<RateLimitSettings, ConfigErrors> {
        let prefix = self.env_prefix.as_deref().unwrap_or_default();
        let in_section = |path: &[String]| path.first().is_some_and(|p| p == TABLE);
        let vars: Vec<(String, String)> = match (&self.env_prefix, &self.env) {
            (None, _) => Vec::new(),
            (Some(_), Some(vars)) => vars
                .iter()
                .filter(|(name, _)| {
                    env::strip_prefix_ignore_case(name, prefix)
                        .is_some_and(|rest| in_section(&env::key_path(rest)))
                })
                .cloned()
                .collect(),
            (Some(_), None) => env::process_vars(prefix, in_section)?,
        };
        let label = self
            .file
            .as_deref()
            .map_or_else(|| TABLE.to_owned(), |p| p.display().to_string());
        let unnamed = env::unnamed(&vars, prefix);
        let root = merged(self.file.as_deref(), &vars, prefix, &label)?;
        let base = self.file.as_deref().and_then(Path::parent);
        let mut c = Check::default();
        let read = rate_limit::read(&mut c, root.get(TABLE), base);
        match (read.settings, c.count(), unnamed.is_empty()) {
            (Some(settings), 0, true) => Ok(settings),
            _ => {
                let mut problems = unnamed;
                problems.extend(env::attribute(c.into_problems(), &vars, prefix));
                Err(ConfigErrors(problems))
            }
        }
    }
}

#[cfg(all(test, feature = "local"))]
#[path = "section_tests.rs"]
mod tests;
