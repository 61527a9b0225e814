//! Request bodies are JSON objects: [`Object`] and [`parse`], the one place that says so; and
//! what a body's fields are read as and checked by: [`Text`], a subject's bounds
//! ([`checked_subject`]) and the 400 that refuses a field ([`Refused`]).
//!
//! A struct derived with `serde` also deserialises from a JSON array, by position
//! (`["keep","s",1]` is `{"policy":"keep","subject":"s","cost":1}`), which the documented
//! bodies do not allow. Every body of the API (`/v1/evaluate` and each entry of its list form,
//! `POST /v1/leases`, the gate submit) is read through [`Object`], which accepts a map only: an
//! array, or any other value that is not an object, is refused with serde's "invalid type"
//! error, which the handler answers as its documented 400 (`malformed_json`,
//! `malformed_body`) before anything is charged, held or submitted.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use axum::response::Response;
use edge_middleware::{MAX_SUBJECT_BYTES, problem};
use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A `T` read from a JSON object only (see the module docs). Borrowing is kept: `T`'s fields
/// are read from the same deserializer, so a `&'de str` field still borrows from the body.
pub(crate) struct Object<T>(pub(crate) T);

impl<T> Deref for Object<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OnlyMap<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for OnlyMap<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(OnlyMap(PhantomData))
            .map(Object)
    }
}

/// `body` as a `T` when it is a JSON object of `T`'s fields.
///
/// # Errors
/// serde_json's error for a body that is not JSON, not an object, or not `T`.
pub(crate) fn parse<'de, T: Deserialize<'de>>(body: &'de [u8]) -> serde_json::Result<T> {
    serde_json::from_slice::<Object<T>>(body).map(|o| o.0)
}

/// A JSON string borrowed from the body when it has no escapes, copied otherwise.
///
/// `Option<Cow<str>>` would always copy: serde borrows into a `Cow` only when the field is
/// the `Cow` itself. Refuses exactly what `String` refuses, with the same messages.
pub(crate) struct Text<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_string(Visitor)
    }
}

/// A body the API refuses: 400 problem+json with a stable `error` and a `detail`.
#[derive(Debug)]
pub(crate) struct Refused {
    error: &'static str,
    detail: String,
}

impl Refused {
    pub(crate) fn new(error: &'static str, detail: &str) -> Self {
        Self {
            error,
            detail: detail.to_owned(),
        }
    }

    pub(crate) fn response(&self) -> Response {
        problem::bad_request(self.error, &self.detail)
    }
}

/// A subject of 1..=[`MAX_SUBJECT_BYTES`] bytes, or the 400 that refuses it (`at` prefixes
/// its detail). An empty subject is no subject (`missing_subject`), the one rule of every
/// port: gRPC refuses an empty descriptor value, and the middleware reads an empty header as
/// the absent one.
pub(crate) fn checked_subject<'s>(subject: Option<&'s str>, at: &str) -> Result<&'s str, Refused> {
    match subject {
        None => Err(Refused::new(
            "missing_subject",
            &format!("{at}subject is required"),
        )),
        Some("") => Err(Refused::new(
            "missing_subject",
            &format!("{at}subject must not be empty"),
        )),
        Some(s) if s.len() > MAX_SUBJECT_BYTES => Err(Refused::new(
            "subject_too_long",
            &format!(
                "{at}subject is {} bytes, at most {MAX_SUBJECT_BYTES} are accepted",
                s.len()
            ),
        )),
        Some(s) => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Pair<'a> {
        key: &'a str,
        #[serde(default)]
        id: Option<String>,
    }

    #[test]
    fn an_object_is_read_and_keeps_borrowing() {
        let body = br#"{"id":"e-1","key":"k"}"#;
        let p: Pair<'_> = parse(body).expect("an object");
        assert_eq!(
            p,
            Pair {
                key: "k",
                id: Some("e-1".into())
            }
        );
    }

    #[test]
    fn a_sequence_or_any_other_value_is_refused() {
        // A derived struct alone reads the array by position.
        assert!(serde_json::from_str::<Pair<'_>>(r#"["k","id"]"#).is_ok());
        for body in [r#"["k","id"]"#, "[]", r#""k""#, "1", "null", "true"] {
            let e = parse::<Pair<'_>>(body.as_bytes()).expect_err(body);
            assert!(
                e.to_string().contains("expected a JSON object"),
                "{body}: {e}"
            );
        }
        // Unknown members are still refused inside the object.
        assert!(parse::<Pair<'_>>(br#"{"key":"k","x":1}"#).is_err());
    }

    #[test]
    fn nested_objects_refuse_sequences_too() {
        #[derive(Deserialize)]
        struct List<'a> {
            #[serde(borrow)]
            items: Vec<Object<Pair<'a>>>,
        }
        let ok: List<'_> = parse(br#"{"items":[{"key":"a"},{"key":"b"}]}"#).expect("objects");
        assert_eq!(ok.items[1].key, "b");
        assert!(parse::<List<'_>>(br#"{"items":[["a"]]}"#).is_err());
    }
}
