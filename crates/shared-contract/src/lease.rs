//! Concurrency leases: "at most `limit` requests of one subject in flight".
//!
//! A caller acquires a lease before the work and releases it after. Each lease carries an
//! expiry on the provider's clock (`lease_ttl` after its acquire), so the lease of a holder
//! that crashed is reclaimed without anyone releasing it. The lease id names everything a
//! release needs (policy, subject digest, a random token), so any instance can release it.
//!
//! Text form of a lease id: `l1.<policy>.<subject digest, 64 hex>.<token, 32 hex>`. The
//! parser is strict (lowercase hex, exact lengths, a valid policy id) and names what is wrong.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::decision::{Certainty, IncompatibleCategory, Source, UnavailableCategory};
use crate::ids::{Deadline, PolicyId, PolicyRevision, SubjectDigest};
use crate::policy::{ConcurrencyParams, RateLimitPolicy};

/// The random part of a lease id: 128 bits, unguessable, so only the holder (who was told
/// the id) can release the lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken([u8; 16]);

impl LeaseToken {
    /// A token from its 16 bytes; any value is valid.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The token's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// 32 lowercase hex digits: the form stored in Redis and written in lease ids.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for LeaseToken {
    // The token is the holder's proof: debug output shows a prefix only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

/// Where providers take new lease tokens from; injected so that tests can fix them.
pub trait TokenSource: Send + Sync + fmt::Debug {
    /// A new token, different from every earlier one of this source.
    fn next_token(&self) -> LeaseToken;
}

/// Unpredictable tokens without a dependency: SipHash keyed with the process's random
/// `RandomState` keys (read from the operating system) over a counter. SipHash is a keyed
/// pseudo-random function, so without the keys the next token cannot be guessed from
/// earlier ones.
#[derive(Debug)]
pub struct RandomTokens {
    keys: [RandomState; 2],
    counter: AtomicU64,
}

impl Default for RandomTokens {
    fn default() -> Self {
        Self {
            keys: [RandomState::new(), RandomState::new()],
            counter: AtomicU64::new(0),
        }
    }
}

impl TokenSource for RandomTokens {
    fn next_token(&self) -> LeaseToken {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.keys[0].hash_one(n).to_le_bytes());
        bytes[8..].copy_from_slice(&self.keys[1].hash_one(n).to_le_bytes());
        LeaseToken(bytes)
    }
}

/// Tokens 1, 2, 3, ... (big-endian): for tests, where ids must be predictable.
#[derive(Debug, Default)]
pub struct SequenceTokens(AtomicU64);

impl TokenSource for SequenceTokens {
    fn next_token(&self) -> LeaseToken {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        let mut bytes = [0u8; 16];
        bytes[8..].copy_from_slice(&n.to_be_bytes());
        LeaseToken(bytes)
    }
}

/// Why a lease id text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseIdError {
    /// The text is not four `.`-separated parts or is longer than [`LeaseId::MAX_LEN`]; carries the
    /// text (clipped).
    #[error("lease id must be l1.<policy>.<64 hex subject digest>.<32 hex token>, got {0:?}")]
    Shape(String),
    /// The first part is not `l1`; carries that part.
    #[error("lease id version must be l1, got {0:?}")]
    Version(String),
    /// The policy part is not a valid [`PolicyId`]; carries that part.
    #[error("lease id policy {0:?} is not a valid policy id")]
    Policy(String),
    /// The subject part is not 64 lowercase hex digits; carries that part.
    #[error("lease id subject digest must be 64 lowercase hex digits, got {0:?}")]
    Subject(String),
    /// The token part is not 32 lowercase hex digits; carries that part.
    #[error("lease id token must be 32 lowercase hex digits, got {0:?}")]
    Token(String),
}

/// A lease: which policy and subject it counts against, and its token.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct LeaseId {
    /// The concurrency policy the lease counts against.
    pub policy_id: PolicyId,
    /// The subject whose places the lease takes one of.
    pub subject: SubjectDigest,
    /// The holder's proof: a release must name it.
    pub token: LeaseToken,
}

impl LeaseId {
    /// Longest text form: `l1.` + 64-byte policy + `.` + 64 + `.` + 32.
    pub const MAX_LEN: usize = 3 + PolicyId::MAX_LEN + 1 + 64 + 1 + 32;

    /// # Errors
    /// [`LeaseIdError`] naming the part that is wrong.
    pub fn parse(text: &str) -> Result<Self, LeaseIdError> {
        let clip = || text.chars().take(LeaseId::MAX_LEN + 8).collect::<String>();
        if text.len() > Self::MAX_LEN {
            return Err(LeaseIdError::Shape(clip()));
        }
        let mut parts = text.split('.');
        let (Some(version), Some(policy), Some(subject), Some(token), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(LeaseIdError::Shape(clip()));
        };
        if version != "l1" {
            return Err(LeaseIdError::Version(version.to_owned()));
        }
        let policy_id =
            PolicyId::new(policy).map_err(|_| LeaseIdError::Policy(policy.to_owned()))?;
        let subject = unhex::<32>(subject)
            .map(SubjectDigest::from_bytes)
            .ok_or_else(|| LeaseIdError::Subject(subject.to_owned()))?;
        let token = unhex::<16>(token)
            .map(LeaseToken)
            .ok_or_else(|| LeaseIdError::Token(token.to_owned()))?;
        Ok(Self {
            policy_id,
            subject,
            token,
        })
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "l1.{}.{}.{}",
            self.policy_id,
            hex(self.subject.as_bytes()),
            hex(&self.token.0)
        )
    }
}

impl FromStr for LeaseId {
    type Err = LeaseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// Exactly `2 * N` lowercase hex digits (one spelling per value, so an id has one text form).
pub(crate) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// A request for one lease of `policy_id` for `subject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The concurrency policy to take a place of.
    pub policy_id: PolicyId,
    /// The subject the lease is for.
    pub subject: SubjectDigest,
    /// When the caller needs the answer by.
    pub deadline: Deadline,
}

/// A request to give a lease back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// The lease to give back, as the acquire returned it.
    pub lease: LeaseId,
    /// When the caller needs the answer by.
    pub deadline: Deadline,
}

/// A held lease, as an acquire answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id: what a release names.
    pub id: LeaseId,
    /// The policy revision the lease was acquired under.
    pub revision: PolicyRevision,
    /// Unix ms, by the provider's clock, when the lease expires if not released.
    pub expires_at_ms: u64,
    /// The policy's `lease_ttl` in ms (`expires_at_ms` minus the acquire's time).
    pub ttl_ms: u64,
    /// The policy's limit: most leases of one subject held at once.
    pub limit: u64,
    /// Leases the subject may still acquire now, after this one.
    pub remaining: u64,
    /// Which provider, or which stand-in for it, granted the lease.
    pub source: Source,
    /// How exact the count of held leases is.
    pub certainty: Certainty,
}

impl Lease {
    /// The lease `id` of `policy` (a concurrency policy with `params`), held until
    /// `expires_at_ms` with `remaining` places still free; `certain` unless a provider says
    /// otherwise.
    pub fn new(
        policy: &RateLimitPolicy,
        params: &ConcurrencyParams,
        id: LeaseId,
        expires_at_ms: u64,
        remaining: u64,
        source: Source,
    ) -> Self {
        Self {
            id,
            revision: policy.revision(),
            expires_at_ms,
            ttl_ms: params.lease_ttl_ms(),
            limit: params.limit(),
            remaining,
            source,
            certainty: Certainty::Certain,
        }
    }
}

/// The honest result of an acquire. Only `Acquired` holds a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// A place was free: the lease is held now.
    Acquired(Lease),
    /// `limit` leases are held; nothing changed. The earliest of them expires in
    /// `retry_after_ms` (sooner if one is released).
    Denied {
        /// The policy whose places are all taken.
        policy_id: PolicyId,
        /// The policy's limit: most leases of one subject held at once.
        limit: u64,
        /// Milliseconds until the earliest held lease expires.
        retry_after_ms: u64,
        /// Which provider, or which stand-in for it, denied.
        source: Source,
    },
    /// Known: nothing was acquired.
    Unavailable {
        /// The policy that could not be evaluated.
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
        /// Why nothing was tried.
        category: UnavailableCategory,
    },
    /// Sent, result unknown: a lease may be held now (it then expires by its TTL).
    Indeterminate {
        /// The policy whose acquire may or may not have happened.
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
    },
    /// State, program or reply mismatch; no lease is returned (after a `Reply` mismatch the program
    /// ran, so a lease may be held until it expires).
    Incompatible {
        /// The policy whose state, program or reply did not fit.
        policy_id: PolicyId,
        /// What did not fit.
        category: IncompatibleCategory,
    },
}

impl AcquireOutcome {
    /// The outcome's name as reported on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired(_) => "acquired",
            AcquireOutcome::Denied { .. } => "denied",
            AcquireOutcome::Unavailable { .. } => "unavailable",
            AcquireOutcome::Indeterminate { .. } => "indeterminate",
            AcquireOutcome::Incompatible { .. } => "incompatible",
        }
    }
}

/// The honest result of a release. Only `Released` freed a place; no outcome ever frees a
/// lease other than the one named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was held and is freed now.
    Released,
    /// The lease had expired (its place was already free); it is forgotten now.
    Expired,
    /// No such lease is held: released before, never acquired, of another subject, or
    /// expired and already reclaimed.
    NotHeld,
    /// Known: nothing was released.
    Unavailable {
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
        /// Why nothing was tried.
        category: UnavailableCategory,
    },
    /// Sent, result unknown: the lease may be freed or still held (it expires by its TTL).
    Indeterminate {
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
    },
    /// State, program or reply mismatch (after a `Reply` mismatch the program ran, so the lease may
    /// be freed).
    Incompatible {
        /// What did not fit.
        category: IncompatibleCategory,
    },
}

impl ReleaseOutcome {
    /// The outcome's name as reported on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            ReleaseOutcome::Released => "released",
            ReleaseOutcome::Expired => "expired",
            ReleaseOutcome::NotHeld => "not_held",
            ReleaseOutcome::Unavailable { .. } => "unavailable",
            ReleaseOutcome::Indeterminate { .. } => "indeterminate",
            ReleaseOutcome::Incompatible { .. } => "incompatible",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> LeaseId {
        LeaseId {
            policy_id: PolicyId::new("conc-1").expect("valid id"),
            subject: SubjectDigest::from_bytes([0xab; 32]),
            token: SequenceTokens::default().next_token(),
        }
    }

    #[test]
    fn lease_id_text_round_trips() {
        let id = id();
        let text = id.to_string();
        assert_eq!(
            text,
            format!("l1.conc-1.{}.{}1", "ab".repeat(32), "0".repeat(31))
        );
        assert_eq!(LeaseId::parse(&text), Ok(id));
    }

    #[test]
    fn malformed_lease_ids_name_the_bad_part() {
        let good = id().to_string();
        let sub = "ab".repeat(32);
        let tok = "0".repeat(32);
        let cases = [
            ("", "Shape"),
            ("l1.conc", "Shape"),
            (&format!("{good}.x") as &str, "Shape"),
            (&format!("l2.conc.{sub}.{tok}"), "Version"),
            (&format!("l1.Conc.{sub}.{tok}"), "Policy"),
            (&format!("l1..{sub}.{tok}"), "Policy"),
            (&format!("l1.conc.{}.{tok}", "AB".repeat(32)), "Subject"),
            (&format!("l1.conc.{}.{tok}", "ab".repeat(31)), "Subject"),
            (&format!("l1.conc.{sub}.{}", "g".repeat(32)), "Token"),
            (&format!("l1.conc.{sub}.{}", "0".repeat(33)), "Token"),
            (&"x".repeat(LeaseId::MAX_LEN + 1), "Shape"),
        ];
        for (text, want) in cases {
            let err = LeaseId::parse(text).expect_err(text);
            assert!(format!("{err:?}").starts_with(want), "{text}: {err:?}");
        }
    }

    #[test]
    fn random_tokens_do_not_repeat() {
        let source = RandomTokens::default();
        let tokens: std::collections::HashSet<_> =
            (0..10_000).map(|_| source.next_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        // Two sources have independent keys.
        assert_ne!(
            RandomTokens::default().next_token(),
            RandomTokens::default().next_token()
        );
    }
}
