//! The fast path of an OpenAI chat-completion chunk (an SSE event's data):
//! the common shape (`model`, `choices` of `index`, `delta` with `role`
//! and texts, `finish_reason`, `stop_reason` as a string, `logprobs`,
//! `usage` and `error` null; other fields plain values or nested plain
//! JSON) read by the hand scanner ([`super::json_scan`]) into what serde
//! would read, without its per-chunk model string and choices vector and
//! with each text in a kept string ([`crate::spare`]): a streamed token
//! then costs the node no allocation.
//!
//! It gives up (`None`) at anything else: an escape or control character,
//! tool calls, log probabilities or usage that are not null, a repeated
//! field, a value of an unexpected type, malformed JSON. The caller then
//! parses the chunk with serde, so every answer, and every error, stays
//! serde's. What it accepts, it reads exactly as serde would (checked by
//! property tests and the `openai_chunk` fuzz target).

use std::borrow::Cow;

use serde_json::Value;
use smallvec::SmallVec;

use super::{
    json_scan::{plain, Cursor},
    openai_stream::{ChoiceJson, CompletionJson, MessageJson},
};

/// The chunk's fields, or `None`: serde must read it.
pub(super) fn parse(data: &str) -> Option<CompletionJson<'_>> {
    let text = plain(data.as_bytes())?;
    let mut c = Cursor::new(text);
    let mut out = CompletionJson::default();
    c.fields(&["model", "choices", "usage", "error"], |c, i| {
        match i {
            0 => out.model = c.opt(Cursor::plain_str)?.map(Cow::Borrowed),
            1 => out.choices = c.opt(choices)?,
            // Usage (once, at the end) and an error: serde's unless null.
            _ => c.opt(|_| None::<()>)?.unwrap_or(()),
        }
        Some(())
    })?;
    c.ws();
    // Trailing characters are serde's error to report.
    (c.i == text.len()).then_some(out)
}

/// `[ choice, … ]`.
fn choices<'a>(c: &mut Cursor<'a>) -> Option<SmallVec<[ChoiceJson<'a>; 1]>> {
    let mut all = SmallVec::new();
    c.array(|c| {
        all.push(choice(c)?);
        Some(())
    })?;
    Some(all)
}

/// One choice: its index, message, finish and stop reasons.
fn choice<'a>(c: &mut Cursor<'a>) -> Option<ChoiceJson<'a>> {
    let mut out = ChoiceJson::default();
    let keys = ["index", "delta", "message", "finish_reason", "stop_reason", "logprobs"];
    c.fields(&keys, |c, i| {
        match i {
            // serde refuses an index beyond u32.
            0 => out.index = c.opt(Cursor::u64)?.map(u32::try_from).transpose().ok()?,
            1 => out.delta = c.opt(message)?,
            2 => out.message = c.opt(message)?,
            3 => out.finish_reason = c.opt(Cursor::plain_str)?.map(str::to_owned),
            4 => out.stop_reason = c.opt(Cursor::plain_str)?.map(|s| Value::String(s.to_owned())),
            // Log probabilities: serde's unless null.
            _ => c.opt(|_| None::<()>)?.unwrap_or(()),
        }
        Some(())
    })?;
    Some(out)
}

/// A delta or message: its texts (and `role`, skipped); tool calls are
/// serde's unless null.
fn message(c: &mut Cursor<'_>) -> Option<MessageJson> {
    let mut out = MessageJson::default();
    let keys = ["content", "reasoning_content", "reasoning", "refusal", "tool_calls"];
    c.fields(&keys, |c, i| {
        if i == 4 {
            return c.opt(|_| None::<()>).map(drop);
        }
        let text = c.opt(Cursor::plain_str)?.map(|s| Value::String(crate::spare::text(s)));
        match i {
            0 => out.content = text,
            1 => out.reasoning_content = text,
            2 => out.reasoning = text,
            _ => out.refusal = text,
        }
        Some(())
    })?;
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn serde(data: &str) -> Option<String> {
        serde_json::from_str::<CompletionJson>(data).ok().map(|l| format!("{l:?}"))
    }

    fn fast(data: &str) -> Option<String> {
        parse(data).map(|l| format!("{l:?}"))
    }

    /// What the fast path reads is what serde reads.
    fn agrees(data: &str) {
        if let Some(f) = fast(data) {
            assert_eq!(Some(f), serde(data), "{data}");
        }
    }

    #[test]
    fn the_common_chunks_take_the_fast_path() {
        let chunks = [
            // vLLM, OpenAI, llama.cpp's server (its timings), the mock.
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733000000,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null},"logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
            r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"prompt_n":1,"predicted_per_second":12.5}}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"END"}]}"#,
            r#"{"model":"ünïcödé","choices":[{"delta":{"content":"日本","refusal":null,"tool_calls":null}},{"index":1,"delta":{"refusal":"no"}}]}"#,
            "{}",
            r#" { "choices" : [ ] , "error" : null } "#,
        ];
        for data in chunks {
            assert!(fast(data).is_some(), "slow: {data}");
            agrees(data);
        }
    }

    #[test]
    fn anything_else_goes_to_serde() {
        let chunks = [
            r#"{"choices":[{"delta":{"content":"a\nb"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            r#"{"error":{"message":"boom"}}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"choices":[{"index":4294967296}]}"#,
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"choices":[{"stop_reason":128001}]}"#,
            r#"{"choices":[{"delta":{"content":1}}]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[{}],}"#,
            r#"{"model":"a"} x"#,
            "[1]",
        ];
        for data in chunks {
            assert_eq!(fast(data), None, "fast: {data}");
        }
    }

    #[test]
    fn a_token_takes_a_kept_string() {
        crate::spare::keep(String::with_capacity(32));
        let chunk = parse(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#).unwrap();
        let choices = chunk.choices.unwrap();
        assert!(!choices.spilled(), "one choice held inline");
        match &choices[0].delta.as_ref().unwrap().content {
            Some(Value::String(s)) => assert_eq!((s.as_str(), s.capacity()), ("Hi", 32)),
            other => panic!("{other:?}"),
        }
    }

    fn value() -> impl Strategy<Value = String> {
        super::super::json_scan::strategies::value("content|reasoning_content|reasoning|refusal|role|tool_calls|x")
    }

    fn choice() -> impl Strategy<Value = String> {
        let key = "(index|delta|message|finish_reason|stop_reason|logprobs|x)";
        proptest::collection::vec((key, value()), 0..4).prop_map(|fields| {
            let inner: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", inner.join(","))
        })
    }

    proptest! {
        #[test]
        fn the_fast_path_reads_what_serde_reads(
            fields in proptest::collection::vec(
                ("(model|choices|usage|error|id|created|x)", prop_oneof![
                    value(),
                    proptest::collection::vec(choice(), 0..3).prop_map(|c| format!("[{}]", c.join(","))),
                ], "[ ]{0,1}"),
                0..6,
            ),
            tail in "[ }x]{0,2}",
        ) {
            let mut data = String::from("{");
            for (i, (k, v, ws)) in fields.iter().enumerate() {
                if i > 0 {
                    data.push(',');
                }
                data.push_str(&format!("{ws}\"{k}\"{ws}:{ws}{v}"));
            }
            data.push('}');
            data.push_str(&tail);
            agrees(&data);
        }
    }
}
