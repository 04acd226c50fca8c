//! The per-request `"mock": {...}` object and its resolution against the CLI
//! defaults. Every endpoint (OpenAI and Ollama) accepts the same object; an
//! endpoint ignores the keys that have no meaning for it.

use std::time::Duration;

use serde::Deserialize;

use super::MockConfig;

/// Most token steps one write may carry (`burst`).
pub const MAX_BURST: u64 = 4096;

/// Most parallel tool calls or choices one answer may carry.
pub const MAX_FANOUT: u64 = 128;

/// Per-request behaviour overrides (`"mock": {...}` in the request body).
/// Unknown keys are refused, so a typo fails loudly instead of testing nothing.
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
    /// Go silent after this many content chunks of a stream (the
    /// connection stays open, nothing more is sent until the client leaves).
    pub stall_after: Option<u64>,
    /// Send the whole stream, terminal event included, but never end the
    /// body: the connection stays open until the client leaves.
    pub hold_open: Option<bool>,
    /// Reasoning tokens before the content.
    pub reasoning: Option<u64>,
    /// Pad every content token to at least this many bytes.
    pub token_bytes: Option<u64>,
    /// Read the request, then close the connection without answering.
    pub hangup: Option<bool>,
    /// Token steps written together, in one write after this many
    /// intervals (streams).
    pub burst: Option<u64>,
    /// Answer with this many parallel tool calls instead of content (0: content).
    pub tool_calls: Option<u64>,
    /// Function name of the tool calls.
    pub tool_name: Option<String>,
    /// Answer with this refusal instead of content (empty: content).
    pub refusal: Option<String>,
    /// Attach logprobs to every content token, as if the request asked.
    pub logprobs: Option<bool>,
    /// A label of the request: when its client leaves before the answer is
    /// complete, the instant is listed under this tag at `GET /closes`.
    pub tag: Option<String>,
}

/// A request the mock refuses, answered as a 400 in the endpoint's error shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Error statuses the mock agrees to produce.
pub fn valid_error_status(status: u16) -> bool {
    (400..=599).contains(&status)
}

/// The overrides merged with the CLI defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    /// Content tokens.
    pub tokens: u64,
    /// Reasoning tokens.
    pub reasoning: u64,
    /// Whether the request itself set `reasoning` (Ollama's `think` needs to know).
    pub reasoning_set: bool,
    /// Delay before the first token.
    pub ttft: Duration,
    /// Delay between tokens.
    pub interval: Duration,
    /// Close after this many content chunks.
    pub abort_after: Option<u64>,
    /// Go silent after this many content chunks (streams).
    pub stall_after: Option<u64>,
    /// Never end a stream's body (streams).
    pub hold_open: bool,
    /// Token steps written together (streams; at least 1).
    pub burst: u64,
    /// Answer with this error status.
    pub error_status: Option<u16>,
    /// Content tokens are padded to at least this many bytes.
    pub token_bytes: usize,
    /// Close without answering.
    pub hangup: bool,
    /// Parallel tool calls (0: none).
    pub tool_calls: u64,
    /// Function name of the tool calls.
    pub tool_name: String,
    /// Refusal text (`None`: no refusal).
    pub refusal: Option<String>,
    /// Logprobs forced on.
    pub logprobs: bool,
    /// The request's tag.
    pub tag: Option<String>,
}

/// Longest tag accepted.
pub const MAX_TAG_BYTES: usize = 128;

impl Knobs {
    /// Merges `o` over `config`, refusing values the mock cannot honour.
    pub fn resolve(o: Option<MockOverrides>, config: &MockConfig) -> Result<Self, BadRequest> {
        let o = o.unwrap_or_default();
        let error_status = o.error_status.or(config.error_status);
        if let Some(status) = error_status {
            if !valid_error_status(status) {
                return Err(BadRequest(format!("mock.error_status {status} is not in 400..=599")));
            }
        }
        let tool_calls = o.tool_calls.unwrap_or(config.tool_calls);
        if tool_calls > MAX_FANOUT {
            return Err(BadRequest(format!("mock.tool_calls {tool_calls} is above {MAX_FANOUT}")));
        }
        if o.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG_BYTES) {
            return Err(BadRequest(format!("mock.tag is longer than {MAX_TAG_BYTES} bytes")));
        }
        Ok(Self {
            tokens: o.tokens.unwrap_or(config.tokens),
            reasoning: o.reasoning.unwrap_or(config.reasoning),
            reasoning_set: o.reasoning.is_some(),
            ttft: Duration::from_millis(o.ttft_ms.unwrap_or(config.ttft_ms)),
            interval: Duration::from_millis(o.token_interval_ms.unwrap_or(config.token_interval_ms)),
            abort_after: o.abort_after.or(config.abort_after),
            stall_after: o.stall_after,
            hold_open: o.hold_open.unwrap_or(false),
            burst: o.burst.unwrap_or(config.burst).clamp(1, MAX_BURST),
            error_status,
            token_bytes: usize::try_from(o.token_bytes.unwrap_or(config.token_bytes).min(64 << 20)).unwrap_or(0),
            hangup: o.hangup.unwrap_or(false),
            tool_calls,
            tool_name: o.tool_name.or_else(|| config.tool_name.clone()).unwrap_or_else(|| "get_weather".to_owned()),
            refusal: o.refusal.or_else(|| config.refusal.clone()).filter(|r| !r.is_empty()),
            logprobs: o.logprobs.unwrap_or(config.logprobs),
            tag: o.tag,
        })
    }

    /// Time a real server would take to produce `tokens` tokens, for answers
    /// that are sent whole: the first-token delay plus one interval per gap.
    pub fn whole_delay(&self, tokens: u64) -> Duration {
        let gaps = u32::try_from(tokens.saturating_sub(1)).unwrap_or(u32::MAX);
        self.ttft.saturating_add(self.interval.saturating_mul(gaps))
    }
}

/// Content token `i` of choice `choice`: `tok<i> ` (choice 0) or
/// `tok<i>-c<choice> ` (so the choices of one answer differ), padded with `x`
/// before the space up to `token_bytes`.
pub fn content_token(choice: u64, i: u64, token_bytes: usize) -> String {
    let mut t = if choice == 0 { format!("tok{i}") } else { format!("tok{i}-c{choice}") };
    if token_bytes > t.len() + 1 {
        t.extend(std::iter::repeat_n('x', token_bytes - t.len() - 1));
    }
    t.push(' ');
    t
}

/// Reasoning token `i` of choice `choice`: `think<i> ` or `think<i>-c<choice> `.
pub fn reasoning_token(choice: u64, i: u64) -> String {
    if choice == 0 {
        format!("think{i} ")
    } else {
        format!("think{i}-c{choice} ")
    }
}

/// `text` cut after every space, so that concatenating the pieces gives
/// `text` back (refusals and tool-result echoes are streamed as these pieces).
pub fn split_words(text: &str) -> Vec<String> {
    text.split_inclusive(' ').map(str::to_owned).collect()
}

/// Prompt tokens of `chars` characters of input: one per four, at least one.
pub fn prompt_tokens(chars: usize) -> u64 {
    (chars as u64 / 4).max(1)
}

/// Characters of an OpenAI message `content`: a string, or the text of its parts.
pub fn content_chars(content: &serde_json::Value) -> usize {
    match content {
        serde_json::Value::String(s) => s.chars().count(),
        serde_json::Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).map(|t| t.chars().count()).sum()
        }
        _ => 0,
    }
}

/// The text of an OpenAI message `content` (string or text parts, joined).
pub fn content_text(content: &serde_json::Value) -> String {
    match content {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).collect::<Vec<_>>().concat()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn resolves_over_config() {
        let config = MockConfig::for_tests();
        let k = Knobs::resolve(None, &config).unwrap();
        assert_eq!((k.tokens, k.reasoning, k.reasoning_set, k.tool_calls), (16, 0, false, 0));
        assert_eq!((k.tool_name.as_str(), k.refusal.as_deref(), k.logprobs), ("get_weather", None, false));
        let o: MockOverrides = serde_json::from_str(
            r#"{"tokens":2,"reasoning":0,"ttft_ms":5,"tool_calls":3,"tool_name":"f","refusal":"no","logprobs":true}"#,
        )
        .unwrap();
        let k = Knobs::resolve(Some(o), &config).unwrap();
        assert_eq!((k.tokens, k.reasoning_set, k.tool_calls, k.tool_name.as_str()), (2, true, 3, "f"));
        assert_eq!((k.refusal.as_deref(), k.logprobs, k.ttft), (Some("no"), true, Duration::from_millis(5)));
        let o: MockOverrides = serde_json::from_str(r#"{"refusal":""}"#).unwrap();
        assert_eq!(Knobs::resolve(Some(o), &config).unwrap().refusal, None);
        let o: MockOverrides = serde_json::from_str(r#"{"tag":"t-1"}"#).unwrap();
        assert_eq!(Knobs::resolve(Some(o), &config).unwrap().tag.as_deref(), Some("t-1"));
        let long = format!(r#"{{"tag":"{}"}}"#, "x".repeat(MAX_TAG_BYTES + 1));
        for bad in [r#"{"error_status":200}"#, r#"{"tool_calls":1000}"#, long.as_str()] {
            let o: MockOverrides = serde_json::from_str(bad).unwrap();
            assert!(Knobs::resolve(Some(o), &config).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<MockOverrides>(r#"{"bogus":1}"#).is_err());
    }

    #[test]
    fn tokens_and_words() {
        assert_eq!(content_token(0, 3, 0), "tok3 ");
        assert_eq!(content_token(2, 3, 0), "tok3-c2 ");
        let t = content_token(0, 7, 1000);
        assert_eq!(t.len(), 1000);
        assert!(t.starts_with("tok7x") && t.ends_with("x "));
        assert_eq!((reasoning_token(0, 1), reasoning_token(1, 1)), ("think1 ".to_owned(), "think1-c1 ".to_owned()));
        assert_eq!(split_words("tool said: 11 C"), ["tool ", "said: ", "11 ", "C"]);
        assert_eq!(split_words("").concat(), "");
        assert_eq!((prompt_tokens(0), prompt_tokens(17)), (1, 4));
        let parts = serde_json::json!([{"type":"text","text":"ab"},{"type":"image_url"},{"type":"text","text":"c"}]);
        assert_eq!((content_chars(&parts), content_text(&parts).as_str()), (3, "abc"));
    }
}
