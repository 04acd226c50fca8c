//! Chat-completions semantics of the mock: request validation and the
//! response plan (which answer, how many tokens and choices, which delays).
//! Pure functions; [`super::chat_stream`] and [`super::chat_body`] render the
//! plan, and the connection code only paces and writes what they produce.

use std::time::Duration;

use serde::Deserialize;

use super::overrides::{self, content_chars, content_text, split_words, Knobs, MAX_FANOUT};
pub use super::overrides::{BadRequest, MockOverrides};
use super::reply::{self, Action, Env, Flavor, Reply, Stream, Timing, Whole};
use super::{chat_body, chat_stream, logprobs, tool_calls, MockConfig};

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
    n: Option<u64>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u64>,
    #[serde(default)]
    tools: Vec<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    /// A string or a list of them.
    #[serde(default)]
    stop: Option<serde_json::Value>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

impl ChatRequest {
    /// The tool a forced `tool_choice` makes the model call (`"required"`:
    /// the first declared; an object: the function it names), as a model
    /// obeying it would.
    fn forced_tool(&self) -> Option<String> {
        let first = || self.tools.first().and_then(|t| t["function"]["name"].as_str()).map(str::to_owned);
        match self.tool_choice.as_ref()? {
            serde_json::Value::String(c) if c == "required" => first(),
            c @ serde_json::Value::Object(_) => c["function"]["name"].as_str().map(str::to_owned),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: serde_json::Value,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

/// What the assistant answers, in every choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Content tokens `tok0 `, `tok1 `, ...
    Tokens,
    /// Content given as pieces (the echo of a tool result).
    Text(Vec<String>),
    /// A refusal, as pieces.
    Refusal(Vec<String>),
    /// Parallel tool calls instead of content.
    ToolCalls {
        /// Number of calls.
        calls: u64,
        /// Function name.
        name: String,
    },
}

/// Everything needed to answer one chat request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `chatcmpl-mock-<seq>`.
    pub id: String,
    /// Number of the request (tool-call ids).
    pub seq: u64,
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
    /// Reasoning tokens to emit per choice (after the `max_tokens` cap).
    pub reasoning: u64,
    /// Counted units per choice: content tokens or pieces, refusal pieces,
    /// or tool-call argument fragments (after the cap).
    pub content: u64,
    /// `"stop"`, `"length"` or `"tool_calls"`.
    pub finish_reason: &'static str,
    /// The stop string the answer ended before, reported as vLLM does
    /// (`stop_reason` beside the finish reason).
    pub stop_reason: Option<String>,
    /// The kind of answer.
    pub answer: Answer,
    /// `n`: choices in the answer.
    pub choices: u64,
    /// `Some(top_logprobs)` when logprobs were asked for.
    pub logprobs: Option<u64>,
    /// Delay before the first token.
    pub ttft: Duration,
    /// Delay between tokens.
    pub interval: Duration,
    /// Close after this many counted units.
    pub abort_after: Option<u64>,
    /// Go silent after this many counted units (streams).
    pub stall_after: Option<u64>,
    /// Never end the stream's body.
    pub hold_open: bool,
    /// Token steps per write (streams).
    pub burst: u64,
    /// Answer with this error status instead.
    pub error_status: Option<u16>,
    /// Content tokens are padded to at least this many bytes.
    pub token_bytes: usize,
    /// Close the connection without answering.
    pub hangup: bool,
    /// `mock.tag`.
    pub tag: Option<String>,
}

impl Plan {
    /// Text of content token `i` of the first choice.
    pub fn content_token(&self, i: u64) -> String {
        self.piece(0, i)
    }

    /// Text of content (or refusal) unit `i` of choice `choice`.
    pub fn piece(&self, choice: u64, i: u64) -> String {
        let at = |pieces: &[String]| usize::try_from(i).ok().and_then(|i| pieces.get(i)).cloned().unwrap_or_default();
        match &self.answer {
            Answer::Text(pieces) | Answer::Refusal(pieces) => at(pieces),
            Answer::Tokens | Answer::ToolCalls { .. } => overrides::content_token(choice, i, self.token_bytes),
        }
    }

    /// Tokens in `usage.completion_tokens`, over all choices.
    pub fn completion_tokens(&self) -> u64 {
        (self.reasoning + self.content).saturating_mul(self.choices)
    }

    /// Whether the response ends by closing the connection after
    /// `abort_after` content chunks instead of finishing.
    pub fn aborts(&self) -> bool {
        self.abort_after.is_some_and(|n| n <= self.content)
    }
}

/// Validates a chat request body and plans the answer. `seq` numbers the id.
pub fn plan(body: &[u8], config: &MockConfig, seq: u64, created: u64) -> Result<Plan, BadRequest> {
    let req: ChatRequest =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
    let Some(last) = req.messages.last() else {
        return Err(BadRequest("'messages' must not be empty".into()));
    };
    let forced = req.forced_tool();
    let k = Knobs::resolve(req.mock, config)?;
    let choices = req.n.unwrap_or(1);
    if !(1..=MAX_FANOUT).contains(&choices) {
        return Err(BadRequest(format!("'n' must be in 1..={MAX_FANOUT}, got {choices}")));
    }
    let top = req.top_logprobs.unwrap_or(0);
    if top > logprobs::MAX_TOP {
        return Err(BadRequest(format!("'top_logprobs' must be at most {}, got {top}", logprobs::MAX_TOP)));
    }
    let answer = if last.role.as_deref() == Some("tool") {
        Answer::Text(split_words(&tool_calls::echo(&content_text(&last.content))))
    } else if k.tool_calls > 0 {
        Answer::ToolCalls { calls: k.tool_calls, name: k.tool_name.clone() }
    } else if let Some(name) = forced {
        Answer::ToolCalls { calls: 1, name }
    } else if let Some(text) = &k.refusal {
        Answer::Refusal(split_words(text))
    } else {
        Answer::Tokens
    };
    let stops = iop_core::request::stop_strings(req.stop.as_ref());
    let mut stop_reason = None;
    let (answer, reasoning, content, finish_reason) = match answer {
        Answer::ToolCalls { calls, name } => {
            (Answer::ToolCalls { calls, name }, k.reasoning, calls * tool_calls::FRAGMENTS, "tool_calls")
        }
        answer => {
            let units = match &answer {
                Answer::Text(p) | Answer::Refusal(p) => p.len() as u64,
                _ => k.tokens,
            };
            // A stop string ends the answer before the first piece it occurs in.
            let piece = |i: u64| match &answer {
                Answer::Text(p) | Answer::Refusal(p) => usize::try_from(i).ok().and_then(|i| p.get(i)).cloned(),
                _ => Some(overrides::content_token(0, i, k.token_bytes)),
            };
            let hit = if stops.is_empty() {
                None
            } else {
                (0..units).find_map(|i| find_stop(&piece(i)?, &stops).map(|s| (i, s.to_owned())))
            };
            let (answer, units) = match hit {
                Some((at, s)) => {
                    stop_reason = Some(s);
                    (truncate(answer, at), at)
                }
                None => (answer, units),
            };
            let cap = req.max_completion_tokens.or(req.max_tokens).unwrap_or(u64::MAX);
            if k.reasoning.saturating_add(units) > cap {
                let r = k.reasoning.min(cap);
                // Cut by the cap first: the stop string was never reached.
                stop_reason = None;
                (truncate(answer, cap - r), r, cap - r, "length")
            } else {
                (answer, k.reasoning, units, "stop")
            }
        }
    };
    let chars: usize = req.messages.iter().map(|m| content_chars(&m.content)).sum();
    Ok(Plan {
        id: format!("chatcmpl-mock-{seq}"),
        seq,
        model: req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| config.model.clone()),
        created,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.and_then(|s| s.include_usage).unwrap_or(false),
        prompt_tokens: overrides::prompt_tokens(chars),
        reasoning,
        content,
        finish_reason,
        stop_reason,
        answer,
        choices,
        logprobs: (req.logprobs == Some(true) || k.logprobs).then_some(top),
        ttft: k.ttft,
        interval: k.interval,
        abort_after: k.abort_after,
        stall_after: k.stall_after,
        hold_open: k.hold_open,
        burst: k.burst,
        error_status: k.error_status,
        token_bytes: k.token_bytes,
        hangup: k.hangup,
        tag: k.tag,
    })
}

/// The first of `stops` that `piece` holds.
fn find_stop<'s>(piece: &str, stops: &[&'s str]) -> Option<&'s str> {
    stops.iter().find(|s| piece.contains(**s)).copied()
}

/// Keeps the first `n` pieces of a text answer.
fn truncate(answer: Answer, n: u64) -> Answer {
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    match answer {
        Answer::Text(mut p) => {
            p.truncate(n);
            Answer::Text(p)
        }
        Answer::Refusal(mut p) => {
            p.truncate(n);
            Answer::Refusal(p)
        }
        other => other,
    }
}

/// `POST /v1/chat/completions`.
pub fn reply(body: &[u8], env: &Env<'_>) -> Reply {
    let plan = match plan(body, env.config, env.seq, env.now.secs) {
        Ok(plan) => plan,
        Err(e) => return reply::bad_request(Flavor::OpenAi, &e),
    };
    if let Some(early) = reply::early_reply(Flavor::OpenAi, plan.hangup, plan.error_status, &plan.model) {
        return early.tagged(plan.tag);
    }
    let tag = plan.tag.clone();
    let action = if plan.stream {
        Action::Stream(Stream {
            content_type: "text/event-stream",
            headers: vec![("cache-control", "no-cache".to_owned())],
            eager_head: true,
            timing: Timing {
                ttft: plan.ttft,
                interval: plan.interval,
                abort_after: plan.abort_after,
                stall_after: plan.stall_after,
                hold_open: plan.hold_open,
                burst: plan.burst,
            },
            script: Box::new(chat_stream::ChatScript::new(plan)),
        })
    } else {
        // As long as a real server would take to produce the same tokens.
        let gaps = u32::try_from((plan.reasoning + plan.content).saturating_sub(1)).unwrap_or(u32::MAX);
        let delay = plan.ttft.saturating_add(plan.interval.saturating_mul(gaps));
        let mut whole = Whole::json(200, "application/json", chat_body::completion_body(&plan));
        whole.delay = delay;
        whole.abort = plan.aborts();
        Action::Whole(whole)
    };
    Reply::new(Flavor::OpenAi, action).tagged(tag)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::mockprov::chat_body::completion_body;
    use crate::mockprov::chat_stream::Chunks;
    use crate::mockprov::errors::{error_body, mock_error_body};
    use crate::mockprov::models::models_body;
    use crate::mockprov::overrides::{content_token, reasoning_token};
    use serde_json::{json, Value};

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
    fn a_stop_string_ends_the_answer_before_it_as_vllm_says() {
        let body = |stop: &str, max: u64| {
            format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"stop":{stop},"max_tokens":{max},"mock":{{"tokens":5}}}}"#
            )
        };
        let p = plan(body(r#"["zz","tok2"]"#, 9).as_bytes(), &config(), 1, 0).unwrap();
        assert_eq!((p.content, p.finish_reason, p.stop_reason.as_deref()), (2, "stop", Some("tok2")));
        let whole: Value = serde_json::from_str(&completion_body(&p)).unwrap();
        assert_eq!(whole["choices"][0]["stop_reason"], "tok2");
        assert_eq!(whole["choices"][0]["message"]["content"], "tok0 tok1 ");
        // Past the cap it is a `length` answer; never met, a plain stop.
        let p = plan(body(r#""tok4""#, 2).as_bytes(), &config(), 1, 0).unwrap();
        assert_eq!((p.content, p.finish_reason, p.stop_reason), (2, "length", None));
        let p = plan(body(r#""nope""#, 9).as_bytes(), &config(), 1, 0).unwrap();
        assert_eq!((p.content, p.finish_reason, p.stop_reason), (5, "stop", None));
    }

    #[test]
    fn a_forced_tool_choice_is_one_call_of_that_tool() {
        let tools =
            r#""tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}]"#;
        for (choice, name) in [(r#""required""#, "a"), (r#"{"type":"function","function":{"name":"b"}}"#, "b")] {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{tools},"tool_choice":{choice}}}"#);
            let p = plan(body.as_bytes(), &config(), 1, 0).unwrap();
            assert_eq!(p.finish_reason, "tool_calls", "{choice}");
            assert!(matches!(&p.answer, Answer::ToolCalls { calls: 1, name: n } if n == name), "{choice}");
        }
        let auto = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{tools},"tool_choice":"auto"}}"#);
        assert_eq!(plan(auto.as_bytes(), &config(), 1, 0).unwrap().finish_reason, "stop");
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
            br#"{"messages":[{"content":"x"}],"n":0}"#,
            br#"{"messages":[{"content":"x"}],"n":1000}"#,
            br#"{"messages":[{"content":"x"}],"top_logprobs":21}"#,
            br#"{"messages":[{"content":"x"}],"mock":{"tool_calls":129}}"#,
        ] {
            assert!(plan(bad, &config(), 1, 0).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn chunks_are_openai_shaped() {
        let body = br#"{"model":"m\"q","messages":[{"content":"x"}],"mock":{"reasoning":1,"tokens":2}}"#;
        let p = plan(body, &config(), 9, 123).unwrap();
        let c = Chunks::new(&p);
        let role: Value = serde_json::from_str(&c.role(0, &p.answer)).unwrap();
        assert_eq!(role["id"], "chatcmpl-mock-9");
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["created"], 123);
        assert_eq!(role["model"], "m\"q");
        assert_eq!(role["choices"][0]["index"], 0);
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
        assert_eq!((&role["system_fingerprint"], &role["service_tier"]), (&json!("fp_mock"), &json!("default")));
        assert!(role.get("usage").is_none(), "no usage key without include_usage");
        let tok: Value = serde_json::from_str(&c.content(0, &content_token(0, 1, 0), None)).unwrap();
        assert_eq!(tok["choices"][0]["delta"]["content"], "tok1 ");
        let think: Value = serde_json::from_str(&c.reasoning(0, &reasoning_token(0, 0))).unwrap();
        assert_eq!(think["choices"][0]["delta"]["reasoning_content"], "think0 ");
        let fin: Value = serde_json::from_str(&c.finish(0, "stop", None)).unwrap();
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
        assert_eq!(err["error"]["code"], "mock_error");
        let err: Value = serde_json::from_str(&error_body("a \"b\"", "invalid_request_error", "null")).unwrap();
        assert_eq!(err["error"]["message"], "a \"b\"");
        let models: Value = serde_json::from_str(&models_body("mock")).unwrap();
        assert_eq!(models["data"][0]["id"], "mock");
    }
}
