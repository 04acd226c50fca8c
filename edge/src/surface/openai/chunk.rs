//! JSON encoding of OpenAI chat completion chunks, written straight into
//! byte buffers (one per token on the hot path: no JSON tree), in OpenAI's
//! exact shapes: several choices, content, reasoning, refusal and tool-call
//! deltas, the provider's log probabilities as sent, finish and usage.

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{Delta, Part, RunFailure, TextKind, Usage},
    http::put_decimal,
    sse,
};

/// Appends `s` as a JSON string literal, byte for byte what serde_json
/// writes.
pub fn json_str(out: &mut BytesMut, s: &str) {
    // Most strings on the hot path (a token) need no escape: copied as they
    // are, without serde's writer and escape table per byte.
    if plain(s) {
        out.reserve(s.len() + 2);
        out.put_u8(b'"');
        out.put_slice(s.as_bytes());
        out.put_u8(b'"');
        return;
    }
    // Writing to a BytesMut cannot fail.
    let _ = serde_json::to_writer(out.writer(), s);
}

/// Whether `s` is its own JSON string body (nothing to escape: no control
/// character, quote or backslash), eight bytes at a time.
fn plain(s: &str) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Any byte of `x` below `n` (n ≤ 128), or equal to `b`: exact as a whole.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let is = |x: u64, b: u8| below(x ^ (ONES * u64::from(b)), 1);
    let escapes = |x: u64| below(x, 0x20) | is(x, b'"') | is(x, b'\\') != 0;
    let mut words = s.as_bytes().chunks_exact(8);
    for w in words.by_ref() {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        if escapes(u64::from_le_bytes(word)) {
            return false;
        }
    }
    // The rest, padded with a byte that needs no escape.
    let rest = words.remainder();
    let mut word = [b'a'; 8];
    word[..rest.len()].copy_from_slice(rest);
    !escapes(u64::from_le_bytes(word))
}

/// Appends an OpenAI `usage` object.
pub fn usage_json(out: &mut BytesMut, u: &Usage) {
    out.put_slice(b"{\"prompt_tokens\":");
    put_decimal(out, u.input_tokens);
    out.put_slice(b",\"completion_tokens\":");
    put_decimal(out, u.output_tokens);
    out.put_slice(b",\"total_tokens\":");
    put_decimal(out, u.input_tokens.saturating_add(u.output_tokens));
    if let Some(c) = u.cached_input_tokens {
        out.put_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        put_decimal(out, c);
        out.put_slice(b"}");
    }
    if let Some(r) = u.reasoning_tokens {
        out.put_slice(b",\"completion_tokens_details\":{\"reasoning_tokens\":");
        put_decimal(out, r);
        out.put_slice(b"}");
    }
    out.put_slice(b"}");
}

/// Appends one delta object (`{"content":..}`, `{"tool_calls":[..]}`, ...).
pub fn delta_json(out: &mut BytesMut, part: &Part) {
    match part {
        Part::Content(t) => {
            out.put_slice(b"{\"content\":");
            json_str(out, t);
            out.put_slice(b"}");
        }
        Part::Reasoning(t) => {
            out.put_slice(b"{\"reasoning_content\":");
            json_str(out, t);
            out.put_slice(b"}");
        }
        Part::Refusal(t) => {
            out.put_slice(b"{\"refusal\":");
            json_str(out, t);
            out.put_slice(b"}");
        }
        Part::ToolCall(c) => {
            // The first fragment of a call names it; later ones carry only
            // argument pieces (as OpenAI streams them).
            out.put_slice(b"{\"tool_calls\":[{\"index\":");
            put_decimal(out, u64::from(c.index));
            if !c.id.is_empty() {
                out.put_slice(b",\"id\":");
                json_str(out, &c.id);
            }
            if !c.kind.is_empty() {
                out.put_slice(b",\"type\":");
                json_str(out, &c.kind);
            }
            out.put_slice(b",\"function\":{");
            if !c.name.is_empty() {
                out.put_slice(b"\"name\":");
                json_str(out, &c.name);
                out.put_slice(b",");
            }
            out.put_slice(b"\"arguments\":");
            json_str(out, &c.arguments);
            out.put_slice(b"}}]}");
        }
    }
}

/// Encodes the SSE events of one streamed completion.
pub struct ChunkEncoder {
    /// `data: {"id":..,"object":..,"created":..,"model":..,` shared by every
    /// chunk (its first [`Self::common`] bytes), then [`TEXT_HEAD`]: the
    /// whole head of the usual chunk, choice 0's content.
    prefix: BytesMut,
    /// Where the head every chunk shares ends in `prefix`.
    common: usize,
}

/// What follows the shared head in choice 0's content chunk, up to the
/// text's opening quote.
const TEXT_HEAD: &[u8] = b"\"choices\":[{\"index\":0,\"delta\":{\"content\":\"";
/// What follows the text of choice 0's content chunk, from its closing quote.
const TEXT_TAIL: &[u8] = b"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

impl ChunkEncoder {
    /// An encoder for completion `id` of `model` created at `created` (unix seconds).
    pub fn new(id: &str, model: &str, created: u64) -> Self {
        // Room for the shared head and the content chunk's.
        let mut prefix = BytesMut::with_capacity(192);
        prefix.put_slice(b"data: {\"id\":");
        json_str(&mut prefix, id);
        prefix.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        put_decimal(&mut prefix, created);
        prefix.put_slice(b",\"model\":");
        json_str(&mut prefix, model);
        prefix.put_slice(b",");
        let common = prefix.len();
        prefix.put_slice(TEXT_HEAD);
        Self { prefix, common }
    }

    /// The head every chunk shares.
    fn head(&self) -> &[u8] {
        &self.prefix[..self.common]
    }

    fn choice(
        &self,
        out: &mut BytesMut,
        choice: u32,
        delta: impl FnOnce(&mut BytesMut),
        logprobs: Option<&[u8]>,
        finish: Option<&str>,
    ) {
        out.put_slice(self.head());
        out.put_slice(b"\"choices\":[{\"index\":");
        put_decimal(out, u64::from(choice));
        out.put_slice(b",\"delta\":");
        delta(out);
        out.put_slice(b",\"logprobs\":");
        out.put_slice(logprobs.unwrap_or(b"null"));
        out.put_slice(b",\"finish_reason\":");
        match finish {
            Some(f) => json_str(out, f),
            None => out.put_slice(b"null"),
        }
        out.put_slice(b"}]}\n\n");
    }

    /// A choice's first chunk: `delta: {"role":"assistant","content":""}`.
    pub fn role(&self, out: &mut BytesMut, choice: u32) {
        self.choice(out, choice, |o| o.put_slice(b"{\"role\":\"assistant\",\"content\":\"\"}"), None, None);
    }

    /// A piece of a choice's output, with the provider's log probabilities.
    pub fn delta(&self, out: &mut BytesMut, d: &Delta) {
        // The usual chunk (choice 0's plain text, no log probabilities) in
        // three copies: its head, the text, its tail.
        if let (0, Part::Content(t), None) = (d.choice, &d.part, &d.logprobs) {
            if plain(t) {
                out.reserve(self.prefix.len() + t.len() + TEXT_TAIL.len());
                out.put_slice(&self.prefix);
                out.put_slice(t.as_bytes());
                out.put_slice(TEXT_TAIL);
                return;
            }
        }
        self.choice(out, d.choice, |o| delta_json(o, &d.part), d.logprobs.as_deref(), None);
    }

    /// A token of choice 0 without log probabilities: what [`Self::delta`]
    /// writes for it, from the text where it arrived.
    pub fn text(&self, out: &mut BytesMut, kind: TextKind, t: &str) {
        if kind == TextKind::Content && plain(t) {
            out.reserve(self.prefix.len() + t.len() + TEXT_TAIL.len());
            out.put_slice(&self.prefix);
            out.put_slice(t.as_bytes());
            out.put_slice(TEXT_TAIL);
            return;
        }
        let key: &[u8] = match kind {
            TextKind::Content => b"{\"content\":",
            TextKind::Reasoning => b"{\"reasoning_content\":",
        };
        self.choice(
            out,
            0,
            |o| {
                o.put_slice(key);
                json_str(o, t);
                o.put_slice(b"}");
            },
            None,
            None,
        );
    }

    /// Choice 0's content delta.
    #[cfg(test)]
    pub fn content(&self, out: &mut BytesMut, text: &str) {
        self.delta(out, &Delta { choice: 0, part: Part::Content(text.into()), logprobs: None });
    }

    /// A choice's finish chunk.
    pub fn finish(&self, out: &mut BytesMut, choice: u32, reason: &str) {
        self.choice(out, choice, |o| o.put_slice(b"{}"), None, Some(reason));
    }

    /// The usage chunk (`choices: []`), sent when the client asked for it.
    pub fn usage(&self, out: &mut BytesMut, u: &Usage) {
        out.put_slice(self.head());
        out.put_slice(b"\"choices\":[],\"usage\":");
        usage_json(out, u);
        out.put_slice(b"}\n\n");
    }

    /// An error event ending a stream that already started.
    pub fn error(&self, out: &mut BytesMut, f: &RunFailure) {
        sse::write_event(out, &super::error::failure_body(f));
    }

    /// `data: [DONE]`.
    pub fn done(&self, out: &mut BytesMut) {
        sse::write_done(out);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::ToolCallDelta;

    use super::*;

    fn event_json(bytes: &[u8]) -> serde_json::Value {
        let s = std::str::from_utf8(bytes).unwrap();
        let data = s.strip_prefix("data: ").unwrap().trim_end();
        serde_json::from_str(data).unwrap()
    }

    #[test]
    fn strings_are_written_as_serde_writes_them() {
        let mut cases: Vec<String> = (0u32..0x800).filter_map(char::from_u32).map(|c| format!("a{c}b")).collect();
        cases.extend(
            ["", "plain token", "\"", "\\", "\u{7f}\u{80}", "é\n\t\u{1}", "tab\there", "😀 ok"].map(String::from),
        );
        for s in cases {
            let mut out = BytesMut::new();
            json_str(&mut out, &s);
            assert_eq!(&out[..], serde_json::to_string(&s).unwrap().as_bytes(), "{s:?}");
        }
    }

    #[test]
    fn the_usual_chunk_is_the_general_one() {
        let enc = ChunkEncoder::new("chatcmpl-1", "m\"x", 7);
        for text in ["tok ", "", "a\"b", "é\n", "😀", "back\\slash"] {
            let d = Delta { choice: 0, part: Part::Content(text.into()), logprobs: None };
            let mut fast = BytesMut::new();
            enc.delta(&mut fast, &d);
            let mut general = BytesMut::new();
            enc.choice(&mut general, 0, |o| delta_json(o, &d.part), None, None);
            assert_eq!(fast, general, "{text:?}");
        }
        let mut usage = BytesMut::new();
        enc.usage(&mut usage, &Usage::default());
        assert!(usage.starts_with(b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\\\"x\",\"choices\":[],"));
    }

    #[test]
    fn chunks_are_valid_openai_json() {
        let enc = ChunkEncoder::new("chatcmpl-1", "m\"x", 7);
        let mut out = BytesMut::new();
        enc.content(&mut out, "he said \"hi\"\n");
        let v = event_json(&out);
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["model"], "m\"x");
        assert_eq!(v["choices"][0]["delta"]["content"], "he said \"hi\"\n");
        assert!(v["choices"][0]["finish_reason"].is_null());

        out.clear();
        enc.finish(&mut out, 2, "length");
        let v = event_json(&out);
        assert_eq!(
            (v["choices"][0]["index"].as_u64(), v["choices"][0]["finish_reason"].as_str()),
            (Some(2), Some("length"))
        );

        out.clear();
        let u = Usage { input_tokens: 3, output_tokens: 4, reasoning_tokens: Some(1), cached_input_tokens: None };
        enc.usage(&mut out, &u);
        let v = event_json(&out);
        assert_eq!(v["usage"]["total_tokens"], 7);
        assert_eq!(v["usage"]["completion_tokens_details"]["reasoning_tokens"], 1);
        assert!(v["usage"].get("prompt_tokens_details").is_none());
        assert_eq!(v["choices"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn tool_calls_refusals_and_logprobs_in_openai_shape() {
        let enc = ChunkEncoder::new("c", "m", 1);
        let mut out = BytesMut::new();
        let first = ToolCallDelta {
            index: 1,
            id: "call_1".into(),
            kind: "function".into(),
            name: "f".into(),
            arguments: String::new(),
        };
        enc.delta(&mut out, &Delta { choice: 0, part: Part::ToolCall(Box::new(first)), logprobs: None });
        let v = event_json(&out);
        assert_eq!(
            v["choices"][0]["delta"],
            serde_json::json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]})
        );
        out.clear();
        let next = ToolCallDelta { index: 1, arguments: "{\"a\":1}".into(), ..Default::default() };
        enc.delta(&mut out, &Delta { choice: 3, part: Part::ToolCall(Box::new(next)), logprobs: None });
        let v = event_json(&out);
        assert_eq!(v["choices"][0]["index"], 3);
        assert_eq!(
            v["choices"][0]["delta"],
            serde_json::json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"a\":1}"}}]})
        );
        out.clear();
        let lp = bytes::Bytes::from_static(
            br#"{"refusal":[{"token":"no","logprob":-0.5,"bytes":[110,111],"top_logprobs":[]}]}"#,
        );
        enc.delta(&mut out, &Delta { choice: 0, part: Part::Refusal("no".into()), logprobs: Some(lp) });
        let v = event_json(&out);
        assert_eq!(v["choices"][0]["delta"]["refusal"], "no");
        assert_eq!(v["choices"][0]["logprobs"]["refusal"][0]["logprob"], -0.5);
    }
}
