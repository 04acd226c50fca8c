//! iop-core: what the edge and the node share.
//!
//! - [`wire`]: generated edge↔node prost types ([`wire::pb`]) and the sans-IO
//!   frame codec.
//! - [`config`]: TOML configs of both binaries (raw serde layer, validated types).
//! - [`rt`]: thread-per-core runtime bootstrap, per-core `SO_REUSEPORT`
//!   listeners, cross-core mailboxes.
//! - [`http`], [`sse`]: sans-IO HTTP/1.1 and server-sent-events codecs.
//! - [`exec`]: run events, usage and failure classification.
//! - [`flow`]: per-stream credit windows on the edge↔node link.
//! - [`lease`]: sealed credential leases (managed mode).
//! - [`limits`]: counted slots, a log throttle, the open-file limit.
//! - [`calendar`]: days since the epoch as UTC dates.
//! - [`net`]: the stream seam (plain TCP or TLS) and TLS configuration.
//! - [`liveness`]: the response-stall timeout and a stall terminal's evidence.
//! - [`tunnel`]: the provider tunnel's items and header rules.
//! - [`request`]: top-level fields of an OpenAI request body, edited in place.
//! - [`messages`]: an Anthropic Messages request translated onto an OpenAI
//!   chat-completions body.
//! - [`responses`]: an OpenAI Responses request translated onto an OpenAI
//!   chat-completions body.
//! - `translate` (crate-private): what those two translations share.
//! - [`ws`]: a sans-IO WebSocket (RFC 6455) server codec: the upgrade
//!   handshake, a frame reader with limits, frame writers.

pub mod calendar;
pub mod config;
pub mod exec;
pub mod flow;
pub mod http;
pub mod lease;
pub mod limits;
pub mod liveness;
pub mod messages;
pub mod net;
pub mod request;
pub mod responses;
pub mod rt;
pub mod sse;
mod translate;
pub mod tunnel;
pub mod wire;
pub mod ws;
