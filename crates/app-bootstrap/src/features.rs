//! Which providers this build holds (the crate's `redis` and `local` features), and the one
//! sentence that refuses what needs a provider it does not hold.
//!
//! Configuration names providers in every build: a file asking for one that is not compiled
//! in is refused at validation, with its key path and the feature to build with (so `--check`
//! reports it and exits 2), rather than read as an unknown value or failing at start-up.

use std::fmt;

/// An optional provider of this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feature {
    Redis,
    Local,
}

impl Feature {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Local => "local",
        }
    }

    /// Whether this build holds the provider.
    pub(crate) fn compiled(self) -> bool {
        match self {
            Self::Redis => cfg!(feature = "redis"),
            Self::Local => cfg!(feature = "local"),
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The problem of `what` (a value, a section, a provider) in a build without `feature`.
pub(crate) fn unavailable(what: impl fmt::Display, feature: impl fmt::Display) -> String {
    format!("{what} is not available: app-bootstrap was built without its `{feature}` feature")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_feature_to_build_with() {
        assert_eq!(
            unavailable("\"redis\"", Feature::Redis),
            "\"redis\" is not available: app-bootstrap was built without its `redis` feature"
        );
    }
}
