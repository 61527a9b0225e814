//! A small JSON Schema validator for the subset `openapi.json` uses, so the test needs no
//! validator crate (and its build) on a shared machine.
//!
//! It refuses any keyword it does not know rather than ignoring it: a schema that says more
//! than the validator checks fails the test instead of passing unchecked. `pattern` is the one
//! assertion not evaluated (no regex engine here): the patterns in the document are on ids the
//! server itself writes.

use serde_json::Value;

/// Keywords that annotate and assert nothing.
const ANNOTATIONS: [&str; 5] = ["description", "title", "examples", "default", "pattern"];

/// Validates `value` against `schema`, resolving `#/...` references in `root`; returns each
/// failure as `path: why`.
pub fn validate(root: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(root, schema, value, "$", &mut errors);
    errors
}

/// The schema `#/a/b` of `root` points at.
pub fn resolve<'a>(root: &'a Value, reference: &str) -> &'a Value {
    let pointer = reference
        .strip_prefix('#')
        .unwrap_or_else(|| panic!("only local references are supported: {reference}"));
    root.pointer(pointer)
        .unwrap_or_else(|| panic!("unresolved reference {reference}"))
}

fn type_matches(name: &str, v: &Value) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("unknown type {other:?}"),
    }
}

fn check(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(schema) = schema.as_object() else {
        match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => return errors.push(format!("{at}: no value is allowed")),
            other => panic!("a schema must be an object or a boolean: {other}"),
        }
    };
    for (keyword, arg) in schema {
        let k = keyword.as_str();
        match k {
            _ if ANNOTATIONS.contains(&k) => {}
            "$ref" => check(
                root,
                resolve(root, arg.as_str().expect("a string")),
                v,
                at,
                errors,
            ),
            "type" => {
                let names: Vec<&str> = match arg {
                    Value::String(s) => vec![s.as_str()],
                    Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                    other => panic!("bad type {other}"),
                };
                if !names.iter().any(|n| type_matches(n, v)) {
                    errors.push(format!("{at}: {v} is not of type {names:?}"));
                }
            }
            "const" if v != arg => errors.push(format!("{at}: {v} is not {arg}")),
            "const" => {}
            "enum" => {
                let options = arg.as_array().expect("an array");
                if !options.contains(v) {
                    errors.push(format!("{at}: {v} is not one of {arg}"));
                }
            }
            "properties" | "required" | "additionalProperties" => {
                if let Some(o) = v.as_object() {
                    object(root, schema, k, arg, o, at, errors);
                }
            }
            "items" => {
                for (i, item) in v.as_array().into_iter().flatten().enumerate() {
                    check(root, arg, item, &format!("{at}[{i}]"), errors);
                }
            }
            "minItems" | "maxItems" => {
                if let Some(a) = v.as_array() {
                    bound(k, arg, a.len() as f64, at, errors);
                }
            }
            "minLength" | "maxLength" => {
                if let Some(s) = v.as_str() {
                    bound(k, arg, s.chars().count() as f64, at, errors);
                }
            }
            "minimum" | "maximum" => {
                if let Some(n) = v.as_f64() {
                    bound(k, arg, n, at, errors);
                }
            }
            "oneOf" | "anyOf" | "allOf" => {
                let branches = arg.as_array().expect("an array");
                let failures: Vec<Vec<String>> = branches
                    .iter()
                    .map(|b| validate_at(root, b, v, at))
                    .collect();
                let passed = failures.iter().filter(|f| f.is_empty()).count();
                let ok = match k {
                    "oneOf" => passed == 1,
                    "anyOf" => passed >= 1,
                    _ => passed == branches.len(),
                };
                if !ok {
                    errors.push(format!(
                        "{at}: {k} matched {passed} of {} branches: {failures:?}",
                        branches.len()
                    ));
                }
            }
            other => panic!("the validator does not know the keyword {other:?} (at {at})"),
        }
    }
}

fn validate_at(root: &Value, schema: &Value, v: &Value, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    check(root, schema, v, at, &mut errors);
    errors
}

fn object(
    root: &Value,
    schema: &serde_json::Map<String, Value>,
    keyword: &str,
    arg: &Value,
    o: &serde_json::Map<String, Value>,
    at: &str,
    errors: &mut Vec<String>,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    match keyword {
        "properties" => {
            for (name, sub) in arg.as_object().expect("an object") {
                if let Some(member) = o.get(name) {
                    check(root, sub, member, &format!("{at}.{name}"), errors);
                }
            }
        }
        "required" => {
            for name in arg
                .as_array()
                .expect("an array")
                .iter()
                .filter_map(Value::as_str)
            {
                if !o.contains_key(name) {
                    errors.push(format!("{at}: required member {name:?} is missing"));
                }
            }
        }
        _ => {
            for (name, member) in o {
                if properties.is_some_and(|p| p.contains_key(name)) {
                    continue;
                }
                check(root, arg, member, &format!("{at}.{name}"), errors);
            }
        }
    }
}

fn bound(keyword: &str, arg: &Value, n: f64, at: &str, errors: &mut Vec<String>) {
    let limit = arg.as_f64().expect("a number");
    let ok = if keyword.starts_with("min") {
        n >= limit
    } else {
        n <= limit
    };
    if !ok {
        errors.push(format!("{at}: {n} breaks {keyword} {limit}"));
    }
}

#[test]
fn the_validator_refuses_what_the_schema_forbids() {
    let root = serde_json::json!({"components": {"schemas": {"D": {
        "type": "object",
        "properties": {"a": {"const": 1}, "b": {"type": "array", "items": {"enum": ["x"]}, "maxItems": 1}},
        "required": ["a"],
        "additionalProperties": false,
    }}}});
    let schema = serde_json::json!({"oneOf": [{"$ref": "#/components/schemas/D"}, {"type": "string", "minLength": 2}]});
    assert!(validate(&root, &schema, &serde_json::json!({"a": 1, "b": ["x"]})).is_empty());
    assert!(validate(&root, &schema, &serde_json::json!("ab")).is_empty());
    for bad in [
        serde_json::json!({"a": 2}),
        serde_json::json!({"b": []}),
        serde_json::json!({"a": 1, "c": 0}),
        serde_json::json!({"a": 1, "b": ["y"]}),
        serde_json::json!({"a": 1, "b": ["x", "x"]}),
        serde_json::json!("a"),
        serde_json::json!(3),
    ] {
        assert!(!validate(&root, &schema, &bad).is_empty(), "{bad} passed");
    }
}

#[test]
#[should_panic(expected = "does not know the keyword")]
fn the_validator_refuses_a_keyword_it_does_not_check() {
    let root = serde_json::json!({});
    validate(
        &root,
        &serde_json::json!({"multipleOf": 2}),
        &serde_json::json!(4),
    );
}
