//! One Responses API `response` object put together from a run's events:
//! exactly what the stream's `response.completed` (or
//! `response.incomplete`) carries, written by the same writer.

use bytes::BytesMut;
use iop_core::exec::{ExecEvent, RunFailure};

use super::{write_response, Head, Outcome, ResponseMeta, State};

/// A run's events so far, as one response.
pub struct ResponseAggregate {
    head: Head,
    state: State,
}

impl ResponseAggregate {
    /// An empty response described by `meta`.
    pub fn new(meta: ResponseMeta) -> Self {
        Self::from_head(Head::new(meta))
    }

    /// The aggregate of the response `head` was rendered from.
    pub(super) fn from_head(head: Head) -> Self {
        Self { head, state: State::default() }
    }

    /// The model the provider's start named (empty when it named none).
    pub fn model(&self) -> &str {
        self.state.model()
    }

    /// Takes one event; `Ok(true)` once the run completed, `Err` for a
    /// failed run (or one too big to buffer: the caller drops the stream,
    /// which cancels the run on the node).
    pub fn on_event(&mut self, ev: ExecEvent) -> Result<bool, RunFailure> {
        match self.state.apply(ev, &mut |_, _| {}) {
            Outcome::Going => Ok(false),
            Outcome::Ended => Ok(true),
            Outcome::Failed(f) => Err(f),
        }
    }

    /// The `response` object (`completed` or `incomplete` once the run
    /// completed; `in_progress` before).
    pub fn write(&self, out: &mut BytesMut) {
        write_response(out, &self.head, &self.state, self.state.status());
    }
}

impl crate::surface::encode::EventAggregate for ResponseAggregate {
    fn on_event(&mut self, ev: ExecEvent) -> Result<bool, RunFailure> {
        ResponseAggregate::on_event(self, ev)
    }
}

#[cfg(test)]
#[path = "object_tests.rs"]
mod tests;
