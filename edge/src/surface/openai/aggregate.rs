//! One `chat.completion` put together from a run's events and written
//! straight into bytes, in OpenAI's key order (`id`, `object`, `created`,
//! `model`, `choices`, `usage`): no JSON tree is built and dropped per
//! answer.

use std::collections::BTreeMap;

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{codes, ExecEvent, FailureSource, Part, RunFailure, Usage},
    http::put_decimal,
};
use serde_json::Value;

use super::{
    super::failures::{node_cancelled, protocol},
    chunk::{json_str, usage_json},
};

/// Largest non-streamed completion the edge buffers (all choices' text).
const MAX_AGGREGATE_BYTES: usize = 64 * 1024 * 1024;

/// One tool call put together from its fragments.
#[derive(Default)]
pub(super) struct ToolCall {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

/// One choice put together from its deltas.
#[derive(Default)]
pub(super) struct Choice {
    content: String,
    reasoning: String,
    refusal: String,
    tool_calls: BTreeMap<u32, ToolCall>,
    /// Log-probability lists by kind (`content`, `refusal`), concatenated.
    logprobs: BTreeMap<String, Vec<Value>>,
    finish_reason: Option<String>,
}

impl Choice {
    fn add_logprobs(&mut self, raw: &[u8]) {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(raw) else { return };
        for (kind, list) in map {
            if let Value::Array(items) = list {
                self.logprobs.entry(kind).or_default().extend(items);
            }
        }
    }

    /// `{"index":..,"message":{..},"logprobs":..,"finish_reason":..}`.
    fn write(&self, out: &mut BytesMut, index: u32) {
        out.put_slice(b"{\"index\":");
        put_decimal(out, u64::from(index));
        out.put_slice(b",\"message\":{\"role\":\"assistant\",\"content\":");
        // OpenAI's content is null beside tool calls or a refusal.
        if self.content.is_empty() && (!self.tool_calls.is_empty() || !self.refusal.is_empty()) {
            out.put_slice(b"null");
        } else {
            json_str(out, &self.content);
        }
        out.put_slice(b",\"refusal\":");
        if self.refusal.is_empty() {
            out.put_slice(b"null");
        } else {
            json_str(out, &self.refusal);
        }
        if !self.reasoning.is_empty() {
            out.put_slice(b",\"reasoning_content\":");
            json_str(out, &self.reasoning);
        }
        if !self.tool_calls.is_empty() {
            out.put_slice(b",\"tool_calls\":[");
            for (i, c) in self.tool_calls.values().enumerate() {
                if i > 0 {
                    out.put_slice(b",");
                }
                out.put_slice(b"{\"id\":");
                json_str(out, &c.id);
                out.put_slice(b",\"type\":");
                json_str(out, if c.kind.is_empty() { "function" } else { &c.kind });
                out.put_slice(b",\"function\":{\"name\":");
                json_str(out, &c.name);
                out.put_slice(b",\"arguments\":");
                json_str(out, &c.arguments);
                out.put_slice(b"}}");
            }
            out.put_slice(b"]");
        }
        out.put_slice(b"},\"logprobs\":");
        if self.logprobs.is_empty() {
            out.put_slice(b"null");
        } else {
            // Writing to a BytesMut cannot fail.
            let _ = serde_json::to_writer(out.writer(), &self.logprobs);
        }
        out.put_slice(b",\"finish_reason\":");
        json_str(out, self.finish_reason.as_deref().unwrap_or("stop"));
        out.put_slice(b"}");
    }
}

/// A run's events so far, by choice.
pub(super) struct Aggregate {
    /// The model the provider said it runs (empty: it did not say).
    pub model: String,
    choices: BTreeMap<u32, Choice>,
    usage: Option<Usage>,
    bytes: usize,
}

impl Aggregate {
    pub fn new() -> Self {
        let mut choices = BTreeMap::new();
        choices.insert(0, Choice::default());
        Self { model: String::new(), choices, usage: None, bytes: 0 }
    }

    /// Takes one event; `Ok(true)` once the run completed, `Err` for a
    /// failed run (or one too big to buffer: the caller drops the stream,
    /// which cancels the run on the node).
    pub fn on_event(&mut self, ev: ExecEvent) -> Result<bool, RunFailure> {
        if self.bytes > MAX_AGGREGATE_BYTES {
            let msg = format!("the completion exceeds {MAX_AGGREGATE_BYTES} bytes; use stream=true");
            return Err(RunFailure::new(codes::INTERNAL, 502, FailureSource::Edge, msg));
        }
        match ev {
            ExecEvent::Start { model } => self.model = model,
            ExecEvent::Delta(d) => {
                let choice = self.choices.entry(d.choice).or_default();
                if let Some(lp) = &d.logprobs {
                    self.bytes += lp.len();
                    choice.add_logprobs(lp);
                }
                match d.part {
                    Part::Content(t) => {
                        self.bytes += t.len();
                        choice.content.push_str(&t);
                    }
                    Part::Reasoning(t) => {
                        self.bytes += t.len();
                        choice.reasoning.push_str(&t);
                    }
                    Part::Refusal(t) => {
                        self.bytes += t.len();
                        choice.refusal.push_str(&t);
                    }
                    Part::ToolCall(c) => {
                        self.bytes += c.arguments.len() + c.name.len() + c.id.len();
                        let call = choice.tool_calls.entry(c.index).or_default();
                        for (field, piece) in [(&mut call.id, c.id), (&mut call.kind, c.kind), (&mut call.name, c.name)]
                        {
                            if !piece.is_empty() {
                                *field = piece;
                            }
                        }
                        call.arguments.push_str(&c.arguments);
                    }
                }
            }
            ExecEvent::ChoiceFinish { choice, finish_reason, .. } => {
                self.choices.entry(choice).or_default().finish_reason = Some(finish_reason);
            }
            ExecEvent::Embeddings(_) => return Err(protocol("the provider answered a chat request with embeddings")),
            ExecEvent::Complete { finish_reason, usage } => {
                let first = self.choices.entry(0).or_default();
                first.finish_reason.get_or_insert(finish_reason);
                self.usage = usage;
                return Ok(true);
            }
            ExecEvent::Error(f) => return Err(f),
            ExecEvent::Cancelled { reason } => return Err(node_cancelled(&reason)),
        }
        Ok(false)
    }

    /// The `chat.completion` body.
    pub fn write(&self, out: &mut BytesMut, id: &str, created: u64, model: &str) {
        let text: usize = self.bytes + 256 * self.choices.len();
        out.reserve(text.saturating_add(256));
        out.put_slice(b"{\"id\":");
        json_str(out, id);
        out.put_slice(b",\"object\":\"chat.completion\",\"created\":");
        put_decimal(out, created);
        out.put_slice(b",\"model\":");
        json_str(out, model);
        out.put_slice(b",\"choices\":[");
        for (n, (index, choice)) in self.choices.iter().enumerate() {
            if n > 0 {
                out.put_slice(b",");
            }
            choice.write(out, *index);
        }
        out.put_slice(b"]");
        if let Some(u) = &self.usage {
            out.put_slice(b",\"usage\":");
            usage_json(out, u);
        }
        out.put_slice(b"}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::{Delta, ToolCallDelta};
    use serde_json::json;

    use super::*;

    fn d(choice: u32, part: Part) -> ExecEvent {
        ExecEvent::Delta(Delta { choice, part, logprobs: None })
    }

    fn written(agg: &Aggregate) -> String {
        let mut out = BytesMut::new();
        agg.write(&mut out, "chatcmpl-1", 7, "m\"x");
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn a_plain_answer_in_openais_key_order() {
        let mut agg = Aggregate::new();
        for ev in [
            ExecEvent::Start { model: "up".into() },
            d(0, Part::Content("he said \"hi\"\n".into())),
            d(0, Part::Content("é".into())),
        ] {
            assert!(!agg.on_event(ev).unwrap());
        }
        let usage = Usage { input_tokens: 3, output_tokens: 4, reasoning_tokens: None, cached_input_tokens: Some(1) };
        assert!(agg.on_event(ExecEvent::Complete { finish_reason: "length".into(), usage: Some(usage) }).unwrap());
        assert_eq!(agg.model, "up");
        assert_eq!(
            written(&agg),
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m\"x","choices":[{"index":0,"message":{"role":"assistant","content":"he said \"hi\"\né","refusal":null},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":1}}}"#
        );
    }

    #[test]
    fn tool_calls_refusals_reasoning_logprobs_and_several_choices() {
        let mut agg = Aggregate::new();
        let first = ToolCallDelta {
            index: 1,
            id: "c1".into(),
            kind: String::new(),
            name: "f".into(),
            arguments: "{\"a\"".into(),
        };
        let rest = ToolCallDelta { index: 1, arguments: ":1}".into(), ..Default::default() };
        let lp = |raw: &'static [u8]| {
            ExecEvent::Delta(Delta {
                choice: 0,
                part: Part::Reasoning("r".into()),
                logprobs: Some(bytes::Bytes::from_static(raw)),
            })
        };
        for ev in [
            lp(br#"{"content":[{"token":"a"}]}"#),
            lp(br#"{"content":[{"token":"b"}],"refusal":[]}"#),
            d(0, Part::ToolCall(Box::new(first))),
            d(0, Part::ToolCall(Box::new(rest))),
            d(2, Part::Refusal("no".into())),
            ExecEvent::ChoiceFinish { choice: 2, finish_reason: "stop".into(), stop_sequence: None },
        ] {
            assert!(!agg.on_event(ev).unwrap());
        }
        assert!(agg.on_event(ExecEvent::Complete { finish_reason: "tool_calls".into(), usage: None }).unwrap());
        let v: Value = serde_json::from_str(&written(&agg)).unwrap();
        assert!(v.get("usage").is_none());
        let c0 = &v["choices"][0];
        assert_eq!(
            c0["message"],
            json!({"role": "assistant", "content": null, "refusal": null, "reasoning_content": "rr",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
        );
        assert_eq!(c0["logprobs"], json!({"content": [{"token": "a"}, {"token": "b"}], "refusal": []}));
        assert_eq!(c0["finish_reason"], "tool_calls");
        let c2 = &v["choices"][1];
        assert_eq!((&c2["index"], &c2["finish_reason"]), (&json!(2), &json!("stop")));
        assert_eq!((&c2["message"]["content"], &c2["message"]["refusal"]), (&Value::Null, &json!("no")));
    }

    #[test]
    fn failures_and_wrong_events_end_the_aggregate() {
        let mut agg = Aggregate::new();
        assert_eq!(agg.on_event(ExecEvent::Cancelled { reason: "drain".into() }).unwrap_err().status, 503);
        let f = RunFailure::new(codes::UPSTREAM_PROTOCOL, 502, FailureSource::Provider, "x");
        assert_eq!(agg.on_event(ExecEvent::Error(f.clone())).unwrap_err(), f);
        assert_eq!(agg.on_event(ExecEvent::Embeddings(Default::default())).unwrap_err().status, 502);
    }
}
