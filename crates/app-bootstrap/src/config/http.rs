//! `[http]`: where the reference app listens, how many worker threads serve it, and the
//! listener's limits (timeouts, connections, body size).

use std::net::SocketAddr;

use figment::value::Value;

use super::reader::{Check, Key, Toml, key, read_section, render_section};
use crate::settings::HttpSettings;

pub(super) const P: &str = "http";

/// Every key of `[http]`: how it is read and rendered. Defaults: [`HttpSettings::default`].
const KEYS: &[Key<HttpSettings>] = &[
    Key {
        name: "bind",
        read: |c, path, v, s| {
            if let Some(a) = address(c, path, v) {
                s.bind = a;
            }
        },
        render: |s, o| o.str("bind", &s.bind.to_string()),
    },
    Key {
        name: "worker_threads",
        read: |c, path, v, s| {
            if let Some(n) = c.whole(path, Some(v)) {
                s.worker_threads = Some(n);
            }
        },
        render: |s, o| match s.worker_threads {
            Some(n) => o.raw("worker_threads", n),
            None => o.line("# worker_threads: one per CPU"),
        },
    },
    key!("header_read_timeout", header_read_timeout),
    key!("idle_timeout", idle_timeout),
    key!("max_connections", max_connections),
    key!("max_body_bytes", max_body_bytes),
];

fn address(c: &mut Check, path: &str, v: &Value) -> Option<SocketAddr> {
    c.parsed(path, Some(v), |s| {
        s.parse::<SocketAddr>()
            .map_err(|_| format!("{s:?} is not an address such as \"127.0.0.1:8080\""))
    })
}

/// `None` when the section has problems (reported).
pub(super) fn read(c: &mut Check, v: Option<&Value>) -> Option<HttpSettings> {
    read_section(c, P, v, KEYS, HttpSettings::validate)
}

pub(super) fn render(o: &mut Toml, s: &HttpSettings) {
    render_section(o, P, KEYS, s);
}
