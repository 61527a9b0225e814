//! Unit tests of the generic reader: each typed read on a good value, a value of the wrong
//! type and one out of range, every problem named by the key path it was given.

use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml as TomlText};
use figment::value::{Dict, Value};
use shared_contract::{PolicyError, PolicyErrors};

use super::*;

/// The value TOML gives `text` (`"50ms"`, `3`, `inf`, `[1, 2]`, `{ a = 1 }`).
fn toml(text: &str) -> Value {
    let d: Dict = Figment::from(TomlText::string(&format!("v = {text}")))
        .extract()
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    d.get("v").cloned().expect("v")
}

/// A value as the environment gives it: always text.
fn env(text: &str) -> Value {
    Value::from(text.to_owned())
}

/// Runs one read and returns its value and the problems as `path: problem` lines.
fn run<T>(read: impl FnOnce(&mut Check) -> Option<T>) -> (Option<T>, Vec<String>) {
    let mut c = Check::default();
    let out = read(&mut c);
    let lines = c.into_problems().iter().map(ToString::to_string).collect();
    (out, lines)
}

/// The one problem of a read that must fail.
fn refused<T: std::fmt::Debug>(read: impl FnOnce(&mut Check) -> Option<T>) -> String {
    match run(read) {
        (None, p) if p.len() == 1 => p[0].clone(),
        other => panic!("expected one problem and no value, got {other:?}"),
    }
}

#[test]
fn an_absent_key_reads_as_nothing_and_reports_nothing() {
    assert_eq!(run(|c| c.string("a.b", None)), (None, vec![]));
    assert_eq!(run(|c| c.whole::<u64>("a.b", None)), (None, vec![]));
    assert_eq!(run(|c| c.duration("a.b", None)), (None, vec![]));
    assert_eq!(run(|c| c.bool("a.b", None)), (None, vec![]));
}

#[test]
fn string_reads_strings_and_names_the_wrong_type() {
    let v = toml("\"x\"");
    assert_eq!(
        run(|c| c.string("s.k", Some(&v))),
        (Some("x".into()), vec![])
    );
    let v = toml("5");
    assert_eq!(
        refused(|c| c.string("s.k", Some(&v))),
        "s.k: must be a string, got 5"
    );
    let v = toml("[1]");
    assert_eq!(
        refused(|c| c.string("s.k", Some(&v))),
        "s.k: must be a string, got an array"
    );
}

#[test]
fn a_secret_of_the_wrong_type_is_not_shown() {
    let v = toml("\"hunter2-hunter2\"");
    assert_eq!(
        run(|c| c.secret("r.pw", Some(&v))).0.as_deref(),
        Some("hunter2-hunter2")
    );
    let v = toml("1234567890");
    let p = refused(|c| c.secret("r.pw", Some(&v)));
    assert!(p.starts_with("r.pw: must be a string"), "{p}");
    assert!(!p.contains("1234567890"), "{p}");
}

#[test]
fn bool_reads_toml_booleans_and_environment_text() {
    let v = toml("true");
    assert_eq!(run(|c| c.bool("b", Some(&v))), (Some(true), vec![]));
    assert_eq!(
        run(|c| c.bool("b", Some(&env("FALSE")))),
        (Some(false), vec![])
    );
    assert_eq!(
        refused(|c| c.bool("x.enabled", Some(&env("maybe")))),
        "x.enabled: must be true or false, got \"maybe\""
    );
    let v = toml("1");
    assert_eq!(
        refused(|c| c.bool("x.enabled", Some(&v))),
        "x.enabled: must be true or false, got 1"
    );
}

#[test]
fn whole_reads_numbers_and_digit_text_within_the_field_type() {
    let v = toml("7");
    assert_eq!(run(|c| c.whole::<u32>("n", Some(&v))), (Some(7), vec![]));
    assert_eq!(
        run(|c| c.whole::<usize>("n", Some(&env("0042")))),
        (Some(42), vec![])
    );
    let v = toml("-1");
    assert_eq!(
        refused(|c| c.whole::<u64>("s.n", Some(&v))),
        "s.n: must be >= 0, got -1"
    );
    let v = toml("1.5");
    assert_eq!(
        refused(|c| c.whole::<u64>("s.n", Some(&v))),
        "s.n: must be a whole number, got 1.5"
    );
    let v = toml("4294967296");
    assert_eq!(
        refused(|c| c.whole::<u32>("s.n", Some(&v))),
        "s.n: must be <= 4294967295, got 4294967296"
    );
    assert_eq!(
        refused(|c| c.whole::<u64>("s.n", Some(&env("18446744073709551616")))),
        "s.n: must be <= 18446744073709551615, got 18446744073709551616"
    );
    // Text that is not all digits is not a number, even with a sign.
    assert_eq!(
        refused(|c| c.whole::<u64>("s.n", Some(&env("+5")))),
        "s.n: must be a whole number, got \"+5\""
    );
    let v = toml("true");
    assert_eq!(
        refused(|c| c.whole::<u64>("s.n", Some(&v))),
        "s.n: must be a whole number, got true"
    );
}

#[test]
fn duration_reads_humantime_text_and_refuses_bare_and_infinite_numbers() {
    let v = toml("\"1m 30s\"");
    assert_eq!(
        run(|c| c.duration("d", Some(&v))),
        (Some(Duration::from_secs(90)), vec![])
    );
    let v = toml("50");
    let p = refused(|c| c.duration("s.t", Some(&v)));
    assert!(
        p.starts_with("s.t: must be a duration string") && p.contains("no unit"),
        "{p}"
    );
    for text in ["inf", "nan"] {
        let v = toml(text);
        let p = refused(|c| c.duration("s.t", Some(&v)));
        assert!(p.starts_with("s.t: must be a finite duration"), "{p}");
        assert!(p.ends_with(&format!("got {text}")), "{p}");
    }
    let v = toml("\"forever\"");
    let p = refused(|c| c.duration("s.t", Some(&v)));
    assert!(p.starts_with("s.t: \"forever\" is not a duration"), "{p}");
    let v = toml("false");
    assert_eq!(
        refused(|c| c.duration("s.t", Some(&v))),
        "s.t: must be a duration string such as \"50ms\", got false"
    );
}

#[test]
fn choice_parses_a_name_and_lists_the_choices_otherwise() {
    let parse = |s: &str| (s == "a").then_some(1);
    let v = toml("\"a\"");
    assert_eq!(
        run(|c| c.choice("k", Some(&v), parse, "a letter", "\"a\"")),
        (Some(1), vec![])
    );
    let v = toml("\"b\"");
    assert_eq!(
        refused(|c| c.choice("s.k", Some(&v), parse, "a letter", "\"a\"")),
        "s.k: \"b\" is not a letter; use \"a\""
    );
    let v = toml("3");
    assert_eq!(
        refused(|c| c.choice("s.k", Some(&v), parse, "a letter", "\"a\"")),
        "s.k: must be a string, got 3"
    );
}

#[test]
fn parsed_reports_the_parsers_own_problem() {
    let parse = |s: &str| s.parse::<u8>().map_err(|_| format!("{s:?} is not a byte"));
    let v = toml("\"7\"");
    assert_eq!(run(|c| c.parsed("k", Some(&v), parse)), (Some(7), vec![]));
    let v = toml("\"300\"");
    assert_eq!(
        refused(|c| c.parsed("s.k", Some(&v), parse)),
        "s.k: \"300\" is not a byte"
    );
    let v = toml("7");
    assert_eq!(
        refused(|c| c.parsed("s.k", Some(&v), parse)),
        "s.k: must be a string, got 7"
    );
}

#[test]
fn required_reports_only_an_absent_key() {
    let v = toml("1");
    assert_eq!(
        run(|c| c.required("s.k", Some(&v), "required").cloned()).1,
        Vec::<String>::new()
    );
    assert_eq!(
        refused(|c| c.required("s.k", None, "required here").cloned()),
        "s.k: required here"
    );
}

#[test]
fn tables_and_sections() {
    let v = toml("{ a = 1 }");
    assert_eq!(
        run(|c| c.table("t", Some(&v)).map(Dict::len)),
        (Some(1), vec![])
    );
    let v = toml("3");
    assert_eq!(
        refused(|c| c.table("t", Some(&v)).map(Dict::len)),
        "t: must be a table, got 3"
    );
    // An absent section is an empty table (its defaults), not an error.
    assert_eq!(
        run(|c| c.section("t", None).map(Dict::len)),
        (Some(0), vec![])
    );
    assert_eq!(
        refused(|c| c.section("t", Some(&v)).map(Dict::len)),
        "t: must be a table, got 3"
    );
}

#[test]
fn unknown_keys_are_named_with_the_known_ones() {
    let Value::Dict(_, d) = toml("{ good = 1, typo = 2 }") else {
        panic!("a table");
    };
    let (_, p) = run(|c| {
        c.unknown_keys("s", &d, ["good", "other"].into_iter());
        Some(())
    });
    assert_eq!(
        p,
        vec!["s.typo: unknown key (known here: good, other)".to_owned()]
    );
}

#[test]
fn an_owners_field_problems_are_put_under_the_section_path() {
    let refused: Result<(), PolicyErrors> = Err(PolicyErrors(vec![
        PolicyError {
            field: "capacity",
            problem: "must be > 0".into(),
        },
        PolicyError {
            field: "window",
            problem: "too long".into(),
        },
    ]));
    let (out, p) = run(|c| c.owned("rate_limit.policies.api", refused));
    assert_eq!(out, None);
    assert_eq!(
        p,
        vec![
            "rate_limit.policies.api.capacity: must be > 0".to_owned(),
            "rate_limit.policies.api.window: too long".to_owned(),
        ]
    );
    assert_eq!(
        run(|c| c.owned("x", Ok::<_, PolicyErrors>(3))),
        (Some(3), vec![])
    );
}

/// A section for the [`Key`] tests.
#[derive(Debug, Default, PartialEq)]
struct Demo {
    on: bool,
    n: u32,
    wait: Duration,
    name: String,
}

const DEMO: &[Key<Demo>] = &[
    key!("on", on),
    key!("n", n),
    key!("wait", wait),
    key!("name", name),
];

fn demo(text: &str) -> (Option<Demo>, Vec<String>) {
    let v = toml(text);
    run(|c| {
        read_section(c, "demo", Some(&v), DEMO, |d: &Demo| {
            if d.n == 13 {
                Err(PolicyErrors(vec![PolicyError {
                    field: "n",
                    problem: "unlucky".into(),
                }]))
            } else {
                Ok(())
            }
        })
    })
}

#[test]
fn a_section_is_read_by_its_keys_over_the_defaults() {
    let (s, p) = demo("{ on = true, wait = \"2s\" }");
    assert_eq!(p, Vec::<String>::new());
    let s = s.expect("read");
    assert_eq!(
        s,
        Demo {
            on: true,
            wait: Duration::from_secs(2),
            ..Demo::default()
        }
    );
    let mut o = Toml::default();
    render_section(&mut o, "demo", DEMO, &s);
    assert_eq!(
        o.finish(),
        "[demo]\non = true\nn = 0\nwait = \"2s\"\nname = \"\"\n\n"
    );
}

#[test]
fn every_problem_of_a_section_is_named_and_it_reads_as_nothing() {
    let (s, p) = demo("{ on = 1, n = 4294967296, wait = 5, nmae = \"x\" }");
    assert_eq!(s, None);
    assert_eq!(
        p,
        vec![
            "demo.nmae: unknown key (known here: on, n, wait, name)".to_owned(),
            "demo.on: must be true or false, got 1".to_owned(),
            "demo.n: must be <= 4294967295, got 4294967296".to_owned(),
            "demo.wait: must be a duration string such as \"50ms\" or \"1s\" (a bare number has no unit), got 5"
                .to_owned(),
        ]
    );
    // The owner's check runs on what could be read.
    assert_eq!(demo("{ n = 13 }").1, vec!["demo.n: unlucky".to_owned()]);
}

#[test]
fn toml_output_separates_tables_by_one_blank_line() {
    let mut o = Toml::default();
    o.table("a");
    o.str("s", "q\"uote");
    o.table("b");
    o.ms("t", 1500);
    o.array_table("c");
    o.line("# note");
    assert_eq!(
        o.finish(),
        "[a]\ns = 'q\"uote'\n\n[b]\nt = \"1s 500ms\"\n\n[[c]]\n# note\n\n"
    );
}

#[test]
fn shown_values_are_short() {
    let long = "x".repeat(200);
    assert_eq!(
        show(&Value::from(long)).len(),
        82,
        "80 characters and the quotes"
    );
    assert_eq!(show(&toml("-inf")), "-inf");
    assert_eq!(show(&toml("{ a = 1 }")), "a table");
    assert_eq!(join("", "http"), "http");
    assert_eq!(join("http", "bind"), "http.bind");
}
