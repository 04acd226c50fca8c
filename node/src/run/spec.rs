//! What an adapter receives and where it sends events.

use std::future::Future;

use bytes::Bytes;
use iop_core::{exec::ExecEvent, wire::pb};

/// One run as handed to an adapter.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Edge-assigned run id (for logs).
    pub run_id: String,
    /// Upstream model name.
    pub target: String,
    /// Chat messages.
    pub messages: Vec<pb::ChatMessage>,
    /// Completion token cap from the client.
    pub max_tokens: Option<u32>,
    /// Other OpenAI parameters as a JSON object (may be empty = `{}`).
    pub params_json: Bytes,
}

/// The receiving end went away (run cancelled or session closed); the
/// adapter should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("run event sink closed")]
pub struct SinkClosed;

/// Where an adapter sends its events, in order. At most one terminal event
/// (Complete / Error / Cancelled) is delivered; anything after it is dropped.
/// `emit` waits while the sink is full (backpressure from the edge).
pub trait EventSink {
    /// Sends one event.
    fn emit(&mut self, ev: ExecEvent) -> impl Future<Output = Result<(), SinkClosed>>;
}
