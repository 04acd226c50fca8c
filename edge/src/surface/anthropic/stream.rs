//! A normalized run streamed as Anthropic's Messages API does it:
//! `message_start`, `ping`, content blocks (each `content_block_start`,
//! deltas, `content_block_stop`), `message_delta` with the stop reason and
//! usage, `message_stop`; or an `error` event once the stream began. The
//! JSON is written straight into the output buffer (no tree, no allocation
//! per event).

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{ExecEvent, Part, RunFailure, TextKind, ToolCallDelta, Usage},
    http::put_decimal,
};

use super::answer::{stop_fields, stop_reason, tool_id, usage_json, ToolIds};
use crate::surface::{
    encode::EventEncoder,
    failures::{node_cancelled, protocol},
    openai::{
        chunk::json_str,
        error::{clip_to, MAX_MESSAGE_BYTES},
    },
};

/// The kind of the content block being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// A `tool_use` block, for the tool call of this index.
    Tool(u32),
}

/// Encodes one run's events as a Messages API event stream. Only choice 0
/// is rendered (Anthropic has no `n`).
pub struct MessagesEncoder {
    id: String,
    /// The model to name when the provider's start names none.
    model: String,
    input_estimate: u64,
    stop_sequences: Vec<String>,
    tool_ids: ToolIds,
    /// `message_start` went out.
    started: bool,
    /// A terminal event went out: later events write nothing.
    ended: bool,
    /// The last block opened, while it is not stopped.
    open: Option<Open>,
    /// Blocks opened so far (the next block's index).
    blocks: u32,
    /// Tool-call index → its block's index.
    tools: Vec<(u32, u32)>,
    refusal: bool,
    /// Choice 0's own finish reason, when it came before the terminal.
    finish: Option<String>,
    /// The stop sequence the provider said ended choice 0.
    matched: Option<String>,
}

impl MessagesEncoder {
    /// An encoder for message `id` of `model` (named unless the provider's
    /// start names another), whose prompt is estimated at `input_estimate`
    /// tokens before the provider counts it.
    pub fn new(id: &str, model: &str, input_estimate: u64, stop_sequences: Vec<String>) -> Self {
        Self {
            id: id.to_owned(),
            model: model.to_owned(),
            input_estimate,
            stop_sequences,
            tool_ids: ToolIds::new(id),
            started: false,
            ended: false,
            open: None,
            blocks: 0,
            tools: Vec::new(),
            refusal: false,
            finish: None,
            matched: None,
        }
    }

    /// A `ping` event (Anthropic sends them during long waits).
    pub fn ping(&mut self, out: &mut BytesMut) {
        head(out, b"ping");
        tail(out);
    }

    /// How long a stream may be silent before a `ping` goes out.
    pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

    fn message_start(&mut self, out: &mut BytesMut, reported: &str) {
        self.started = true;
        let model = if reported.is_empty() { self.model.as_str() } else { reported };
        head(out, b"message_start");
        out.put_slice(b",\"message\":{\"id\":");
        json_str(out, &self.id);
        out.put_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        json_str(out, model);
        out.put_slice(b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":");
        put_decimal(out, self.input_estimate);
        out.put_slice(b",\"output_tokens\":0}}");
        tail(out);
        self.ping(out);
    }

    /// Index of the open block (the last one opened).
    fn current(&self) -> u32 {
        self.blocks.saturating_sub(1)
    }

    /// Stops the open block, if any. A thinking block ends with its
    /// signature, as Anthropic's always do; a provider other than Anthropic
    /// gives none, so it is empty.
    fn stop_block(&mut self, out: &mut BytesMut) {
        let Some(open) = self.open.take() else { return };
        let index = self.current();
        if open == Open::Thinking {
            delta_head(out, index, b"signature_delta");
            out.put_slice(b",\"signature\":\"\"}");
            tail(out);
        }
        head(out, b"content_block_stop");
        out.put_slice(b",\"index\":");
        put_decimal(out, u64::from(index));
        tail(out);
    }

    /// Opens a block of `kind` (stopping the open one) and writes its start
    /// up to its `content_block` object, which the caller writes before
    /// [`tail`]; its index.
    fn start_block(&mut self, out: &mut BytesMut, kind: Open) -> u32 {
        self.stop_block(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some(kind);
        head(out, b"content_block_start");
        out.put_slice(b",\"index\":");
        put_decimal(out, u64::from(index));
        out.put_slice(b",\"content_block\":");
        index
    }

    fn text(&mut self, out: &mut BytesMut, kind: Open, t: &str) {
        // An empty piece (servers open with `content: ""`) opens no block.
        if t.is_empty() {
            return;
        }
        reserve_for(out, t.len());
        // What follows the block's index in its delta, the text's key included.
        let (block, delta): (&[u8], &[u8]) = match kind {
            Open::Thinking => (
                b"{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
                b",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":",
            ),
            _ => (b"{\"type\":\"text\",\"text\":\"\"}", b",\"delta\":{\"type\":\"text_delta\",\"text\":"),
        };
        let index = if self.open == Some(kind) {
            self.current()
        } else {
            let index = self.start_block(out, kind);
            out.put_slice(block);
            tail(out);
            index
        };
        // A token's event in four copies and its index.
        out.put_slice(DELTA_OPEN);
        put_decimal(out, u64::from(index));
        out.put_slice(delta);
        json_str(out, t);
        out.put_slice(b"}}\n\n");
    }

    /// A tool-call fragment: its call's block (opened by its first
    /// fragment), then the arguments piece as sent. A fragment of a call
    /// whose block was stopped (a provider interleaving calls) goes to that
    /// block's index all the same: clients gather deltas by index, and
    /// nothing is dropped.
    fn tool_call(&mut self, out: &mut BytesMut, c: &ToolCallDelta) {
        let known = self.tools.iter().find(|(call, _)| *call == c.index).map(|(_, block)| *block);
        let index = match known {
            Some(block) => block,
            None => {
                let index = self.start_block(out, Open::Tool(c.index));
                out.put_slice(b"{\"type\":\"tool_use\",\"id\":");
                tool_id(out, &self.tool_ids, &c.id, c.index);
                out.put_slice(b",\"name\":");
                json_str(out, &c.name);
                out.put_slice(b",\"input\":{}}");
                tail(out);
                self.tools.push((c.index, index));
                index
            }
        };
        if c.arguments.is_empty() {
            return;
        }
        reserve_for(out, c.arguments.len());
        delta_head(out, index, b"input_json_delta");
        out.put_slice(b",\"partial_json\":");
        json_str(out, &c.arguments);
        out.put_slice(b"}");
        tail(out);
    }

    fn complete(&mut self, out: &mut BytesMut, finish: &str, usage: Option<&Usage>) {
        self.stop_block(out);
        let finish = self.finish.as_deref().unwrap_or(finish);
        let matched = self.matched.as_deref();
        let stop = stop_reason(finish, matched, self.refusal, !self.tools.is_empty(), &self.stop_sequences);
        head(out, b"message_delta");
        out.put_slice(b",\"delta\":{");
        stop_fields(out, stop);
        out.put_slice(b"},\"usage\":");
        match usage {
            Some(u) => usage_json(out, u),
            // Unknown: no invented input count.
            None => out.put_slice(b"{\"output_tokens\":0}"),
        }
        tail(out);
        head(out, b"message_stop");
        tail(out);
    }

    /// An `error` event ending a stream that began (no block is stopped:
    /// Anthropic's error events cut the stream where it is).
    fn error(&mut self, out: &mut BytesMut, f: &RunFailure) {
        head(out, b"error");
        out.put_slice(b",\"error\":{\"type\":");
        json_str(out, super::error::error_type(f.status));
        out.put_slice(b",\"message\":");
        json_str(out, &clip_to(&f.message, MAX_MESSAGE_BYTES));
        out.put_slice(b"}");
        tail(out);
    }
}

impl EventEncoder for MessagesEncoder {
    fn keepalive(&self) -> Option<std::time::Duration> {
        Some(Self::KEEPALIVE)
    }

    fn ping(&mut self, out: &mut BytesMut) {
        MessagesEncoder::ping(self, out);
    }

    fn text(&mut self, out: &mut BytesMut, kind: TextKind, t: &str) {
        if self.ended {
            return;
        }
        if !self.started {
            self.message_start(out, "");
        }
        let block = match kind {
            TextKind::Content => Open::Text,
            TextKind::Reasoning => Open::Thinking,
        };
        MessagesEncoder::text(self, out, block, t);
    }

    fn event(&mut self, out: &mut BytesMut, ev: ExecEvent) -> bool {
        if self.ended {
            return true;
        }
        if !self.started {
            let reported = if let ExecEvent::Start { model } = &ev { model.as_str() } else { "" };
            self.message_start(out, reported);
        }
        match ev {
            ExecEvent::Start { .. } => {}
            ExecEvent::Delta(d) if d.choice == 0 => match &d.part {
                Part::Content(t) => self.text(out, Open::Text, t),
                Part::Reasoning(t) => self.text(out, Open::Thinking, t),
                // Anthropic has no refusal block: its text, then `refusal`.
                Part::Refusal(t) => {
                    self.refusal = true;
                    self.text(out, Open::Text, t);
                }
                Part::ToolCall(c) => self.tool_call(out, c),
            },
            ExecEvent::Delta(_) => {}
            ExecEvent::ChoiceFinish { choice: 0, finish_reason, stop_sequence } => {
                self.finish = Some(finish_reason);
                self.matched = stop_sequence;
            }
            ExecEvent::ChoiceFinish { .. } => {}
            ExecEvent::Embeddings(_) => {
                self.ended = true;
                self.error(out, &protocol("the provider answered a messages request with embeddings"));
            }
            ExecEvent::Complete { finish_reason, usage } => {
                self.ended = true;
                self.complete(out, &finish_reason, usage.as_ref());
            }
            ExecEvent::Error(f) => {
                self.ended = true;
                self.error(out, &f);
            }
            ExecEvent::Cancelled { reason } => {
                self.ended = true;
                self.error(out, &node_cancelled(&reason));
            }
        }
        self.ended
    }
}

/// `event: <name>\ndata: {"type":"<name>"`; the event's fields follow.
fn head(out: &mut BytesMut, name: &[u8]) {
    out.put_slice(b"event: ");
    out.put_slice(name);
    out.put_slice(b"\ndata: {\"type\":\"");
    out.put_slice(name);
    out.put_slice(b"\"");
}

/// Ends the event's JSON and the event.
fn tail(out: &mut BytesMut) {
    out.put_slice(b"}\n\n");
}

/// A `content_block_delta` up to its block's index.
const DELTA_OPEN: &[u8] = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":";

/// A `content_block_delta` up to the delta's `type`; its field follows.
fn delta_head(out: &mut BytesMut, index: u32, kind: &[u8]) {
    out.put_slice(DELTA_OPEN);
    put_decimal(out, u64::from(index));
    out.put_slice(b",\"delta\":{\"type\":\"");
    out.put_slice(kind);
    out.put_slice(b"\"");
}

/// Room for a large piece's event at once: grown as it is written, the
/// buffer would double past it (as the OpenAI chunks reserve).
fn reserve_for(out: &mut BytesMut, text: usize) {
    const LARGE: usize = 16 * 1024;
    if text >= LARGE {
        out.reserve(text + 256);
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
pub(super) mod tests;
