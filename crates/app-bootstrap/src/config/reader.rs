//! The generic reader: typed reads of an untyped figment tree that collect every problem
//! (rather than stopping at the first), each named by its full key path.
//!
//! A read only reads: it checks that a value has the type its key needs (a table, a string, a
//! whole number that fits the field, a humantime duration) and converts it. What a value must
//! be beyond its type (a range, a relation to another field) is the settings owner's rule:
//! its own check returns field-named problems and [`Check::fields`] puts them under the
//! section's key path, so each rule lives in one place.
//!
//! A flat section is described once, as a list of [`Key`]s: each names a key, reads it into
//! the section's settings and renders its effective value for `--check`. The list is the
//! section's key list too ([`read_keys`] reports the keys it does not hold), so adding a key
//! is one line where the field's type says how it is read and shown ([`key!`], [`Scalar`]).

use std::fmt::{self, Write as _};
use std::time::Duration;

use figment::value::{Dict, Num, Value};
use shared_contract::PolicyErrors;

use super::Problem;
use crate::features::{Feature, unavailable};

/// How the problem of a key that is not known starts.
pub(crate) const UNKNOWN_KEY: &str = "unknown key";

/// Collects problems while the tree is read.
#[derive(Debug, Default)]
pub(crate) struct Check {
    problems: Vec<Problem>,
}

impl Check {
    pub(crate) fn push(&mut self, path: impl Into<String>, problem: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            problem: problem.into(),
        });
    }

    /// How many problems are reported so far: a section compares it before and after its
    /// reads to know whether it read cleanly.
    pub(crate) fn count(&self) -> usize {
        self.problems.len()
    }

    /// Whether a problem at exactly `path` was reported since `since` (a [`Self::count`]).
    #[cfg(feature = "redis")]
    pub(crate) fn reported(&self, since: usize, path: &str) -> bool {
        self.problems
            .get(since..)
            .is_some_and(|new| new.iter().any(|p| p.path == path))
    }

    pub(crate) fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    /// Puts a settings owner's field-named problems under `path` (`capacity` of the policy
    /// at `rate_limit.policies.api` is `rate_limit.policies.api.capacity`).
    pub(crate) fn fields<F: AsRef<str>>(
        &mut self,
        path: &str,
        problems: impl IntoIterator<Item = (F, String)>,
    ) {
        for (field, problem) in problems {
            self.push(join(path, field.as_ref()), problem);
        }
    }

    /// A settings owner's verdict: its value, or `None` with its problems put under `path`.
    pub(crate) fn owned<T>(&mut self, path: &str, checked: Result<T, PolicyErrors>) -> Option<T> {
        match checked {
            Ok(t) => Some(t),
            Err(errors) => {
                self.fields(path, errors.0.into_iter().map(|e| (e.field, e.problem)));
                None
            }
        }
    }

    /// Reports every key of `dict` that is not in `known` (a problem starting with
    /// [`UNKNOWN_KEY`]).
    pub(crate) fn unknown_keys<'k>(
        &mut self,
        path: &str,
        dict: &Dict,
        known: impl Iterator<Item = &'k str> + Clone,
    ) {
        for key in dict.keys() {
            if !known.clone().any(|k| k == key) {
                let known: Vec<&str> = known.clone().collect();
                self.push(
                    join(path, key),
                    format!("{UNKNOWN_KEY} (known here: {})", known.join(", ")),
                );
            }
        }
    }

    pub(crate) fn table<'d>(&mut self, path: &str, v: Option<&'d Value>) -> Option<&'d Dict> {
        match v? {
            Value::Dict(_, d) => Some(d),
            other => {
                self.push(path, format!("must be a table, got {}", show(other)));
                None
            }
        }
    }

    /// A section's table: `Some` empty table when the key is absent (its defaults apply),
    /// `None` when it is not a table (reported).
    pub(crate) fn section<'d>(&mut self, path: &str, v: Option<&'d Value>) -> Option<&'d Dict> {
        static EMPTY: Dict = Dict::new();
        match v {
            None => Some(&EMPTY),
            v => self.table(path, v),
        }
    }

    pub(crate) fn string(&mut self, path: &str, v: Option<&Value>) -> Option<String> {
        match v? {
            Value::String(_, s) => Some(s.clone()),
            other => {
                self.push(path, format!("must be a string, got {}", show(other)));
                None
            }
        }
    }

    /// A secret: like [`Self::string`], but the value is never shown.
    pub(crate) fn secret(&mut self, path: &str, v: Option<&Value>) -> Option<String> {
        match v? {
            Value::String(_, s) => Some(s.clone()),
            _ => {
                self.push(path, "must be a string (value not shown: it is a secret)");
                None
            }
        }
    }

    pub(crate) fn bool(&mut self, path: &str, v: Option<&Value>) -> Option<bool> {
        match v? {
            Value::Bool(_, b) => Some(*b),
            // From the environment.
            Value::String(_, t) if t.eq_ignore_ascii_case("true") => Some(true),
            Value::String(_, t) if t.eq_ignore_ascii_case("false") => Some(false),
            other => {
                self.push(path, format!("must be true or false, got {}", show(other)));
                None
            }
        }
    }

    /// A whole number that fits `T` (`u32`, `u64`, `usize`); a larger one is refused here,
    /// with `T`'s bound, since no field could hold it.
    pub(crate) fn whole<T: Whole>(&mut self, path: &str, v: Option<&Value>) -> Option<T> {
        self.whole_at_least(path, v, 0)
    }

    /// [`Self::whole`] for a key whose owner refuses values below `min` (a policy's counts,
    /// [`shared_contract::MIN_COUNT`]): a negative number is refused here with that bound,
    /// in the owner's words ("must be >= 1, got -3"), so that it reads as the owner's
    /// problem for 0 does. A number in `0..min` is left to the owner's check.
    pub(crate) fn whole_at_least<T: Whole>(
        &mut self,
        path: &str,
        v: Option<&Value>,
        min: u64,
    ) -> Option<T> {
        let n = self.u64(path, v, min)?;
        match T::try_from(n) {
            Ok(t) => Some(t),
            Err(_) => {
                self.push(path, format!("must be <= {}, got {n}", T::MAX));
                None
            }
        }
    }

    fn u64(&mut self, path: &str, v: Option<&Value>, min: u64) -> Option<u64> {
        match v? {
            // From the environment: digits only, as a TOML integer would be written.
            Value::String(_, t) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
                match t.parse::<u64>() {
                    Ok(u) => Some(u),
                    Err(_) => {
                        self.push(path, format!("must be <= {}, got {t}", u64::MAX));
                        None
                    }
                }
            }
            Value::Num(_, n) => match integer(n) {
                Some(i) if i < 0 => {
                    self.push(path, format!("must be >= {min}, got {i}"));
                    None
                }
                Some(i) => match u64::try_from(i) {
                    Ok(u) => Some(u),
                    Err(_) => {
                        self.push(path, format!("must be <= {}, got {i}", u64::MAX));
                        None
                    }
                },
                None => {
                    self.push(path, format!("must be a whole number, got {}", show_num(n)));
                    None
                }
            },
            other => {
                self.push(path, format!("must be a whole number, got {}", show(other)));
                None
            }
        }
    }

    /// A number, whole or not (`1`, `0.25`; from the environment, its decimal text); a
    /// NaN or infinity is refused here, since no rule could hold it.
    pub(crate) fn number(&mut self, path: &str, v: Option<&Value>) -> Option<f64> {
        let f = match v? {
            Value::Num(_, n) => match integer(n) {
                // A whole number this large loses digits as f64; no field wants one.
                Some(i) => i as f64,
                None => n.to_f64().unwrap_or(f64::NAN),
            },
            Value::String(_, t) => match t.trim().parse::<f64>() {
                Ok(f) => f,
                Err(_) => {
                    self.push(path, format!("must be a number, got {t:?}"));
                    return None;
                }
            },
            other => {
                self.push(path, format!("must be a number, got {}", show(other)));
                return None;
            }
        };
        if f.is_finite() {
            Some(f)
        } else {
            self.push(path, format!("must be a finite number, got {f}"));
            None
        }
    }

    /// A humantime duration string (`"50ms"`, `"1s"`, `"2m"`).
    pub(crate) fn duration(&mut self, path: &str, v: Option<&Value>) -> Option<Duration> {
        match v? {
            Value::String(_, s) => match humantime::parse_duration(s) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.push(
                        path,
                        format!("{s:?} is not a duration such as \"50ms\" or \"1s\" ({e})"),
                    );
                    None
                }
            },
            Value::Num(_, n) => {
                // An integer has no f64 reading here; it is finite.
                let what = if n.to_f64().is_none_or(f64::is_finite) {
                    "must be a duration string such as \"50ms\" or \"1s\" (a bare number has no unit)"
                } else {
                    "must be a finite duration string such as \"50ms\" or \"1s\""
                };
                self.push(path, format!("{what}, got {}", show_num(n)));
                None
            }
            other => {
                self.push(
                    path,
                    format!(
                        "must be a duration string such as \"50ms\", got {}",
                        show(other)
                    ),
                );
                None
            }
        }
    }

    /// A string parsed by `parse`, whose error is the problem (`"x" is not a valid header
    /// name`).
    pub(crate) fn parsed<T, E: std::fmt::Display>(
        &mut self,
        path: &str,
        v: Option<&Value>,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        let s = self.string(path, v)?;
        match parse(&s) {
            Ok(t) => Some(t),
            Err(e) => {
                self.push(path, e.to_string());
                None
            }
        }
    }

    /// A string of a fixed set of names, parsed by `parse`; `what` and `choices` make the
    /// message (`"ring" is not a topology; use "standalone", ...`).
    pub(crate) fn choice<T>(
        &mut self,
        path: &str,
        v: Option<&Value>,
        parse: impl FnOnce(&str) -> Option<T>,
        what: &str,
        choices: &str,
    ) -> Option<T> {
        self.parsed(path, v, |s| {
            parse(s).ok_or_else(|| format!("{s:?} is not {what}; use {choices}"))
        })
    }

    /// A required key: reports `problem` when `v` is absent.
    pub(crate) fn required<'v>(
        &mut self,
        path: &str,
        v: Option<&'v Value>,
        problem: &str,
    ) -> Option<&'v Value> {
        if v.is_none() {
            self.push(path, problem);
        }
        v
    }

    /// Refuses `what` at `path` when this build lacks `feature`; whether it holds it.
    pub(crate) fn needs(&mut self, path: &str, what: impl fmt::Display, feature: Feature) -> bool {
        if !feature.compiled() {
            self.push(path, unavailable(what, feature));
        }
        feature.compiled()
    }

    /// A section only `feature` reads, in a build without it: refused when present (its
    /// values cannot be checked, and nothing would use them).
    #[cfg(not(all(feature = "redis", feature = "local")))]
    pub(crate) fn unavailable_section(&mut self, path: &str, v: Option<&Value>, feature: Feature) {
        if v.is_some() {
            self.needs(path, "this section", feature);
        }
    }
}

/// An unsigned integer type a whole-number key may be read into.
pub(crate) trait Whole: TryFrom<u64> {
    const MAX: u64;
}

impl Whole for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl Whole for u64 {
    const MAX: u64 = u64::MAX;
}

impl Whole for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// A field type a [`Key`] reads by its type alone, and how `--check` shows its value.
pub(crate) trait Scalar: Sized {
    fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self>;
    /// The value as TOML.
    fn render(&self) -> String;
}

impl Scalar for bool {
    fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self> {
        c.bool(path, Some(v))
    }
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Scalar for String {
    fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self> {
        c.string(path, Some(v))
    }
    fn render(&self) -> String {
        toml_str(self)
    }
}

impl Scalar for f64 {
    fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self> {
        c.number(path, Some(v))
    }
    /// `{:?}` keeps the point (`1.0`), so the value reads back as a TOML float.
    fn render(&self) -> String {
        format!("{self:?}")
    }
}

impl Scalar for Duration {
    fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self> {
        c.duration(path, Some(v))
    }
    fn render(&self) -> String {
        toml_str(&humantime::format_duration(*self).to_string())
    }
}

macro_rules! whole_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            fn read(c: &mut Check, path: &str, v: &Value) -> Option<Self> {
                c.whole(path, Some(v))
            }
            fn render(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
whole_scalar!(u32, u64, usize);

/// One key of a flat section: its name, how its value is read into the section's settings
/// `D`, and how `--check` renders it from the built settings `S` (writing nothing hides it).
pub(crate) struct Key<D, S = D> {
    pub(crate) name: &'static str,
    pub(crate) read: fn(&mut Check, &str, &Value, &mut D),
    pub(crate) render: fn(&S, &mut Toml),
}

/// A [`Key`] for a field read and rendered by its type ([`Scalar`]):
/// `key!("cool_down", cool_down)`. With a second field path, the read goes to the first and
/// the rendering comes from the second (a section read into a draft).
macro_rules! key {
    ($name:literal, $($field:ident).+) => {
        key!($name, $($field).+ ; $($field).+)
    };
    ($name:literal, $($read:ident).+ ; $($shown:ident).+) => {
        $crate::config::reader::Key {
            name: $name,
            read: |c, path, v, s| {
                if let Some(x) = $crate::config::reader::Scalar::read(c, path, v) {
                    s.$($read).+ = x;
                }
            },
            render: |s, o| o.scalar($name, &s.$($shown).+),
        }
    };
}
pub(crate) use key;

/// An array of tables at `path` (`[[routes]]`, `[[rls.descriptors]]`), each read by `item`
/// at `path[i]`: an empty list when absent, `None` when it is not an array or any table had
/// problems (reported).
pub(crate) fn array_of_tables<T>(
    c: &mut Check,
    path: &str,
    v: Option<&Value>,
    mut item: impl FnMut(&mut Check, &str, &Dict) -> Option<T>,
) -> Option<Vec<T>> {
    let items = match v {
        None => return Some(Vec::new()),
        Some(Value::Array(_, items)) => items,
        Some(other) => {
            let got = show(other);
            c.push(
                path,
                format!("must be an array of tables ([[{path}]]), got {got}"),
            );
            return None;
        }
    };
    let before = c.count();
    let mut out = Vec::new();
    for (i, v) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if let Some(d) = c.table(&at, Some(v))
            && let Some(t) = item(c, &at, d)
        {
            out.push(t);
        }
    }
    (c.count() == before).then_some(out)
}

/// The names of `keys`, for [`Check::unknown_keys`].
pub(crate) fn names<D, S>(keys: &[Key<D, S>]) -> impl Iterator<Item = &'static str> + Clone {
    keys.iter().map(|k| k.name)
}

/// Reads every key of `keys` present in `dict` into `into`, in the list's order, after
/// reporting the keys of `dict` the list does not hold.
pub(crate) fn read_keys<D, S>(
    c: &mut Check,
    path: &str,
    dict: &Dict,
    keys: &[Key<D, S>],
    into: &mut D,
) {
    c.unknown_keys(path, dict, names(keys));
    read_present(c, path, dict, keys, into);
}

/// Reads every key of `keys` present in `dict` into `into`, in the list's order (for a
/// section that also holds tables, whose keys its caller checks). A key that cannot be read
/// is reported and leaves its field as it was (its default).
pub(crate) fn read_present<D, S>(
    c: &mut Check,
    path: &str,
    dict: &Dict,
    keys: &[Key<D, S>],
    into: &mut D,
) {
    for k in keys {
        if let Some(v) = dict.get(k.name) {
            (k.read)(c, &join(path, k.name), v, into);
        }
    }
}

/// A flat section at `path`: its keys read over `S::default()`, then the owner's `validate`.
/// `None` when it is not a table or anything in it was reported.
pub(crate) fn read_section<S: Default>(
    c: &mut Check,
    path: &str,
    v: Option<&Value>,
    keys: &[Key<S>],
    validate: impl FnOnce(&S) -> Result<(), PolicyErrors>,
) -> Option<S> {
    let d = c.section(path, v)?;
    let before = c.count();
    let mut s = S::default();
    read_keys(c, path, d, keys, &mut s);
    c.owned(path, validate(&s));
    (c.count() == before).then_some(s)
}

/// Renders every key of `keys` from `settings`, in the list's order.
pub(crate) fn render_keys<D, S>(o: &mut Toml, keys: &[Key<D, S>], settings: &S) {
    for k in keys {
        (k.render)(settings, o);
    }
}

/// `[path]` and its keys.
pub(crate) fn render_section<D, S>(o: &mut Toml, path: &str, keys: &[Key<D, S>], settings: &S) {
    o.table(path);
    render_keys(o, keys, settings);
}

/// The effective configuration as TOML text (`--check`).
#[derive(Debug, Default)]
pub(crate) struct Toml(String);

impl Toml {
    /// `[name]`, after a blank line unless it is the first line.
    pub(crate) fn table(&mut self, name: impl std::fmt::Display) {
        self.open(format_args!("[{name}]"));
    }

    /// `[[name]]`, after a blank line unless it is the first line.
    pub(crate) fn array_table(&mut self, name: &str) {
        self.open(format_args!("[[{name}]]"));
    }

    fn open(&mut self, header: std::fmt::Arguments<'_>) {
        if !self.0.is_empty() {
            self.0.push('\n');
        }
        let _ = writeln!(self.0, "{header}");
    }

    /// `key = value`, the value already TOML.
    pub(crate) fn raw(&mut self, key: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.0, "{key} = {value}");
    }

    pub(crate) fn scalar(&mut self, key: &str, value: &impl Scalar) {
        self.raw(key, value.render());
    }

    pub(crate) fn str(&mut self, key: &str, value: &str) {
        self.raw(key, toml_str(value));
    }

    /// A duration given in milliseconds (how validated settings hold them).
    pub(crate) fn ms(&mut self, key: &str, ms: u64) {
        self.scalar(key, &Duration::from_millis(ms));
    }

    /// A line as it is (a comment, or a key with a comment after it).
    pub(crate) fn line(&mut self, text: impl std::fmt::Display) {
        let _ = writeln!(self.0, "{text}");
    }

    /// The text, ending in a blank line as each table does.
    pub(crate) fn finish(mut self) -> String {
        if !self.0.is_empty() {
            self.0.push('\n');
        }
        self.0
    }
}

/// `s` as a TOML string.
pub(crate) fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// `path.key`, or `key` at the top.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A whole number of any width and sign; `None` for a float.
fn integer(n: &Num) -> Option<i128> {
    n.to_i128()
        .or_else(|| n.to_u128().and_then(|u| i128::try_from(u).ok()))
}

fn show_num(n: &Num) -> String {
    show(&Value::Num(Default::default(), *n))
}

/// A short rendering of a value for an error message.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(_, s) => format!("{:?}", s.chars().take(80).collect::<String>()),
        Value::Char(_, c) => format!("{c:?}"),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => match n.to_f64() {
            Some(f) if f.is_nan() => "nan".into(),
            Some(f) if f.is_infinite() => {
                if f > 0.0 {
                    "inf".into()
                } else {
                    "-inf".into()
                }
            }
            _ => match integer(n) {
                Some(i) => i.to_string(),
                None => n.to_f64().map(|f| f.to_string()).unwrap_or_default(),
            },
        },
        Value::Empty(..) => "nothing".into(),
        Value::Dict(..) => "a table".into(),
        Value::Array(..) => "an array".into(),
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
