//! Concurrency leases on Redis: `lua/lease-acquire-v1.lua` and `lua/lease-release-v1.lua`,
//! their arguments, and the strict parsers of their replies.
//!
//! One sorted set per (policy, revision, subject) holds the subject's leases (token ->
//! expiry on the server's `TIME`), under the same digested key and hash tag as every state
//! key, so each call touches one key of one slot (cluster-safe). The key expires with its
//! latest lease, so a crashed holder's leases are reclaimed by Redis itself.
//!
//! Failure certainty is the rate programs': `Unavailable` when nothing was sent,
//! `Indeterminate` when the program may have run (an acquire may then hold a place until
//! its TTL; a release may or may not have freed it). An unknown reply is never a lease.

use redis::Value;
use shared_contract::exact::MAX_SAFE_INTEGER;
use shared_contract::policy::ConcurrencyParams;
use shared_contract::{
    AcquireOutcome, AcquireRequest, IncompatibleCategory, Lease, LeaseId, RateLimitPolicy,
    ReleaseOutcome, ReleaseRequest, Source, TokenSource,
};

use crate::commands;
use crate::failure::Failure;
use crate::keys::{PolicyKeys, hash_slot};
use crate::pool::{Pool, ScriptReply};
use crate::resp;
use crate::script::{Script, ScriptArgs, embedded};

/// The acquire program.
pub static ACQUIRE: Script = embedded!(
    "lease-acquire-v1.lua",
    &[
        &commands::TIME,
        &commands::ZREMRANGEBYSCORE,
        &commands::ZSCORE,
        &commands::ZCARD,
        &commands::ZRANGE,
        &commands::ZADD,
        &commands::PEXPIRE,
    ]
);

/// The release program.
pub static RELEASE: Script = embedded!(
    "lease-release-v1.lua",
    &[&commands::TIME, &commands::ZSCORE, &commands::ZREM]
);

/// Both lease programs, as a provider with a concurrency policy preloads them and the ACL
/// check covers them.
pub(crate) fn scripts() -> [&'static Script; 2] {
    [&ACQUIRE, &RELEASE]
}

/// One acquire call: `1 key token limit ttl` after `EVALSHA sha1`.
struct AcquireCall<'a> {
    key: &'a str,
    token: &'a str,
    params: ConcurrencyParams,
}

impl ScriptArgs for AcquireCall<'_> {
    fn count(&self) -> usize {
        5
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"$1\r\n1\r\n");
        resp::write_bulk(out, self.key.as_bytes());
        resp::write_bulk(out, self.token.as_bytes());
        resp::write_bulk_u64(out, self.params.limit());
        resp::write_bulk_u64(out, self.params.lease_ttl_ms());
    }

    /// Only an acquired lease wrote state; a place that a failover may forget is exactly
    /// the over-admission `min_replicas_ack` exists to prevent.
    fn needs_ack(&self, reply: &Value) -> bool {
        matches!(reply, Value::Array(f) if matches!(f.first(), Some(Value::BulkString(s)) if s == b"ACQUIRED"))
    }
}

/// One release call: `1 key token` after `EVALSHA sha1`.
struct ReleaseCall<'a> {
    key: &'a str,
    token: &'a str,
}

impl ScriptArgs for ReleaseCall<'_> {
    fn count(&self) -> usize {
        3
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"$1\r\n1\r\n");
        resp::write_bulk(out, self.key.as_bytes());
        resp::write_bulk(out, self.token.as_bytes());
    }

    /// A release a failover forgets leaves the lease held until its TTL: fewer places, never
    /// more, so it does not wait for replicas.
    fn needs_ack(&self, _reply: &Value) -> bool {
        false
    }
}

/// A valid acquire reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The lease is held until `expires_at_ms`.
    Acquired {
        /// The server's time at the acquire, Unix ms.
        server_now_ms: u64,
        /// When the lease expires, Unix ms by the server's clock (`server_now_ms` + the lease TTL).
        expires_at_ms: u64,
        /// Places still free after this lease (below the policy's limit).
        remaining: u64,
    },
    /// All of the policy's `limit` leases are held; nothing changed.
    Denied {
        /// Until the earliest held lease expires, in ms (at least 1).
        retry_after_ms: u64,
    },
    /// The key holds another type, or already holds this token; nothing written.
    StateIncompatible,
    /// The program refused an argument; nothing written.
    Invalid,
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) if *i >= 0 && (*i as u64) <= MAX_SAFE_INTEGER => Some(*i as u64),
        _ => None,
    }
}

fn status(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(s) => Some(s),
        _ => None,
    }
}

/// Parses an acquire reply strictly and checks it against the policy: six fields, a known
/// status, integers in range, the limit of the policy, an expiry of exactly `now + ttl`,
/// `remaining < limit`, a retry within the TTL. `None` for anything else.
pub fn parse_acquire(value: &Value, params: &ConcurrencyParams) -> Option<AcquireReply> {
    let Value::Array(f) = value else { return None };
    if f.len() != 6 {
        return None;
    }
    let n: Vec<u64> = f[1..].iter().map(int).collect::<Option<_>>()?;
    let (now, expires, limit, remaining, retry) = (n[0], n[1], n[2], n[3], n[4]);
    let zeros = expires == 0 && limit == 0 && remaining == 0 && retry == 0;
    Some(match status(&f[0])? {
        b"ACQUIRED"
            if limit == params.limit()
                && remaining < limit
                && retry == 0
                && Some(expires) == now.checked_add(params.lease_ttl_ms()) =>
        {
            AcquireReply::Acquired {
                server_now_ms: now,
                expires_at_ms: expires,
                remaining,
            }
        }
        b"DENIED" if limit == params.limit() && expires == 0 && remaining == 0 && retry >= 1 => {
            AcquireReply::Denied {
                retry_after_ms: retry,
            }
        }
        b"STATE_INCOMPATIBLE" if zeros => AcquireReply::StateIncompatible,
        b"INVALID" if zeros => AcquireReply::Invalid,
        _ => return None,
    })
}

/// A valid release reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReply {
    /// The lease was held, and is removed.
    Released,
    /// The lease had expired (its place was free already), and is removed.
    Expired,
    /// No such lease: released before, never acquired, or reclaimed.
    NotHeld,
    /// The key holds another type; nothing written.
    StateIncompatible,
    /// The program refused the token (missing or malformed); nothing written.
    Invalid,
}

/// Parses a release reply strictly: two fields, a known status, an integer time.
pub fn parse_release(value: &Value) -> Option<ReleaseReply> {
    let Value::Array(f) = value else { return None };
    if f.len() != 2 {
        return None;
    }
    int(&f[1])?;
    Some(match status(&f[0])? {
        b"RELEASED" => ReleaseReply::Released,
        b"EXPIRED" => ReleaseReply::Expired,
        b"NOT_HELD" => ReleaseReply::NotHeld,
        b"STATE_INCOMPATIBLE" => ReleaseReply::StateIncompatible,
        b"INVALID" => ReleaseReply::Invalid,
        _ => return None,
    })
}

/// What a lease call needs of the provider.
pub(crate) struct Leasing<'a> {
    pub pool: &'a Pool,
    pub keys: &'a PolicyKeys,
    pub timeout: std::time::Duration,
    pub retry_after_ms: u64,
    pub min_replicas_ack: u32,
}

impl Leasing<'_> {
    /// Runs `script` on `key`; the failure outcome, built by `failed`, when it did not answer.
    async fn run<T>(
        &self,
        script: &Script,
        key: &str,
        call: &dyn ScriptArgs,
        deadline: shared_contract::Deadline,
        failed: impl Fn(Failure) -> T,
    ) -> Result<ScriptReply, T> {
        let _permit = self
            .pool
            .admit(deadline, self.timeout)
            .map_err(|c| failed(Failure::Unavailable(c)))?;
        self.pool
            .run_script(script, hash_slot(key.as_bytes()), call, self.timeout)
            .await
            .map_err(failed)
    }

    /// Acquires one lease of `policy` (a concurrency policy with `params`).
    pub(crate) async fn acquire(
        &self,
        policy: &RateLimitPolicy,
        params: ConcurrencyParams,
        request: &AcquireRequest,
        tokens: &dyn TokenSource,
    ) -> AcquireOutcome {
        let policy_id = policy.id().clone();
        let key = self.keys.state_key(&request.subject);
        let token = tokens.next_token();
        let hex = token.to_hex();
        let call = AcquireCall {
            key: &key,
            token: &hex,
            params,
        };
        let failed = |f: Failure| match f {
            Failure::Unavailable(category) => AcquireOutcome::Unavailable {
                policy_id: policy_id.clone(),
                retry_after_ms: self.retry_after_ms,
                category,
            },
            Failure::Incompatible(category) => AcquireOutcome::Incompatible {
                policy_id: policy_id.clone(),
                category,
            },
            Failure::Indeterminate | Failure::NoScript => AcquireOutcome::Indeterminate {
                policy_id: policy_id.clone(),
                retry_after_ms: self.retry_after_ms,
            },
        };
        let reply = match self
            .run(&ACQUIRE, &key, &call, request.deadline, failed)
            .await
        {
            Ok(reply) => reply,
            Err(outcome) => return outcome,
        };
        let incompatible = |category| AcquireOutcome::Incompatible {
            policy_id: policy_id.clone(),
            category,
        };
        match parse_acquire(&reply.value, &params) {
            Some(AcquireReply::Acquired { .. }) if !reply.durable(self.min_replicas_ack) => {
                AcquireOutcome::Indeterminate {
                    policy_id: policy_id.clone(),
                    retry_after_ms: self.retry_after_ms,
                }
            }
            Some(AcquireReply::Acquired {
                expires_at_ms,
                remaining,
                ..
            }) => {
                let id = LeaseId {
                    policy_id: policy_id.clone(),
                    subject: request.subject,
                    token,
                };
                AcquireOutcome::Acquired(Lease::new(
                    policy,
                    &params,
                    id,
                    expires_at_ms,
                    remaining,
                    Source::GlobalRedis,
                ))
            }
            Some(AcquireReply::Denied { retry_after_ms }) => AcquireOutcome::Denied {
                policy_id: policy_id.clone(),
                limit: params.limit(),
                retry_after_ms,
                source: Source::GlobalRedis,
            },
            Some(AcquireReply::StateIncompatible) => incompatible(IncompatibleCategory::State),
            Some(AcquireReply::Invalid) => incompatible(IncompatibleCategory::Program),
            None => incompatible(IncompatibleCategory::Reply),
        }
    }

    /// Releases the lease `request` names.
    pub(crate) async fn release(&self, request: &ReleaseRequest) -> ReleaseOutcome {
        let key = self.keys.state_key(&request.lease.subject);
        let hex = request.lease.token.to_hex();
        let call = ReleaseCall {
            key: &key,
            token: &hex,
        };
        let failed = |f: Failure| match f {
            Failure::Unavailable(category) => ReleaseOutcome::Unavailable {
                retry_after_ms: self.retry_after_ms,
                category,
            },
            Failure::Incompatible(category) => ReleaseOutcome::Incompatible { category },
            Failure::Indeterminate | Failure::NoScript => ReleaseOutcome::Indeterminate {
                retry_after_ms: self.retry_after_ms,
            },
        };
        let reply = match self
            .run(&RELEASE, &key, &call, request.deadline, failed)
            .await
        {
            Ok(reply) => reply,
            Err(outcome) => return outcome,
        };
        let incompatible = |category| ReleaseOutcome::Incompatible { category };
        match parse_release(&reply.value) {
            Some(ReleaseReply::Released) => ReleaseOutcome::Released,
            Some(ReleaseReply::Expired) => ReleaseOutcome::Expired,
            Some(ReleaseReply::NotHeld) => ReleaseOutcome::NotHeld,
            Some(ReleaseReply::StateIncompatible) => incompatible(IncompatibleCategory::State),
            Some(ReleaseReply::Invalid) => incompatible(IncompatibleCategory::Program),
            None => incompatible(IncompatibleCategory::Reply),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params() -> ConcurrencyParams {
        let p = RateLimitPolicy::concurrency("jobs", 3, Duration::from_secs(10))
            .cleanup_grace(Duration::ZERO)
            .max_clock_regression(Duration::ZERO)
            .build()
            .expect("valid policy");
        match p.algorithm() {
            shared_contract::Algorithm::Concurrency(c) => *c,
            _ => panic!("concurrency"),
        }
    }

    fn reply(status: &str, n: &[i64]) -> Value {
        let mut v = vec![Value::BulkString(status.as_bytes().to_vec())];
        v.extend(n.iter().map(|i| Value::Int(*i)));
        Value::Array(v)
    }

    #[test]
    fn acquire_replies_are_parsed_strictly_against_the_policy() {
        let p = params();
        assert_eq!(
            parse_acquire(&reply("ACQUIRED", &[1000, 11_000, 3, 2, 0]), &p),
            Some(AcquireReply::Acquired {
                server_now_ms: 1000,
                expires_at_ms: 11_000,
                remaining: 2
            })
        );
        assert_eq!(
            parse_acquire(&reply("DENIED", &[1000, 0, 3, 0, 500]), &p),
            Some(AcquireReply::Denied {
                retry_after_ms: 500
            })
        );
        let refused: [&[i64]; 6] = [
            &[1000, 11_001, 3, 2, 0], // not now + ttl
            &[1000, 11_000, 4, 2, 0], // another limit
            &[1000, 11_000, 3, 3, 0], // remaining == limit
            &[1000, 11_000, 3, 2],    // arity
            &[-1, 11_000, 3, 2, 0],   // negative
            &[1000, 11_000, 3, 2, 1], // a retry on an acquire
        ];
        for n in refused {
            assert_eq!(parse_acquire(&reply("ACQUIRED", n), &p), None, "{n:?}");
        }
        assert_eq!(
            parse_acquire(&reply("DENIED", &[1000, 0, 3, 0, 0]), &p),
            None
        );
        assert_eq!(parse_acquire(&reply("HELD", &[1000, 0, 0, 0, 0]), &p), None);
        assert_eq!(
            parse_acquire(&reply("STATE_INCOMPATIBLE", &[1000, 0, 0, 0, 0]), &p),
            Some(AcquireReply::StateIncompatible)
        );
        assert_eq!(parse_acquire(&Value::Int(1), &p), None);
    }

    #[test]
    fn release_replies_are_parsed_strictly() {
        assert_eq!(
            parse_release(&reply("RELEASED", &[5])),
            Some(ReleaseReply::Released)
        );
        assert_eq!(
            parse_release(&reply("NOT_HELD", &[5])),
            Some(ReleaseReply::NotHeld)
        );
        assert_eq!(
            parse_release(&reply("EXPIRED", &[5])),
            Some(ReleaseReply::Expired)
        );
        assert_eq!(parse_release(&reply("RELEASED", &[5, 6])), None);
        assert_eq!(parse_release(&reply("FREED", &[5])), None);
        assert_eq!(parse_release(&reply("RELEASED", &[-5])), None);
    }

    #[test]
    fn lease_programs_declare_their_calls_and_read_time_once() {
        for s in scripts() {
            crate::script::tests::assert_declares_its_calls(s);
            assert_eq!(
                s.source.matches("redis.call('TIME')").count(),
                1,
                "{}",
                s.name
            );
            assert!(s.test_variant().is_ok(), "{}", s.name);
            assert!(s.source.starts_with(&format!("-- {}", s.name)));
        }
    }
}
