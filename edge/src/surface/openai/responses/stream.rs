//! A normalized run streamed as the Responses API does it: named events,
//! each `data:` carrying its `type` and a `sequence_number` from 0 over the
//! whole stream. `response.created` and `response.in_progress` open it;
//! each output item is `response.output_item.added`, its parts
//! (`response.content_part.added`, deltas, the part's `.done`,
//! `response.content_part.done`) or its arguments' deltas and `.done`, and
//! `response.output_item.done`; `response.completed` (or
//! `response.incomplete`) carries the whole response, `response.failed`
//! ends a run that failed. The JSON is written straight into the output
//! buffer.

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{ExecEvent, TextKind},
    http::put_decimal,
};

use super::{
    write_item, write_part, write_response, Head, Item, Outcome, Output, Phase, ResponseMeta, State, Step, Text,
};
use crate::surface::{encode::EventEncoder, openai::chunk::json_str};

/// Encodes one run's events as a Responses API event stream. Only choice 0
/// is rendered.
pub struct ResponsesEncoder {
    head: Head,
    state: State,
    /// The next event's `sequence_number`.
    seq: u64,
    /// `response.created` went out.
    started: bool,
    /// A terminal event went out: later events write nothing.
    ended: bool,
    /// The current part's deltas' fields, rendered once.
    tail: DeltaTail,
}

/// What follows the sequence number in every delta of one part (`,"item_id":
/// …,"output_index":…,"content_index":…,"delta":`), rendered at its first
/// delta: a token's event is then three copies and its sequence number.
#[derive(Default)]
struct DeltaTail {
    /// The item's output index and the part's index (`usize::MAX` for a
    /// function call's arguments).
    key: Option<(usize, usize)>,
    bytes: Vec<u8>,
}

impl ResponsesEncoder {
    /// An encoder for the response `meta` describes.
    pub fn new(meta: ResponseMeta) -> Self {
        Self::from_head(Head::new(meta))
    }

    /// An encoder for the response `head` was rendered from.
    pub(super) fn from_head(head: Head) -> Self {
        Self { head, state: State::default(), seq: 0, started: false, ended: false, tail: DeltaTail::default() }
    }
}

impl EventEncoder for ResponsesEncoder {
    fn text(&mut self, out: &mut BytesMut, kind: TextKind, t: &str) {
        if self.ended {
            return;
        }
        let Self { head, state, seq, started, ended, tail } = self;
        let mut w = Events { head, seq, out, tail };
        if !*started {
            *started = true;
            w.response(b"response.created", state, Phase::InProgress);
            w.response(b"response.in_progress", state, Phase::InProgress);
        }
        let outcome = state.apply_text(kind, t, &mut |output, step| w.step(output, step));
        w.outcome(state, outcome, ended);
    }

    fn event(&mut self, out: &mut BytesMut, ev: ExecEvent) -> bool {
        if self.ended {
            return true;
        }
        let Self { head, state, seq, started, ended, tail } = self;
        let mut w = Events { head, seq, out, tail };
        if !*started {
            *started = true;
            if let ExecEvent::Start { .. } = ev {
                // The provider's start names the model the response names.
                state.apply(ev, &mut |_, _| {});
                w.response(b"response.created", state, Phase::InProgress);
                w.response(b"response.in_progress", state, Phase::InProgress);
                return false;
            }
            w.response(b"response.created", state, Phase::InProgress);
            w.response(b"response.in_progress", state, Phase::InProgress);
        }
        let outcome = state.apply(ev, &mut |output, step| w.step(output, step));
        w.outcome(state, outcome, ended);
        *ended
    }
}

impl Events<'_> {
    /// Ends the response when `outcome` says so (`ended` then set).
    fn outcome(&mut self, state: &State, outcome: Outcome, ended: &mut bool) {
        let w = self;
        match outcome {
            Outcome::Going => {}
            Outcome::Ended => {
                let phase = state.status();
                w.response(phase.event(), state, phase);
                *ended = true;
            }
            Outcome::Failed(f) => {
                w.response(b"response.failed", state, Phase::Failed(&f));
                *ended = true;
            }
        }
    }
}

/// Writes events: the stream's place (its head and sequence) and its buffer.
struct Events<'a> {
    head: &'a Head,
    seq: &'a mut u64,
    out: &'a mut BytesMut,
    tail: &'a mut DeltaTail,
}

/// `event: <name>\ndata: {"type":"<name>","sequence_number":` of a delta.
macro_rules! delta_open {
    ($name:literal) => {
        concat!("event: ", $name, "\ndata: {\"type\":\"", $name, "\",\"sequence_number\":").as_bytes()
    };
}

impl Events<'_> {
    /// `event: <name>\ndata: {"type":"<name>","sequence_number":<n>`; the
    /// event's fields follow.
    fn open(&mut self, name: &[u8]) {
        let out = &mut *self.out;
        out.put_slice(b"event: ");
        out.put_slice(name);
        out.put_slice(b"\ndata: {\"type\":\"");
        out.put_slice(name);
        out.put_slice(b"\",\"sequence_number\":");
        put_decimal(out, *self.seq);
        *self.seq += 1;
    }

    /// Ends the event's JSON and the event.
    fn close(&mut self) {
        self.out.put_slice(b"}\n\n");
    }

    /// An event carrying the `response` object.
    fn response(&mut self, name: &[u8], state: &State, phase: Phase<'_>) {
        self.open(name);
        self.out.put_slice(b",\"response\":");
        write_response(self.out, self.head, state, phase);
        self.close();
    }

    /// `,"item_id":…,"output_index":…` and, for a part, its `content_index`.
    fn at(&mut self, output: &Output, at: usize, part: bool) {
        let item = &output.items()[at];
        self.out.put_slice(b",\"item_id\":");
        self.head.item_id(self.out, item, at);
        self.out.put_slice(b",\"output_index\":");
        put_decimal(self.out, at as u64);
        if let (true, Item::Texts { parts, .. }) = (part, item) {
            self.out.put_slice(b",\"content_index\":");
            put_decimal(self.out, parts.len().saturating_sub(1) as u64);
        }
    }

    /// `response.output_item.added` or `.done` with the item as it is.
    fn item(&mut self, name: &[u8], output: &Output, at: usize) {
        self.open(name);
        self.out.put_slice(b",\"output_index\":");
        put_decimal(self.out, at as u64);
        self.out.put_slice(b",\"item\":");
        write_item(self.out, self.head, at, &output.items()[at]);
        self.close();
    }

    /// The end of an item's last part: its text's `.done` and
    /// `response.content_part.done`, both with the whole text.
    fn part_done(&mut self, output: &Output, at: usize) {
        let Some((kind, text)) = output.items()[at].last_part() else { return };
        reserve_for(self.out, 3 * text.len());
        let (name, field): (&[u8], &[u8]) = match kind {
            Text::Reasoning => (b"response.reasoning_text.done", b",\"text\":"),
            Text::Output => (b"response.output_text.done", b",\"text\":"),
            Text::Refusal => (b"response.refusal.done", b",\"refusal\":"),
        };
        self.open(name);
        self.at(output, at, true);
        self.out.put_slice(field);
        json_str(self.out, text);
        if *kind == Text::Output {
            self.out.put_slice(b",\"logprobs\":[]");
        }
        self.close();
        self.open(b"response.content_part.done");
        self.at(output, at, true);
        self.out.put_slice(b",\"part\":");
        write_part(self.out, *kind, text);
        self.close();
    }

    /// The events of one step of the output.
    fn step(&mut self, output: &Output, step: Step<'_>) {
        match step {
            Step::Added(at) => self.item(b"response.output_item.added", output, at),
            Step::PartAdded(at) => {
                let Some((kind, _)) = output.items()[at].last_part() else { return };
                self.open(b"response.content_part.added");
                self.at(output, at, true);
                self.out.put_slice(b",\"part\":");
                write_part(self.out, *kind, "");
                self.close();
            }
            Step::Delta(at, piece) => {
                reserve_for(self.out, piece.len());
                let item = &output.items()[at];
                let kind = item.last_part().map(|(kind, _)| *kind);
                let open: &[u8] = match kind {
                    Some(Text::Reasoning) => delta_open!("response.reasoning_text.delta"),
                    Some(Text::Output) => delta_open!("response.output_text.delta"),
                    Some(Text::Refusal) => delta_open!("response.refusal.delta"),
                    None => delta_open!("response.function_call_arguments.delta"),
                };
                let part = match item {
                    Item::Texts { parts, .. } => parts.len().saturating_sub(1),
                    Item::Call(_) => usize::MAX,
                };
                if self.tail.key != Some((at, part)) {
                    // Rendered where the event goes, then kept.
                    let from = self.out.len();
                    self.at(output, at, true);
                    self.out.put_slice(b",\"delta\":");
                    self.tail.bytes = self.out[from..].to_vec();
                    self.out.truncate(from);
                    self.tail.key = Some((at, part));
                }
                self.out.put_slice(open);
                put_decimal(self.out, *self.seq);
                *self.seq += 1;
                self.out.put_slice(&self.tail.bytes);
                json_str(self.out, piece);
                if kind == Some(Text::Output) {
                    self.out.put_slice(b",\"logprobs\":[]");
                }
                self.close();
            }
            Step::PartDone(at) => self.part_done(output, at),
            Step::Done(at) => {
                match &output.items()[at] {
                    Item::Texts { .. } => self.part_done(output, at),
                    Item::Call(c) => {
                        reserve_for(self.out, 2 * c.arguments.len());
                        self.open(b"response.function_call_arguments.done");
                        self.at(output, at, false);
                        self.out.put_slice(b",\"arguments\":");
                        json_str(self.out, &c.arguments);
                        self.close();
                    }
                }
                self.item(b"response.output_item.done", output, at);
            }
        }
    }
}

/// Room for a large piece's events at once: grown as it is written, the
/// buffer would double past it (as the OpenAI chunks reserve).
fn reserve_for(out: &mut BytesMut, text: usize) {
    const LARGE: usize = 16 * 1024;
    if text >= LARGE {
        out.reserve(text + 512);
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
pub(super) mod tests;
