//! What turns a normalized run's events into one dialect's streamed answer.
//! The stream's write loop (batching, framing, pacing, credit) is written
//! once and drives any of them.

use bytes::BytesMut;
use iop_core::exec::ExecEvent;

/// One dialect's streamed answer, event by event.
pub trait EventEncoder {
    /// Appends the wire form of `ev` to `out`; true when it ended the stream.
    fn event(&mut self, out: &mut BytesMut, ev: ExecEvent) -> bool;

    /// How long the stream may go without an event before the dialect says
    /// something to keep it alive (Anthropic's `ping`); `None`: never, and
    /// no timer is armed.
    fn keepalive(&self) -> Option<std::time::Duration> {
        None
    }

    /// Appends the keep-alive event.
    fn ping(&mut self, _out: &mut BytesMut) {}
}

/// One dialect's whole answer, gathered from a run's events.
pub trait EventAggregate {
    /// Takes `ev`; `Ok(true)` once the run completed, `Err` when it failed.
    fn on_event(&mut self, ev: ExecEvent) -> Result<bool, iop_core::exec::RunFailure>;
}
