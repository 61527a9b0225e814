//! Physical Redis keys: `<prefix>:{<tag>}<digest>`, e.g. `rl:{q3Zx}Hk2mP0aV9c-1sQeW`.
//!
//! - `tag` (4 base64url characters, 24 bits) is derived from the subject digest **only**. It is
//!   the Redis Cluster hash tag, so every key of one subject (one per policy) lives in one slot
//!   (a later multi-policy check can then run as one atomic script), while different subjects
//!   spread evenly over the 16384 slots.
//! - `digest` (16 base64url characters, 96 bits) is SHA-256 over a domain label and the
//!   length-prefixed fields (policy id, policy revision, algorithm, subject digest). Each field
//!   is preceded by its length as a 4-byte big-endian integer, so no two field tuples encode to
//!   the same bytes. A new policy revision (or algorithm) therefore rolls to a new key, and old
//!   state expires by its TTL.
//! - No raw subject, principal, IP, API key or route ever appears: the subject is already an
//!   HMAC digest when it reaches the port, and the key only holds hashes of it.
//!
//! Two more shapes live under the same prefix: the replay key of an evaluation id
//! (`<prefix>:{<tag>}e:<digest>`, [`replay_key`]) and the fleet key of the heartbeat
//! (`<prefix>:fleet:{<name>}`, [`fleet_key`]), which holds instance ids, never a subject.
//!
//! ## Why not the policy id as the hash tag
//!
//! A layout of the form `capability=rate / region=<policyId> / kind=state / digest(...)` puts
//! the policy id in the key, which makes a cluster hash tag of `<policyId>` the natural
//! choice. That places *every* subject of a policy in one slot: one shard would carry the
//! whole policy's traffic, and a subject's keys for two policies would sit on different
//! shards, so a multi-policy check could never be one atomic script. Tagging by subject gives the opposite, wanted, distribution. The policy id
//! still goes into the digest (not in clear text): keys stay short (25 bytes with the default
//! prefix, which matters at millions of keys) and reveal nothing but the prefix.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use shared_contract::{EvaluationId, RateLimitPolicy, ReservationId, SubjectDigest};

use crate::error::{Error, SettingsProblem};

/// Domain label of the hash-tag derivation.
const TAG_DOMAIN: &[u8] = b"rl-tag-v1";
/// Domain label of the key digest.
const KEY_DOMAIN: &[u8] = b"rl-key-v1";
/// Domain label of the replay-key digest.
const REPLAY_DOMAIN: &[u8] = b"rl-replay-v1";
/// Bytes of SHA-256 kept in a replay key: 16 bytes = 22 base64url characters.
const REPLAY_BYTES: usize = 16;
/// Domain separation of reservation record keys.
const RESERVATION_DOMAIN: &[u8] = b"rl-reservation-v1";
/// Bytes of SHA-256 kept in the tag: 3 bytes = exactly 4 base64url characters.
const TAG_BYTES: usize = 3;
/// Bytes of SHA-256 kept in the digest: 12 bytes = exactly 16 base64url characters.
const DIGEST_BYTES: usize = 12;

/// Checks a key prefix: 1..=32 characters of `[A-Za-z0-9_.-]` (no `{`/`}`: they would change
/// the cluster hash tag; no `:`: it separates the prefix from the rest).
///
/// # Errors
/// The problem, on `key_prefix`, otherwise.
pub fn check_prefix(prefix: &str) -> Result<(), SettingsProblem> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 32
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SettingsProblem::new(
            "key_prefix",
            format!(
                "must be 1..=32 characters of [A-Za-z0-9_.-], got {:?}",
                prefix.chars().take(40).collect::<String>()
            ),
        ))
    }
}

fn put_field(h: &mut Sha256, field: &[u8]) {
    // Fields are at most 64 bytes (policy ids), so the length always fits.
    h.update((field.len() as u32).to_be_bytes());
    h.update(field);
}

/// The key builder of one policy: the hash state over the policy's fields is computed once,
/// so a key costs one SHA-256 continuation plus the tag hash.
#[derive(Clone)]
pub struct PolicyKeys {
    prefix: Box<str>,
    policy_state: Sha256,
}

impl std::fmt::Debug for PolicyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyKeys")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PolicyKeys {
    /// The key builder of `policy` under `prefix`.
    ///
    /// # Errors
    /// [`Error::Settings`] when `prefix` is not acceptable (see [`check_prefix`]).
    pub fn new(prefix: &str, policy: &RateLimitPolicy) -> Result<Self, Error> {
        check_prefix(prefix)?;
        let mut h = Sha256::new();
        put_field(&mut h, KEY_DOMAIN);
        put_field(&mut h, policy.id().as_str().as_bytes());
        put_field(&mut h, &policy.revision().get().to_be_bytes());
        put_field(&mut h, policy.kind().as_str().as_bytes());
        Ok(Self {
            prefix: prefix.into(),
            policy_state: h,
        })
    }

    /// The state key of `subject` under this policy.
    pub fn state_key(&self, subject: &SubjectDigest) -> String {
        let mut h = self.policy_state.clone();
        put_field(&mut h, subject.as_bytes());
        let digest = h.finalize();
        let mut key = String::with_capacity(self.prefix.len() + 3 + 4 + 16);
        key.push_str(&self.prefix);
        key.push_str(":{");
        push_subject_tag(subject, &mut key);
        key.push('}');
        URL_SAFE_NO_PAD.encode_string(&digest[..DIGEST_BYTES], &mut key);
        key
    }
}

/// One member of a multi-limit evaluation, as its replay key digests it.
#[derive(Debug, Clone, Copy)]
pub struct ReplayMember<'a> {
    /// The member's policy: its id and revision are digested.
    pub policy: &'a RateLimitPolicy,
    /// The member's subject digest.
    pub subject: &'a SubjectDigest,
    /// The member's cost, in the policy's units.
    pub cost: u64,
}

/// The replay key of evaluation id `id` over `members` (in order):
/// `<prefix>:{tag}e:<digest>`, the tag of the first member's subject (so it shares the
/// members' slot whenever they share one), the digest over the id and every member's policy
/// id, revision, subject and cost. The same id with other limits is another key. It cannot
/// equal a state key: those have no `:` after the tag.
///
/// `prefix` is the provider's checked key prefix.
pub fn replay_key(prefix: &str, id: &EvaluationId, members: &[ReplayMember<'_>]) -> Option<String> {
    let first = members.first()?;
    let mut h = Sha256::new();
    put_field(&mut h, REPLAY_DOMAIN);
    put_field(&mut h, id.as_str().as_bytes());
    for m in members {
        put_field(&mut h, m.policy.id().as_str().as_bytes());
        put_field(&mut h, &m.policy.revision().get().to_be_bytes());
        put_field(&mut h, m.subject.as_bytes());
        put_field(&mut h, &m.cost.to_be_bytes());
    }
    let digest = h.finalize();
    let mut key = String::with_capacity(prefix.len() + 5 + 4 + 22);
    key.push_str(prefix);
    key.push_str(":{");
    push_subject_tag(first.subject, &mut key);
    key.push_str("}e:");
    URL_SAFE_NO_PAD.encode_string(&digest[..REPLAY_BYTES], &mut key);
    Some(key)
}

/// The record key of reservation `id`: `<prefix>:{tag}r:<digest>`, the tag of the id's
/// subject (the reservation's first limit's, so it shares that limit's slot), the digest
/// (16 bytes of SHA-256) over the subject and the token, so the token itself never appears
/// in a key. It cannot equal a state key (no `:` after their tag) nor a replay key (`e:`).
///
/// `prefix` is the provider's checked key prefix.
pub fn reservation_key(prefix: &str, id: &ReservationId) -> String {
    let mut h = Sha256::new();
    put_field(&mut h, RESERVATION_DOMAIN);
    put_field(&mut h, id.subject.as_bytes());
    put_field(&mut h, id.token.as_bytes());
    let digest = h.finalize();
    let mut key = String::with_capacity(prefix.len() + 5 + 4 + 22);
    key.push_str(prefix);
    key.push_str(":{");
    push_subject_tag(&id.subject, &mut key);
    key.push_str("}r:");
    URL_SAFE_NO_PAD.encode_string(&digest[..REPLAY_BYTES], &mut key);
    key
}

/// The fleet key of fleet `name`: `<prefix>:fleet:{<name>}`, the name its hash tag (one
/// slot per fleet on a cluster). It cannot equal a state or replay key: those have `{` right
/// after the prefix.
///
/// `prefix` is the provider's checked key prefix, `name` a checked fleet name
/// (`[A-Za-z0-9_.-]`, so no brace changes the tag).
pub fn fleet_key(prefix: &str, name: &str) -> String {
    format!("{prefix}:fleet:{{{name}}}")
}

/// The 4-character hash tag of a subject: the same for every policy.
pub fn subject_tag(subject: &SubjectDigest) -> String {
    let mut tag = String::with_capacity(4);
    push_subject_tag(subject, &mut tag);
    tag
}

fn push_subject_tag(subject: &SubjectDigest, out: &mut String) {
    let mut h = Sha256::new();
    put_field(&mut h, TAG_DOMAIN);
    put_field(&mut h, subject.as_bytes());
    URL_SAFE_NO_PAD.encode_string(&h.finalize()[..TAG_BYTES], out);
}

/// The Redis Cluster slot of `key` (CRC16/XMODEM of the hash tag, or of the whole key when
/// it has none), as the cluster computes it.
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use shared_contract::{EvaluationId, RateLimitPolicy};

    use super::*;

    fn policy(id: &str, revision: u32) -> RateLimitPolicy {
        RateLimitPolicy::fixed_window(id, 10)
            .revision(revision)
            .cleanup_grace(Duration::from_secs(1))
            .max_clock_regression(Duration::from_secs(1))
            .build()
            .expect("valid policy")
    }

    fn subject(n: u32) -> SubjectDigest {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&n.to_be_bytes());
        SubjectDigest::from_bytes(b)
    }

    fn keys(id: &str, revision: u32) -> PolicyKeys {
        PolicyKeys::new("rl", &policy(id, revision)).expect("valid prefix")
    }

    #[test]
    fn key_has_the_documented_shape() {
        let key = keys("api", 1).state_key(&subject(7));
        assert_eq!(key.len(), "rl:{".len() + 4 + 1 + 16, "{key}");
        assert!(key.starts_with("rl:{"));
        assert_eq!(key.as_bytes()[8], b'}');
        assert!(
            key[3..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'{' | b'}'))
        );
    }

    #[test]
    fn a_new_revision_rolls_the_key() {
        let s = subject(1);
        assert_ne!(keys("api", 1).state_key(&s), keys("api", 2).state_key(&s));
        assert_eq!(keys("api", 1).state_key(&s), keys("api", 1).state_key(&s));
    }

    #[test]
    fn one_subject_shares_its_tag_and_slot_across_policies() {
        let s = subject(42);
        let a = keys("api", 1).state_key(&s);
        let b = keys("login", 3).state_key(&s);
        assert_ne!(a, b);
        assert_eq!(a[..9], b[..9]);
        assert_eq!(hash_slot(a.as_bytes()), hash_slot(b.as_bytes()));
    }

    #[test]
    fn keys_contain_no_bytes_of_the_subject_or_policy_id() {
        let policy_id = "checkout-premium";
        let digest = SubjectDigest::from_bytes(*b"user-42@example.com/10.0.0.1:abc");
        let key = keys(policy_id, 1).state_key(&digest);
        assert!(!key.contains(policy_id));
        let raw = digest.as_bytes();
        // No 4-byte window of the subject digest (raw or as hex) shows up in the key.
        for w in raw.windows(4) {
            assert!(!key.as_bytes().windows(4).any(|k| k == w), "{key}");
        }
        assert!(!key.contains("user"));
    }

    #[test]
    fn subjects_spread_over_many_slots() {
        let k = keys("api", 1);
        let slots: HashSet<u16> = (0..10_000)
            .map(|n| hash_slot(k.state_key(&subject(n)).as_bytes()))
            .collect();
        // 10 000 subjects over 16 384 slots: an even spread fills about 7 600 distinct ones;
        // tagging by policy would fill exactly one.
        assert!(slots.len() > 7_000, "only {} slots", slots.len());
    }

    #[test]
    fn hash_slot_matches_redis_reference_values() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
    }

    #[test]
    fn a_replay_key_shares_the_first_members_slot_and_digests_every_member() {
        let (a, b, b2) = (policy("api", 1), policy("login", 1), policy("login", 2));
        let (s1, s2) = (subject(1), subject(2));
        let id = EvaluationId::new("retry-1").expect("valid id");
        let m = |policy, subject, cost| ReplayMember {
            policy,
            subject,
            cost,
        };
        let key = replay_key("rl", &id, &[m(&a, &s1, 1), m(&b, &s1, 1)]).expect("members");
        let state = keys("api", 1).state_key(&s1);
        assert_eq!(hash_slot(key.as_bytes()), hash_slot(state.as_bytes()));
        assert!(
            key.starts_with(&state[..9]) && key[9..].starts_with("e:"),
            "{key}"
        );
        assert!(!key.contains("retry"));
        for other in [
            vec![m(&a, &s1, 1)],
            vec![m(&a, &s1, 2), m(&b, &s1, 1)],
            vec![m(&a, &s1, 1), m(&b, &s2, 1)],
            vec![m(&b, &s1, 1), m(&a, &s1, 1)],
            vec![m(&a, &s1, 1), m(&b2, &s1, 1)],
        ] {
            assert_ne!(replay_key("rl", &id, &other), Some(key.clone()));
        }
        let id2 = EvaluationId::new("retry-2").expect("valid id");
        assert_ne!(
            replay_key("rl", &id2, &[m(&a, &s1, 1), m(&b, &s1, 1)]),
            Some(key.clone())
        );
        assert_eq!(replay_key("rl", &id, &[]), None);
    }

    #[test]
    fn bad_prefixes_are_refused_by_name() {
        assert!(check_prefix("rl").is_ok());
        for bad in ["", "a{b", "a}b", "a:b", "a b", &"x".repeat(33)] {
            let err = check_prefix(bad).expect_err(bad);
            assert!(err.to_string().contains("key_prefix"), "{err}");
        }
    }
}
