//! What turns a normalized run's events into one dialect's streamed answer.
//! The stream's write loop (batching, framing, pacing, credit) is written
//! once and drives any of them.

use bytes::BytesMut;
use iop_core::exec::{Delta, ExecEvent, TextKind};

/// One dialect's streamed answer, event by event.
pub trait EventEncoder {
    /// Appends the wire form of `ev` to `out`; true when it ended the stream.
    fn event(&mut self, out: &mut BytesMut, ev: ExecEvent) -> bool;

    /// Appends the wire form of a token of choice 0 (what most events of a
    /// stream are), read where it arrived; never ends the stream. An
    /// encoder that has no faster way makes the event of it.
    fn text(&mut self, out: &mut BytesMut, kind: TextKind, text: &str) {
        let ev = ExecEvent::Delta(Delta { choice: 0, part: kind.part(text.to_owned()), logprobs: None });
        self.event(out, ev);
    }

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

/// Checks that `E` writes a token read in place ([`EventEncoder::text`])
/// exactly as it writes the token's event, first or after the start, in
/// text and reasoning, plain or needing escapes.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) fn check_text_writes_its_event<E: EventEncoder>(mut make: impl FnMut() -> E) {
    use TextKind::{Content, Reasoning};
    let tokens = [(Content, "Hel"), (Content, "lo \"q\"\n\\"), (Reasoning, "think"), (Content, "é€😀"), (Content, "")];
    for start_first in [false, true] {
        let (mut by_text, mut by_event) = (make(), make());
        let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
        if start_first {
            by_text.event(&mut a, ExecEvent::Start { model: "m".into() });
            by_event.event(&mut b, ExecEvent::Start { model: "m".into() });
        }
        for (kind, t) in tokens {
            by_text.text(&mut a, kind, t);
            let ev = ExecEvent::Delta(Delta { choice: 0, part: kind.part(t.into()), logprobs: None });
            assert!(!by_event.event(&mut b, ev));
            assert_eq!(a, b, "after {t:?} (start first: {start_first})");
        }
        let done = ExecEvent::Complete { finish_reason: "stop".into(), usage: None };
        assert!(by_text.event(&mut a, done.clone()));
        assert!(by_event.event(&mut b, done));
        assert_eq!(a, b);
    }
}
