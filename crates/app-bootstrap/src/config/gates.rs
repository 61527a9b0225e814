//! `[event_gates.<id>]`: every event gate, each field read here (types, names) and then
//! checked by [`GateSettings::new`] (ranges), whose field names complete the key path.
//! A gate is refused when its provider (the rate limiter's, see `crate::gates`) is not
//! compiled in.

use figment::value::{Dict, Value};
use shared_contract::gate::{GateId, GateMode, GateSet, GateSettings, GateSpec};

use super::reader::{Check, Toml, join};
use crate::features::Feature;

pub(super) const P: &str = "event_gates";

const KEYS: &[&str] = &[
    "mode",
    "duration",
    "retention",
    "max_events",
    "max_clock_regression",
];

/// Every gate; `None` when one has problems (reported). No section: no gate. `provider`:
/// the gates' provider, `None` when `[rate_limit]` does not say (its problems are reported).
pub(super) fn read(c: &mut Check, v: Option<&Value>, provider: Option<Feature>) -> Option<GateSet> {
    let Some(d) = c.table(P, v) else {
        return v.is_none().then(GateSet::default);
    };
    let mut gates = Vec::new();
    let mut ok = true;
    for (name, value) in d {
        let path = join(P, name);
        // The redis provider, when missing, is refused at `rate_limit.provider` already.
        if provider == Some(Feature::Local) {
            let what = "the local gate provider (gates are local unless rate limiting is enabled with provider = \"redis\")";
            ok &= c.needs(&path, what, Feature::Local);
        }
        let gate = c
            .table(&path, Some(value))
            .and_then(|g| read_gate(c, &path, name, g));
        match gate {
            Some(g) => gates.push(g),
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    match GateSet::new(gates) {
        Ok(set) => Some(set),
        Err(e) => {
            c.push(P, e.to_string());
            None
        }
    }
}

fn read_gate(c: &mut Check, path: &str, name: &str, g: &Dict) -> Option<GateSettings> {
    c.unknown_keys(path, g, KEYS.iter().copied());
    let at = |key: &str| join(path, key);
    let id = match GateId::new(name) {
        Ok(id) => Some(id),
        Err(e) => {
            c.push(path, e.to_string());
            None
        }
    };
    let mode = c
        .required(
            &at("mode"),
            g.get("mode"),
            "required (\"only_once\" or \"strictly_once\")",
        )
        .and_then(|v| {
            let choices = "\"only_once\" or \"strictly_once\"";
            c.choice(&at("mode"), Some(v), GateMode::parse, "a mode", choices)
        });
    let duration = c
        .required(
            &at("duration"),
            g.get("duration"),
            "required (a duration such as \"3s\")",
        )
        .and_then(|v| c.duration(&at("duration"), Some(v)));
    let retention = c.duration(&at("retention"), g.get("retention"));
    let max_events = c.whole(&at("max_events"), g.get("max_events"));
    let regression = c.duration(&at("max_clock_regression"), g.get("max_clock_regression"));
    let mut spec = GateSpec::new(id?, mode?, duration?);
    if let Some(r) = retention {
        spec.retention = r;
    }
    if let Some(m) = max_events {
        spec.max_events = m;
    }
    if let Some(r) = regression {
        spec.max_clock_regression = r;
    }
    c.owned(path, GateSettings::new(spec))
}

pub(super) fn render(o: &mut Toml, gates: &GateSet) {
    for g in gates.iter() {
        o.table(format_args!("{P}.{}", g.id()));
        o.str("mode", g.mode().as_str());
        o.ms("duration", g.duration_ms());
        o.ms("retention", g.retention_ms());
        o.raw("max_events", g.max_events());
        o.ms("max_clock_regression", g.max_clock_regression_ms());
    }
}
