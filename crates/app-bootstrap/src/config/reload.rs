//! `[reload]`: whether a change of the configuration file reloads it (`SIGHUP` always does).

use figment::value::Value;
use shared_contract::PolicyErrors;

use super::reader::{Check, Key, Toml, read_section, render_section};
use crate::settings::ReloadSettings;

pub(super) const P: &str = "reload";

const KEYS: &[Key<ReloadSettings>] = &[Key {
    name: "watch",
    read: |c, path, v, s| {
        if let Some(w) = c.bool(path, Some(v)) {
            s.watch = w;
        }
    },
    render: |s, o| o.raw("watch", s.watch),
}];

/// `None` when the section has problems (reported).
pub(super) fn read(c: &mut Check, v: Option<&Value>) -> Option<ReloadSettings> {
    read_section(c, P, v, KEYS, |_| Ok::<(), PolicyErrors>(()))
}

pub(super) fn render(o: &mut Toml, s: &ReloadSettings) {
    render_section(o, P, KEYS, s);
}

#[cfg(test)]
mod tests {
    use crate::config::from_toml;

    #[test]
    fn watch_is_on_by_default_and_a_bool() {
        assert!(from_toml("").expect("defaults").reload.watch);
        let off = from_toml("[reload]\nwatch = false\n").expect("off");
        assert!(!off.reload.watch);
        assert!(off.render().contains("[reload]\nwatch = false"));
        let e = from_toml("[reload]\nwatch = \"no\"\n").expect_err("a string");
        assert!(e.names("reload.watch"), "{e}");
        let e = from_toml("[reload]\ninterval = \"1s\"\n").expect_err("unknown");
        assert!(e.names("reload.interval"), "{e}");
    }
}
