//! The Anthropic dialect. Today: telling a request that speaks it, so the
//! answers the edge gives before any surface (API-key refusals) come in
//! its shape. The Messages surface will grow here.

pub mod error;

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
