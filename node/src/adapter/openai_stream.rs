//! Sans-IO mapping of OpenAI chat-completion responses (SSE chunks or one
//! JSON object) to run events, and of error bodies to failures.

use iop_core::exec::{codes, ExecEvent, FailureSource, RunFailure, Usage};
use serde::Deserialize;
use serde_json::Value;

/// Longest error message passed on, in characters.
const MAX_MESSAGE_CHARS: usize = 512;

/// A chunk or a whole completion. Every field is optional so unknown or
/// partial shapes from other servers still parse.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletionJson {
    model: Option<String>,
    choices: Option<Vec<ChoiceJson>>,
    usage: Option<UsageJson>,
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChoiceJson {
    /// Streaming chunks.
    delta: Option<MessageJson>,
    /// Non-streaming completions.
    message: Option<MessageJson>,
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MessageJson {
    // `Value` because some servers send content parts or null here.
    content: Option<Value>,
    reasoning_content: Option<Value>,
    reasoning: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UsageJson {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    completion_tokens_details: Option<CompletionDetailsJson>,
    prompt_tokens_details: Option<PromptDetailsJson>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletionDetailsJson {
    reasoning_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PromptDetailsJson {
    cached_tokens: Option<u64>,
}

impl From<UsageJson> for Usage {
    fn from(u: UsageJson) -> Self {
        Usage {
            input_tokens: u.prompt_tokens.unwrap_or(0),
            output_tokens: u.completion_tokens.unwrap_or(0),
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            cached_input_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// Whether the stream goes on after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// More chunks expected.
    Continue,
    /// A terminal event was produced.
    Done,
}

/// State of one response being mapped.
#[derive(Debug)]
pub(crate) struct StreamState {
    target: String,
    started: bool,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

impl StreamState {
    /// `target` is the model name used for `Start` when the provider names none.
    pub(crate) fn new(target: &str) -> Self {
        Self { target: target.to_owned(), started: false, finish_reason: None, usage: None }
    }

    /// Maps the data of one SSE event.
    pub(crate) fn on_data(&mut self, data: &str, out: &mut Vec<ExecEvent>) -> Flow {
        let data = data.trim();
        if data.is_empty() {
            return Flow::Continue;
        }
        if data == "[DONE]" {
            self.complete(out);
            return Flow::Done;
        }
        let chunk: CompletionJson = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(e) => {
                out.push(ExecEvent::Error(protocol(format!("malformed stream chunk: {e}"))));
                return Flow::Done;
            }
        };
        if let Some(err) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            out.push(ExecEvent::Error(error_chunk_failure(err)));
            return Flow::Done;
        }
        self.start(chunk.model.as_deref(), out);
        if let Some(u) = chunk.usage {
            self.usage = Some(u.into());
        }
        if let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) {
            if let Some(delta) = choice.delta.or(choice.message) {
                push_message(delta, out);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        Flow::Continue
    }

    /// The stream ended without `[DONE]`: complete if the provider said why
    /// it finished, fail otherwise.
    pub(crate) fn on_eof(&mut self, out: &mut Vec<ExecEvent>) {
        if self.finish_reason.is_some() {
            self.complete(out);
        } else {
            out.push(ExecEvent::Error(protocol("upstream stream ended before [DONE]")));
        }
    }

    /// Maps a non-streaming `chat.completion` body.
    pub(crate) fn on_completion_body(&mut self, body: &[u8], out: &mut Vec<ExecEvent>) {
        let completion: CompletionJson = match serde_json::from_slice(body) {
            Ok(c) => c,
            Err(e) => {
                out.push(ExecEvent::Error(protocol(format!("malformed completion body: {e}"))));
                return;
            }
        };
        if let Some(err) = completion.error.as_ref().filter(|e| !e.is_null()) {
            out.push(ExecEvent::Error(error_chunk_failure(err)));
            return;
        }
        let Some(choice) = completion.choices.and_then(|c| c.into_iter().next()) else {
            out.push(ExecEvent::Error(protocol("completion body has no choices")));
            return;
        };
        self.start(completion.model.as_deref(), out);
        if let Some(message) = choice.message.or(choice.delta) {
            push_message(message, out);
        }
        self.finish_reason = choice.finish_reason.filter(|r| !r.is_empty());
        self.usage = completion.usage.map(Usage::from);
        self.complete(out);
    }

    fn start(&mut self, model: Option<&str>, out: &mut Vec<ExecEvent>) {
        if !self.started {
            self.started = true;
            let model = model.filter(|m| !m.is_empty()).unwrap_or(&self.target).to_owned();
            out.push(ExecEvent::Start { model });
        }
    }

    fn complete(&mut self, out: &mut Vec<ExecEvent>) {
        self.start(None, out);
        let finish_reason = self.finish_reason.take().unwrap_or_else(|| "stop".to_owned());
        out.push(ExecEvent::Complete { finish_reason, usage: self.usage.take() });
    }
}

/// Reasoning first, then content; empty texts are dropped.
fn push_message(m: MessageJson, out: &mut Vec<ExecEvent>) {
    let reasoning = text(m.reasoning_content).or_else(|| text(m.reasoning));
    if let Some(r) = reasoning {
        out.push(ExecEvent::ReasoningDelta(r));
    }
    if let Some(c) = text(m.content) {
        out.push(ExecEvent::Delta(c));
    }
}

fn text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// A broken or malformed stream.
pub(crate) fn protocol(message: impl Into<String>) -> RunFailure {
    RunFailure::new(codes::UPSTREAM_PROTOCOL, 502, FailureSource::Provider, message)
}

/// Statuses after which another attempt may succeed.
fn retryable_status(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// A non-2xx answer, with the provider's message from its body.
pub(crate) fn status_failure(status: u16, body: &[u8]) -> RunFailure {
    let message = error_message(body).unwrap_or_else(|| format!("upstream answered HTTP {status}"));
    // Only error statuses pass through; anything else (3xx) is a bad gateway.
    let answer = if (400..=599).contains(&status) { status } else { 502 };
    let failure = RunFailure::new(codes::UPSTREAM_STATUS, answer, FailureSource::Provider, message);
    if retryable_status(status) {
        failure.retryable()
    } else {
        failure
    }
}

/// An `{"error": ...}` chunk inside a 2xx stream.
fn error_chunk_failure(err: &Value) -> RunFailure {
    let message = json_message(err)
        .or_else(|| err.as_str().map(str::to_owned))
        .unwrap_or_else(|| "upstream reported an error".to_owned());
    // vLLM and others put the HTTP status they would have sent in `code`.
    let status = err
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..=599).contains(c))
        .unwrap_or(502);
    let failure = RunFailure::new(codes::UPSTREAM_STATUS, status, FailureSource::Provider, truncate(&message));
    if retryable_status(status) {
        failure.retryable()
    } else {
        failure
    }
}

/// The human-readable message of an error body: `error.message`,
/// `error` (a string), `message` or `detail`, else the raw text truncated.
/// `None` for an empty body.
pub(crate) fn error_message(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let found = v.get("error").and_then(|e| json_message(e).or_else(|| e.as_str().map(str::to_owned)));
        if let Some(m) = found.or_else(|| json_message(&v)) {
            return Some(truncate(&m));
        }
    }
    let raw = String::from_utf8_lossy(body);
    let raw = raw.trim();
    (!raw.is_empty()).then(|| truncate(raw))
}

/// `message`, or `detail` (FastAPI sends validation details as a list).
fn json_message(v: &Value) -> Option<String> {
    if let Some(m) = v.get("message").and_then(Value::as_str).filter(|m| !m.is_empty()) {
        return Some(m.to_owned());
    }
    match v.get("detail")? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn map(chunks: &[&str], eof: bool) -> Vec<ExecEvent> {
        let mut st = StreamState::new("target-m");
        let mut out = Vec::new();
        for c in chunks {
            if st.on_data(c, &mut out) == Flow::Done {
                return out;
            }
        }
        if eof {
            st.on_eof(&mut out);
        }
        out
    }

    fn start(m: &str) -> ExecEvent {
        ExecEvent::Start { model: m.into() }
    }

    #[test]
    fn content_and_done_with_usage() {
        let evs = map(
            &[
                r#"{"id":"x","model":"served-m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"model":"served-m","choices":[{"delta":{"content":"Hel"},"finish_reason":null}]}"#,
                r#"{"choices":[{"delta":{"content":"lo"},"finish_reason":"length"}],"usage":null}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}"#,
                "[DONE]",
                r#"{"choices":[{"delta":{"content":"after done"}}]}"#,
            ],
            true,
        );
        assert_eq!(
            evs,
            vec![
                start("served-m"),
                ExecEvent::Delta("Hel".into()),
                ExecEvent::Delta("lo".into()),
                ExecEvent::Complete {
                    finish_reason: "length".into(),
                    usage: Some(Usage { input_tokens: 7, output_tokens: 2, ..Default::default() }),
                },
            ]
        );
    }

    #[test]
    fn reasoning_fields_and_usage_details() {
        let evs = map(
            &[
                r#"{"choices":[{"delta":{"reasoning_content":"think a"}}]}"#,
                r#"{"choices":[{"delta":{"reasoning":"think b","content":"answer"}}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,
                    "completion_tokens_details":{"reasoning_tokens":3},
                    "prompt_tokens_details":{"cached_tokens":4}}}"#,
                "[DONE]",
            ],
            false,
        );
        assert_eq!(
            evs,
            vec![
                start("target-m"),
                ExecEvent::ReasoningDelta("think a".into()),
                ExecEvent::ReasoningDelta("think b".into()),
                ExecEvent::Delta("answer".into()),
                ExecEvent::Complete {
                    finish_reason: "stop".into(),
                    usage: Some(Usage {
                        input_tokens: 10,
                        output_tokens: 5,
                        reasoning_tokens: Some(3),
                        cached_input_tokens: Some(4),
                    }),
                },
            ]
        );
    }

    #[test]
    fn done_without_finish_reason_defaults_to_stop_and_no_usage() {
        let evs = map(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#, "[DONE]"], false);
        assert_eq!(evs.last(), Some(&ExecEvent::Complete { finish_reason: "stop".into(), usage: None }));
        // [DONE] alone still starts the run first.
        assert_eq!(map(&["[DONE]"], false)[0], start("target-m"));
    }

    #[test]
    fn error_chunk_ends_the_stream() {
        let evs = map(
            &[
                r#"{"choices":[{"delta":{"content":"x"}}]}"#,
                r#"{"error":{"message":"model overloaded","type":"ServiceUnavailable","code":503}}"#,
                r#"{"choices":[{"delta":{"content":"y"}}]}"#,
            ],
            true,
        );
        assert_eq!(evs.len(), 3);
        let ExecEvent::Error(f) = &evs[2] else { panic!("{evs:?}") };
        assert_eq!(
            (f.code, f.status, f.retryable, f.source),
            (codes::UPSTREAM_STATUS, 503, true, FailureSource::Provider)
        );
        assert_eq!(f.message, "model overloaded");
        // A string error without a usable code.
        let evs = map(&[r#"{"error":"boom"}"#], true);
        let ExecEvent::Error(f) = &evs[0] else { panic!("{evs:?}") };
        assert_eq!((f.status, f.retryable, f.message.as_str()), (502, true, "boom"));
    }

    #[test]
    fn missing_done_completes_only_with_finish_reason() {
        let evs = map(&[r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}"#], true);
        assert_eq!(evs.last(), Some(&ExecEvent::Complete { finish_reason: "stop".into(), usage: None }));
        let evs = map(&[r#"{"choices":[{"delta":{"content":"x"}}]}"#], true);
        let ExecEvent::Error(f) = evs.last().unwrap() else { panic!("{evs:?}") };
        assert_eq!((f.code, f.status, f.retryable), (codes::UPSTREAM_PROTOCOL, 502, false));
        // Nothing at all: an error, no Start.
        let evs = map(&[], true);
        assert!(matches!(evs.as_slice(), [ExecEvent::Error(_)]), "{evs:?}");
    }

    #[test]
    fn malformed_chunk_is_a_protocol_error() {
        let evs = map(&["{not json", r#"{"choices":[]}"#], true);
        let ExecEvent::Error(f) = &evs[0] else { panic!("{evs:?}") };
        assert_eq!(f.code, codes::UPSTREAM_PROTOCOL);
        assert_eq!(evs.len(), 1);
    }

    #[test]
    fn odd_but_valid_shapes_are_tolerated() {
        let evs = map(
            &[
                r#"{"choices":[{"delta":{"content":null,"tool_calls":[{"id":"t"}]}}],"system_fingerprint":"x","usage":{}}"#,
                r#"{"choices":[{"delta":{"content":[{"type":"text","text":"ignored"}]}}]}"#,
                r#"{"choices":null}"#,
                "",
                "[DONE]",
            ],
            false,
        );
        assert_eq!(
            evs,
            vec![
                start("target-m"),
                ExecEvent::Complete { finish_reason: "stop".into(), usage: Some(Usage::default()) }
            ]
        );
    }

    #[test]
    fn non_streaming_completion_body() {
        let body = br#"{"id":"c","object":"chat.completion","model":"served",
            "choices":[{"index":0,"message":{"role":"assistant","content":"Hi!","reasoning_content":"hmm"},
            "finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let mut st = StreamState::new("t");
        let mut out = Vec::new();
        st.on_completion_body(body, &mut out);
        assert_eq!(
            out,
            vec![
                start("served"),
                ExecEvent::ReasoningDelta("hmm".into()),
                ExecEvent::Delta("Hi!".into()),
                ExecEvent::Complete {
                    finish_reason: "stop".into(),
                    usage: Some(Usage { input_tokens: 3, output_tokens: 2, ..Default::default() }),
                },
            ]
        );
        let mut out = Vec::new();
        StreamState::new("t").on_completion_body(b"{}", &mut out);
        assert!(matches!(out.as_slice(), [ExecEvent::Error(f)] if f.code == codes::UPSTREAM_PROTOCOL), "{out:?}");
    }

    #[test]
    fn error_body_extraction() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (br#"{"error":{"message":"Rate limit reached","type":"requests"}}"#, Some("Rate limit reached")),
            (br#"{"error":"model not found"}"#, Some("model not found")),
            (br#"{"object":"error","message":"bad max_tokens","code":400}"#, Some("bad max_tokens")),
            (br#"{"detail":"Not Found"}"#, Some("Not Found")),
            (
                br#"{"detail":[{"loc":["body"],"msg":"field required"}]}"#,
                Some(r#"[{"loc":["body"],"msg":"field required"}]"#),
            ),
            (b"  Bad Gateway\n", Some("Bad Gateway")),
            (br#"{"unrelated":1}"#, Some(r#"{"unrelated":1}"#)),
            (b"", None),
            (b"\xff\xfe", Some("\u{fffd}\u{fffd}")),
        ];
        for (body, want) in cases {
            assert_eq!(error_message(body).as_deref(), *want, "{}", String::from_utf8_lossy(body));
        }
        let long = "é".repeat(2000);
        let m = error_message(long.as_bytes()).unwrap();
        assert_eq!(m.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn status_failures_are_classified() {
        for (status, retryable) in
            [(400, false), (401, false), (429, true), (500, false), (502, true), (503, true), (504, true)]
        {
            let f = status_failure(status, b"");
            assert_eq!(
                (f.code, f.status, f.retryable, f.source),
                (codes::UPSTREAM_STATUS, status, retryable, FailureSource::Provider)
            );
            assert_eq!(f.message, format!("upstream answered HTTP {status}"));
        }
        assert_eq!(status_failure(302, b"moved").status, 502);
        assert_eq!(status_failure(404, br#"{"error":{"message":"no such model"}}"#).message, "no such model");
    }
}
