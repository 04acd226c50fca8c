//! What an adapter receives and where it sends events.

use std::future::Future;

use bytes::Bytes;
use iop_core::{exec::ExecEvent, wire::pb};

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// An OpenAI chat completion request.
    Chat,
    /// An OpenAI embeddings request.
    Embeddings,
    /// The tokens of a chat request's prompt, by the provider's tokenizer.
    Tokenize,
}

impl From<i32> for Operation {
    fn from(v: i32) -> Self {
        match pb::RunOperation::try_from(v) {
            Ok(pb::RunOperation::Embeddings) => Operation::Embeddings,
            Ok(pb::RunOperation::Tokenize) => Operation::Tokenize,
            _ => Operation::Chat,
        }
    }
}

/// One run as handed to an adapter.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Edge-assigned run id (for logs).
    pub run_id: String,
    /// Upstream model name.
    pub target: String,
    /// The client's request body (OpenAI JSON, `model` already `target`),
    /// exactly as sent: adapters read what they need from it.
    pub body: Bytes,
    /// Chat, embeddings or a token count.
    pub operation: Operation,
    /// Managed mode: the `Authorization` value from the run's opened
    /// credential lease (else the adapter's own, if any).
    pub credential: Option<iop_core::config::Secret>,
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

    /// Sends `evs` in order (what one read of the provider held) and
    /// leaves it empty; a sink may send them together.
    fn emit_many(&mut self, evs: &mut Vec<ExecEvent>) -> impl Future<Output = Result<(), SinkClosed>> {
        async move {
            for ev in evs.drain(..) {
                self.emit(ev).await?;
            }
            Ok(())
        }
    }
}
