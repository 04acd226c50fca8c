//! JSON encoding of OpenAI chat completion chunks and responses, written
//! straight into byte buffers (one per token on the hot path: no JSON tree).

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{RunFailure, Usage},
    sse,
};

/// Appends `s` as a JSON string literal.
fn json_str(out: &mut BytesMut, s: &str) {
    // Writing to a BytesMut cannot fail.
    let _ = serde_json::to_writer(out.writer(), s);
}

/// Appends an OpenAI `usage` object.
pub fn usage_json(out: &mut BytesMut, u: &Usage) {
    out.put_slice(b"{\"prompt_tokens\":");
    out.put_slice(itoa(u.input_tokens).as_bytes());
    out.put_slice(b",\"completion_tokens\":");
    out.put_slice(itoa(u.output_tokens).as_bytes());
    out.put_slice(b",\"total_tokens\":");
    out.put_slice(itoa(u.input_tokens + u.output_tokens).as_bytes());
    if let Some(c) = u.cached_input_tokens {
        out.put_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        out.put_slice(itoa(c).as_bytes());
        out.put_slice(b"}");
    }
    if let Some(r) = u.reasoning_tokens {
        out.put_slice(b",\"completion_tokens_details\":{\"reasoning_tokens\":");
        out.put_slice(itoa(r).as_bytes());
        out.put_slice(b"}");
    }
    out.put_slice(b"}");
}

fn itoa(n: u64) -> String {
    n.to_string()
}

/// Encodes the SSE events of one streamed completion.
pub struct ChunkEncoder {
    /// `data: {"id":..,"object":..,"created":..,"model":..,` shared by every chunk.
    prefix: BytesMut,
}

impl ChunkEncoder {
    /// An encoder for completion `id` of `model` created at `created` (unix seconds).
    pub fn new(id: &str, model: &str, created: u64) -> Self {
        let mut prefix = BytesMut::with_capacity(128);
        prefix.put_slice(b"data: {\"id\":");
        json_str(&mut prefix, id);
        prefix.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        prefix.put_slice(itoa(created).as_bytes());
        prefix.put_slice(b",\"model\":");
        json_str(&mut prefix, model);
        prefix.put_slice(b",");
        Self { prefix }
    }

    fn choice(&self, out: &mut BytesMut, delta: impl FnOnce(&mut BytesMut), finish: Option<&str>) {
        out.put_slice(&self.prefix);
        out.put_slice(b"\"choices\":[{\"index\":0,\"delta\":");
        delta(out);
        out.put_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(f) => json_str(out, f),
            None => out.put_slice(b"null"),
        }
        out.put_slice(b"}]}\n\n");
    }

    /// The first chunk: `delta: {"role":"assistant","content":""}`.
    pub fn role(&self, out: &mut BytesMut) {
        self.choice(out, |o| o.put_slice(b"{\"role\":\"assistant\",\"content\":\"\"}"), None);
    }

    /// A content delta.
    pub fn content(&self, out: &mut BytesMut, text: &str) {
        self.choice(
            out,
            |o| {
                o.put_slice(b"{\"content\":");
                json_str(o, text);
                o.put_slice(b"}");
            },
            None,
        );
    }

    /// A reasoning delta (`reasoning_content`, as vLLM and DeepSeek send it).
    pub fn reasoning(&self, out: &mut BytesMut, text: &str) {
        self.choice(
            out,
            |o| {
                o.put_slice(b"{\"reasoning_content\":");
                json_str(o, text);
                o.put_slice(b"}");
            },
            None,
        );
    }

    /// The finish chunk.
    pub fn finish(&self, out: &mut BytesMut, reason: &str) {
        self.choice(out, |o| o.put_slice(b"{}"), Some(reason));
    }

    /// The usage chunk (`choices: []`), sent when the client asked for it.
    pub fn usage(&self, out: &mut BytesMut, u: &Usage) {
        out.put_slice(&self.prefix);
        out.put_slice(b"\"choices\":[],\"usage\":");
        usage_json(out, u);
        out.put_slice(b"}\n\n");
    }

    /// An error event ending a stream that already started.
    pub fn error(&self, out: &mut BytesMut, f: &RunFailure) {
        let body = super::error::body(f.status, &f.message, Some(f.code));
        sse::write_event(out, &body);
    }

    /// `data: [DONE]`.
    pub fn done(&self, out: &mut BytesMut) {
        sse::write_done(out);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn event_json(bytes: &[u8]) -> serde_json::Value {
        let s = std::str::from_utf8(bytes).unwrap();
        let data = s.strip_prefix("data: ").unwrap().trim_end();
        serde_json::from_str(data).unwrap()
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
        enc.finish(&mut out, "length");
        assert_eq!(event_json(&out)["choices"][0]["finish_reason"], "length");

        out.clear();
        let u = Usage { input_tokens: 3, output_tokens: 4, reasoning_tokens: Some(1), cached_input_tokens: None };
        enc.usage(&mut out, &u);
        let v = event_json(&out);
        assert_eq!(v["usage"]["total_tokens"], 7);
        assert_eq!(v["usage"]["completion_tokens_details"]["reasoning_tokens"], 1);
        assert!(v["usage"].get("prompt_tokens_details").is_none());
        assert_eq!(v["choices"].as_array().unwrap().len(), 0);
    }
}
