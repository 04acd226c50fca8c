//! Sans-IO mapping of OpenAI chat-completion responses (SSE chunks or one
//! JSON object) to run events, and of error bodies to failures.

use std::borrow::Cow;

use bytes::Bytes;
use iop_core::exec::{codes, Delta, ExecEvent, FailureSource, Part, ProviderError, RunFailure, ToolCallDelta, Usage};
use serde::Deserialize;
use serde_json::{value::RawValue, Value};
use smallvec::SmallVec;

/// Longest error message passed on, in characters.
const MAX_MESSAGE_CHARS: usize = 512;

/// A chunk or a whole completion. Every field is optional so unknown or
/// partial shapes from other servers still parse.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct CompletionJson<'a> {
    #[serde(borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    /// One choice (the usual) held inline.
    #[serde(borrow)]
    pub(super) choices: Option<SmallVec<[ChoiceJson<'a>; 1]>>,
    usage: Option<UsageJson>,
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ChoiceJson<'a> {
    pub(super) index: Option<u32>,
    /// Streaming chunks.
    pub(super) delta: Option<MessageJson>,
    /// Non-streaming completions.
    pub(super) message: Option<MessageJson>,
    pub(super) finish_reason: Option<String>,
    /// vLLM: the stop string that ended the choice (a token id, or null,
    /// otherwise: only a string names a stop sequence).
    pub(super) stop_reason: Option<Value>,
    /// Passed on as sent.
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct MessageJson {
    // `Value` because some servers send content parts or null here.
    pub(super) content: Option<Value>,
    pub(super) reasoning_content: Option<Value>,
    pub(super) reasoning: Option<Value>,
    pub(super) refusal: Option<Value>,
    tool_calls: Option<Vec<ToolCallJson>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolCallJson {
    index: Option<u32>,
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: Option<FunctionJson>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FunctionJson {
    name: Option<String>,
    /// A JSON text (OpenAI); some servers send an object.
    arguments: Option<Value>,
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

impl UsageJson {
    /// Usage, when the provider said at least how many prompt tokens.
    fn into_usage(self) -> Option<Usage> {
        Some(Usage {
            input_tokens: self.prompt_tokens?,
            output_tokens: self.completion_tokens.unwrap_or(0),
            reasoning_tokens: self.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            cached_input_tokens: self.prompt_tokens_details.and_then(|d| d.cached_tokens),
        })
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
    /// Finish reason of each choice that finished.
    finished: Vec<(u32, String)>,
    usage: Option<Usage>,
}

impl StreamState {
    /// `target` is the model name used for `Start` when the provider names none.
    pub(crate) fn new(target: &str) -> Self {
        Self { target: target.to_owned(), started: false, finished: Vec::new(), usage: None }
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
        // The common chunk by hand; anything else (and every error) by serde.
        let chunk: CompletionJson = match super::openai_line::parse(data).map_or_else(|| serde_json::from_str(data), Ok)
        {
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
        if let Some(u) = chunk.usage.and_then(UsageJson::into_usage) {
            self.usage = Some(u);
        }
        for (i, choice) in chunk.choices.unwrap_or_default().into_iter().enumerate() {
            self.choice(choice, u32::try_from(i).unwrap_or(u32::MAX), out);
        }
        Flow::Continue
    }

    /// The stream ended without `[DONE]`: complete if the provider said why
    /// it finished, fail otherwise.
    pub(crate) fn on_eof(&mut self, out: &mut Vec<ExecEvent>) {
        if self.finished.is_empty() {
            out.push(ExecEvent::Error(protocol("upstream stream ended before [DONE]")));
        } else {
            self.complete(out);
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
        let choices = completion.choices.unwrap_or_default();
        if choices.is_empty() {
            out.push(ExecEvent::Error(protocol("completion body has no choices")));
            return;
        }
        self.start(completion.model.as_deref(), out);
        for (i, choice) in choices.into_iter().enumerate() {
            self.choice(choice, u32::try_from(i).unwrap_or(u32::MAX), out);
        }
        self.usage = completion.usage.and_then(UsageJson::into_usage);
        self.complete(out);
    }

    /// One choice of a chunk or completion (`position` when it has no index).
    fn choice(&mut self, choice: ChoiceJson<'_>, position: u32, out: &mut Vec<ExecEvent>) {
        let index = choice.index.unwrap_or(position);
        let mut logprobs = choice.logprobs.map(|raw| Bytes::copy_from_slice(raw.get().as_bytes()));
        if let Some(m) = choice.delta.or(choice.message) {
            push_message(m, index, &mut logprobs, out);
        }
        if let Some(lp) = logprobs {
            // Log probabilities with no text beside them still reach the client.
            out.push(ExecEvent::Delta(Delta { choice: index, part: Part::Content(String::new()), logprobs: Some(lp) }));
        }
        if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
            self.finished.push((index, reason.clone()));
            let stop_sequence = match choice.stop_reason {
                Some(Value::String(s)) if reason == "stop" && !s.is_empty() => Some(s),
                _ => None,
            };
            out.push(ExecEvent::ChoiceFinish { choice: index, finish_reason: reason, stop_sequence });
        }
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
        let finish_reason =
            self.finished.iter().find(|(c, _)| *c == 0).map_or_else(|| "stop".to_owned(), |(_, r)| r.clone());
        out.push(ExecEvent::Complete { finish_reason, usage: self.usage.take() });
    }
}

/// Reasoning, refusal, content, then tool calls; empty texts are dropped.
/// The choice's log probabilities go with its first content or refusal.
fn push_message(m: MessageJson, choice: u32, logprobs: &mut Option<Bytes>, out: &mut Vec<ExecEvent>) {
    let delta = |part, logprobs| ExecEvent::Delta(Delta { choice, part, logprobs });
    if let Some(r) = text(m.reasoning_content).or_else(|| text(m.reasoning)) {
        out.push(delta(Part::Reasoning(r), None));
    }
    if let Some(r) = text(m.refusal) {
        out.push(delta(Part::Refusal(r), logprobs.take()));
    }
    if let Some(c) = text(m.content) {
        out.push(delta(Part::Content(c), logprobs.take()));
    }
    for (i, call) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
        let function = call.function.unwrap_or_default();
        let arguments = match function.arguments {
            Some(Value::String(s)) => s,
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        };
        out.push(delta(
            Part::ToolCall(Box::new(ToolCallDelta {
                index: call.index.unwrap_or(u32::try_from(i).unwrap_or(u32::MAX)),
                id: call.id.unwrap_or_default(),
                kind: call.kind.unwrap_or_default(),
                name: function.name.unwrap_or_default(),
                arguments,
            })),
            None,
        ));
    }
}

fn text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s),
        // An empty text's memory holds the next token.
        Value::String(s) => {
            crate::spare::keep(s);
            None
        }
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

/// A non-2xx answer, with the provider's message, error fields and
/// `Retry-After` (`retry_after_ms`, from the response headers).
pub(crate) fn status_failure(status: u16, body: &[u8], retry_after_ms: Option<u64>) -> RunFailure {
    let message = error_message(body).unwrap_or_else(|| format!("upstream answered HTTP {status}"));
    // Only error statuses pass through; anything else (3xx) is a bad gateway.
    let answer = if (400..=599).contains(&status) { status } else { 502 };
    let provider = serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("error").map(provider_fields));
    let failure = RunFailure::new(codes::UPSTREAM_STATUS, answer, FailureSource::Provider, message)
        .with_provider(provider, retry_after_ms);
    if retryable_status(status) {
        failure.retryable()
    } else {
        failure
    }
}

/// `code`, `param` and `type` of an OpenAI-shaped error object.
fn provider_fields(err: &Value) -> ProviderError {
    let field = |k: &str| match err.get(k)? {
        Value::String(s) => Some(truncate(s)),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    ProviderError { code: field("code"), param: field("param"), kind: field("type") }
}

/// The wait a provider asked for: `retry-after-ms`, else `retry-after`
/// in seconds (an HTTP date is not honoured: the edge says 1 s then).
pub(crate) fn retry_after_ms(ms: Option<&[u8]>, secs: Option<&[u8]>) -> Option<u64> {
    let num = |v: &[u8]| std::str::from_utf8(v).ok()?.trim().parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0);
    ms.and_then(num).or_else(|| secs.and_then(num).map(|s| s * 1000.0)).map(|m| m.min(86_400_000.0) as u64)
}

/// An `{"error": ...}` chunk inside a 2xx stream.
pub(crate) fn error_chunk_failure(err: &Value) -> RunFailure {
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
    let failure = RunFailure::new(codes::UPSTREAM_STATUS, status, FailureSource::Provider, truncate(&message))
        .with_provider(Some(provider_fields(err)), None);
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
                ExecEvent::content("Hel"),
                ExecEvent::content("lo"),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "length".into(), stop_sequence: None },
                ExecEvent::Complete {
                    finish_reason: "length".into(),
                    usage: Some(Usage { input_tokens: 7, output_tokens: 2, ..Default::default() }),
                },
            ]
        );
    }

    #[test]
    fn a_stop_string_vllm_names_is_the_stop_sequence() {
        let evs = map(
            &[
                r#"{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null,"stop_reason":null}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"END"}]}"#,
                "[DONE]",
            ],
            false,
        );
        let stop =
            ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: Some("END".into()) };
        assert_eq!(evs[2], stop);
        // A stop token's id (or no stop string) names no sequence.
        for reason in ["128001", "null", "\"\""] {
            let chunk = format!(r#"{{"choices":[{{"delta":{{}},"finish_reason":"stop","stop_reason":{reason}}}]}}"#);
            let evs = map(&[&chunk, "[DONE]"], false);
            let none = ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None };
            assert_eq!(evs[1], none, "{reason}");
        }
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
                ExecEvent::reasoning("think a"),
                ExecEvent::reasoning("think b"),
                ExecEvent::content("answer"),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None },
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
        let evs = map(&[r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"length"}]}"#], true);
        assert_eq!(evs.last(), Some(&ExecEvent::Complete { finish_reason: "length".into(), usage: None }));
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
                r#"{"choices":[{"delta":{"content":null}}],"system_fingerprint":"x","usage":{}}"#,
                r#"{"choices":[{"delta":{"content":[{"type":"text","text":"ignored"}]}}]}"#,
                r#"{"choices":null}"#,
                "",
                "[DONE]",
            ],
            false,
        );
        // An empty usage object says nothing: no usage, not zeros.
        assert_eq!(evs, vec![start("target-m"), ExecEvent::Complete { finish_reason: "stop".into(), usage: None }]);
    }

    fn tool(choice: u32, index: u32, id: &str, name: &str, arguments: &str) -> ExecEvent {
        ExecEvent::Delta(Delta {
            choice,
            part: Part::ToolCall(Box::new(ToolCallDelta {
                index,
                id: id.into(),
                kind: if id.is_empty() { String::new() } else { "function".into() },
                name: name.into(),
                arguments: arguments.into(),
            })),
            logprobs: None,
        })
    }

    #[test]
    fn tool_calls_refusals_logprobs_and_choices() {
        let evs = map(
            &[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}},{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":"{\"x\""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}},{"index":1,"delta":{"refusal":"no"},"logprobs":{"refusal":[{"token":"no","logprob":-0.1}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"},{"index":1,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
            false,
        );
        let lp = |s: &'static str| Some(Bytes::from_static(s.as_bytes()));
        assert_eq!(
            evs,
            vec![
                start("target-m"),
                tool(0, 0, "call_a", "f", ""),
                tool(0, 1, "call_b", "g", "{\"x\""),
                tool(0, 1, "", "", ":1}"),
                ExecEvent::Delta(Delta {
                    choice: 1,
                    part: Part::Refusal("no".into()),
                    logprobs: lp(r#"{"refusal":[{"token":"no","logprob":-0.1}]}"#),
                }),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "tool_calls".into(), stop_sequence: None },
                ExecEvent::Delta(Delta {
                    choice: 1,
                    part: Part::Content("x".into()),
                    logprobs: lp(r#"{"content":[]}"#)
                }),
                ExecEvent::ChoiceFinish { choice: 1, finish_reason: "stop".into(), stop_sequence: None },
                ExecEvent::Complete { finish_reason: "tool_calls".into(), usage: None },
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
                ExecEvent::reasoning("hmm"),
                ExecEvent::content("Hi!"),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None },
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
            let f = status_failure(status, b"", None);
            assert_eq!(
                (f.code, f.status, f.retryable, f.source),
                (codes::UPSTREAM_STATUS, status, retryable, FailureSource::Provider)
            );
            assert_eq!(f.message, format!("upstream answered HTTP {status}"));
        }
        assert_eq!(status_failure(302, b"moved", None).status, 502);
        assert_eq!(status_failure(404, br#"{"error":{"message":"no such model"}}"#, None).message, "no such model");
        let f = status_failure(
            429,
            br#"{"error":{"message":"slow","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
            Some(7000),
        );
        let p = f.provider.unwrap();
        assert_eq!(
            (p.code.as_deref(), p.param, p.kind.as_deref()),
            (Some("rate_limit_exceeded"), None, Some("requests"))
        );
        assert_eq!(f.retry_after_ms, Some(7000));
        assert_eq!(retry_after_ms(None, Some(b" 7 ")), Some(7000));
        assert_eq!(retry_after_ms(Some(b"1500"), Some(b"7")), Some(1500));
        assert_eq!(retry_after_ms(None, Some(b"Wed, 21 Oct 2015 07:28:00 GMT")), None);
    }
}
