//! Chat-completions semantics of the mock: request validation, the response
//! plan (how many tokens, which delays) and the JSON of every chunk. Pure
//! functions; the connection code only paces and writes what these produce.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;

use super::MockConfig;

/// Per-request behaviour overrides (`"mock": {...}` in the request body).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockOverrides {
    /// Content tokens to produce.
    pub tokens: Option<u64>,
    /// Delay between tokens.
    pub token_interval_ms: Option<u64>,
    /// Delay before the first token.
    pub ttft_ms: Option<u64>,
    /// Answer with this error status instead.
    pub error_status: Option<u16>,
    /// Close the connection after this many content chunks.
    pub abort_after: Option<u64>,
    /// Reasoning tokens before the content.
    pub reasoning: Option<u64>,
    /// Pad every content token to at least this many bytes.
    pub token_bytes: Option<u64>,
    /// Read the request, then close the connection without answering.
    pub hangup: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<Message>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    content: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// A request the mock refuses, answered as an OpenAI-shaped 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Everything needed to answer one chat request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `chatcmpl-mock-<n>`.
    pub id: String,
    /// Model echoed in every chunk.
    pub model: String,
    /// Unix seconds.
    pub created: u64,
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt tokens reported in usage.
    pub prompt_tokens: u64,
    /// Reasoning tokens to emit (after the `max_tokens` cap).
    pub reasoning: u64,
    /// Content tokens to emit (after the cap).
    pub content: u64,
    /// `"stop"` or `"length"`.
    pub finish_reason: &'static str,
    /// Delay before the first token.
    pub ttft: Duration,
    /// Delay between tokens.
    pub interval: Duration,
    /// Close after this many content chunks.
    pub abort_after: Option<u64>,
    /// Answer with this error status instead.
    pub error_status: Option<u16>,
    /// Content tokens are padded to at least this many bytes.
    pub token_bytes: usize,
    /// Close the connection without answering.
    pub hangup: bool,
}

impl Plan {
    /// Text of content token `i`: `tok<i> `, padded with `x` before the
    /// space up to `token_bytes`.
    pub fn content_token(&self, i: u64) -> String {
        let mut t = format!("tok{i}");
        if self.token_bytes > t.len() + 1 {
            t.extend(std::iter::repeat_n('x', self.token_bytes - t.len() - 1));
        }
        t.push(' ');
        t
    }

    /// Tokens in usage.completion_tokens.
    pub fn completion_tokens(&self) -> u64 {
        self.reasoning + self.content
    }

    /// Whether the response ends by closing the connection after
    /// `abort_after` content chunks instead of finishing.
    pub fn aborts(&self) -> bool {
        self.abort_after.is_some_and(|n| n <= self.content)
    }
}

/// Error statuses the mock agrees to produce.
pub fn valid_error_status(status: u16) -> bool {
    (400..=599).contains(&status)
}

/// Validates a chat request body and plans the answer. `seq` numbers the id.
pub fn plan(body: &[u8], config: &MockConfig, seq: u64, created: u64) -> Result<Plan, BadRequest> {
    let req: ChatRequest =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
    if req.messages.is_empty() {
        return Err(BadRequest("'messages' must not be empty".into()));
    }
    let o = req.mock.unwrap_or_default();
    let error_status = o.error_status.or(config.error_status);
    if let Some(status) = error_status {
        if !valid_error_status(status) {
            return Err(BadRequest(format!("mock.error_status {status} is not in 400..=599")));
        }
    }
    let tokens = o.tokens.unwrap_or(config.tokens);
    let reasoning = o.reasoning.unwrap_or(config.reasoning);
    let wanted = tokens.saturating_add(reasoning);
    let cap = req.max_completion_tokens.or(req.max_tokens).unwrap_or(u64::MAX);
    let (reasoning, content, finish_reason) = if wanted > cap {
        let r = reasoning.min(cap);
        (r, cap - r, "length")
    } else {
        (reasoning, tokens, "stop")
    };
    let chars: usize = req.messages.iter().map(|m| content_chars(&m.content)).sum();
    Ok(Plan {
        id: format!("chatcmpl-mock-{seq}"),
        model: req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| config.model.clone()),
        created,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.and_then(|s| s.include_usage).unwrap_or(false),
        prompt_tokens: (chars as u64 / 4).max(1),
        reasoning,
        content,
        finish_reason,
        ttft: Duration::from_millis(o.ttft_ms.unwrap_or(config.ttft_ms)),
        interval: Duration::from_millis(o.token_interval_ms.unwrap_or(config.token_interval_ms)),
        abort_after: o.abort_after.or(config.abort_after),
        error_status,
        token_bytes: usize::try_from(o.token_bytes.unwrap_or(config.token_bytes).min(64 << 20)).unwrap_or(0),
        hangup: o.hangup.unwrap_or(false),
    })
}

/// Characters of a message's content: a string, or the text of its parts.
fn content_chars(content: &serde_json::Value) -> usize {
    match content {
        serde_json::Value::String(s) => s.chars().count(),
        serde_json::Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).map(|t| t.chars().count()).sum()
        }
        _ => 0,
    }
}

/// Text of content token `i`.
pub fn content_token(i: u64) -> String {
    format!("tok{i} ")
}

/// Text of reasoning token `i`.
pub fn reasoning_token(i: u64) -> String {
    format!("think{i} ")
}

fn json_str(s: &str) -> String {
    // Serializing a str cannot fail; the fallback keeps the output valid JSON regardless.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// Builds the JSON of every chunk of one streamed answer; the shared prefix
/// is rendered once.
#[derive(Debug)]
pub struct Chunks {
    /// `{"id":..,"object":"chat.completion.chunk","created":..,"model":..,`
    head: String,
}

impl Chunks {
    /// Chunk builder for `plan`.
    pub fn new(plan: &Plan) -> Self {
        let head = format!(
            "{{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},",
            json_str(&plan.id),
            plan.created,
            json_str(&plan.model)
        );
        Self { head }
    }

    fn choice(&self, delta: &str, finish_reason: Option<&str>) -> String {
        let finish = finish_reason.map_or_else(|| "null".to_owned(), json_str);
        format!(
            "{}\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}",
            self.head
        )
    }

    /// The first chunk: the assistant role with empty content.
    pub fn role(&self) -> String {
        self.choice(r#"{"role":"assistant","content":""}"#, None)
    }

    /// A content delta.
    pub fn content(&self, text: &str) -> String {
        self.choice(&format!("{{\"content\":{}}}", json_str(text)), None)
    }

    /// A reasoning delta.
    pub fn reasoning(&self, text: &str) -> String {
        self.choice(&format!("{{\"reasoning_content\":{}}}", json_str(text)), None)
    }

    /// The finish chunk: empty delta and the finish reason.
    pub fn finish(&self, finish_reason: &str) -> String {
        self.choice("{}", Some(finish_reason))
    }

    /// The usage chunk (`choices: []`).
    pub fn usage(&self, plan: &Plan) -> String {
        format!("{}\"choices\":[],\"usage\":{}}}", self.head, usage_json(plan))
    }
}

fn usage_json(plan: &Plan) -> String {
    let completion = plan.completion_tokens();
    format!(
        "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{},\
         \"prompt_tokens_details\":{{\"cached_tokens\":0}},\
         \"completion_tokens_details\":{{\"reasoning_tokens\":{}}}}}",
        plan.prompt_tokens,
        completion,
        plan.prompt_tokens + completion,
        plan.reasoning
    )
}

/// The whole non-streamed `chat.completion` body.
pub fn completion_body(plan: &Plan) -> String {
    let mut content = String::new();
    for i in 0..plan.content {
        content.push_str(&plan.content_token(i));
    }
    let reasoning = if plan.reasoning > 0 {
        let mut text = String::new();
        for i in 0..plan.reasoning {
            let _ = write!(text, "think{i} ");
        }
        format!(",\"reasoning_content\":{}", json_str(&text))
    } else {
        String::new()
    };
    format!(
        "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\
         \"message\":{{\"role\":\"assistant\",\"content\":{}{reasoning}}},\"logprobs\":null,\
         \"finish_reason\":{}}}],\"usage\":{}}}",
        json_str(&plan.id),
        plan.created,
        json_str(&plan.model),
        json_str(&content),
        json_str(plan.finish_reason),
        usage_json(plan)
    )
}

/// OpenAI-shaped error body. `code` is a JSON value (number, string or null).
pub fn error_body(message: &str, kind: &str, code: &str) -> String {
    format!(
        "{{\"error\":{{\"message\":{},\"type\":{},\"param\":null,\"code\":{code}}}}}",
        json_str(message),
        json_str(kind)
    )
}

/// The configured provider error (`--error-status`).
pub fn mock_error_body(status: u16) -> String {
    format!("{{\"error\":{{\"message\":\"mock provider error\",\"type\":\"mock_error\",\"code\":{status}}}}}")
}

/// `GET /v1/models`.
pub fn models_body(model: &str) -> String {
    format!(
        "{{\"object\":\"list\",\"data\":[{{\"id\":{},\"object\":\"model\",\"created\":0,\"owned_by\":\"iop-mockprov\"}}]}}",
        json_str(model)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn config() -> MockConfig {
        MockConfig::for_tests()
    }

    #[test]
    fn plans_defaults_and_overrides() {
        let body = br#"{"model":"m1","messages":[{"role":"user","content":"0123456789abcdef"}],"stream":true,
            "stream_options":{"include_usage":true},"mock":{"tokens":3,"reasoning":2,"ttft_ms":5}}"#;
        let p = plan(body, &config(), 7, 100).unwrap();
        assert_eq!(p.id, "chatcmpl-mock-7");
        assert_eq!((p.model.as_str(), p.stream, p.include_usage), ("m1", true, true));
        assert_eq!((p.prompt_tokens, p.reasoning, p.content, p.finish_reason), (4, 2, 3, "stop"));
        assert_eq!(p.ttft, Duration::from_millis(5));

        let p = plan(br#"{"messages":[{"role":"user","content":"hi"}]}"#, &config(), 1, 0).unwrap();
        assert_eq!((p.model.as_str(), p.stream, p.prompt_tokens, p.content), ("mock", false, 1, 16));
    }

    #[test]
    fn large_tokens_and_hangup() {
        let body = br#"{"messages":[{"content":"x"}],"mock":{"tokens":2,"token_bytes":1000,"hangup":true}}"#;
        let p = plan(body, &config(), 1, 0).unwrap();
        assert!(p.hangup);
        let t = p.content_token(7);
        assert_eq!(t.len(), 1000);
        assert!(t.starts_with("tok7x") && t.ends_with("x "));
        let p = plan(br#"{"messages":[{"content":"x"}]}"#, &config(), 1, 0).unwrap();
        assert_eq!((p.content_token(3), p.hangup), ("tok3 ".to_owned(), false));
    }

    #[test]
    fn max_tokens_caps_reasoning_then_content() {
        let body =
            br#"{"messages":[{"content":[{"type":"text","text":"12345678"}]}],"max_tokens":5,"mock":{"reasoning":3}}"#;
        let p = plan(body, &config(), 1, 0).unwrap();
        assert_eq!((p.prompt_tokens, p.reasoning, p.content, p.finish_reason), (2, 3, 2, "length"));
        let body = br#"{"messages":[{"content":"x"}],"max_tokens":100,"max_completion_tokens":4}"#;
        let p = plan(body, &config(), 1, 0).unwrap();
        assert_eq!((p.content, p.finish_reason), (4, "length"));
        let body = br#"{"messages":[{"content":"x"}],"max_tokens":16}"#;
        assert_eq!(plan(body, &config(), 1, 0).unwrap().finish_reason, "stop");
    }

    #[test]
    fn rejects_bad_requests() {
        for bad in [
            &b"not json"[..],
            b"{}",
            br#"{"messages":[]}"#,
            br#"{"messages":"x"}"#,
            br#"{"messages":[{"content":"x"}],"mock":{"error_status":200}}"#,
            br#"{"messages":[{"content":"x"}],"mock":{"bogus":1}}"#,
            br#"{"messages":[{"content":"x"}],"max_tokens":-1}"#,
        ] {
            assert!(plan(bad, &config(), 1, 0).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn chunks_are_openai_shaped() {
        let body = br#"{"model":"m\"q","messages":[{"content":"x"}],"mock":{"reasoning":1,"tokens":2}}"#;
        let p = plan(body, &config(), 9, 123).unwrap();
        let c = Chunks::new(&p);
        let role: Value = serde_json::from_str(&c.role()).unwrap();
        assert_eq!(role["id"], "chatcmpl-mock-9");
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["created"], 123);
        assert_eq!(role["model"], "m\"q");
        assert_eq!(role["choices"][0]["index"], 0);
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
        let tok: Value = serde_json::from_str(&c.content(&content_token(1))).unwrap();
        assert_eq!(tok["choices"][0]["delta"]["content"], "tok1 ");
        let think: Value = serde_json::from_str(&c.reasoning(&reasoning_token(0))).unwrap();
        assert_eq!(think["choices"][0]["delta"]["reasoning_content"], "think0 ");
        let fin: Value = serde_json::from_str(&c.finish("stop")).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "stop");
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        let usage: Value = serde_json::from_str(&c.usage(&p)).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 3);
        assert_eq!(usage["usage"]["total_tokens"], 4);
        assert_eq!(usage["usage"]["completion_tokens_details"]["reasoning_tokens"], 1);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

        let full: Value = serde_json::from_str(&completion_body(&p)).unwrap();
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], "tok0 tok1 ");
        assert_eq!(full["choices"][0]["message"]["reasoning_content"], "think0 ");
        let err: Value = serde_json::from_str(&mock_error_body(503)).unwrap();
        assert_eq!(err["error"]["code"], 503);
        let err: Value = serde_json::from_str(&error_body("a \"b\"", "invalid_request_error", "null")).unwrap();
        assert_eq!(err["error"]["message"], "a \"b\"");
        let models: Value = serde_json::from_str(&models_body("mock")).unwrap();
        assert_eq!(models["data"][0]["id"], "mock");
    }
}
