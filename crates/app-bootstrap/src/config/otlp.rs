//! `[otlp]`: OpenTelemetry trace export over OTLP/gRPC. Absent (or without `endpoint`), the
//! app exports nothing and builds no exporter.

use figment::value::Value;

use super::reader::{Check, Key, Toml, key, read_section, render_section};
use crate::settings::OtlpSettings;

pub(super) const P: &str = "otlp";

/// Every key of `[otlp]`. Defaults: [`OtlpSettings::default`]; rules:
/// [`OtlpSettings::validate`].
const KEYS: &[Key<OtlpSettings>] = &[
    Key {
        name: "endpoint",
        read: |c, path, v, s| {
            if let Some(e) = c.string(path, Some(v)) {
                s.endpoint = Some(e);
            }
        },
        render: |s, o| match &s.endpoint {
            Some(e) => o.str("endpoint", e),
            None => o.line("# endpoint: absent, no trace export"),
        },
    },
    key!("service_name", service_name),
    key!("sample_ratio", sample_ratio),
];

/// `None` when the section has problems (reported).
pub(super) fn read(c: &mut Check, v: Option<&Value>) -> Option<OtlpSettings> {
    read_section(c, P, v, KEYS, OtlpSettings::validate)
}

pub(super) fn render(o: &mut Toml, s: &OtlpSettings) {
    render_section(o, P, KEYS, s);
}

#[cfg(test)]
mod tests {
    use crate::config::{Sources, from_toml, load};

    #[test]
    fn absent_section_exports_nothing_with_the_documented_defaults() {
        let s = from_toml("").expect("defaults");
        assert_eq!(s.otlp.endpoint, None);
        assert_eq!(s.otlp.service_name, "inbound-web");
        assert!((s.otlp.sample_ratio - 1.0).abs() < f64::EPSILON);
        assert!(
            s.render()
                .contains("[otlp]\n# endpoint: absent, no trace export\nservice_name = \"inbound-web\"\nsample_ratio = 1.0\n"),
            "{}",
            s.render()
        );
    }

    #[test]
    fn a_valid_section_is_read_and_rendered_back() {
        let s = from_toml(
            "[otlp]\nendpoint = \"http://collector:4317\"\nservice_name = \"edge\"\nsample_ratio = 0.25\n",
        )
        .expect("valid");
        assert_eq!(s.otlp.endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!(s.otlp.service_name, "edge");
        assert!((s.otlp.sample_ratio - 0.25).abs() < f64::EPSILON);
        let again = from_toml(&s.render()).expect("the rendering reads back");
        assert_eq!(again.otlp, s.otlp);
        // A whole number is a ratio too.
        let zero = from_toml("[otlp]\nsample_ratio = 0\n").expect("0");
        assert!(zero.otlp.sample_ratio.abs() < f64::EPSILON);
    }

    #[test]
    fn bad_values_are_refused_by_key_path() {
        for endpoint in [
            "grpc://127.0.0.1:4317",
            "https://collector:4317",
            "127.0.0.1:4317",
            "http://",
            "http://host:99999",
            "http://user:pw@host:4317",
            "http://ho st:4317",
        ] {
            let e = from_toml(&format!("[otlp]\nendpoint = \"{endpoint}\"\n")).expect_err(endpoint);
            assert!(e.names("otlp.endpoint"), "{endpoint}: {e}");
        }
        for ratio in ["1.5", "-0.1", "nan", "inf", "\"half\""] {
            let e = from_toml(&format!("[otlp]\nsample_ratio = {ratio}\n")).expect_err(ratio);
            assert!(e.names("otlp.sample_ratio"), "{ratio}: {e}");
        }
        let e = from_toml("[otlp]\nservice_name = \"\"\n").expect_err("empty name");
        assert!(e.names("otlp.service_name"), "{e}");
        let e = from_toml("[otlp]\nendpoint = 4317\n").expect_err("number");
        assert!(e.names("otlp.endpoint"), "{e}");
        let e = from_toml("[otlp]\nendpiont = \"http://a:4317\"\n").expect_err("typo");
        assert!(e.names("otlp.endpiont"), "{e}");
        // Every problem of the section in one pass.
        let e = from_toml("[otlp]\nendpoint = \"ftp://a\"\nsample_ratio = 2\n").expect_err("two");
        assert!(
            e.names("otlp.endpoint") && e.names("otlp.sample_ratio"),
            "{e}"
        );
    }

    #[test]
    fn the_environment_sets_the_ratio_as_text() {
        let sources = Sources {
            file: None,
            env: Some(vec![
                ("APP_OTLP__ENDPOINT".into(), "http://127.0.0.1:4317".into()),
                ("APP_OTLP__SAMPLE_RATIO".into(), "0.5".into()),
            ]),
        };
        let s = load(&sources).expect("valid");
        assert_eq!(s.otlp.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert!((s.otlp.sample_ratio - 0.5).abs() < f64::EPSILON);
        let bad = Sources {
            file: None,
            env: Some(vec![("APP_OTLP__SAMPLE_RATIO".into(), "lots".into())]),
        };
        let e = load(&bad).expect_err("not a number");
        assert!(e.names("otlp.sample_ratio"), "{e}");
    }
}
