//! Descriptor rules: which policy limits a rate-limit descriptor of a gateway (Envoy's
//! `RateLimitService`), and the subject of a matching descriptor.
//!
//! A rule names a `domain`, the descriptor's entry keys in order (`"remote_address"`, or
//! `"path=/login"`, which also fixes the entry's value) and a policy. Matching is that of
//! envoyproxy/ratelimit: a descriptor matches a rule when its entries' keys are the rule's,
//! in order, and every fixed value is equal. When several rules match, the most specific one
//! wins, position by position from the first entry: a fixed value beats a key alone (the
//! configuration tree of envoyproxy/ratelimit looks `key_value` up before `key`; unlike it,
//! a dead end on the fixed branch falls back to the key-only rule instead of matching nothing).
//!
//! The subject is the descriptor's values in order, each prefixed with its length as four
//! big-endian bytes (so `("ab", "c")` and `("a", "bc")` differ), then HMAC-digested with the
//! application's [`SubjectHasher`], as the HTTP middleware digests its subjects: raw values
//! never leave this module.
//!
//! The rules live here, beside the HTTP edge, so that the composition root can build them
//! from configuration and a gRPC server can use them without depending on each other.

use std::collections::HashMap;
use std::fmt;

use shared_contract::{PolicyId, SubjectDigest};

use crate::subject::{MAX_SUBJECT_BYTES, SubjectHasher};

/// Most entries in one descriptor (of a rule, and of a request a server accepts).
pub const MAX_ENTRIES: usize = 16;
/// Longest entry key or value, in bytes.
pub const MAX_ENTRY_BYTES: usize = MAX_SUBJECT_BYTES;

/// What answers a descriptor that no rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownDescriptor {
    /// `OK` for it (what Envoy users expect of a rate-limit service).
    #[default]
    Allow,
    /// `OVER_LIMIT` for the whole request, and nothing is charged.
    Deny,
}

impl UnknownDescriptor {
    /// `"allow"` or `"deny"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "allow" => Some(Self::Allow),
            "deny" => Some(Self::Deny),
            _ => None,
        }
    }

    /// The configuration's spelling: `"allow"` or `"deny"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// Why a descriptor rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// The rule's `domain` is empty.
    #[error("the domain must not be empty")]
    EmptyDomain,
    /// The rule has no entries.
    #[error("a rule needs at least one entry")]
    NoEntries,
    /// The rule has more than [`MAX_ENTRIES`] entries.
    #[error("a rule takes at most {max} entries, got {got}")]
    TooManyEntries {
        /// How many entries the rule has.
        got: usize,
        /// The most accepted ([`MAX_ENTRIES`]).
        max: usize,
    },
    /// An entry's key (the text before any `=`) is empty.
    #[error("entry {entry:?} has an empty key; use \"key\" or \"key=value\"")]
    EmptyKey {
        /// The entry as configured.
        entry: String,
    },
    /// An entry ends in `=`: its fixed value is empty.
    #[error("entry {entry:?} has an empty value after '='; use \"key\" to match any value")]
    EmptyValue {
        /// The entry as configured.
        entry: String,
    },
    /// An entry's key or value is longer than [`MAX_ENTRY_BYTES`].
    #[error("entry {entry:?} is longer than {max} bytes")]
    TooLong {
        /// The entry as configured.
        entry: String,
        /// The longest key or value accepted, in bytes ([`MAX_ENTRY_BYTES`]).
        max: usize,
    },
    /// A rule has the same domain and entries as an earlier one, so it could never match.
    #[error("rule {index} repeats an earlier rule: domain {domain:?}, entries [{entries}]")]
    Duplicate {
        /// The repeated rule's position in configured order, from 0.
        index: usize,
        /// Its domain.
        domain: String,
        /// Its entries, comma-separated as the configuration writes them.
        entries: String,
    },
}

/// One entry of a rule: a key, and optionally the value it must have.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryMatcher {
    key: String,
    value: Option<String>,
}

impl EntryMatcher {
    /// Parses `"key"` (any value) or `"key=value"` (that value only; split at the first `=`).
    ///
    /// # Errors
    /// [`DescriptorError::EmptyKey`], [`DescriptorError::EmptyValue`] or
    /// [`DescriptorError::TooLong`], naming `entry`.
    pub fn parse(entry: &str) -> Result<Self, DescriptorError> {
        let (key, value) = match entry.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (entry, None),
        };
        let named = || entry.to_owned();
        if key.is_empty() {
            return Err(DescriptorError::EmptyKey { entry: named() });
        }
        if value.is_some_and(str::is_empty) {
            return Err(DescriptorError::EmptyValue { entry: named() });
        }
        if key.len() > MAX_ENTRY_BYTES || value.is_some_and(|v| v.len() > MAX_ENTRY_BYTES) {
            return Err(DescriptorError::TooLong {
                entry: named(),
                max: MAX_ENTRY_BYTES,
            });
        }
        Ok(Self {
            key: key.to_owned(),
            value: value.map(str::to_owned),
        })
    }

    /// The descriptor entry key this matches.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fixed value, if any.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }
}

impl fmt::Display for EntryMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// One rule: descriptors of `domain` with these entries are limited by `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    domain: String,
    entries: Vec<EntryMatcher>,
    policy: PolicyId,
    charge_after: bool,
}

impl DescriptorRule {
    /// A rule limiting descriptors of `domain` with `entries` (in order) by `policy`.
    ///
    /// # Errors
    /// [`DescriptorError::EmptyDomain`], [`DescriptorError::NoEntries`] or
    /// [`DescriptorError::TooManyEntries`].
    pub fn new(
        domain: String,
        entries: Vec<EntryMatcher>,
        policy: PolicyId,
    ) -> Result<Self, DescriptorError> {
        if domain.is_empty() {
            return Err(DescriptorError::EmptyDomain);
        }
        if entries.is_empty() {
            return Err(DescriptorError::NoEntries);
        }
        if entries.len() > MAX_ENTRIES {
            return Err(DescriptorError::TooManyEntries {
                got: entries.len(),
                max: MAX_ENTRIES,
            });
        }
        Ok(Self {
            domain,
            entries,
            policy,
            charge_after: false,
        })
    }

    /// The same rule for costs known after the work (`charge = "after"`, Envoy's stream-done
    /// call): a cost of 0 is a check (charging nothing) and any other cost is charged past the
    /// limit if need be, never denied.
    #[must_use]
    pub fn charging_after(mut self) -> Self {
        self.charge_after = true;
        self
    }

    /// Whether the rule charges after the work ([`Self::charging_after`]).
    pub fn charges_after(&self) -> bool {
        self.charge_after
    }

    /// The descriptor domain this rule applies to (never empty).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The entries a matching descriptor has, in order (1 to [`MAX_ENTRIES`]).
    pub fn entries(&self) -> &[EntryMatcher] {
        &self.entries
    }

    /// The policy that limits a matching descriptor.
    pub fn policy(&self) -> &PolicyId {
        &self.policy
    }

    /// Whether a descriptor with these `(key, value)` entries matches this rule.
    fn matches<'a>(&self, entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>) -> bool {
        entries.len() == self.entries.len()
            && self
                .entries
                .iter()
                .zip(entries)
                .all(|(m, (k, v))| m.key == k && m.value.as_deref().is_none_or(|f| f == v))
    }

    /// The entries as the configuration writes them, comma-separated.
    fn entries_text(&self) -> String {
        self.entries
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every descriptor rule, in configured order, indexed by domain. Empty: every descriptor is
/// unknown.
#[derive(Debug, Clone, Default)]
pub struct DescriptorRules {
    rules: Vec<DescriptorRule>,
    by_domain: HashMap<String, Vec<usize>>,
}

impl DescriptorRules {
    /// The rules, in configured order.
    ///
    /// # Errors
    /// [`DescriptorError::Duplicate`] for a second rule with the same domain and entries
    /// (it could never match), naming its index.
    pub fn new(rules: impl IntoIterator<Item = DescriptorRule>) -> Result<Self, DescriptorError> {
        let mut out = Self::default();
        for (index, rule) in rules.into_iter().enumerate() {
            let same = out.by_domain.entry(rule.domain.clone()).or_default();
            if same.iter().any(|&j| out.rules[j].entries == rule.entries) {
                return Err(DescriptorError::Duplicate {
                    index,
                    domain: rule.domain.clone(),
                    entries: rule.entries_text(),
                });
            }
            same.push(out.rules.len());
            out.rules.push(rule);
        }
        Ok(out)
    }

    /// Whether there are no rules (every descriptor is then unknown).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Every rule, in configured order.
    pub fn iter(&self) -> impl Iterator<Item = &DescriptorRule> {
        self.rules.iter()
    }

    /// The rule that limits a descriptor of `domain` with `entries` (`(key, value)` pairs in
    /// order): the most specific matching one (see the module docs), `None` when none matches.
    pub fn find<'a, I>(&self, domain: &str, entries: I) -> Option<&DescriptorRule>
    where
        I: ExactSizeIterator<Item = (&'a str, &'a str)> + Clone,
    {
        self.by_domain
            .get(domain)?
            .iter()
            .map(|&i| &self.rules[i])
            .filter(|r| r.matches(entries.clone()))
            // Position by position, a fixed value sorts above a key alone; the first of equals
            // (there are none: duplicates are refused) would win.
            .max_by(|a, b| {
                let fixed = |r: &DescriptorRule| -> Vec<bool> {
                    r.entries.iter().map(|e| e.value.is_some()).collect()
                };
                fixed(a).cmp(&fixed(b))
            })
    }
}

/// The subject digest of a descriptor's `values`, in order: each value's length as four
/// big-endian bytes, then its bytes, digested with `hasher`.
pub fn subject<'a>(
    hasher: &SubjectHasher,
    values: impl IntoIterator<Item = &'a str>,
) -> SubjectDigest {
    let mut composed = Vec::with_capacity(64);
    for v in values {
        // Values are at most MAX_ENTRY_BYTES long where they are accepted; saturating keeps
        // the encoding total for any input.
        let len = u32::try_from(v.len()).unwrap_or(u32::MAX);
        composed.extend_from_slice(&len.to_be_bytes());
        composed.extend_from_slice(v.as_bytes());
    }
    hasher.digest(&composed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::SubjectSecret;

    fn rule(domain: &str, entries: &[&str], policy: &str) -> DescriptorRule {
        DescriptorRule::new(
            domain.into(),
            entries
                .iter()
                .map(|e| EntryMatcher::parse(e).expect("valid entry"))
                .collect(),
            PolicyId::new(policy).expect("valid id"),
        )
        .expect("valid rule")
    }

    fn found<'r>(
        rules: &'r DescriptorRules,
        domain: &str,
        entries: &[(&str, &str)],
    ) -> Option<&'r str> {
        rules
            .find(domain, entries.iter().copied())
            .map(|r| r.policy().as_str())
    }

    #[test]
    fn descriptors_match_by_keys_in_order_and_fixed_values() {
        let rules = DescriptorRules::new([
            rule("edge", &["remote_address"], "ip"),
            rule("edge", &["tenant", "path"], "tenant_path"),
            rule("edge", &["tenant", "path=/login"], "login"),
            rule("other", &["remote_address"], "other"),
        ])
        .expect("valid rules");
        assert_eq!(
            found(&rules, "edge", &[("remote_address", "10.0.0.1")]),
            Some("ip")
        );
        assert_eq!(
            found(&rules, "other", &[("remote_address", "1")]),
            Some("other")
        );
        assert_eq!(found(&rules, "nope", &[("remote_address", "1")]), None);
        // Keys out of order, a prefix only, or one entry more: no match.
        assert_eq!(
            found(&rules, "edge", &[("path", "/"), ("tenant", "t")]),
            None
        );
        assert_eq!(found(&rules, "edge", &[("tenant", "t")]), None);
        assert_eq!(
            found(&rules, "edge", &[("remote_address", "1"), ("x", "y")]),
            None
        );
        // The fixed value wins over the key alone; another value falls back to it.
        assert_eq!(
            found(&rules, "edge", &[("tenant", "t"), ("path", "/login")]),
            Some("login")
        );
        assert_eq!(
            found(&rules, "edge", &[("tenant", "t"), ("path", "/home")]),
            Some("tenant_path")
        );
    }

    #[test]
    fn bad_rules_are_refused_naming_the_entry() {
        for (entry, want) in [
            ("", "empty key"),
            ("=x", "empty key"),
            ("path=", "empty value"),
        ] {
            let e = EntryMatcher::parse(entry).expect_err("bad entry");
            assert!(e.to_string().contains(want), "{e}");
            assert!(e.to_string().contains(&format!("{entry:?}")), "{e}");
        }
        let id = PolicyId::new("p").expect("valid id");
        assert_eq!(
            DescriptorRule::new("edge".into(), vec![], id.clone()),
            Err(DescriptorError::NoEntries)
        );
        let entry = EntryMatcher::parse("k").expect("valid entry");
        assert_eq!(
            DescriptorRule::new(String::new(), vec![entry], id),
            Err(DescriptorError::EmptyDomain)
        );
        let twice = DescriptorRules::new([rule("d", &["k=v"], "a"), rule("d", &["k=v"], "b")]);
        assert!(matches!(twice, Err(DescriptorError::Duplicate { .. })));
        assert_eq!(
            EntryMatcher::parse("a=b=c").expect("valid entry").value(),
            Some("b=c")
        );
    }

    #[test]
    fn subjects_are_length_prefixed_and_keyed() {
        let hasher = SubjectHasher::new(&SubjectSecret::new(vec![7; 32], "t").expect("32 bytes"));
        assert_ne!(subject(&hasher, ["ab", "c"]), subject(&hasher, ["a", "bc"]));
        assert_eq!(subject(&hasher, ["ab", "c"]), subject(&hasher, ["ab", "c"]));
        assert_eq!(
            subject(&hasher, ["ab"]),
            hasher.digest(b"\x00\x00\x00\x02ab"),
            "one value is its length and bytes"
        );
    }
}
