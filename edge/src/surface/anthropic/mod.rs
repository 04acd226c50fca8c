//! The Anthropic dialect: `POST /v1/messages` translated onto the
//! normalized run for providers that do not speak it ([`normalized`]), its
//! answer rendered streamed ([`stream::MessagesEncoder`]) or whole
//! ([`message::MessageAggregate`]); count_tokens estimated where no
//! provider counts ([`count`]); Anthropic-shaped errors, and telling a
//! request that speaks it, so the answers the edge gives before any route
//! (API-key refusals, unknown paths) come in its shape.

pub mod agent;
mod answer;
pub mod count;
pub mod error;
pub mod message;
pub mod normalized;
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
