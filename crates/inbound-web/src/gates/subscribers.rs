//! The bound on gate-stream subscribers: at most [`MAX_SUBSCRIBERS_PER_GATE`] per gate and
//! [`MAX_SUBSCRIBERS`] in the process. Beyond either, the WebSocket upgrade is refused with
//! 503 problem+json (`too_many_subscribers`, `Retry-After: 1`) before any socket exists.
//!
//! A [`Permit`] is taken before the upgrade and released when the connection ends (or when an
//! upgrade never completes), so the count is exact whatever way a connection goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use shared_contract::gate::GateId;

/// Most subscribers of one gate.
pub const MAX_SUBSCRIBERS_PER_GATE: usize = 256;
/// Most subscribers of all gates together.
pub const MAX_SUBSCRIBERS: usize = 1024;

/// The live subscriber counts.
#[derive(Debug)]
pub struct Subscribers {
    per_gate_max: usize,
    total_max: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_gate: HashMap<GateId, usize>,
}

/// One admitted subscriber; dropping it frees its place.
#[derive(Debug)]
pub struct Permit {
    owner: Arc<Subscribers>,
    gate: GateId,
}

impl Subscribers {
    /// Counts with the given bounds (the server uses [`MAX_SUBSCRIBERS_PER_GATE`] and
    /// [`MAX_SUBSCRIBERS`]).
    pub fn new(per_gate_max: usize, total_max: usize) -> Arc<Self> {
        Arc::new(Self {
            per_gate_max,
            total_max,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A place for one more subscriber of `gate`, or `None` when a bound is reached.
    pub fn admit(self: &Arc<Self>, gate: &GateId) -> Option<Permit> {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let of_gate = c.per_gate.get(gate).copied().unwrap_or(0);
        if c.total >= self.total_max || of_gate >= self.per_gate_max {
            return None;
        }
        c.total += 1;
        c.per_gate.insert(gate.clone(), of_gate + 1);
        crate::gates::metrics::subscribers(gate, of_gate + 1);
        Some(Permit {
            owner: self.clone(),
            gate: gate.clone(),
        })
    }

    /// Live subscribers of `gate` and in total.
    pub fn counts(&self, gate: &GateId) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        (c.per_gate.get(gate).copied().unwrap_or(0), c.total)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut c = self
            .owner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_gate.get_mut(&self.gate) {
            *n = n.saturating_sub(1);
            crate::gates::metrics::subscribers(&self.gate, *n);
            if *n == 0 {
                c.per_gate.remove(&self.gate);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(name: &str) -> GateId {
        GateId::new(name).expect("a gate id")
    }

    #[test]
    fn both_bounds_hold_and_a_dropped_permit_frees_its_place() {
        let s = Subscribers::new(2, 3);
        let (a, b) = (gate("a"), gate("b"));
        let a1 = s.admit(&a).expect("first of a");
        let _a2 = s.admit(&a).expect("second of a");
        assert!(s.admit(&a).is_none(), "per-gate bound");
        let _b1 = s.admit(&b).expect("first of b");
        assert!(s.admit(&b).is_none(), "total bound");
        assert_eq!(s.counts(&a), (2, 3));
        drop(a1);
        assert_eq!(s.counts(&a), (1, 2));
        assert!(s.admit(&b).is_some(), "a freed place is usable");
    }
}
