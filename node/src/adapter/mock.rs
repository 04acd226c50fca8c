//! In-process deterministic mock provider. Its text matches the mock
//! upstream server `iop-mockprov`: content token `i` is `"tok{i} "`,
//! reasoning token `i` is `"think{i} "`. It reads the request like a
//! provider would (`max_tokens`/`max_completion_tokens`, `n`, `logprobs`,
//! `top_logprobs`, the last message) and, like iop-mockprov, a `"mock"`
//! object for shapes a test wants: `tool_calls` (n parallel calls of the
//! first declared tool, or `tool_name`), `refusal`. Embeddings are deterministic unit vectors
//! derived from each input (8 dimensions unless `dimensions` says).

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    exec::{codes, Delta, ExecEvent, FailureSource, Part, RunFailure, ToolCallDelta, Usage},
    wire::pb,
};
use serde::Deserialize;

use crate::run::{EventSink, Operation, RunSpec, SinkClosed};

/// With no interval between tokens, yield to sibling tasks this often
/// (monoio has no preemption; a long stream would starve them).
const YIELD_EVERY: u32 = 64;
/// Most choices one request may ask for.
const MAX_CHOICES: u32 = 128;

/// Mock behaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockSettings {
    /// Content tokens per completion (capped by the request's max_tokens).
    pub tokens: u32,
    /// Delay between tokens.
    pub token_interval: Duration,
    /// Delay before the first token.
    pub first_token_delay: Duration,
    /// Emit `tokens / 2` (at least 1) reasoning deltas before the content.
    pub reasoning: bool,
}

impl From<pb::MockSettings> for MockSettings {
    fn from(m: pb::MockSettings) -> Self {
        Self {
            tokens: m.tokens,
            token_interval: Duration::from_millis(u64::from(m.token_interval_ms)),
            first_token_delay: Duration::from_millis(u64::from(m.first_token_delay_ms)),
            reasoning: m.reasoning,
        }
    }
}

/// What the mock reads of a chat request.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Request {
    messages: Vec<Message>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    n: Option<u32>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Vec<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    /// A string or a list of them.
    stop: Option<serde_json::Value>,
    mock: Option<Overrides>,
}

/// The first content token (of `content`) a stop string occurs in, and
/// that string: the answer ends before it, as a server's stop check would.
fn stopped_at(stops: &[&str], content: u32) -> Option<(u32, String)> {
    if stops.is_empty() {
        return None;
    }
    (0..content).find_map(|i| {
        let token = format!("tok{i} ");
        stops.iter().find(|s| token.contains(**s)).map(|s| (i, (*s).to_owned()))
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Message {
    role: String,
    content: serde_json::Value,
}

/// Per-request shapes (`"mock": {...}`); unknown keys are ignored here
/// (iop-mockprov's own keys may travel in the same object).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Overrides {
    tool_calls: Option<u32>,
    tool_name: Option<String>,
    refusal: Option<String>,
}

/// Text of a message's content: a string, or the text of its parts.
fn text_of(content: &serde_json::Value) -> String {
    match content {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).collect::<Vec<_>>().concat()
        }
        _ => String::new(),
    }
}

/// What one answer of the mock is made of.
enum Shape {
    /// Content tokens (`tok{i} `), possibly after reasoning.
    Tokens,
    /// The answer to a tool result: one content delta.
    ToolResult(String),
    /// A refusal, in word-sized fragments.
    Refusal(String),
    /// Parallel tool calls.
    ToolCalls { calls: u32, name: String },
}

/// The in-process mock adapter.
#[derive(Debug, Clone)]
pub struct MockAdapter {
    id: String,
    max_concurrency: u32,
    settings: MockSettings,
}

impl MockAdapter {
    /// A mock provider.
    pub fn new(id: String, max_concurrency: u32, settings: MockSettings) -> Self {
        Self { id, max_concurrency, settings }
    }

    /// Provider id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Concurrent runs admitted.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// Its behaviour.
    pub fn settings(&self) -> &MockSettings {
        &self.settings
    }

    /// Streams the deterministic completion for `spec`.
    pub async fn execute<S: EventSink>(&self, spec: RunSpec, sink: &mut S) {
        // SinkClosed means the run is gone: nothing left to do.
        let _ = self.run(&spec, sink).await;
    }

    async fn run<S: EventSink>(&self, spec: &RunSpec, sink: &mut S) -> Result<(), SinkClosed> {
        if spec.operation == Operation::Embeddings {
            return embed(spec, sink).await;
        }
        let req = match parse(spec) {
            Ok(r) => r,
            Err(f) => return sink.emit(ExecEvent::Error(f)).await,
        };
        let s = &self.settings;
        let n = req.n.unwrap_or(1);
        let overrides = req.mock.unwrap_or_default();
        let last = req.messages.last();
        // A forced tool call (`"required"`, or one function named) is one
        // call, as a model obeying it makes.
        let forced = match &req.tool_choice {
            Some(serde_json::Value::String(c)) if c == "required" => Some(None),
            Some(c @ serde_json::Value::Object(_)) => Some(c["function"]["name"].as_str().map(str::to_owned)),
            _ => None,
        };
        let (tool_calls, tool_name) = match forced {
            Some(name) if overrides.tool_calls.is_none() => (Some(1), name.or(overrides.tool_name)),
            _ => (overrides.tool_calls, overrides.tool_name),
        };
        let shape = match (last, overrides.refusal, tool_calls) {
            (Some(m), _, _) if m.role == "tool" => Shape::ToolResult(format!("tool said: {}", text_of(&m.content))),
            (_, Some(r), _) => Shape::Refusal(r),
            (_, None, Some(calls)) if calls > 0 => {
                // Call a tool the client declared, as a model would.
                let declared = req.tools.iter().find_map(|t| t["function"]["name"].as_str().map(str::to_owned));
                let name = tool_name.or(declared).unwrap_or_else(|| "get_weather".into());
                Shape::ToolCalls { calls, name }
            }
            _ => Shape::Tokens,
        };
        let logprobs = req.logprobs.unwrap_or(false).then(|| req.top_logprobs.unwrap_or(0).min(20));
        sink.emit(ExecEvent::Start { model: spec.target.clone() }).await?;
        let cap =
            req.max_completion_tokens.or(req.max_tokens).map_or(u32::MAX, |c| u32::try_from(c).unwrap_or(u32::MAX));
        let reasoning = if s.reasoning { (s.tokens / 2).max(1) } else { 0 };
        let mut step = 0u32;
        let mut output = 0u64;
        let mut finish = "stop";
        let mut matched = None;
        let delta = |choice: u32, part: Part, lp: Option<Bytes>| ExecEvent::Delta(Delta { choice, part, logprobs: lp });
        match shape {
            Shape::Tokens => {
                let mut content = s.tokens.min(cap);
                if content < s.tokens {
                    finish = "length";
                }
                if let Some((at, stop)) = stopped_at(&iop_core::request::stop_strings(req.stop.as_ref()), content) {
                    (content, finish, matched) = (at, "stop", Some(stop));
                }
                for i in 0..reasoning {
                    self.pace(step).await;
                    step = step.saturating_add(1);
                    for c in 0..n {
                        sink.emit(delta(c, Part::Reasoning(format!("think{i} ")), None)).await?;
                    }
                }
                for i in 0..content {
                    self.pace(step).await;
                    step = step.saturating_add(1);
                    let token = format!("tok{i} ");
                    for c in 0..n {
                        let lp = logprobs.map(|k| token_logprobs(&token, k));
                        sink.emit(delta(c, Part::Content(token.clone()), lp)).await?;
                    }
                }
                output = u64::from(content) * u64::from(n);
            }
            Shape::ToolResult(text) => {
                self.pace(step).await;
                for c in 0..n {
                    sink.emit(delta(c, Part::Content(text.clone()), None)).await?;
                }
                output = u64::from(n);
            }
            Shape::Refusal(text) => {
                for (i, word) in text.split_inclusive(' ').enumerate() {
                    self.pace(u32::try_from(i).unwrap_or(u32::MAX)).await;
                    for c in 0..n {
                        sink.emit(delta(c, Part::Refusal(word.to_owned()), None)).await?;
                    }
                    output += u64::from(n);
                }
            }
            Shape::ToolCalls { calls, name } => {
                finish = "tool_calls";
                for i in 0..calls {
                    let args = format!("{{\"city\":\"Paris\",\"n\":{i}}}");
                    let (a, b) = args.split_at(args.len() / 2);
                    for c in 0..n {
                        let id = format!("call_{}_{c}_{i}", spec.run_id);
                        let first = ToolCallDelta {
                            index: i,
                            id,
                            kind: "function".into(),
                            name: name.clone(),
                            arguments: String::new(),
                        };
                        self.pace(step).await;
                        step = step.saturating_add(1);
                        sink.emit(delta(c, Part::ToolCall(Box::new(first)), None)).await?;
                        for piece in [a, b] {
                            let frag = ToolCallDelta { index: i, arguments: piece.to_owned(), ..Default::default() };
                            sink.emit(delta(c, Part::ToolCall(Box::new(frag)), None)).await?;
                        }
                    }
                    output += 8 * u64::from(n);
                }
            }
        }
        if n > 1 || matched.is_some() {
            for c in 0..n {
                let stop_sequence = matched.clone();
                sink.emit(ExecEvent::ChoiceFinish { choice: c, finish_reason: finish.into(), stop_sequence }).await?;
            }
        }
        let chars: usize = req.messages.iter().map(|m| text_of(&m.content).chars().count()).sum();
        let usage = Usage {
            input_tokens: u64::try_from(chars / 4).unwrap_or(u64::MAX).max(1),
            output_tokens: output,
            reasoning_tokens: s.reasoning.then_some(u64::from(reasoning) * u64::from(n)),
            cached_input_tokens: None,
        };
        sink.emit(ExecEvent::Complete { finish_reason: finish.into(), usage: Some(usage) }).await
    }

    /// Waits before token number `step` (counting reasoning and content).
    async fn pace(&self, step: u32) {
        let s = &self.settings;
        if step == 0 {
            if !s.first_token_delay.is_zero() {
                iop_core::rt::time::sleep(s.first_token_delay).await;
            }
        } else if !s.token_interval.is_zero() {
            iop_core::rt::time::sleep(s.token_interval).await;
        } else if step.is_multiple_of(YIELD_EVERY) {
            iop_core::rt::yield_now().await;
        }
    }
}

/// Reads the request; refuses what a provider would refuse.
fn parse(spec: &RunSpec) -> Result<Request, RunFailure> {
    let invalid = |msg: String| RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, msg);
    let req: Request = serde_json::from_slice(&spec.body).map_err(|e| invalid(format!("invalid request body: {e}")))?;
    if req.messages.is_empty() {
        return Err(invalid("`messages` must not be empty".into()));
    }
    match req.n {
        Some(0) => Err(invalid("`n` must be at least 1".into())),
        Some(n) if n > MAX_CHOICES => Err(invalid(format!("`n` must be at most {MAX_CHOICES}"))),
        _ => Ok(req),
    }
}

/// What the mock reads of an embeddings request.
#[derive(Debug, Deserialize)]
struct EmbedRequest {
    input: serde_json::Value,
    dimensions: Option<u32>,
}

/// Most dimensions the mock computes.
const MAX_DIMENSIONS: u32 = 4096;

/// Answers an embeddings request: one vector per input (a string, an
/// array of strings, a token array or an array of token arrays).
async fn embed<S: EventSink>(spec: &RunSpec, sink: &mut S) -> Result<(), SinkClosed> {
    let invalid =
        |msg: String| ExecEvent::Error(RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, msg));
    let req: EmbedRequest = match serde_json::from_slice(&spec.body) {
        Ok(r) => r,
        Err(e) => return sink.emit(invalid(format!("invalid request body: {e}"))).await,
    };
    let dims = match req.dimensions {
        None => 8,
        Some(d @ 1..=MAX_DIMENSIONS) => d,
        Some(d) => return sink.emit(invalid(format!("`dimensions` must be 1..={MAX_DIMENSIONS}, not {d}"))).await,
    };
    let inputs: Vec<String> = match &req.input {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(items) if !items.is_empty() && items.iter().all(|i| i.is_number()) => {
            vec![req.input.to_string()]
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            let text =
                |i: &serde_json::Value| i.as_str().map(str::to_owned).or_else(|| i.is_array().then(|| i.to_string()));
            match items.iter().map(text).collect::<Option<Vec<_>>>() {
                Some(v) => v,
                None => return sink.emit(invalid("`input` items must be strings or token arrays".into())).await,
            }
        }
        _ => return sink.emit(invalid("`input` must be a string or a non-empty array".into())).await,
    };
    sink.emit(ExecEvent::Start { model: spec.target.clone() }).await?;
    let chars: usize = inputs.iter().map(|i| i.chars().count()).sum();
    let vectors = inputs.iter().map(|i| unit_vector(i, dims)).collect();
    sink.emit(ExecEvent::Embeddings(vectors)).await?;
    let tokens = u64::try_from(chars / 4).unwrap_or(u64::MAX).max(1);
    let usage = Usage { input_tokens: tokens, output_tokens: 0, reasoning_tokens: None, cached_input_tokens: None };
    sink.emit(ExecEvent::Complete { finish_reason: "stop".into(), usage: Some(usage) }).await
}

/// A unit vector of `dims` values that depends only on `text`.
fn unit_vector(text: &str, dims: u32) -> Vec<f32> {
    // FNV-1a seeds a xorshift stream: cheap, stable across runs.
    let mut h = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    // xorshift never leaves zero.
    h = h.max(1);
    let v: Vec<f32> = (0..dims)
        .map(|_| {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            // The top 24 bits, as a value in [-1, 1).
            ((h >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
    v.into_iter().map(|x| x / norm).collect()
}

/// OpenAI's `logprobs` object for one content token, with `k` alternatives.
fn token_logprobs(token: &str, k: u32) -> Bytes {
    let top: Vec<serde_json::Value> = (0..k)
        .map(|j| {
            let alt = format!("alt{j}");
            serde_json::json!({"token": alt, "logprob": -1.0 - f64::from(j), "bytes": alt.as_bytes()})
        })
        .collect();
    let v = serde_json::json!({"content": [{"token": token, "logprob": -0.25, "bytes": token.as_bytes(), "top_logprobs": top}]});
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{cell::Cell, rc::Rc, time::Instant};

    use super::*;
    use crate::adapter::tests::{spec, spec_body, VecSink};

    fn mock(tokens: u32, reasoning: bool) -> MockAdapter {
        MockAdapter::new("m".into(), 1, MockSettings { tokens, reasoning, ..Default::default() })
    }

    fn run(adapter: &MockAdapter, spec: RunSpec) -> Vec<ExecEvent> {
        iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            adapter.execute(spec, &mut sink).await;
            sink.events
        })
        .unwrap()
    }

    fn complete(ev: &ExecEvent) -> (&str, Usage) {
        match ev {
            ExecEvent::Complete { finish_reason, usage: Some(u) } => (finish_reason, *u),
            other => panic!("not a complete with usage: {other:?}"),
        }
    }

    #[test]
    fn stop_when_under_max_tokens() {
        // 17 chars of content -> 4 input tokens.
        let evs = run(&mock(3, false), spec("model-a", "abcdefghijklmnopq", Some(10)));
        assert_eq!(evs[0], ExecEvent::Start { model: "model-a".into() });
        assert_eq!(
            &evs[1..4],
            &[ExecEvent::content("tok0 "), ExecEvent::content("tok1 "), ExecEvent::content("tok2 ")]
        );
        let (finish, usage) = complete(&evs[4]);
        assert_eq!(finish, "stop");
        assert_eq!(
            usage,
            Usage { input_tokens: 4, output_tokens: 3, reasoning_tokens: None, cached_input_tokens: None }
        );
        assert_eq!(evs.len(), 5);
    }

    #[test]
    fn a_stop_string_ends_the_answer_before_it_and_is_named() {
        let body = r#"{"model":"m","stop":["zz","tok2"],"messages":[{"role":"user","content":"x"}]}"#;
        let evs = run(&mock(5, false), spec_body("m", body));
        assert_eq!(&evs[1..3], &[ExecEvent::content("tok0 "), ExecEvent::content("tok1 ")]);
        let named =
            ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: Some("tok2".into()) };
        assert_eq!(evs[3], named);
        assert_eq!(complete(&evs[4]), ("stop", Usage { input_tokens: 1, output_tokens: 2, ..Default::default() }));
        // A stop string past the cap leaves it a `length` answer; one never met, a plain stop.
        for (stop, max, finish, len) in [(r#""tok4""#, 2, "length", 4), (r#""nope""#, 9, "stop", 7)] {
            let body = format!(
                r#"{{"model":"m","stop":{stop},"max_tokens":{max},"messages":[{{"role":"user","content":"x"}}]}}"#
            );
            let evs = run(&mock(5, false), spec_body("m", &body));
            assert_eq!((complete(evs.last().unwrap()).0, evs.len()), (finish, len), "{stop}");
        }
    }

    #[test]
    fn length_when_capped_and_input_at_least_one() {
        let evs = run(&mock(5, false), spec("m", "hi", Some(2)));
        assert_eq!(evs.len(), 4);
        let (finish, usage) = complete(&evs[3]);
        assert_eq!((finish, usage.output_tokens, usage.input_tokens), ("length", 2, 1));
        // A cap equal to the token count is a normal stop.
        let evs = run(&mock(5, false), spec("m", "hi", Some(5)));
        assert_eq!(complete(evs.last().unwrap()).0, "stop");
        // max_completion_tokens wins.
        let body =
            r#"{"model":"m","max_tokens":9,"max_completion_tokens":1,"messages":[{"role":"user","content":"x"}]}"#;
        let evs = run(&mock(5, false), spec_body("m", body));
        assert_eq!(evs.len(), 3);
    }

    #[test]
    fn reasoning_deltas_come_first() {
        let evs = run(&mock(4, true), spec("m", "", None));
        let kinds: Vec<_> = evs[1..evs.len() - 1].to_vec();
        assert_eq!(
            kinds,
            vec![
                ExecEvent::reasoning("think0 "),
                ExecEvent::reasoning("think1 "),
                ExecEvent::content("tok0 "),
                ExecEvent::content("tok1 "),
                ExecEvent::content("tok2 "),
                ExecEvent::content("tok3 "),
            ]
        );
        let (_, usage) = complete(evs.last().unwrap());
        assert_eq!((usage.output_tokens, usage.reasoning_tokens), (4, Some(2)));
        // One token still gets one reasoning delta.
        let evs = run(&mock(1, true), spec("m", "", None));
        assert_eq!(evs[1], ExecEvent::reasoning("think0 "));
        assert_eq!(complete(evs.last().unwrap()).1.reasoning_tokens, Some(1));
    }

    #[test]
    fn several_choices_interleave_and_each_finishes() {
        let body = r#"{"model":"m","n":2,"logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"x"}]}"#;
        let evs = run(&mock(2, false), spec_body("m", body));
        let choices: Vec<u32> =
            evs.iter().filter_map(|e| if let ExecEvent::Delta(d) = e { Some(d.choice) } else { None }).collect();
        assert_eq!(choices, vec![0, 1, 0, 1]);
        let ExecEvent::Delta(d) = &evs[1] else { panic!() };
        let lp: serde_json::Value = serde_json::from_slice(d.logprobs.as_ref().unwrap()).unwrap();
        assert_eq!(lp["content"][0]["token"], "tok0 ");
        assert_eq!(lp["content"][0]["top_logprobs"].as_array().unwrap().len(), 2);
        let finishes: Vec<_> = evs.iter().filter(|e| matches!(e, ExecEvent::ChoiceFinish { .. })).collect();
        assert_eq!(finishes.len(), 2);
        assert_eq!(complete(evs.last().unwrap()).1.output_tokens, 4);
    }

    #[test]
    fn a_forced_tool_choice_is_one_call_of_that_tool() {
        let tools =
            r#""tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}]"#;
        for (choice, name) in [(r#""required""#, "a"), (r#"{"type":"function","function":{"name":"b"}}"#, "b")] {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],{tools},"tool_choice":{choice}}}"#
            );
            let evs = run(&mock(3, false), spec_body("m", &body));
            let names: Vec<&str> = evs
                .iter()
                .filter_map(|e| match e {
                    ExecEvent::Delta(Delta { part: Part::ToolCall(c), .. }) if !c.name.is_empty() => {
                        Some(c.name.as_str())
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(names, [name], "{choice}");
            assert_eq!(complete(evs.last().unwrap()).0, "tool_calls");
        }
    }

    #[test]
    fn tool_calls_then_the_answer_to_the_tool_result() {
        let body =
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"mock":{"tool_calls":2,"tool_name":"lookup"}}"#;
        let evs = run(&mock(3, false), spec_body("m", body));
        let mut args = ["".to_owned(), "".to_owned()];
        let mut names = vec![];
        for e in &evs {
            if let ExecEvent::Delta(Delta { part: Part::ToolCall(c), .. }) = e {
                if !c.name.is_empty() {
                    assert_eq!(c.kind, "function");
                    assert!(!c.id.is_empty());
                    names.push(c.name.clone());
                }
                args[c.index as usize].push_str(&c.arguments);
            }
        }
        assert_eq!(names, vec!["lookup", "lookup"]);
        for (i, a) in args.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_str(a).unwrap();
            assert_eq!(v["n"], i);
        }
        assert_eq!(complete(evs.last().unwrap()).0, "tool_calls");
        let second = r#"{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null},{"role":"tool","tool_call_id":"c","content":"sunny"}],"mock":{"tool_calls":2}}"#;
        let evs = run(&mock(3, false), spec_body("m", second));
        assert_eq!(evs[1], ExecEvent::content("tool said: sunny"));
        assert_eq!(complete(evs.last().unwrap()).0, "stop");
        // Without `tool_name`: the first tool the client declared.
        let declared = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"find_flight"}}],"mock":{"tool_calls":1}}"#;
        let evs = run(&mock(3, false), spec_body("m", declared));
        assert!(evs
            .iter()
            .any(|e| matches!(e, ExecEvent::Delta(Delta { part: Part::ToolCall(c), .. }) if c.name == "find_flight")));
    }

    #[test]
    fn refusals_and_bad_requests() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"mock":{"refusal":"I can't help"}}"#;
        let evs = run(&mock(3, false), spec_body("m", body));
        let text: String = evs
            .iter()
            .filter_map(|e| {
                if let ExecEvent::Delta(Delta { part: Part::Refusal(t), .. }) = e {
                    Some(t.as_str())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(text, "I can't help");
        for bad in [r#"{"model":"m","messages":[]}"#, r#"{"model":"m","n":0,"messages":[{"role":"user"}]}"#, "nope"] {
            let evs = run(&mock(3, false), spec_body("m", bad));
            assert!(matches!(&evs[..], [ExecEvent::Error(f)] if f.status == 400), "{bad}: {evs:?}");
        }
    }

    #[test]
    fn embeddings_are_stable_unit_vectors_per_input() {
        let embed = |body: &str| {
            let mut spec = spec_body("m", body);
            spec.operation = Operation::Embeddings;
            run(&mock(3, false), spec)
        };
        let evs = embed(r#"{"model":"m","input":["a","bb","a"],"dimensions":16}"#);
        let [ExecEvent::Start { .. }, ExecEvent::Embeddings(v), ExecEvent::Complete { usage: Some(u), .. }] = &evs[..]
        else {
            panic!("{evs:?}")
        };
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|e| e.len() == 16 && (e.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4));
        assert_eq!(v[0], v[2]);
        assert_ne!(v[0], v[1]);
        assert_eq!((u.input_tokens, u.output_tokens), (1, 0));
        let evs = embed(r#"{"model":"m","input":[1,2,3]}"#);
        assert!(matches!(&evs[1], ExecEvent::Embeddings(v) if v.len() == 1 && v[0].len() == 8), "{evs:?}");
        for bad in [r#"{"model":"m"}"#, r#"{"input":[]}"#, r#"{"input":[{}]}"#, r#"{"input":"x","dimensions":0}"#, "["]
        {
            let evs = embed(bad);
            assert!(matches!(&evs[..], [ExecEvent::Error(f)] if f.status == 400), "{bad}: {evs:?}");
        }
    }

    #[test]
    fn zero_tokens_completes_at_once() {
        let evs = run(&mock(0, false), spec("m", "", None));
        assert_eq!(evs.len(), 2);
        assert_eq!(complete(&evs[1]).1.output_tokens, 0);
    }

    #[test]
    fn stops_when_sink_closes() {
        let adapter = mock(100, false);
        let evs = iop_core::rt::block_on_current(async {
            let mut sink = VecSink { close_after: Some(3), ..Default::default() };
            adapter.execute(spec("m", "", None), &mut sink).await;
            sink.events
        })
        .unwrap();
        assert_eq!(evs.len(), 3);
        assert!(!evs.iter().any(ExecEvent::is_terminal));
    }

    #[test]
    fn paces_tokens() {
        let adapter = MockAdapter::new(
            "m".into(),
            1,
            MockSettings {
                tokens: 3,
                token_interval: Duration::from_millis(20),
                first_token_delay: Duration::from_millis(50),
                reasoning: false,
            },
        );
        let started = Instant::now();
        let evs = run(&adapter, spec("m", "", None));
        assert_eq!(evs.len(), 5);
        assert!(started.elapsed() >= Duration::from_millis(90), "{:?}", started.elapsed());
    }

    #[test]
    fn long_unpaced_stream_lets_siblings_run() {
        let adapter = mock(1000, false);
        let ticks = Rc::new(Cell::new(0u32));
        let evs = iop_core::rt::block_on_current({
            let ticks = Rc::clone(&ticks);
            async move {
                let ticker = monoio::spawn({
                    let ticks = Rc::clone(&ticks);
                    async move {
                        loop {
                            ticks.set(ticks.get() + 1);
                            iop_core::rt::yield_now().await;
                        }
                    }
                });
                let mut sink = VecSink::default();
                adapter.execute(spec("m", "", None), &mut sink).await;
                drop(ticker);
                sink.events
            }
        })
        .unwrap();
        assert_eq!(evs.len(), 1002);
        assert!(ticks.get() >= 5, "sibling ran {} times", ticks.get());
    }
}
