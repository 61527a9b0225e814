//! `[log]`: how the app writes its log (the level comes from `RUST_LOG`).

use figment::value::Value;
use shared_contract::PolicyErrors;

use super::reader::{Check, Key, Toml, read_section, render_section};
use crate::settings::{LogFormat, LogSettings};

pub(super) const P: &str = "log";

const KEYS: &[Key<LogSettings>] = &[Key {
    name: "format",
    read: |c, path, v, s| {
        if let Some(f) = c.choice(
            path,
            Some(v),
            LogFormat::parse,
            "a log format",
            "\"text\" or \"json\"",
        ) {
            s.format = f;
        }
    },
    render: |s, o| o.str("format", s.format.as_str()),
}];

/// `None` when the section has problems (reported).
pub(super) fn read(c: &mut Check, v: Option<&Value>) -> Option<LogSettings> {
    read_section(c, P, v, KEYS, |_| Ok::<(), PolicyErrors>(()))
}

pub(super) fn render(o: &mut Toml, s: &LogSettings) {
    render_section(o, P, KEYS, s);
}

#[cfg(test)]
mod tests {
    use crate::config::from_toml;
    use crate::settings::LogFormat;

    #[test]
    fn format_is_text_json_or_refused_by_key_path() {
        let text = from_toml("").expect("defaults");
        assert_eq!(text.log.format, LogFormat::Text);
        let json = from_toml("[log]\nformat = \"json\"\n").expect("json");
        assert_eq!(json.log.format, LogFormat::Json);
        assert!(json.render().contains("[log]\nformat = \"json\""));
        let e = from_toml("[log]\nformat = \"yaml\"\n").expect_err("yaml");
        assert!(e.names("log.format"), "{e}");
        let e = from_toml("[log]\nfromat = \"json\"\n").expect_err("typo");
        assert!(e.names("log.fromat"), "{e}");
    }
}
