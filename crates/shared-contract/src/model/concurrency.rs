//! Concurrency: at most `limit` leases of one subject held at once, each expiring `lease_ttl`
//! after its acquire unless released first.
//!
//! - acquire at `now`: first drop the leases with `expires_at <= now`; then admit iff fewer
//!   than `limit` remain, adding `(token, now + lease_ttl)`. A denied acquire changes
//!   nothing and answers `retry_after = earliest expiry - now` (when a place frees at the
//!   latest; a release frees one sooner);
//! - release of a token: absent is `NotHeld`; present with `expires_at <= now` is `Expired`
//!   (and removed); otherwise `Released` (removed). A release never touches another token.
//!
//! There is no clock rule as for the rate algorithms: expiries are absolute times, so a clock
//! that goes back only keeps leases a little longer, never admits more than `limit`.
//! The state lives until its latest expiry; after that it decides exactly like no state, so
//! a provider may forget it from then on (Redis: the key's TTL; local: the entry's lifetime).
//! The one answer that forgetting changes: a release of an expired lease is `Expired` while
//! the state is kept and `NotHeld` once it is forgotten. Both free nothing
//! ([`release_answer_allowed`] is the rule the differential tests hold providers to).

use super::ModelError;
use crate::exact::{add, sub};
use crate::lease::LeaseToken;
use crate::policy::{ConcurrencyParams, MAX_TIME_MS};

/// The leases of one subject, in acquire order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConcurrencyState {
    /// `(token, expires_at_ms)`; tokens are distinct.
    pub leases: Vec<(LeaseToken, u64)>,
}

impl ConcurrencyState {
    /// Leases still held at `now`.
    pub fn held(&self, now_ms: u64) -> usize {
        self.leases.iter().filter(|(_, e)| *e > now_ms).count()
    }

    /// The latest expiry: after it the state is the same as no state.
    pub fn latest_expiry_ms(&self) -> Option<u64> {
        self.leases.iter().map(|(_, e)| *e).max()
    }
}

/// The verdict of an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is held until `expires_at_ms`; `remaining` more may be acquired now.
    Acquired {
        /// Unix ms, by the provider's clock, when the new lease expires: `now + lease_ttl`.
        expires_at_ms: u64,
        /// Leases the subject may still acquire now, after this one.
        remaining: u64,
        /// The state to store: the live leases plus the new one (expired ones dropped).
        new_state: ConcurrencyState,
    },
    /// `limit` leases are held; the earliest expires in `retry_after_ms`.
    Denied {
        /// Milliseconds until the earliest held lease expires (a release frees a place sooner).
        retry_after_ms: u64,
    },
}

/// The verdict of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Release {
    /// The lease was held and is removed now.
    Released,
    /// The lease had expired (its place was already free); it is removed now.
    Expired,
    /// No lease of this token is in the state; nothing changed.
    NotHeld,
}

fn check_now(now_ms: u64) -> Result<(), ModelError> {
    if now_ms > MAX_TIME_MS {
        Err(ModelError::ClockOutOfRange(now_ms))
    } else {
        Ok(())
    }
}

/// One acquire of `token` at `now_ms`. See the module docs.
///
/// # Errors
/// [`ModelError::ClockOutOfRange`]; [`ModelError::StateIncompatible`] when a live lease
/// holds `token` already (tokens are random: a repeat is a broken token source, never a
/// second place).
pub fn acquire(
    p: &ConcurrencyParams,
    state: Option<&ConcurrencyState>,
    now_ms: u64,
    token: LeaseToken,
) -> Result<Acquire, ModelError> {
    check_now(now_ms)?;
    let leases: &[(LeaseToken, u64)] = state.map_or(&[], |s| &s.leases);
    let live: Vec<(LeaseToken, u64)> = leases.iter().copied().filter(|l| l.1 > now_ms).collect();
    // Checked after the expired leases are dropped, as the Lua program does.
    if live.iter().any(|(t, _)| *t == token) {
        return Err(ModelError::StateIncompatible("lease token already held"));
    }
    let held = live.len() as u64;
    if held >= p.limit() {
        let earliest = live.iter().map(|l| l.1).min().unwrap_or(now_ms);
        return Ok(Acquire::Denied {
            retry_after_ms: sub(earliest, now_ms)?,
        });
    }
    let expires_at_ms = add(now_ms, p.lease_ttl_ms())?;
    let mut new_state = ConcurrencyState { leases: live };
    new_state.leases.push((token, expires_at_ms));
    Ok(Acquire::Acquired {
        expires_at_ms,
        remaining: p.limit() - held - 1,
        new_state,
    })
}

/// One release of `token` at `now_ms`, and the state to store when it changed. See the
/// module docs.
///
/// # Errors
/// [`ModelError::ClockOutOfRange`].
pub fn release(
    state: Option<&ConcurrencyState>,
    now_ms: u64,
    token: LeaseToken,
) -> Result<(Release, Option<ConcurrencyState>), ModelError> {
    check_now(now_ms)?;
    let Some(state) = state else {
        return Ok((Release::NotHeld, None));
    };
    let Some(index) = state.leases.iter().position(|(t, _)| *t == token) else {
        return Ok((Release::NotHeld, None));
    };
    let mut new_state = state.clone();
    let (_, expires_at) = new_state.leases.remove(index);
    let verdict = if expires_at <= now_ms {
        Release::Expired
    } else {
        Release::Released
    };
    Ok((verdict, Some(new_state)))
}

/// Whether `got` is an answer a provider may give to a release the model answers `want`
/// with, given the model's state before the release: the same answer, or `NotHeld` for
/// `Expired` once every lease of the subject has expired (the provider may have forgotten
/// the state then, see the module docs).
pub fn release_answer_allowed(
    want: Release,
    got: Release,
    before: Option<&ConcurrencyState>,
    now_ms: u64,
) -> bool {
    want == got
        || (want == Release::Expired
            && got == Release::NotHeld
            && before.is_none_or(|s| s.held(now_ms) == 0))
}
