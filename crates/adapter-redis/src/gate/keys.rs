//! The physical keys of one gate: `<prefix>:gate:{<gate>}:<part>`.
//!
//! Every key of a gate carries the gate id as its Redis Cluster hash tag, so the whole gate
//! lives in one slot and each program is one atomic step over all of it. Gate ids are
//! `[a-z0-9_-]` (no braces), so the tag is exactly the id. Event keys and ids are not in
//! key names: they are fields and members inside these eight keys.

use shared_contract::gate::GateId;

use crate::error::Error;
use crate::keys::check_prefix;

/// The parts, in the KEYS order every gate program expects.
pub const PARTS: [&str; 8] = [
    "clock", "meta", "events", "due", "retained", "windows", "wends", "stream",
];

/// The eight keys of one gate, in KEYS order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateKeys {
    keys: [String; 8],
}

impl GateKeys {
    /// The keys of `gate` under `prefix`.
    ///
    /// # Errors
    /// [`Error::Settings`] when `prefix` is not 1..=32 characters of `[A-Za-z0-9_.-]`.
    pub fn new(prefix: &str, gate: &GateId) -> Result<Self, Error> {
        check_prefix(prefix)?;
        Ok(Self {
            keys: PARTS.map(|part| format!("{prefix}:gate:{{{gate}}}:{part}")),
        })
    }

    /// All eight, in KEYS order.
    pub fn all(&self) -> &[String; 8] {
        &self.keys
    }

    /// The stream of status updates.
    pub fn stream(&self) -> &str {
        &self.keys[7]
    }

    /// The meta hash (the settings the state was written with, the gate's time).
    pub fn meta(&self) -> &str {
        &self.keys[1]
    }

    /// The event map.
    pub fn events(&self) -> &str {
        &self.keys[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_gate_shares_its_hash_tag() {
        let k = GateKeys::new("rl", &GateId::new("orders").expect("valid id")).expect("prefix");
        assert_eq!(k.all()[0], "rl:gate:{orders}:clock");
        assert_eq!(k.stream(), "rl:gate:{orders}:stream");
        for key in k.all() {
            assert!(key.contains("{orders}"), "{key}");
            assert_eq!(key.matches('{').count(), 1, "{key}");
        }
    }

    #[test]
    fn a_bad_prefix_is_refused() {
        assert!(GateKeys::new("a{b", &GateId::new("g").expect("valid id")).is_err());
    }
}
