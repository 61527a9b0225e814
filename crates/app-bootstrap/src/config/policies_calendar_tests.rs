//! Calendar windows in the configuration: `window = "calendar:<unit>"` with an optional
//! `time_zone`, each mistake named by its key, and the view showing what is in force.

use shared_contract::policy::calendar::CalendarUnit;
use shared_contract::{Algorithm, PolicyId};

use crate::config::from_toml;
use crate::settings::RateLimitSettings;

fn file(policy: &str) -> String {
    format!(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"a\"\n\
         [rate_limit.policies.a]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n\
         [rate_limit.policies.q]\n{policy}"
    )
}

#[test]
fn a_calendar_window_reads_its_unit_and_zone() {
    let s = from_toml(&file(
        "algorithm = \"fixed_window\"\nlimit = 1000000\nwindow = \"calendar:month\"\n\
         time_zone = \"Europe/Berlin\"\n",
    ))
    .expect("valid");
    let RateLimitSettings::Enabled(e) = &s.rate_limit else {
        panic!("enabled");
    };
    let q = e.policies.get(&PolicyId::new("q").expect("id")).expect("q");
    let Algorithm::FixedWindow(w) = q.algorithm() else {
        panic!("a fixed window");
    };
    let calendar = w.calendar().expect("a calendar window");
    assert_eq!(
        (calendar.unit(), calendar.time_zone()),
        (CalendarUnit::Month, "Europe/Berlin")
    );
    let view = s.render();
    assert!(view.contains("window = \"calendar:month\""), "{view}");
    assert!(view.contains("time_zone = \"Europe/Berlin\""), "{view}");
    // UTC unless said otherwise.
    let s = from_toml(&file(
        "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"calendar:day\"\n",
    ))
    .expect("valid");
    assert!(s.render().contains("time_zone = \"UTC\""));
}

#[test]
fn calendar_mistakes_are_named_by_their_keys() {
    let cases = [
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"calendar:fortnight\"\n",
            "rate_limit.policies.q.window",
            "calendar:fortnight is not a calendar period",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"calendar:day\"\ntime_zone = \"Mars/Olympus\"\n",
            "rate_limit.policies.q.time_zone",
            "not UTC or an IANA time zone name",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\ntime_zone = \"UTC\"\n",
            "rate_limit.policies.q.time_zone",
            "applies to calendar windows only",
        ),
        (
            "algorithm = \"sliding_window\"\nlimit = 10\nwindow = \"1h\"\ntime_zone = \"UTC\"\n",
            "rate_limit.policies.q.time_zone",
            "is not a parameter of algorithm sliding_window",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"calendar:day\"\ntime_zone = 3\n",
            "rate_limit.policies.q.time_zone",
            "must be a string",
        ),
    ];
    for (policy, key, says) in cases {
        let e = from_toml(&file(policy)).expect_err(policy);
        assert!(e.names(key), "{policy}: {e}");
        assert!(e.to_string().contains(says), "{policy}: {e}");
    }
}
