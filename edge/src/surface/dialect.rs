//! The client's dialect, and errors rendered in it. An error is classified
//! once (status, code, message; a run failure with the provider's fields)
//! wherever it arises, and only its rendering depends on the dialect.

use iop_core::{exec::RunFailure, http::RequestHead};

/// The API a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's (chat completions, completions, embeddings, Responses).
    OpenAi,
    /// Anthropic's (Messages).
    Anthropic,
}

impl Dialect {
    /// The dialect of a request no route claimed yet: Anthropic's for a
    /// Messages path or the `anthropic-version` header its SDKs always send.
    pub fn of(head: &RequestHead) -> Self {
        if super::anthropic::speaks_anthropic(head) {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }

    /// The status this dialect answers the gateway's `status` with.
    pub fn status(self, status: u16) -> u16 {
        match self {
            Dialect::OpenAi => status,
            Dialect::Anthropic => super::anthropic::error::status(status),
        }
    }

    /// The error body for `status` with `message` and the gateway's `code`.
    pub fn error_body(self, status: u16, message: &str, code: &str) -> Vec<u8> {
        match self {
            Dialect::OpenAi => super::openai::error::body(status, message, Some(code)),
            Dialect::Anthropic => super::anthropic::error::body(status, message),
        }
    }

    /// The error body of a run failure before any byte of the answer.
    pub fn failure_body(self, f: &RunFailure) -> Vec<u8> {
        match self {
            Dialect::OpenAi => super::openai::error::failure_body(f),
            Dialect::Anthropic => super::anthropic::error::failure_body(f),
        }
    }

    /// An error event ending a stream that began: OpenAI's SDKs read an
    /// `error` object in a data line, Anthropic's an `error` event.
    pub fn stream_error(self, out: &mut bytes::BytesMut, f: &RunFailure) {
        match self {
            Dialect::OpenAi => iop_core::sse::write_event(out, &self.failure_body(f)),
            Dialect::Anthropic => {
                out.extend_from_slice(b"event: error\n");
                iop_core::sse::write_event(out, &self.failure_body(f));
            }
        }
    }

    /// Where the answer names its request id besides `x-request-id`:
    /// Anthropic's SDKs read `request-id`.
    pub fn request_id_header(self) -> Option<&'static str> {
        match self {
            Dialect::OpenAi => None,
            Dialect::Anthropic => Some("request-id"),
        }
    }
}
