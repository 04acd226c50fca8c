//! What a run's channel carries from the node session to the client's
//! task: an event, or a frame's consecutive tokens still in their wire
//! form ([`TextRun`]). A burst's tokens then cross the channel as one item
//! and are read where they are written, their text borrowed from the
//! frame: no string is made per token, and the channel's work is per frame.
//! A lone token (a frame's last, or one before an event of another kind)
//! is a run of one, held inline.

use bytes::Bytes;
use iop_core::{
    exec::{codes, Delta, ExecEvent, FailureSource, RunFailure, TextKind},
    flow,
    wire::short_text_parts,
};
use smallvec::SmallVec;

use crate::stream::{Failing, Queued};

/// Consecutive tokens of one frame, each an event in its shortest form
/// ([`short_text_parts`]; checked by the session, their text is checked to
/// be UTF-8 when it is read).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TextRun {
    /// One token held inline: a run of one (a frame's lone token) costs no
    /// allocation on its way through.
    raw: SmallVec<[Bytes; 1]>,
    /// Their texts' bytes.
    bytes: usize,
    /// Their cost against the window, each counted as its own event.
    cost: usize,
    /// The cost of all but the last (what was queued before the last
    /// arrived, on top of what was queued before the first).
    ahead: usize,
}

impl TextRun {
    /// A run with room for `tokens` tokens.
    pub fn with_capacity(tokens: usize) -> Self {
        Self { raw: SmallVec::with_capacity(tokens), ..Self::default() }
    }

    /// Appends a token's event, whose text is `text_len` bytes.
    pub fn push(&mut self, raw: Bytes, text_len: usize) {
        self.ahead = self.cost;
        self.cost += usize::try_from(flow::cost(text_len)).unwrap_or(usize::MAX);
        self.bytes += text_len;
        self.raw.push(raw);
    }

    /// Tokens in the run.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Token `i`: its kind and text; `None` past the end or if the node
    /// sent a text that is not UTF-8.
    pub fn token(&self, i: usize) -> Option<(TextKind, &str)> {
        let (kind, text) = short_text_parts(self.raw.get(i)?)?;
        Some((kind, std::str::from_utf8(text).ok()?))
    }

    /// Token `i` as an event of its own.
    pub fn event(&self, i: usize) -> Option<ExecEvent> {
        let (kind, text) = self.token(i)?;
        Some(ExecEvent::Delta(Delta { choice: 0, part: kind.part(text.to_owned()), logprobs: None }))
    }
}

/// The failure of a run whose node sent a token that is not UTF-8.
pub fn malformed_token() -> RunFailure {
    RunFailure::new(codes::INTERNAL, 502, FailureSource::Node, "node sent a malformed run event")
}

/// One item of a run's channel.
#[derive(Debug, Clone, PartialEq)]
pub enum RunItem {
    /// One event, decoded by the session.
    Event(ExecEvent),
    /// A frame's consecutive tokens.
    Texts(TextRun),
}

impl From<ExecEvent> for RunItem {
    fn from(ev: ExecEvent) -> Self {
        RunItem::Event(ev)
    }
}

// See the spares of `stream.rs`.
thread_local! {
    static SPARES: iop_core::rt::mailbox::Spares<RunItem> = const { iop_core::rt::mailbox::Spares::new() };
}

impl Queued for RunItem {
    fn spares() -> iop_core::rt::mailbox::SpareSlots<Self> {
        use iop_core::rt::mailbox::{SpareSlots, Spares};
        SpareSlots::new(|b| Spares::slots(&SPARES, b))
    }

    fn payload_bytes(&self) -> usize {
        match self {
            RunItem::Event(ev) => ev.payload_bytes(),
            RunItem::Texts(t) => t.bytes,
        }
    }

    fn cost(&self) -> usize {
        match self {
            RunItem::Event(ev) => usize::try_from(flow::cost(ev.payload_bytes())).unwrap_or(usize::MAX),
            RunItem::Texts(t) => t.cost,
        }
    }

    fn cost_ahead(&self) -> usize {
        match self {
            RunItem::Event(_) => 0,
            RunItem::Texts(t) => t.ahead,
        }
    }

    fn events(&self) -> usize {
        match self {
            RunItem::Event(_) => 1,
            RunItem::Texts(t) => t.len(),
        }
    }

    fn is_terminal(&self) -> bool {
        matches!(self, RunItem::Event(ev) if ev.is_terminal())
    }

    fn shares(&self) -> bool {
        match self {
            RunItem::Event(ExecEvent::Delta(Delta { logprobs: Some(lp), .. })) => !lp.is_empty(),
            RunItem::Event(_) => false,
            RunItem::Texts(_) => true,
        }
    }

    fn compact(&mut self) {
        match self {
            // Everything else an event holds was decoded into owned values.
            RunItem::Event(ExecEvent::Delta(Delta { logprobs: Some(lp), .. })) => {
                if !lp.is_empty() {
                    *lp = Bytes::copy_from_slice(lp);
                }
            }
            RunItem::Event(_) => {}
            RunItem::Texts(t) => {
                // One copy for the whole run, each token a slice of it.
                let whole = Bytes::from(t.raw.concat());
                let mut at = 0;
                for raw in &mut t.raw {
                    let len = raw.len();
                    *raw = whole.slice(at..at + len);
                    at += len;
                }
            }
        }
    }
}

impl Failing for RunItem {
    fn failed(f: RunFailure) -> Self {
        RunItem::Event(ExecEvent::Error(f))
    }

    fn failure(&self) -> Option<&RunFailure> {
        match self {
            RunItem::Event(ExecEvent::Error(f)) => Some(f),
            _ => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use prost::Message;

    fn wire(ev: ExecEvent) -> Bytes {
        Bytes::from(ev.into_wire_unnamed(0).encode_to_vec())
    }

    #[test]
    fn a_run_reads_its_tokens_and_counts_each_as_an_event() {
        let mut run = TextRun::default();
        for (i, t) in ["a", "bc", "déf"].iter().enumerate() {
            let raw = wire(ExecEvent::content(*t));
            assert!(short_text_parts(&raw).is_some(), "token {i} in its shortest form");
            run.push(raw, t.len());
        }
        assert_eq!(run.token(2), Some((TextKind::Content, "déf")));
        assert_eq!(run.event(0), Some(ExecEvent::content("a")));
        assert_eq!(run.token(3), None);
        let item = RunItem::Texts(run.clone());
        let each = usize::try_from(flow::cost(1)).unwrap();
        assert_eq!(item.cost(), 3 * each, "each token costs what its own event would");
        assert_eq!(item.cost_ahead(), 2 * each);
        assert_eq!((item.events(), item.payload_bytes()), (3, 7));
        // Compacted: the same tokens, out of the frame's buffer.
        let mut compacted = item.clone();
        compacted.compact();
        assert_eq!(compacted, item);
    }

    #[test]
    fn a_token_that_is_not_utf8_reads_as_none() {
        let mut raw = wire(ExecEvent::content("ab")).to_vec();
        let last = raw.len() - 1;
        raw[last] = 0xff;
        let mut run = TextRun::default();
        run.push(Bytes::from(raw), 2);
        assert_eq!(run.token(0), None);
        assert_eq!(run.event(0), None);
    }
}
