//! `GET /openapi.json`: the OpenAPI 3.1 description of every route the app serves, its
//! statuses and its bodies (JSON Schemas), as the checked-in `openapi.json` at the crate root.
//!
//! The document is written by hand, next to the prose of `docs/http-api.md`, rather than
//! derived from the handlers: the handlers write their bodies by hand too (the decision body
//! byte by byte), so a derive would describe types the wire never sees. What keeps it true is
//! the test `tests/it/openapi`: every `.route(...)` of this crate's sources is a path of the
//! document and the reverse, each documented operation answers on the real router, and real
//! requests (allowed, denied, bad input, unknown gate, failures, ...) answer a documented
//! status with a body that validates against the documented schema.
//!
//! Adding a route: the `.route(...)` in the router, and its path in `openapi.json`, in
//! the same change (the test fails until both are there).

use axum::http::StatusCode;
use axum::response::Response;

/// The document, as served.
pub const DOCUMENT: &str = include_str!("../openapi.json");

/// `GET /openapi.json`: 200 with [`DOCUMENT`], served as it is (no copy per request).
pub async fn document() -> Response {
    crate::response::json(StatusCode::OK, DOCUMENT)
}
