//! Sans-IO HTTP/1.1 codec: request heads and bodies for the servers, response
//! heads and bodies for the upstream client. Built on `httparse`; no I/O here.

pub mod chunked;
pub mod client;
pub mod error;
pub mod request;
pub mod response;

pub use chunked::{BodyDecoder, BodyKind};
pub use client::{parse_response_head, write_request_head, ResponseHead};
pub use error::HttpError;
pub use request::{parse_request_head, RequestHead};
pub use response::{reason_phrase, write_chunk, write_last_chunk, write_response_head, Framing};

/// Size limits applied while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted head (request line/status line + headers), in bytes.
    pub max_head_bytes: usize,
    /// Largest accepted decoded body, in bytes.
    pub max_body_bytes: usize,
    /// Most header lines accepted.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_head_bytes: 16 * 1024, max_body_bytes: 4 * 1024 * 1024, max_headers: 64 }
    }
}
