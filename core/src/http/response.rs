//! Server side: writing response heads and chunked bodies.
// SKELETON — to be completed by the http helper.

use bytes::BytesMut;

/// How the response body will be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Appends a status line, `headers`, the framing header and
/// `Connection: keep-alive|close` plus a blank line to `out`.
pub fn write_response_head(
    out: &mut BytesMut,
    status: u16,
    headers: &[(&str, &str)],
    framing: Framing,
    keep_alive: bool,
) {
    let _ = (out, status, headers, framing, keep_alive);
    unimplemented!()
}

/// Appends one chunk (no-op for empty `data`: an empty chunk would end the body).
pub fn write_chunk(out: &mut BytesMut, data: &[u8]) {
    let _ = (out, data);
    unimplemented!()
}

/// Appends the terminating zero-length chunk.
pub fn write_last_chunk(out: &mut BytesMut) {
    let _ = out;
    unimplemented!()
}

/// Canonical reason phrase for a status code.
pub fn reason_phrase(status: u16) -> &'static str {
    let _ = status;
    unimplemented!()
}
