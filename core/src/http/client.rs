//! Client side: writing request heads and parsing response heads.
// SKELETON — to be completed by the http helper.

use bytes::{Bytes, BytesMut};

use super::{BodyKind, HttpError, Limits};

/// A parsed response head. Header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Minor version: 0 or 1.
    pub version: u8,
    /// Header (lower-cased name, raw value) pairs in order.
    pub headers: Vec<(String, Bytes)>,
    /// Body framing, taking the request method into account.
    pub body: BodyKind,
    /// The connection may be reused after the body.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// First value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        let _ = name;
        unimplemented!()
    }
}

/// Appends a request line, `Host`, `headers` and `Content-Length` (when
/// `content_length` is Some) plus a blank line to `out`.
pub fn write_request_head(
    out: &mut BytesMut,
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    content_length: Option<usize>,
) {
    let _ = (out, method, target, host, headers, content_length);
    unimplemented!()
}

/// Parses one response head from the front of `buf` (same contract as
/// `parse_request_head`). `head_request` is true when answering a HEAD
/// request (no body). 1xx interim responses are skipped.
pub fn parse_response_head(
    buf: &mut BytesMut,
    limits: &Limits,
    head_request: bool,
) -> Result<Option<ResponseHead>, HttpError> {
    let _ = (buf, limits, head_request);
    unimplemented!()
}
