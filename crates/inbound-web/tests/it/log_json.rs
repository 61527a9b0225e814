//! `[log] format = "json"` on the real binary: every log line is one JSON object with the
//! level, the target and the message; the default stays text.

use crate::common;

use common::App;

async fn lines_after_start(config: &str) -> (App, Vec<String>) {
    let app = App::start(config, &[("RUST_LOG", "debug")]);
    // A request, so that the log holds more than the start-up lines.
    let _ = reqwest::get(app.url("/v1/evaluate")).await;
    let lines = app.log().lines().map(str::to_owned).collect();
    (app, lines)
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let (_app, lines) = lines_after_start("[log]\nformat = \"json\"\n").await;
    assert!(!lines.is_empty());
    let mut listening = false;
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["level"].is_string(), "{line}");
        assert!(v["target"].is_string(), "{line}");
        let message = v["fields"]["message"].as_str().unwrap_or_default();
        listening |= message.starts_with("listening on http://");
    }
    assert!(listening, "{lines:?}");
}

#[tokio::test]
async fn text_is_the_default_format() {
    let (_app, lines) = lines_after_start("").await;
    let listening = lines
        .iter()
        .find(|l| l.contains("listening on http://"))
        .expect("the start-up line");
    assert!(
        serde_json::from_str::<serde_json::Value>(listening).is_err(),
        "{listening}"
    );
    assert!(listening.contains("INFO"), "{listening}");
}
