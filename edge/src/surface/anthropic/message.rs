//! One Messages API `message` put together from a run's events and written
//! straight into bytes, in Anthropic's key order. Its blocks are the ones
//! the streamed answer ([`super::stream`]) would have opened, in the same
//! order; only choice 0 counts.

use bytes::{BufMut, BytesMut};
use iop_core::exec::{codes, ExecEvent, FailureSource, Part, RunFailure, ToolCallDelta, Usage};

use super::answer::{stop_fields, stop_reason, tool_id, usage_json, ToolIds};
use crate::surface::{
    failures::{node_cancelled, protocol},
    openai::chunk::json_str,
};

/// Largest non-streamed answer the edge buffers (as the OpenAI surface's).
const MAX_AGGREGATE_BYTES: usize = 64 * 1024 * 1024;

/// One content block.
enum Block {
    Thinking(String),
    Text(String),
    ToolUse {
        /// The call's position among the choice's tool calls.
        index: u32,
        id: String,
        name: String,
        /// The JSON arguments, reassembled from their fragments.
        arguments: String,
    },
}

/// A run's events so far, as one assistant message.
pub struct MessageAggregate {
    /// The model the provider said it runs (empty: it did not say).
    model: String,
    stop_sequences: Vec<String>,
    blocks: Vec<Block>,
    /// Tool-call index → its block's position.
    tools: Vec<(u32, usize)>,
    refusal: bool,
    /// Choice 0's finish reason.
    finish: Option<String>,
    /// The stop sequence the provider said ended choice 0.
    matched: Option<String>,
    usage: Option<Usage>,
    bytes: usize,
}

impl MessageAggregate {
    /// An empty message; `stop_sequences` are the request's.
    pub fn new(stop_sequences: Vec<String>) -> Self {
        Self {
            model: String::new(),
            stop_sequences,
            blocks: Vec::new(),
            tools: Vec::new(),
            refusal: false,
            finish: None,
            matched: None,
            usage: None,
            bytes: 0,
        }
    }

    /// The model the provider's start named (empty when it named none).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Takes one event; `Ok(true)` once the run completed, `Err` for a
    /// failed run (or one too big to buffer: the caller drops the stream,
    /// which cancels the run on the node).
    pub fn on_event(&mut self, ev: ExecEvent) -> Result<bool, RunFailure> {
        if self.bytes > MAX_AGGREGATE_BYTES {
            let msg = format!("the message exceeds {MAX_AGGREGATE_BYTES} bytes; use stream: true");
            return Err(RunFailure::new(codes::INTERNAL, 502, FailureSource::Edge, msg));
        }
        match ev {
            ExecEvent::Start { model } => self.model = model,
            ExecEvent::Delta(d) if d.choice == 0 => match d.part {
                Part::Content(t) => self.text(t, false),
                Part::Reasoning(t) => self.text(t, true),
                Part::Refusal(t) => {
                    self.refusal = true;
                    self.text(t, false);
                }
                Part::ToolCall(c) => self.tool_call(*c),
            },
            ExecEvent::Delta(_) => {}
            ExecEvent::ChoiceFinish { choice: 0, finish_reason, stop_sequence } => {
                self.finish = Some(finish_reason);
                self.matched = stop_sequence;
            }
            ExecEvent::ChoiceFinish { .. } => {}
            ExecEvent::Embeddings(_) => {
                return Err(protocol("the provider answered a messages request with embeddings"))
            }
            ExecEvent::Complete { finish_reason, usage } => {
                self.finish.get_or_insert(finish_reason);
                self.usage = usage;
                return Ok(true);
            }
            ExecEvent::Error(f) => return Err(f),
            ExecEvent::Cancelled { reason } => return Err(node_cancelled(&reason)),
        }
        Ok(false)
    }

    /// Text or reasoning: onto the last block when it is of that kind, else
    /// a new block (empty pieces open none, as in the stream).
    fn text(&mut self, t: String, thinking: bool) {
        if t.is_empty() {
            return;
        }
        self.bytes += t.len();
        match (self.blocks.last_mut(), thinking) {
            (Some(Block::Thinking(s)), true) | (Some(Block::Text(s)), false) => s.push_str(&t),
            (_, true) => self.blocks.push(Block::Thinking(t)),
            (_, false) => self.blocks.push(Block::Text(t)),
        }
    }

    /// A tool-call fragment onto its call's block (a new one for a new call).
    fn tool_call(&mut self, c: ToolCallDelta) {
        self.bytes += c.arguments.len() + c.name.len() + c.id.len();
        let known = self.tools.iter().find(|(call, _)| *call == c.index).map(|(_, at)| *at);
        let Some(Block::ToolUse { id, name, arguments, .. }) = known.and_then(|at| self.blocks.get_mut(at)) else {
            self.tools.push((c.index, self.blocks.len()));
            self.blocks.push(Block::ToolUse { index: c.index, id: c.id, name: c.name, arguments: c.arguments });
            return;
        };
        // Later fragments carry no id or name; one that does fills a gap.
        for (field, piece) in [(id, c.id), (name, c.name)] {
            if field.is_empty() {
                *field = piece;
            }
        }
        arguments.push_str(&c.arguments);
    }

    /// The `message` body: message `id`, the provider's model name or
    /// `model_fallback`.
    pub fn write(&self, out: &mut BytesMut, id: &str, model_fallback: &str) {
        out.reserve(self.bytes + 128 * self.blocks.len() + 256);
        let model = if self.model.is_empty() { model_fallback } else { &self.model };
        out.put_slice(b"{\"id\":");
        json_str(out, id);
        out.put_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        json_str(out, model);
        out.put_slice(b",\"content\":[");
        let ids = ToolIds::new(id);
        for (n, block) in self.blocks.iter().enumerate() {
            if n > 0 {
                out.put_slice(b",");
            }
            match block {
                // No signature from a provider other than Anthropic.
                Block::Thinking(t) => {
                    out.put_slice(b"{\"type\":\"thinking\",\"thinking\":");
                    json_str(out, t);
                    out.put_slice(b",\"signature\":\"\"}");
                }
                Block::Text(t) => {
                    out.put_slice(b"{\"type\":\"text\",\"text\":");
                    json_str(out, t);
                    out.put_slice(b"}");
                }
                Block::ToolUse { index, id, name, arguments } => {
                    out.put_slice(b"{\"type\":\"tool_use\",\"id\":");
                    tool_id(out, &ids, id, *index);
                    out.put_slice(b",\"name\":");
                    json_str(out, name);
                    out.put_slice(b",\"input\":");
                    input_json(out, arguments);
                    out.put_slice(b"}");
                }
            }
        }
        out.put_slice(b"],");
        let finish = self.finish.as_deref().unwrap_or("");
        let matched = self.matched.as_deref();
        stop_fields(out, stop_reason(finish, matched, self.refusal, !self.tools.is_empty(), &self.stop_sequences));
        out.put_slice(b",\"usage\":");
        match &self.usage {
            Some(u) => usage_json(out, u),
            None => out.put_slice(b"{\"input_tokens\":0,\"output_tokens\":0}"),
        }
        out.put_slice(b"}");
    }
}

/// A tool call's `input`: the arguments as sent when they are a JSON object
/// (checked without building it), `{}` when there are none. Anything else
/// (arguments cut short, or not an object) is kept as a JSON string of the
/// text: `input` must be an object, but dropping the arguments would hide
/// what the model said; the client's tool validation reports it instead.
fn input_json(out: &mut BytesMut, arguments: &str) {
    let trimmed = arguments.trim();
    if trimmed.is_empty() {
        out.put_slice(b"{}");
    } else if trimmed.starts_with('{') && serde_json::from_str::<serde::de::IgnoredAny>(trimmed).is_ok() {
        out.put_slice(trimmed.as_bytes());
    } else {
        json_str(out, arguments);
    }
}

impl crate::surface::encode::EventAggregate for MessageAggregate {
    fn on_event(&mut self, ev: ExecEvent) -> Result<bool, RunFailure> {
        MessageAggregate::on_event(self, ev)
    }
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
