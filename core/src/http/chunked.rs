//! Body framing and the incremental body decoder (Content-Length, chunked,
//! until-close), shared by server requests and client responses.
// SKELETON — to be completed by the http helper.

use bytes::{Bytes, BytesMut};

use super::HttpError;

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (responses only).
    UntilClose,
}

/// Incremental, sans-IO body decoder.
#[derive(Debug)]
pub struct BodyDecoder {
    _private: (),
}

impl BodyDecoder {
    /// A decoder for `kind` that fails with `BodyTooLarge` once more than
    /// `max_body_bytes` decoded bytes have been produced.
    pub fn new(kind: BodyKind, max_body_bytes: usize) -> Self {
        let _ = (kind, max_body_bytes);
        unimplemented!()
    }

    /// Decodes as much of `buf` as possible, removing consumed bytes from it.
    /// Returns the next piece of decoded body data (zero-copy split of `buf`
    /// where possible), `Ok(None)` when more input is needed. Once
    /// `is_done()` is true no more data is consumed (trailing bytes belong to
    /// the next message).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, HttpError> {
        let _ = buf;
        unimplemented!()
    }

    /// The body is complete.
    pub fn is_done(&self) -> bool {
        unimplemented!()
    }

    /// The peer closed the connection: for `UntilClose` this completes the
    /// body; for other kinds with bytes outstanding it is `Malformed`.
    pub fn finish_on_eof(&mut self) -> Result<(), HttpError> {
        unimplemented!()
    }
}
