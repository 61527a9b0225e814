//! Builds without a provider feature: configuration that needs the missing provider is
//! refused with its key path and the feature's name; what the build holds still works.
//! These run only in non-default builds (`cargo test -p app-bootstrap --no-default-features
//! --features local --lib`, and `--features redis`), as CI does.

use super::{ConfigErrors, Problem, from_toml};

fn errors(toml: &str) -> ConfigErrors {
    match from_toml(toml) {
        Ok(_) => panic!("accepted a configuration this build cannot serve:\n{toml}"),
        Err(e) => e,
    }
}

/// Asserts that `e` holds exactly this problem at `path`.
fn assert_problem(e: &ConfigErrors, path: &str, problem: &str) {
    let expected = Problem {
        path: path.into(),
        problem: problem.into(),
    };
    assert!(e.0.contains(&expected), "{expected} not in:\n{e}");
}

const POLICY: &str =
    "[rate_limit.policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n";

#[cfg(not(feature = "redis"))]
mod without_redis {
    use super::*;

    const REDIS: &str = "app-bootstrap was built without its `redis` feature";

    fn redis_file() -> String {
        format!(
            "[rate_limit]\nenabled = true\nprovider = \"redis\"\ndefault_policy = \"api\"\n\
             subject_secret = \"0123456789abcdef0123456789abcdef\"\n\
             [rate_limit.redis]\nrole = \"coordination\"\nurl = \"redis://127.0.0.1:6379/0\"\n\
             [rate_limit.circuit_breaker]\nfailure_threshold = 3\n{POLICY}"
        )
    }

    #[test]
    fn the_redis_provider_and_its_tables_are_refused_naming_the_feature() {
        let e = errors(&redis_file());
        assert_problem(
            &e,
            "rate_limit.provider",
            &format!("\"redis\" is not available: {REDIS}"),
        );
        assert_problem(
            &e,
            "rate_limit.redis",
            &format!("this section is not available: {REDIS}"),
        );
        assert_problem(
            &e,
            "rate_limit.circuit_breaker",
            &format!("this section is not available: {REDIS}"),
        );
        // Nothing else: the provider's own keys are not checked (nor reported) without it.
        assert_eq!(e.0.len(), 3, "{e}");
    }

    #[test]
    fn a_disabled_section_naming_redis_is_refused_too() {
        let e = errors("[rate_limit]\nenabled = false\nprovider = \"redis\"\n");
        assert_problem(
            &e,
            "rate_limit.provider",
            &format!("\"redis\" is not available: {REDIS}"),
        );
    }

    #[test]
    fn gates_behind_a_missing_redis_provider_add_no_second_problem() {
        let file = format!(
            "{}[event_gates.orders]\nmode = \"only_once\"\nduration = \"3s\"\n",
            redis_file()
        );
        let e = errors(&file);
        assert!(
            !e.0.iter().any(|p| p.path.starts_with("event_gates")),
            "{e}"
        );
    }

    #[cfg(feature = "local")]
    #[test]
    fn the_local_provider_its_fallback_and_local_gates_still_work() {
        let file = format!(
            "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n\
             failure_policy = \"fallback_local\"\n[rate_limit.local]\nmax_keys = 10\n{POLICY}\
             [event_gates.orders]\nmode = \"only_once\"\nduration = \"3s\"\n"
        );
        let s = from_toml(&file).unwrap_or_else(|e| panic!("{e}"));
        let crate::settings::RateLimitSettings::Enabled(e) = &s.rate_limit else {
            panic!("enabled");
        };
        assert_eq!(e.provider.name(), "local");
        assert_eq!(e.local.max_keys, 10);
        assert_eq!(s.event_gates.iter().count(), 1);
    }
}

#[cfg(not(feature = "local"))]
mod without_local {
    use std::time::Duration;

    use shared_contract::gate::{GateId, GateMode, GateSet, GateSettings, GateSpec};

    use super::*;

    const LOCAL: &str = "app-bootstrap was built without its `local` feature";

    #[test]
    fn the_local_provider_and_its_table_are_refused_naming_the_feature() {
        let e = errors(&format!(
            "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n\
             [rate_limit.local]\nmax_keys = 10\n{POLICY}"
        ));
        assert_problem(
            &e,
            "rate_limit.provider",
            &format!("\"local\" is not available: {LOCAL}"),
        );
        assert_problem(
            &e,
            "rate_limit.local",
            &format!("this section is not available: {LOCAL}"),
        );
        assert_eq!(e.0.len(), 2, "{e}");
    }

    #[test]
    fn fallback_local_is_refused_globally_and_per_policy() {
        let e = errors(&format!(
            "[rate_limit]\nfailure_policy = \"fallback_local\"\n{POLICY}\
             failure_policy = \"fallback_local\"\n"
        ));
        let problem = format!("\"fallback_local\" is not available: {LOCAL}");
        assert_problem(&e, "rate_limit.failure_policy", &problem);
        assert_problem(&e, "rate_limit.policies.api.failure_policy", &problem);
    }

    #[test]
    fn local_event_gates_are_refused_each_by_its_key_path() {
        // Rate limiting disabled: the gates would be local.
        let e = errors(
            "[event_gates.orders]\nmode = \"only_once\"\nduration = \"3s\"\n\
             [event_gates.mails]\nmode = \"strictly_once\"\nduration = \"1s\"\n",
        );
        let problem = format!(
            "the local gate provider (gates are local unless rate limiting is enabled with \
             provider = \"redis\") is not available: {LOCAL}"
        );
        assert_problem(&e, "event_gates.orders", &problem);
        assert_problem(&e, "event_gates.mails", &problem);
        assert_eq!(e.0.len(), 2, "{e}");
    }

    #[tokio::test]
    async fn hand_built_local_gates_are_refused_at_build_time() {
        let mut s = from_toml("").unwrap_or_else(|e| panic!("{e}"));
        let spec = GateSpec::new(
            GateId::new("orders").expect("id"),
            GateMode::OnlyOnce,
            Duration::from_secs(3),
        );
        let gate = GateSettings::new(spec).expect("valid gate");
        s.event_gates = GateSet::new([gate]).expect("valid set");
        let err = crate::gates::build_gates(&s)
            .await
            .expect_err("no local provider in this build");
        assert_eq!(
            err.to_string(),
            format!("the local gate provider is not available: {LOCAL}")
        );
    }

    #[cfg(feature = "redis")]
    mod with_redis {
        use shared_contract::{FailurePolicy, PolicyId, PolicySet, RateLimitPolicy};

        use super::*;
        use crate::settings::RateLimitSettings;

        /// A valid redis configuration; nothing connects (validation only, or a build
        /// refused before connecting).
        fn redis_file(extra: &str) -> String {
            format!(
                "[rate_limit]\nenabled = true\nprovider = \"redis\"\ndefault_policy = \"api\"\n\
                 subject_secret = \"0123456789abcdef0123456789abcdef\"\n\
                 [rate_limit.redis]\nrole = \"coordination\"\nurl = \"redis://127.0.0.1:1/0\"\n\
                 {POLICY}{extra}"
            )
        }

        #[test]
        fn the_redis_provider_and_its_gates_still_work() {
            let file =
                redis_file("[event_gates.orders]\nmode = \"only_once\"\nduration = \"3s\"\n");
            let s = from_toml(&file).unwrap_or_else(|e| panic!("{e}"));
            let RateLimitSettings::Enabled(e) = &s.rate_limit else {
                panic!("enabled");
            };
            assert_eq!(e.provider.name(), "redis");
            assert!(e.breaker.enabled, "the breaker guards the redis provider");
            assert_eq!(s.event_gates.iter().count(), 1);
        }

        #[tokio::test]
        async fn hand_built_fallback_local_is_refused_before_connecting() {
            let s = from_toml(&redis_file("")).unwrap_or_else(|e| panic!("{e}"));
            let RateLimitSettings::Enabled(mut e) = s.rate_limit else {
                panic!("enabled");
            };
            let id = PolicyId::new("api").expect("id");
            let policy = RateLimitPolicy::fixed_window("api", 5)
                .failure_policy(FailurePolicy::FallbackLocal)
                .build()
                .expect("valid policy");
            e.policies = PolicySet::new([policy], id).expect("valid set");
            let err = crate::compose::build(&RateLimitSettings::Enabled(e))
                .await
                .expect_err("no fallback in this build");
            assert_eq!(
                err.to_string(),
                format!("failure_policy \"fallback_local\" is not available: {LOCAL}")
            );
        }
    }
}
