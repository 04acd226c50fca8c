//! Server side: request heads.
// SKELETON — to be completed by the http helper.

use bytes::{Bytes, BytesMut};

use super::{BodyKind, HttpError, Limits};

/// A parsed request head. Header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method, e.g. "GET".
    pub method: String,
    /// Request target as sent (path and query).
    pub target: String,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Header (lower-cased name, raw value) pairs in order.
    pub headers: Vec<(String, Bytes)>,
    /// How the body is framed (Empty when neither Content-Length nor chunked).
    pub body: BodyKind,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
}

impl RequestHead {
    /// First value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        let _ = name;
        unimplemented!()
    }

    /// The target without its query string.
    pub fn path(&self) -> &str {
        unimplemented!()
    }
}

/// Parses one request head from the front of `buf`. Returns `Ok(None)` when
/// more bytes are needed (buf untouched); on success the head bytes are
/// removed from `buf`. A head exceeding `limits.max_head_bytes` (complete or
/// not) is `HeadTooLarge`; a Content-Length above `limits.max_body_bytes` is
/// `BodyTooLarge`; conflicting/invalid Content-Length or Transfer-Encoding is
/// `Malformed`/`UnsupportedTransferEncoding`.
pub fn parse_request_head(buf: &mut BytesMut, limits: &Limits) -> Result<Option<RequestHead>, HttpError> {
    let _ = (buf, limits);
    unimplemented!()
}
