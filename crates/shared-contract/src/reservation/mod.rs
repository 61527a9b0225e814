//! The life of a reservation, as every provider keeps it: what it holds per policy
//! ([`Hold`]), until when, and how it ended.
//!
//! The charging rules are the models' ([`crate::model::reserve`]); this is the bookkeeping
//! around them that makes settle and cancel idempotent:
//! - outstanding until settled, cancelled, or `expires_at_ms` (then it stays charged at its
//!   estimates, and settle or cancel answer [`ReservationError::Expired`]);
//! - the first settle charges; a retried settle answers the first result
//!   ([`SettleStep::Replay`]) and charges nothing, whatever actual costs it carries;
//! - a retried cancel answers as the first ([`CancelStep::Replay`]); settle after cancel and
//!   cancel after settle are refused, naming what happened first.
//!
//! So what a reservation has charged is its actual costs once settled, nothing once
//! cancelled, and its estimates otherwise ([`Reservation::charged`]).
//!
//! A provider keeps a reservation until one ttl after its expiry
//! ([`Reservation::forget_at_ms`]): until then a settle is replayed and an expired one is
//! named; after it the id names nothing ([`ReservationError::Unknown`]).

mod id;

pub use id::{ReservationId, ReservationIdError};

/// Longest reservation ttl: one day, like a lease. A reservation covers one piece of work;
/// one never settled stays charged at its estimate, so a long ttl only delays its end.
pub const MAX_RESERVATION_TTL_MS: u64 = 86_400_000;

/// How long a reservation may wait for its settlement: `1..=MAX_RESERVATION_TTL_MS` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReservationTtl(u64);

impl ReservationTtl {
    /// A ttl of `ms` milliseconds.
    ///
    /// # Errors
    /// [`ReservationError::Ttl`] for 0 or above [`MAX_RESERVATION_TTL_MS`].
    pub fn from_millis(ms: u64) -> Result<Self, ReservationError> {
        if (1..=MAX_RESERVATION_TTL_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(ReservationError::Ttl(ms))
        }
    }

    /// The ttl in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

/// What an admitted reservation holds against one policy, for [`crate::model::reserve::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// Effective time (Unix ms) the estimate was charged at.
    pub at_ms: u64,
    /// The cost charged at `at_ms`.
    pub estimate: u64,
}

/// How a reservation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Settled with these actual costs, one per hold.
    Settled(Vec<u64>),
    /// Cancelled: nothing charged.
    Cancelled,
}

/// One reservation: its holds (one per policy, in request order) and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    holds: Vec<Hold>,
    expires_at_ms: u64,
    ttl: ReservationTtl,
    ending: Option<Ending>,
}

/// What a settle request is to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleStep {
    /// Charge the actual costs (then record them with [`Reservation::settled`]).
    Charge,
    /// Already settled: answer the first result, charge nothing.
    Replay,
}

/// What a cancel request is to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelStep {
    /// Refund the estimates (then record it with [`Reservation::cancelled`]).
    Refund,
    /// Already cancelled: answer as the first time, refund nothing.
    Replay,
}

/// Why a reservation request was refused; nothing was charged or refunded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReservationError {
    /// `ttl_ms` is 0 or above the maximum.
    #[error("ttl_ms must be 1..={MAX_RESERVATION_TTL_MS}, got {0}")]
    Ttl(u64),
    /// No reservation has this id: never made, or forgotten one ttl after its expiry.
    #[error("no reservation has this id (never made, or forgotten after its expiry)")]
    Unknown,
    /// The reservation expired (it stays charged at its estimates).
    #[error("the reservation expired at {expired_at_ms} ms; it stays charged at its estimates")]
    Expired {
        /// When it expired (Unix ms, the provider's clock).
        expired_at_ms: u64,
    },
    /// A settle after a cancel.
    #[error("the reservation was cancelled; it cannot be settled")]
    Cancelled,
    /// A cancel after a settle.
    #[error("the reservation was settled; it cannot be cancelled")]
    Settled,
    /// An actual cost above its policy's `max_cost`.
    #[error("actual[{index}] is {actual}, above max_cost {max_cost} of its policy")]
    ActualAboveMax {
        /// Position of the value, from 0.
        index: usize,
        /// The value.
        actual: u64,
        /// The policy's `max_cost`.
        max_cost: u64,
    },
    /// A settle with another number of actual costs than the reservation has requests.
    #[error("actual has {got} values; the reservation has {expected} requests")]
    ActualCount {
        /// Requests in the reservation.
        expected: usize,
        /// Values given.
        got: usize,
    },
}

impl Reservation {
    /// An outstanding reservation of `holds` made at `now_ms`, expiring `ttl` later.
    pub fn new(holds: Vec<Hold>, now_ms: u64, ttl: ReservationTtl) -> Self {
        Reservation {
            holds,
            expires_at_ms: now_ms.saturating_add(ttl.as_millis()),
            ttl,
            ending: None,
        }
    }

    /// When a provider may forget it: one ttl after its expiry.
    pub fn forget_at_ms(&self) -> u64 {
        self.expires_at_ms.saturating_add(self.ttl.as_millis())
    }

    /// The holds, in request order.
    pub fn holds(&self) -> &[Hold] {
        &self.holds
    }

    /// When it expires unless settled or cancelled (Unix ms, the provider's clock).
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// How it ended, if it did (an expiry is not recorded: it changes nothing).
    pub fn ending(&self) -> Option<&Ending> {
        self.ending.as_ref()
    }

    fn expired(&self, now_ms: u64) -> Result<(), ReservationError> {
        if now_ms >= self.expires_at_ms {
            Err(ReservationError::Expired {
                expired_at_ms: self.expires_at_ms,
            })
        } else {
            Ok(())
        }
    }

    /// What a settle with `actual` at `now_ms` is to do.
    ///
    /// # Errors
    /// [`ReservationError::Cancelled`], [`ReservationError::Expired`] (an outstanding
    /// reservation past its expiry) or [`ReservationError::ActualCount`] for a first settle
    /// with the wrong number of values.
    pub fn settle_step(&self, now_ms: u64, actual: &[u64]) -> Result<SettleStep, ReservationError> {
        match self.ending {
            Some(Ending::Settled(_)) => Ok(SettleStep::Replay),
            Some(Ending::Cancelled) => Err(ReservationError::Cancelled),
            None => {
                self.expired(now_ms)?;
                if actual.len() != self.holds.len() {
                    return Err(ReservationError::ActualCount {
                        expected: self.holds.len(),
                        got: actual.len(),
                    });
                }
                Ok(SettleStep::Charge)
            }
        }
    }

    /// Records a settlement that [`Self::settle_step`] allowed and that was charged.
    pub fn settled(&mut self, actual: Vec<u64>) {
        self.ending = Some(Ending::Settled(actual));
    }

    /// What a cancel at `now_ms` is to do.
    ///
    /// # Errors
    /// [`ReservationError::Settled`], or [`ReservationError::Expired`] for an outstanding
    /// reservation past its expiry.
    pub fn cancel_step(&self, now_ms: u64) -> Result<CancelStep, ReservationError> {
        match self.ending {
            Some(Ending::Cancelled) => Ok(CancelStep::Replay),
            Some(Ending::Settled(_)) => Err(ReservationError::Settled),
            None => self.expired(now_ms).map(|()| CancelStep::Refund),
        }
    }

    /// Records a cancellation that [`Self::cancel_step`] allowed and that was refunded.
    pub fn cancelled(&mut self) {
        self.ending = Some(Ending::Cancelled);
    }

    /// What the reservation has charged, per hold: the actual costs once settled, nothing
    /// once cancelled, the estimates otherwise (outstanding or expired).
    pub fn charged(&self) -> Vec<u64> {
        match &self.ending {
            Some(Ending::Settled(actual)) => actual.clone(),
            Some(Ending::Cancelled) => vec![0; self.holds.len()],
            None => self.holds.iter().map(|h| h.estimate).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation() -> Reservation {
        let hold = |estimate| Hold { at_ms: 0, estimate };
        let ttl = ReservationTtl::from_millis(100).expect("in range");
        Reservation::new(vec![hold(5), hold(7)], 1_000, ttl)
    }

    #[test]
    fn a_ttl_outside_its_range_is_named() {
        assert_eq!(
            ReservationTtl::from_millis(0),
            Err(ReservationError::Ttl(0))
        );
        let over = MAX_RESERVATION_TTL_MS + 1;
        let e = ReservationTtl::from_millis(over).expect_err("too long");
        assert!(e.to_string().contains("ttl_ms"), "{e}");
    }

    #[test]
    fn a_second_settle_replays_and_a_cancel_after_it_is_refused() {
        let mut r = reservation();
        assert_eq!(r.settle_step(1_050, &[1, 2]), Ok(SettleStep::Charge));
        r.settled(vec![1, 2]);
        assert_eq!(r.settle_step(1_060, &[9, 9, 9]), Ok(SettleStep::Replay));
        // Even after the expiry: the settlement stands.
        assert_eq!(r.settle_step(5_000, &[9, 9]), Ok(SettleStep::Replay));
        assert_eq!(r.cancel_step(1_060), Err(ReservationError::Settled));
        assert_eq!(r.charged(), vec![1, 2]);
    }

    #[test]
    fn a_cancel_replays_and_a_settle_after_it_is_refused() {
        let mut r = reservation();
        assert_eq!(r.cancel_step(1_000), Ok(CancelStep::Refund));
        r.cancelled();
        assert_eq!(r.cancel_step(1_001), Ok(CancelStep::Replay));
        assert_eq!(
            r.settle_step(1_001, &[1, 2]),
            Err(ReservationError::Cancelled)
        );
        assert_eq!(r.charged(), vec![0, 0]);
    }

    #[test]
    fn an_expired_reservation_stays_charged_at_its_estimates() {
        let r = reservation();
        let expired = Err(ReservationError::Expired {
            expired_at_ms: 1_100,
        });
        assert_eq!(r.settle_step(1_100, &[1, 2]), expired);
        assert_eq!(r.cancel_step(1_100).map(|_| ()), expired.map(|_| ()));
        assert_eq!(r.charged(), vec![5, 7]);
    }

    #[test]
    fn a_first_settle_needs_one_actual_per_request() {
        let r = reservation();
        assert_eq!(
            r.settle_step(1_000, &[1]),
            Err(ReservationError::ActualCount {
                expected: 2,
                got: 1
            })
        );
    }
}
