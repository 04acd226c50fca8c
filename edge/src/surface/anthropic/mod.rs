//! The Anthropic dialect: telling a request that speaks it, so the answers
//! the edge gives before any surface (API-key refusals) come in its shape
//! ([`error`]), and a normalized run's events rendered as the Messages
//! API's answer, streamed ([`stream::MessagesEncoder`]) or whole
//! ([`message::MessageAggregate`]).

mod answer;
pub mod error;
pub mod message;
pub mod stream;

use iop_core::http::RequestHead;

/// Whether the client speaks Anthropic's API: a Messages route, or the
/// `anthropic-version` header Anthropic's SDKs always send.
pub fn speaks_anthropic(head: &RequestHead) -> bool {
    let path = head.path();
    path == "/v1/messages"
        || path.starts_with("/v1/messages/")
        || path == "/v1/complete"
        || head.headers.iter().any(|(n, _)| n.as_bytes() == b"anthropic-version")
}
