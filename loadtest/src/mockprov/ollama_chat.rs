//! `POST /api/chat`, Ollama's native chat API. Streams (the default) are
//! NDJSON, one object per line: `{"model","created_at","message":{...},
//! "done":false}` for each thinking fragment (`message.thinking`, when
//! `think` is on), content token, or the tool calls (all of them whole, in one
//! line, as Ollama parses them); then a final line with `done: true`,
//! `done_reason` and the timing fields. `"stream": false` answers one object
//! with the whole message and the final fields. Fields follow the order of
//! Ollama's Go structs, and zero metrics are left out as `omitempty` does.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::clock::Timestamp;
use super::json::json_str;
use super::overrides::{self, split_words, BadRequest, Knobs, MockOverrides};
use super::reply::{self, Action, Env, Flavor, Frame, Phase, Reply, Script, Stream, Timing, Whole, OLLAMA_JSON};
use super::tool_calls;

/// `load_duration` of every answer (ns).
pub const LOAD_DURATION_NS: u64 = 1_000_000;
/// `prompt_eval_duration` per prompt token (ns).
pub const PROMPT_EVAL_NS_PER_TOKEN: u64 = 100_000;
/// Thinking fragments for `think: true` when neither the request nor the CLI says how many.
pub const DEFAULT_THINKING: u64 = 4;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    think: Option<Value>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: String,
}

#[derive(Debug, Deserialize)]
struct Options {
    #[serde(default)]
    num_predict: Option<i64>,
}

/// What the assistant says after thinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// `tok0 `, `tok1 `, ... (this many).
    Tokens(u64),
    /// The echo of a tool result, as pieces.
    Text(Vec<String>),
    /// This many tool calls (whole, in one line).
    ToolCalls(u64),
}

/// Everything needed to answer one `/api/chat` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaPlan {
    /// Model echoed.
    pub model: String,
    /// Request number (tool-call ids).
    pub seq: u64,
    /// `stream` (default true).
    pub stream: bool,
    /// Empty `messages`: Ollama only loads the model (`done_reason: "load"`).
    pub load: bool,
    /// Thinking fragments.
    pub thinking: u64,
    /// The answer.
    pub said: Said,
    /// `"stop"` or `"length"`.
    pub done_reason: &'static str,
    /// `prompt_eval_count`.
    pub prompt_tokens: u64,
    /// The merged knobs.
    pub knobs: Knobs,
}

fn think(v: Option<&Value>) -> Result<Option<bool>, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if ["low", "medium", "high", "max"].contains(&s.as_str()) => Ok(Some(true)),
        Some(other) => Err(BadRequest(format!("invalid think value: {other}"))),
    }
}

/// Validates an `/api/chat` request and plans the answer.
pub fn plan(body: &[u8], config: &super::MockConfig, seq: u64) -> Result<OllamaPlan, BadRequest> {
    let req: ChatRequest = serde_json::from_slice(body).map_err(|e| BadRequest(e.to_string()))?;
    let model = req.model.filter(|m| !m.is_empty()).ok_or_else(|| BadRequest("model is required".into()))?;
    let knobs = Knobs::resolve(req.mock, config)?;
    let thinking = match think(req.think.as_ref())? {
        Some(true) if knobs.reasoning_set || knobs.reasoning > 0 => knobs.reasoning,
        Some(true) => DEFAULT_THINKING,
        Some(false) if !knobs.reasoning_set => 0,
        _ => knobs.reasoning,
    };
    let last = req.messages.last();
    let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty());
    let said = match last {
        Some(m) if m.role == "tool" => Said::Text(split_words(&tool_calls::echo(&m.content))),
        _ if knobs.tool_calls > 0 && has_tools => Said::ToolCalls(knobs.tool_calls),
        _ => Said::Tokens(knobs.tokens),
    };
    let cap = req.options.and_then(|o| o.num_predict).and_then(|n| u64::try_from(n).ok()).filter(|n| *n > 0);
    let (thinking, said, done_reason) = match (said, cap) {
        (Said::ToolCalls(n), _) => (thinking, Said::ToolCalls(n), "stop"),
        (said, Some(cap)) => {
            let units = match &said {
                Said::Text(p) => p.len() as u64,
                Said::Tokens(n) | Said::ToolCalls(n) => *n,
            };
            if thinking.saturating_add(units) > cap {
                let t = thinking.min(cap);
                let keep = cap - t;
                let said = match said {
                    Said::Text(mut p) => {
                        p.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
                        Said::Text(p)
                    }
                    _ => Said::Tokens(keep),
                };
                (t, said, "length")
            } else {
                (thinking, said, "stop")
            }
        }
        (said, None) => (thinking, said, "stop"),
    };
    let chars: usize = req.messages.iter().map(|m| m.content.chars().count()).sum();
    Ok(OllamaPlan {
        model,
        seq,
        stream: req.stream.unwrap_or(true),
        load: req.messages.is_empty(),
        thinking,
        said,
        done_reason,
        prompt_tokens: overrides::prompt_tokens(chars),
        knobs,
    })
}

/// A `message` object: `role`, `content`, `thinking` when there is some,
/// `tool_calls` (a JSON array) when given.
pub fn message_json(content: &str, thinking: &str, tool_calls: Option<&str>) -> String {
    let mut m = format!("{{\"role\":\"assistant\",\"content\":{}", json_str(content));
    if !thinking.is_empty() {
        m.push_str(&format!(",\"thinking\":{}", json_str(thinking)));
    }
    if let Some(calls) = tool_calls {
        m.push_str(&format!(",\"tool_calls\":{calls}"));
    }
    m.push('}');
    m
}

/// One line of a stream (or a whole answer): `model`, `created_at`,
/// `message`, `done`; a final line (`last`: [`final_fields`]) has
/// `done: true` and those fields after it.
pub fn line_json(model: &str, now: Timestamp, message: &str, last: Option<&str>) -> String {
    format!(
        "{{\"model\":{},\"created_at\":{},\"message\":{message},\"done\":{}{}}}",
        json_str(model),
        json_str(&now.rfc3339()),
        last.is_some(),
        last.unwrap_or_default()
    )
}

/// What a final line has after `done`: `done_reason` and the `metrics`
/// ([`metrics_json`]).
pub fn final_fields(done_reason: &str, metrics: &str) -> String {
    format!(",\"done_reason\":{}{metrics}", json_str(done_reason))
}

/// The counts and timing fields of a final line, each prefixed with a
/// comma, deterministic, zero ones left out (Go's `omitempty`): `eval_count`
/// tokens at one per `interval` (at least 1 ms) after `ttft`.
pub fn metrics_json(prompt_tokens: u64, eval_count: u64, ttft: Duration, interval: Duration) -> String {
    let per_token = interval.max(Duration::from_millis(1)).as_nanos() as u64;
    let prompt_eval = prompt_tokens * PROMPT_EVAL_NS_PER_TOKEN;
    let eval = eval_count * per_token;
    let total = LOAD_DURATION_NS + prompt_eval + ttft.as_nanos() as u64 + eval;
    let mut out = String::new();
    for (name, v) in [
        ("total_duration", total),
        ("load_duration", LOAD_DURATION_NS),
        ("prompt_eval_count", prompt_tokens),
        ("prompt_eval_duration", prompt_eval),
        ("eval_count", eval_count),
        ("eval_duration", eval),
    ] {
        if v > 0 {
            out.push_str(&format!(",\"{name}\":{v}"));
        }
    }
    out
}

impl OllamaPlan {
    /// Lines of content: tokens, text pieces, or 1 for the tool calls.
    pub fn content_steps(&self) -> u64 {
        match &self.said {
            Said::Tokens(n) => *n,
            Said::Text(p) => p.len() as u64,
            Said::ToolCalls(_) => 1,
        }
    }

    /// Content piece `i`.
    pub fn piece(&self, i: u64) -> String {
        match &self.said {
            Said::Text(p) => usize::try_from(i).ok().and_then(|i| p.get(i)).cloned().unwrap_or_default(),
            _ => overrides::content_token(0, i, self.knobs.token_bytes),
        }
    }

    /// `eval_count`: thinking and content tokens (argument fragments for tool calls).
    pub fn eval_count(&self) -> u64 {
        let said = match &self.said {
            Said::ToolCalls(n) => n * tool_calls::FRAGMENTS,
            _ => self.content_steps(),
        };
        self.thinking + said
    }

    /// `message.tool_calls` (all calls).
    pub fn tool_calls(&self) -> String {
        let Said::ToolCalls(n) = self.said else { return "[]".to_owned() };
        let calls: Vec<String> = (0..n)
            .map(|i| tool_calls::ollama_call(&tool_calls::call_id(self.seq, 0, i), &self.knobs.tool_name, i))
            .collect();
        format!("[{}]", calls.join(","))
    }

    /// The `message` object.
    pub fn message(&self, content: &str, thinking: &str, tool_calls: Option<&str>) -> String {
        message_json(content, thinking, tool_calls)
    }

    /// One line of the stream (or the whole answer): model, time, message, done.
    pub fn line(&self, now: Timestamp, message: &str, done: bool) -> String {
        let last = done.then(|| final_fields(self.done_reason, &self.metrics()));
        line_json(&self.model, now, message, last.as_deref())
    }

    /// The timing fields of the final line, each prefixed with a comma,
    /// deterministic, zero ones left out.
    pub fn metrics(&self) -> String {
        metrics_json(self.prompt_tokens, self.eval_count(), self.knobs.ttft, self.knobs.interval)
    }

    /// The `"stream": false` answer.
    pub fn whole(&self, now: Timestamp) -> String {
        let thinking: String = (0..self.thinking).map(|i| overrides::reasoning_token(0, i)).collect();
        let (content, calls) = match self.said {
            Said::ToolCalls(_) => (String::new(), Some(self.tool_calls())),
            _ => ((0..self.content_steps()).map(|i| self.piece(i)).collect(), None),
        };
        self.line(now, &self.message(&content, &thinking, calls.as_deref()), true)
    }

    /// The answer to an empty `messages`: the model is loaded, nothing said.
    pub fn load_line(&self, now: Timestamp) -> String {
        format!(
            "{{\"model\":{},\"created_at\":{},\"message\":{{\"role\":\"assistant\",\"content\":\"\"}},\"done\":true,\
             \"done_reason\":\"load\"}}",
            json_str(&self.model),
            json_str(&now.rfc3339())
        )
    }
}

/// `POST /api/chat`.
pub fn reply(body: &[u8], env: &Env<'_>) -> Reply {
    let plan = match plan(body, env.config, env.seq) {
        Ok(plan) => plan,
        Err(e) => return reply::bad_request(Flavor::Ollama, &e),
    };
    let tag = plan.knobs.tag.clone();
    if let Some(early) = reply::early_reply(Flavor::Ollama, plan.knobs.hangup, plan.knobs.error_status, &plan.model) {
        return early.tagged(tag);
    }
    if plan.load {
        return Reply::new(Flavor::Ollama, Action::Whole(Whole::json(200, OLLAMA_JSON, plan.load_line(env.now))))
            .tagged(tag);
    }
    let k = &plan.knobs;
    let action = if plan.stream {
        Action::Stream(Stream {
            content_type: "application/x-ndjson",
            headers: Vec::new(),
            eager_head: false,
            timing: Timing {
                ttft: k.ttft,
                interval: k.interval,
                abort_after: k.abort_after,
                stall_after: k.stall_after,
                hold_open: k.hold_open,
                burst: k.burst,
            },
            script: Box::new(OllamaScript { plan, step: 0 }),
        })
    } else {
        let mut whole = Whole::json(200, OLLAMA_JSON, plan.whole(env.now));
        whole.delay = k.whole_delay(plan.thinking + plan.content_steps());
        whole.abort = k.abort_after.is_some_and(|n| n <= plan.content_steps());
        Action::Whole(whole)
    };
    Reply::new(Flavor::Ollama, action).tagged(tag)
}

/// The NDJSON lines: thinking, content (or the tool calls), the final line.
#[derive(Debug)]
pub struct OllamaScript {
    plan: OllamaPlan,
    step: u64,
}

impl Script for OllamaScript {
    fn next_phase(&self) -> Option<Phase> {
        let p = &self.plan;
        let body = p.thinking + p.content_steps();
        match self.step {
            s if s < p.thinking => Some(Phase::SIDE),
            s if s < body => Some(Phase::CONTENT),
            s if s == body => Some(Phase::Tail),
            _ => None,
        }
    }

    fn render_next(&mut self, now: Timestamp, frames: &mut Vec<Frame>) {
        let p = &self.plan;
        let s = self.step;
        let body = p.thinking + p.content_steps();
        if s < p.thinking {
            frames.push(Frame::Line(p.line(now, &p.message("", &overrides::reasoning_token(0, s), None), false)));
        } else if s < body {
            let message = match p.said {
                Said::ToolCalls(_) => p.message("", "", Some(&p.tool_calls())),
                _ => p.message(&p.piece(s - p.thinking), "", None),
            };
            frames.push(Frame::Line(p.line(now, &message, false)));
        } else if s == body {
            frames.push(Frame::Line(p.line(now, &p.message("", "", None), true)));
        }
        self.step += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::mockprov::reply::collect;
    use crate::mockprov::MockConfig;
    use serde_json::json;

    const NOW: Timestamp = Timestamp { secs: 1_700_000_000, nanos: 123_456_000 };

    fn plan_of(body: &str) -> OllamaPlan {
        plan(body.as_bytes(), &MockConfig::for_tests(), 8).unwrap()
    }

    fn lines(body: &str) -> Vec<(Phase, Value)> {
        collect(&mut OllamaScript { plan: plan_of(body), step: 0 }, NOW)
            .into_iter()
            .map(|(phase, frames)| {
                assert_eq!(frames.len(), 1);
                let Frame::Line(line) = &frames[0] else { panic!() };
                assert!(!line.contains('\n'));
                (phase, serde_json::from_str(line).unwrap())
            })
            .collect()
    }

    #[test]
    fn stream_lines_are_ollama_shaped() {
        let l = lines(
            r#"{"model":"llama3.2","messages":[{"role":"user","content":"why is the sky blue?"}],"mock":{"tokens":2}}"#,
        );
        assert_eq!(l.len(), 3);
        assert_eq!(
            l[0].1,
            json!({"model":"llama3.2","created_at":"2023-11-14T22:13:20.123456Z","message":{"role":"assistant","content":"tok0 "},"done":false})
        );
        assert_eq!((l[0].0, l[2].0), (Phase::CONTENT, Phase::Tail));
        let last = &l[2].1;
        assert_eq!(
            (&last["done"], &last["done_reason"], &last["message"]),
            (&json!(true), &json!("stop"), &json!({"role":"assistant","content":""}))
        );
        assert_eq!((last["prompt_eval_count"].as_u64(), last["eval_count"].as_u64()), (Some(5), Some(2)));
        for key in ["total_duration", "load_duration", "prompt_eval_duration", "eval_duration"] {
            assert!(last[key].as_u64().unwrap() > 0, "{key}");
        }
        let keys: Vec<&String> = last.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 11);
    }

    #[test]
    fn thinking_comes_first_when_asked() {
        let l = lines(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"think":true,"mock":{"tokens":1}}"#);
        assert_eq!(l.len(), DEFAULT_THINKING as usize + 1 + 1);
        assert_eq!(l[0].1["message"], json!({"role":"assistant","content":"","thinking":"think0 "}));
        assert_eq!(l[0].0, Phase::SIDE);
        assert_eq!(l[4].1["message"]["content"], "tok0 ");
        assert!(l[4].1["message"].get("thinking").is_none());
        let l = lines(r#"{"model":"m","messages":[{"content":"x"}],"think":"high","mock":{"tokens":1,"reasoning":2}}"#);
        assert_eq!(l.len(), 2 + 1 + 1);
        let l = lines(r#"{"model":"m","messages":[{"content":"x"}],"think":false,"mock":{"tokens":1}}"#);
        assert_eq!(l.len(), 2);
        assert!(plan(br#"{"model":"m","messages":[],"think":"hot"}"#, &MockConfig::for_tests(), 1).is_err());
    }

    #[test]
    fn tool_calls_come_whole_in_one_line_and_only_with_tools() {
        let tools = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]"#;
        let l = lines(&format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"tools":{tools},"mock":{{"tool_calls":2}}}}"#
        ));
        assert_eq!(l.len(), 2);
        assert_eq!(
            l[0].1["message"],
            json!({"role":"assistant","content":"","tool_calls":[
                {"id":"call_8_0","function":{"index":0,"name":"get_weather","arguments":{"city":"Paris","n":0}}},
                {"id":"call_8_1","function":{"index":1,"name":"get_weather","arguments":{"city":"Paris","n":1}}}]})
        );
        assert_eq!((&l[1].1["done_reason"], &l[1].1["eval_count"]), (&json!("stop"), &json!(18)));
        // Without tools in the request: plain content.
        let l = lines(r#"{"model":"m","messages":[{"content":"x"}],"mock":{"tool_calls":2,"tokens":1}}"#);
        assert_eq!(l[0].1["message"]["content"], "tok0 ");
        // The second turn echoes the tool result.
        let body = format!(
            r#"{{"model":"m","tools":{tools},"mock":{{"tool_calls":2}},"messages":[{{"role":"user","content":"x"}},
               {{"role":"assistant","content":"","tool_calls":[{{"function":{{"name":"get_weather","arguments":{{"city":"Paris"}}}}}}]}},
               {{"role":"tool","content":"11 degrees","tool_name":"get_weather"}}]}}"#
        );
        let text: String = lines(&body)
            .iter()
            .filter(|(_, v)| v["done"] == false)
            .map(|(_, v)| v["message"]["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "tool said: 11 degrees");
    }

    #[test]
    fn num_predict_caps_and_whole_answers() {
        let p = plan_of(
            r#"{"model":"m","messages":[{"content":"x"}],"options":{"num_predict":3,"temperature":0},"think":true,"mock":{"tokens":5,"reasoning":1}}"#,
        );
        assert_eq!((p.thinking, p.said.clone(), p.done_reason), (1, Said::Tokens(2), "length"));
        let p =
            plan_of(r#"{"model":"m","messages":[{"content":"x"}],"options":{"num_predict":-1},"mock":{"tokens":5}}"#);
        assert_eq!((p.said.clone(), p.done_reason, p.stream), (Said::Tokens(5), "stop", true));

        let p = plan_of(
            r#"{"model":"m","stream":false,"think":true,"messages":[{"content":"x"}],"mock":{"tokens":2,"reasoning":1}}"#,
        );
        let v: Value = serde_json::from_str(&p.whole(NOW)).unwrap();
        assert_eq!(v["message"], json!({"role":"assistant","content":"tok0 tok1 ","thinking":"think0 "}));
        assert_eq!((&v["done"], &v["done_reason"], &v["eval_count"]), (&json!(true), &json!("stop"), &json!(3)));
        let v: Value = serde_json::from_str(&plan_of(r#"{"model":"m","messages":[]}"#).load_line(NOW)).unwrap();
        assert_eq!(
            v,
            json!({"model":"m","created_at":"2023-11-14T22:13:20.123456Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"load"})
        );
    }

    #[test]
    fn replies_and_errors() {
        let config = MockConfig::for_tests();
        let env = Env { config: &config, seq: 1, now: NOW };
        let whole = |r: Reply| match r.action {
            Action::Whole(w) => w,
            other => panic!("{other:?}"),
        };
        let w = whole(reply(br#"{"messages":[{"content":"x"}]}"#, &env));
        assert_eq!((w.status, w.content_type, w.body.as_str()), (400, OLLAMA_JSON, r#"{"error":"model is required"}"#));
        let w = whole(reply(br#"{"model":"x","messages":[{"content":"x"}],"mock":{"error_status":404}}"#, &env));
        assert_eq!((w.status, w.body.as_str()), (404, r#"{"error":"model \"x\" not found, try pulling it first"}"#));
        assert_eq!(whole(reply(br#"{"model":"x","messages":[{"content":[1]}]}"#, &env)).status, 400);
        let Action::Stream(s) = reply(br#"{"model":"x","messages":[{"content":"x"}]}"#, &env).action else { panic!() };
        assert_eq!((s.content_type, s.eager_head), ("application/x-ndjson", false));
        let w = whole(reply(br#"{"model":"x","stream":false,"messages":[{"content":"x"}],"mock":{"tokens":3,"ttft_ms":2,"token_interval_ms":1}}"#, &env));
        assert_eq!(w.delay, std::time::Duration::from_millis(4));
    }
}
