//! The private RESP2 parser, reachable from the fuzz targets in `tests/` (an integration test
//! sees only public items). Hidden from the docs and not part of the crate's API: nothing
//! outside this workspace's tests may call it.

use redis::Value;

/// The `resp` module's parser: one complete reply at the start of `bytes` and the bytes it
/// took, `Ok(None)` when more bytes are needed.
///
/// # Errors
/// The parser's refusal, as text, when the bytes are not RESP2.
pub fn parse_resp(bytes: &[u8]) -> Result<Option<(Value, usize)>, String> {
    crate::resp::parse(bytes).map_err(|e| e.to_string())
}
