//! Shadow mode on the real binary over the local provider: a policy or route in shadow mode
//! is evaluated and charged as usual, never denies (not on `/v1/evaluate`, not in the list
//! form, not through the middleware), its decisions say `"shadow":true` and `would_deny`, and
//! `/metrics` counts what it would have denied as `outcome="shadow_denied"`.

use crate::common;

use common::{App, sample};

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "enforced"

[rate_limit.policies.enforced]
algorithm = "fixed_window"
limit = 5
window = "1h"

[rate_limit.policies.trial]
algorithm = "fixed_window"
limit = 2
window = "1h"
shadow = true

[[routes]]
path_prefix = "/api"
policy = "trial"
subject = "header:x-user"

[[routes]]
path_prefix = "/tight"
policy = "enforced"
subject = "header:x-user"
shadow = true
"#;

#[tokio::test]
async fn shadow_limits_are_charged_never_deny_and_count_what_they_would_have_denied() {
    let app = App::start(CONFIG, &[]);
    let client = reqwest::Client::new();

    // The single form: 200 every time, the decision says what the limit would have done.
    for i in 0..4 {
        let (status, retry, v) =
            common::evaluate(&client, &app, r#"{"policy":"trial","subject":"s-1"}"#).await;
        assert_eq!(status, 200, "evaluation {i}: {v}");
        assert_eq!(retry, None);
        assert_eq!(v["allowed"], true);
        assert_eq!(v["shadow"], true);
        assert_eq!(v["would_deny"], i >= 2, "evaluation {i}: {v}");
        assert_eq!(v["remaining"], if i >= 1 { 0 } else { 1 }, "charged: {v}");
    }

    // The list form: the shadow entry does not veto the enforced one, which is charged.
    let list = r#"{"requests":[{"policy":"enforced","subject":"s-1"},{"policy":"trial","subject":"s-1"}]}"#;
    let (status, _, v) = common::evaluate(&client, &app, list).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["violated_policies"], serde_json::json!([]));
    assert_eq!(v["decisions"][0]["remaining"], 4, "{v}");
    assert!(v["decisions"][0].get("shadow").is_none(), "{v}");
    assert_eq!(v["decisions"][1]["shadow"], true);
    assert_eq!(v["decisions"][1]["would_deny"], true);

    // The middleware: a shadow policy's route and a shadow route over an enforcing policy
    // never answer 429; the headers show the limit.
    for i in 0..3 {
        let r = client
            .get(app.url("/api/x"))
            .header("x-user", "u-1")
            .send()
            .await
            .expect("GET /api/x");
        assert_eq!(r.status(), 200, "request {i}");
        let field = r.headers()["ratelimit"].to_str().expect("ascii").to_owned();
        assert!(field.starts_with("\"trial\";r="), "{field}");
    }
    for i in 0..7 {
        let r = client
            .get(app.url("/tight/x"))
            .header("x-user", "u-2")
            .send()
            .await
            .expect("GET /tight/x");
        assert_eq!(r.status(), 200, "request {i}: a shadow route never denies");
    }
    // The shadow route charged the enforcing policy: u-2 has nothing left on it.
    let (status, _, v) =
        common::evaluate(&client, &app, r#"{"policy":"enforced","subject":"u-2"}"#).await;
    assert_eq!(status, 429, "{v}");

    let text = common::metrics(&client, &app).await;
    let count = |policy: &str, outcome: &str| {
        sample(
            &text,
            &format!("rate_limit_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"}}"),
        )
    };
    // trial (2 per hour): evaluations 3 and 4, the list entry, and the third /api/x.
    assert_eq!(count("trial", "shadow_denied"), 4.0, "{text}");
    assert_eq!(count("trial", "allowed"), 4.0, "{text}");
    assert_eq!(count("trial", "denied"), 0.0, "{text}");
    // enforced: requests 6 and 7 of /tight/x, then the real denial.
    assert_eq!(count("enforced", "shadow_denied"), 2.0, "{text}");
    assert_eq!(count("enforced", "denied"), 1.0, "{text}");
}
