//! The environment's share of the configuration: variables named by a prefix and a key path
//! (`APP_RATE_LIMIT__REDIS__URL` is `rate_limit.redis.url`), kept as the text they are. The
//! reference app's prefix is `APP_`; an embedding service chooses its own
//! ([`super::RateLimitSection::env_prefix`]).
//!
//! figment's own `Env` provider would parse values into TOML-like values, which turns `"5"`
//! into an unsigned number and an all-digit secret into a number without its leading zeros.
//! Here a value stays a string (the typed reads accept digit strings for whole numbers and
//! `true`/`false` for booleans), except for the two spellings TOML itself would use for a
//! string and a list: see [`value`].

use figment::value::{Dict, Value};

use super::reader::UNKNOWN_KEY;
use super::{ConfigErrors, Problem};

/// Prefix of the environment variables that override the reference app's file keys
/// (`APP_RATE_LIMIT__ENABLED`).
pub const ENV_PREFIX: &str = "APP_";
/// Separator of nested keys in environment variable names.
pub const ENV_SEPARATOR: &str = "__";

/// The tree the variables among `vars` that start with `prefix` describe; other variables are
/// ignored, and so is a variable whose name has an empty part (`APP_A____B`: [`unnamed`]
/// reports it). A variable that names an unknown key lands in the tree, where the reader
/// reports it and [`attribute`] names the variable.
pub(super) fn tree(vars: Vec<(String, String)>, prefix: &str) -> Dict {
    let mut root = Dict::new();
    for (name, text) in vars {
        let Some(rest) = strip_prefix_ignore_case(&name, prefix) else {
            continue;
        };
        let path = key_path(rest);
        if path.iter().any(String::is_empty) {
            continue;
        }
        insert(&mut root, &path, value(text));
    }
    root
}

/// A problem for each variable among `vars` starting with `prefix` whose name has an empty
/// part (`APP_A____B`, `APP_HTTP__`): it names no key, so it would set nothing.
pub(super) fn unnamed(vars: &[(String, String)], prefix: &str) -> Vec<Problem> {
    vars.iter()
        .filter_map(|(name, _)| {
            let rest = strip_prefix_ignore_case(name, prefix)?;
            let path = key_path(rest);
            path.iter().any(String::is_empty).then(|| Problem {
                path: path.join("."),
                problem: format!("{name} names no key: a part between {ENV_SEPARATOR:?} is empty"),
            })
        })
        .collect()
}

/// `problems` with each unknown key that a variable of `vars` starting with `prefix` set (at
/// or under it) naming that variable and its key path: `rate_limt: unknown key (...); set by
/// APP_RATE_LIMT__ENABLED (rate_limt.enabled)`.
pub(super) fn attribute(
    problems: Vec<Problem>,
    vars: &[(String, String)],
    prefix: &str,
) -> Vec<Problem> {
    let paths: Vec<(&str, String)> = vars
        .iter()
        .filter_map(|(name, _)| {
            let rest = strip_prefix_ignore_case(name, prefix)?;
            Some((name.as_str(), key_path(rest).join(".")))
        })
        .collect();
    problems
        .into_iter()
        .map(|mut p| {
            if p.problem.starts_with(UNKNOWN_KEY) {
                let under = format!("{}.", p.path);
                for (name, path) in &paths {
                    if *path == p.path || path.starts_with(&under) {
                        p.problem.push_str(&format!("; set by {name} ({path})"));
                    }
                }
            }
            p
        })
        .collect()
}

/// The process's variables starting with `prefix` whose key path `keep` accepts; one that is
/// not UTF-8 is a problem named by its key path.
pub(super) fn process_vars(
    prefix: &str,
    keep: impl Fn(&[String]) -> bool,
) -> Result<Vec<(String, String)>, ConfigErrors> {
    let mut vars = Vec::new();
    let mut problems = Vec::new();
    for (name, text) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = strip_prefix_ignore_case(name, prefix) else {
            continue;
        };
        let path = key_path(rest);
        if !keep(&path) {
            continue;
        }
        match text.into_string() {
            Ok(text) => vars.push((name.to_owned(), text)),
            Err(_) => problems.push(Problem {
                path: path.join("."),
                problem: format!("{name} is not valid UTF-8"),
            }),
        }
    }
    if problems.is_empty() {
        Ok(vars)
    } else {
        Err(ConfigErrors(problems))
    }
}

pub(super) fn strip_prefix_ignore_case<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    (name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &name[prefix.len()..])
}

/// The key path a variable names, from the part after the prefix
/// (`RATE_LIMIT__REDIS__URL` -> `rate_limit`, `redis`, `url`).
pub(super) fn key_path(rest: &str) -> Vec<String> {
    rest.split(ENV_SEPARATOR)
        .map(|s| s.to_ascii_lowercase())
        .collect()
}

/// One environment value: the text itself, except that a value in double quotes is the text
/// between them (`"50ms"`, as TOML writes a string) and a value in brackets is a TOML-like
/// array (`["redis://a:7000", "redis://b:7001"]`).
fn value(text: String) -> Value {
    let t = text.trim();
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        return Value::from(t[1..t.len() - 1].to_owned());
    }
    if t.starts_with('[')
        && t.ends_with(']')
        && let Ok(array @ Value::Array(..)) = t.parse::<Value>()
    {
        return array;
    }
    Value::from(text)
}

/// Puts `value` at `path`, making (or replacing a non-table with) tables on the way.
fn insert(dict: &mut Dict, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, d) = entry {
                insert(d, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn variables_nest_by_double_underscore_case_insensitively() {
        let t = tree(
            vars(&[
                ("APP_RATE_LIMIT__REDIS__URL", "redis://h"),
                ("app_http__bind", "1.2.3.4:5"),
                ("OTHER", "x"),
                ("APP_", "ignored: no key"),
                ("APP_A____B", "ignored: an empty part"),
            ]),
            ENV_PREFIX,
        );
        let rl = t
            .get("rate_limit")
            .and_then(Value::as_dict)
            .expect("rate_limit");
        let redis = rl.get("redis").and_then(Value::as_dict).expect("redis");
        assert_eq!(redis.get("url").and_then(Value::as_str), Some("redis://h"));
        let http = t.get("http").and_then(Value::as_dict).expect("http");
        assert_eq!(http.get("bind").and_then(Value::as_str), Some("1.2.3.4:5"));
        assert_eq!(t.len(), 2, "{t:?}");
    }

    #[test]
    fn values_stay_text_except_quoted_strings_and_bracketed_lists() {
        assert_eq!(value("007".into()).as_str(), Some("007"));
        assert_eq!(value("\"50ms\"".into()).as_str(), Some("50ms"));
        let list = value(r#"["a", "b"]"#.into());
        assert_eq!(list.as_array().map(|a| a.len()), Some(2));
        assert_eq!(value("[not toml".into()).as_str(), Some("[not toml"));
    }

    #[test]
    fn a_deeper_key_replaces_a_plain_value_on_its_way() {
        let t = tree(vars(&[("APP_A", "1"), ("APP_A__B", "2")]), ENV_PREFIX);
        let a = t.get("a").and_then(Value::as_dict).expect("a table");
        assert_eq!(a.get("b").and_then(Value::as_str), Some("2"));
    }
}
