//! The API a run speaks: the request body it sends and how its answer is
//! read (which SSE event ends a stream, which carries a token, where the
//! usage is, what a whole answer must look like).
//!
//! - chat: OpenAI chat completions; a stream ends at `data: [DONE]`.
//! - messages: the Anthropic Messages API; a stream ends at
//!   `message_stop`, tokens are `text_delta`/`thinking_delta` blocks.
//! - responses: the OpenAI Responses API; a stream ends at
//!   `response.completed` (or `.incomplete`), tokens are text and
//!   reasoning deltas.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

use super::stats::Failure;

/// Which API the requests speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/responses`.
    Responses,
}

/// What one SSE event of a valid stream says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Token deltas it carries (non-empty text or reasoning).
    pub tokens: u64,
    /// Output tokens reported in a usage object.
    pub usage: Option<u64>,
    /// The stream's last event.
    pub last: bool,
}

impl Api {
    /// As the flag and the report write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// The path requests go to when the URL names none.
    pub fn default_path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Messages => "/v1/messages",
            Self::Responses => "/v1/responses",
        }
    }

    /// The request body: one user message of `prompt`, the output limit
    /// (required by the Messages API: 4096 when not given).
    pub fn body(self, model: &str, prompt: &str, stream: bool, max_tokens: Option<u64>) -> Value {
        let mut body = match self {
            Self::Chat => json!({"model": model, "messages": [{"role": "user", "content": prompt}], "stream": stream}),
            Self::Messages => json!({
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens.unwrap_or(4096),
                "stream": stream,
            }),
            Self::Responses => json!({"model": model, "input": prompt, "stream": stream, "store": false}),
        };
        match (self, max_tokens) {
            (Self::Chat, Some(n)) => body["max_tokens"] = n.into(),
            (Self::Responses, Some(n)) => body["max_output_tokens"] = n.into(),
            _ => {}
        }
        if self == Self::Chat && stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// Reads one SSE event's data; an `Err` makes the stream invalid.
    pub fn event(self, data: &str) -> Result<Event, Failure> {
        match self {
            Self::Chat => chat_event(data),
            Self::Messages => messages_event(data),
            Self::Responses => responses_event(data),
        }
    }

    /// Validates a whole (non-streamed) answer; the output tokens its usage reports.
    pub fn whole(self, body: &[u8]) -> Result<Option<u64>, Failure> {
        let invalid = |_| Failure::Protocol("invalid_json");
        match self {
            Self::Chat => {
                let c: Completion = serde_json::from_slice(body).map_err(invalid)?;
                if c.choices.is_empty() {
                    return Err(Failure::Protocol("no_choices"));
                }
                Ok(c.usage.and_then(|u| u.completion_tokens))
            }
            Self::Messages => {
                let m: Message = serde_json::from_slice(body).map_err(invalid)?;
                if m.kind != "message" {
                    return Err(Failure::Protocol("not_a_message"));
                }
                Ok(m.usage.and_then(|u| u.output_tokens))
            }
            Self::Responses => {
                let r: Response = serde_json::from_slice(body).map_err(invalid)?;
                if r.object.as_deref() != Some("response") || r.output.is_none() {
                    return Err(Failure::Protocol("not_a_response"));
                }
                Ok(r.usage.and_then(|u| u.output_tokens))
            }
        }
    }
}

fn non_empty(s: &Option<Cow<'_, str>>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

#[derive(Debug, Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    #[serde(default)]
    usage: Option<ChatUsage>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<ChatDelta<'a>>,
}

#[derive(Debug, Deserialize)]
struct ChatDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct ChatUsage {
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Completion {
    choices: Vec<IgnoredAny>,
    #[serde(default)]
    usage: Option<ChatUsage>,
}

fn chat_event(data: &str) -> Result<Event, Failure> {
    if data == "[DONE]" {
        return Ok(Event { last: true, ..Event::default() });
    }
    let chunk: Chunk<'_> = serde_json::from_str(data).map_err(|_| Failure::Protocol("invalid_chunk"))?;
    if chunk.error.is_some() {
        return Err(Failure::Protocol("error_event"));
    }
    let deltas = chunk.choices.iter().flatten().filter_map(|c| c.delta.as_ref());
    let tokens = deltas.filter(|d| non_empty(&d.content) || non_empty(&d.reasoning_content)).count() as u64;
    Ok(Event { tokens, usage: chunk.usage.and_then(|u| u.completion_tokens), last: false })
}

/// Output tokens, as the Messages and Responses APIs name them.
#[derive(Debug, Deserialize)]
struct OutputUsage {
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct MessagesEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<MessagesDelta<'a>>,
    #[serde(default)]
    usage: Option<OutputUsage>,
}

#[derive(Debug, Deserialize)]
struct MessagesDelta<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    usage: Option<OutputUsage>,
}

fn messages_event(data: &str) -> Result<Event, Failure> {
    let ev: MessagesEvent<'_> = serde_json::from_str(data).map_err(|_| Failure::Protocol("invalid_chunk"))?;
    match ev.kind.as_ref() {
        "error" => Err(Failure::Protocol("error_event")),
        "message_stop" => Ok(Event { last: true, ..Event::default() }),
        "content_block_delta" => {
            let token = ev.delta.as_ref().is_some_and(|d| non_empty(&d.text) || non_empty(&d.thinking));
            Ok(Event { tokens: u64::from(token), ..Event::default() })
        }
        "message_delta" => Ok(Event { usage: ev.usage.and_then(|u| u.output_tokens), ..Event::default() }),
        _ => Ok(Event::default()),
    }
}

#[derive(Debug, Deserialize)]
struct ResponsesEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<Cow<'a, str>>,
    #[serde(default)]
    response: Option<Response>,
}

#[derive(Debug, Deserialize)]
struct Response {
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    output: Option<IgnoredAny>,
    #[serde(default)]
    usage: Option<OutputUsage>,
}

fn responses_event(data: &str) -> Result<Event, Failure> {
    let ev: ResponsesEvent<'_> = serde_json::from_str(data).map_err(|_| Failure::Protocol("invalid_chunk"))?;
    match ev.kind.as_ref() {
        "error" | "response.failed" => Err(Failure::Protocol("error_event")),
        "response.completed" | "response.incomplete" => {
            let usage = ev.response.and_then(|r| r.usage).and_then(|u| u.output_tokens);
            Ok(Event { usage, last: true, ..Event::default() })
        }
        "response.output_text.delta" | "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            Ok(Event { tokens: u64::from(non_empty(&ev.delta)), ..Event::default() })
        }
        _ => Ok(Event::default()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_events() {
        let ev = |d: &str| Api::Messages.event(d);
        assert_eq!(ev(r#"{"type":"message_start","message":{"usage":{"input_tokens":3}}}"#).unwrap(), Event::default());
        let text = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#;
        assert_eq!(ev(text).unwrap().tokens, 1);
        let think = r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"h"}}"#;
        assert_eq!(ev(think).unwrap().tokens, 1);
        let json = r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}"#;
        assert_eq!(ev(json).unwrap().tokens, 0);
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}"#;
        assert_eq!(ev(delta).unwrap().usage, Some(7));
        assert!(ev(r#"{"type":"message_stop"}"#).unwrap().last);
        let err = r#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#;
        assert_eq!(ev(err), Err(Failure::Protocol("error_event")));
        assert_eq!(ev("{"), Err(Failure::Protocol("invalid_chunk")));
    }

    #[test]
    fn responses_events() {
        let ev = |d: &str| Api::Responses.event(d);
        let text = r#"{"type":"response.output_text.delta","sequence_number":4,"delta":"hi"}"#;
        assert_eq!(ev(text).unwrap().tokens, 1);
        let empty = r#"{"type":"response.output_text.delta","sequence_number":4,"delta":""}"#;
        assert_eq!(ev(empty).unwrap().tokens, 0);
        let done =
            r#"{"type":"response.completed","response":{"object":"response","output":[],"usage":{"output_tokens":9}}}"#;
        assert_eq!(ev(done).unwrap(), Event { tokens: 0, usage: Some(9), last: true });
        let failed = r#"{"type":"response.failed","response":{"object":"response"}}"#;
        assert_eq!(ev(failed), Err(Failure::Protocol("error_event")));
    }

    #[test]
    fn whole_answers() {
        let m = br#"{"type":"message","content":[{"type":"text","text":"a b"}],"usage":{"output_tokens":2}}"#;
        assert_eq!(Api::Messages.whole(m), Ok(Some(2)));
        assert_eq!(Api::Messages.whole(br#"{"type":"error"}"#), Err(Failure::Protocol("not_a_message")));
        let r = br#"{"object":"response","status":"completed","output":[],"usage":{"output_tokens":3}}"#;
        assert_eq!(Api::Responses.whole(r), Ok(Some(3)));
        assert_eq!(Api::Responses.whole(br#"{"object":"response"}"#), Err(Failure::Protocol("not_a_response")));
    }

    #[test]
    fn bodies() {
        let m = Api::Messages.body("m", "hi", true, None);
        assert_eq!((m["max_tokens"].as_u64(), m["stream"].as_bool()), (Some(4096), Some(true)));
        let r = Api::Responses.body("m", "hi", false, Some(5));
        assert_eq!((r["input"].as_str(), r["max_output_tokens"].as_u64()), (Some("hi"), Some(5)));
        let c = Api::Chat.body("m", "hi", true, Some(5));
        assert_eq!((c["max_tokens"].as_u64(), c["stream_options"]["include_usage"].as_bool()), (Some(5), Some(true)));
    }
}
