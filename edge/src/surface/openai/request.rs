//! Parsing and validating a chat completion request body.

use bytes::Bytes;
use iop_core::wire::pb;
use serde::Deserialize;
use serde_json::{Map, Value};

/// A validated chat completion request.
#[derive(Debug)]
pub struct ChatRequest {
    /// Public model name.
    pub model: String,
    /// Stream the answer as SSE.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Messages for the wire.
    pub messages: Vec<pb::ChatMessage>,
    /// Completion token cap.
    pub max_tokens: Option<u32>,
    /// Remaining parameters, passed to the provider.
    pub params_json: Bytes,
}

/// A request body in its JSON shape, before the messages are converted;
/// enough to look the model up before doing more work.
#[derive(Deserialize)]
pub struct Raw {
    model: String,
    messages: Vec<Map<String, Value>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

#[derive(Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Parses `body`; the error is a client-facing message.
#[cfg(test)]
pub fn parse(body: &[u8]) -> Result<ChatRequest, String> {
    parse_raw(body)?.into_request()
}

/// Parses `body` into its JSON shape and checks the top-level fields.
pub fn parse_raw(body: &[u8]) -> Result<Raw, String> {
    if body.is_empty() {
        return Err("request body is empty; expected a JSON object".into());
    }
    let raw: Raw = serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    if raw.model.is_empty() {
        return Err("`model` must not be empty".into());
    }
    if raw.messages.is_empty() {
        return Err("`messages` must not be empty".into());
    }
    if raw.n.is_some_and(|n| n != 1) {
        return Err("only `n` = 1 is supported".into());
    }
    Ok(raw)
}

impl Raw {
    /// Converts the messages and parameters for the wire.
    pub fn into_request(self) -> Result<ChatRequest, String> {
        let raw = self;
        let messages =
            raw.messages.into_iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<_>, _>>()?;
        let params_json = Bytes::from(serde_json::to_vec(&raw.rest).map_err(|e| format!("invalid parameters: {e}"))?);
        Ok(ChatRequest {
            model: raw.model,
            stream: raw.stream.unwrap_or(false),
            include_usage: raw.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            messages,
            max_tokens: raw.max_completion_tokens.or(raw.max_tokens),
            params_json,
        })
    }
}

/// One message: role and text go in their fields; a message with
/// structured content keeps its whole original object in `extra_json` so
/// OpenAI-compatible providers get it unchanged.
fn message(i: usize, mut m: Map<String, Value>) -> Result<pb::ChatMessage, String> {
    let role = match m.remove("role") {
        Some(Value::String(r)) if !r.is_empty() => r,
        Some(_) => return Err(format!("messages[{i}].role must be a non-empty string")),
        None => return Err(format!("messages[{i}].role is required")),
    };
    let (content, keep_content) = match m.get("content") {
        None | Some(Value::Null) => (String::new(), m.contains_key("content")),
        Some(Value::String(s)) => (s.clone(), false),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            (text, true)
        }
        Some(_) => return Err(format!("messages[{i}].content must be a string, an array of parts, or null")),
    };
    if !keep_content {
        m.remove("content");
    }
    let extra_json =
        if m.is_empty() { Bytes::new() } else { Bytes::from(serde_json::to_vec(&m).map_err(|e| e.to_string())?) };
    Ok(pb::ChatMessage { role, content, extra_json })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_splits_params() {
        let r = parse(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,
                "temperature":0.5,"messages":[{"role":"user","content":"hi","name":"bob"}]}"#,
        )
        .unwrap();
        assert!(r.stream && r.include_usage);
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!(r.messages[0].content, "hi");
        let extra: Value = serde_json::from_slice(&r.messages[0].extra_json).unwrap();
        assert_eq!(extra, serde_json::json!({"name": "bob"}));
        let params: Value = serde_json::from_slice(&r.params_json).unwrap();
        assert_eq!(params, serde_json::json!({"temperature": 0.5}));
    }

    #[test]
    fn structured_content_is_kept_whole() {
        let r = parse(br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#).unwrap();
        assert_eq!(r.messages[0].content, "ab");
        let extra: Value = serde_json::from_slice(&r.messages[0].extra_json).unwrap();
        assert!(extra["content"].is_array());
    }

    #[test]
    fn rejections() {
        assert!(parse(b"").unwrap_err().contains("empty"));
        assert!(parse(b"{not json").unwrap_err().contains("invalid request body"));
        assert!(parse(br#"{"messages":[]}"#).unwrap_err().contains("model"));
        assert!(parse(br#"{"model":"m","messages":[]}"#).unwrap_err().contains("messages"));
        assert!(parse(br#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err().contains("role"));
        assert!(parse(br#"{"model":"m","messages":[{"role":"user","content":5}]}"#).unwrap_err().contains("content"));
        assert!(parse(br#"{"model":"m","n":2,"messages":[{"role":"user","content":"x"}]}"#).unwrap_err().contains("n"));
        assert!(parse(br#"{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}"#).is_err());
    }
}
