//! `POST /v1/completions`, the legacy text-completions API: `text_completion`
//! objects with `choices[].text`, streamed as SSE chunks ending with a finish
//! chunk per choice, the usage chunk (only with
//! `stream_options.include_usage`) and `[DONE]`. A prompt array gets one
//! choice per prompt and `n`, as OpenAI does (index = prompt × n + j).

use serde::Deserialize;
use serde_json::Value;

use super::chat::StreamOptions;
use super::clock::Timestamp;
use super::json::json_str;
use super::overrides::{self, BadRequest, Knobs, MockOverrides, MAX_FANOUT};
use super::reply::{self, Action, Env, Flavor, Frame, Phase, Reply, Script, Stream, Timing, Whole, SYSTEM_FINGERPRINT};

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

/// Everything needed to answer one completions request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPlan {
    /// `cmpl-mock-<seq>`.
    pub id: String,
    /// Model echoed in every chunk.
    pub model: String,
    /// Unix seconds.
    pub created: u64,
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt tokens over all prompts.
    pub prompt_tokens: u64,
    /// Choices: prompts × `n`.
    pub choices: u64,
    /// Tokens per choice (after `max_tokens`).
    pub tokens: u64,
    /// `"stop"` or `"length"`.
    pub finish_reason: &'static str,
    /// The merged knobs.
    pub knobs: Knobs,
}

impl TextPlan {
    /// Text of the whole answer of choice `c`.
    pub fn text(&self, c: u64) -> String {
        (0..self.tokens).map(|i| overrides::content_token(c, i, self.knobs.token_bytes)).collect()
    }

    fn head(&self) -> String {
        format!("{{\"id\":{},\"object\":\"text_completion\",\"created\":{},", json_str(&self.id), self.created)
    }

    fn usage(&self) -> String {
        let completion = self.tokens.saturating_mul(self.choices);
        format!(
            "{{\"prompt_tokens\":{},\"completion_tokens\":{completion},\"total_tokens\":{}}}",
            self.prompt_tokens,
            self.prompt_tokens + completion
        )
    }

    /// One streamed chunk: choice `c` with `text` (and its finish reason).
    pub fn chunk(&self, c: u64, text: &str, finish_reason: Option<&str>) -> String {
        format!(
            "{}\"choices\":[{{\"text\":{},\"index\":{c},\"logprobs\":null,\"finish_reason\":{}}}],\"model\":{},\
             \"system_fingerprint\":{}{}}}",
            self.head(),
            json_str(text),
            super::json::json_opt_str(finish_reason),
            json_str(&self.model),
            json_str(SYSTEM_FINGERPRINT),
            if self.include_usage { ",\"usage\":null" } else { "" }
        )
    }

    /// The usage chunk (`choices: []`).
    pub fn usage_chunk(&self) -> String {
        format!(
            "{}\"choices\":[],\"model\":{},\"system_fingerprint\":{},\"usage\":{}}}",
            self.head(),
            json_str(&self.model),
            json_str(SYSTEM_FINGERPRINT),
            self.usage()
        )
    }

    /// The non-streamed body.
    pub fn body(&self) -> String {
        let choices: Vec<String> = (0..self.choices)
            .map(|c| {
                format!(
                    "{{\"text\":{},\"index\":{c},\"logprobs\":null,\"finish_reason\":{}}}",
                    json_str(&self.text(c)),
                    json_str(self.finish_reason)
                )
            })
            .collect();
        format!(
            "{}\"model\":{},\"system_fingerprint\":{},\"choices\":[{}],\"usage\":{}}}",
            self.head(),
            json_str(&self.model),
            json_str(SYSTEM_FINGERPRINT),
            choices.join(","),
            self.usage()
        )
    }
}

/// Prompt tokens of each prompt: a string, strings, a token array, or token arrays.
fn prompt_tokens(prompt: &Value) -> Result<Vec<u64>, BadRequest> {
    let bad = || BadRequest("'prompt' must be a string, an array of strings, or token arrays".into());
    let string = |s: &str| overrides::prompt_tokens(s.chars().count());
    match prompt {
        Value::String(s) => Ok(vec![string(s)]),
        Value::Array(items) if items.is_empty() => Err(BadRequest("'prompt' must not be empty".into())),
        Value::Array(items) if items.iter().all(Value::is_u64) => Ok(vec![items.len() as u64]),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(string(s)),
                Value::Array(t) if !t.is_empty() && t.iter().all(Value::is_u64) => Ok(t.len() as u64),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// Validates a completions request and plans the answer.
pub fn plan(body: &[u8], config: &super::MockConfig, seq: u64, created: u64) -> Result<TextPlan, BadRequest> {
    let req: CompletionRequest =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
    let prompts = prompt_tokens(req.prompt.as_ref().ok_or_else(|| BadRequest("'prompt' is required".into()))?)?;
    let knobs = Knobs::resolve(req.mock, config)?;
    let n = req.n.unwrap_or(1);
    let choices = n.saturating_mul(prompts.len() as u64);
    if n == 0 || choices > MAX_FANOUT {
        return Err(BadRequest(format!("'n' × prompts must be in 1..={MAX_FANOUT}, got {choices}")));
    }
    let cap = req.max_tokens.unwrap_or(u64::MAX);
    let (tokens, finish_reason) = if knobs.tokens > cap { (cap, "length") } else { (knobs.tokens, "stop") };
    Ok(TextPlan {
        id: format!("cmpl-mock-{seq}"),
        model: req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| config.model.clone()),
        created,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.and_then(|s| s.include_usage).unwrap_or(false),
        prompt_tokens: prompts.iter().sum(),
        choices,
        tokens,
        finish_reason,
        knobs,
    })
}

/// `POST /v1/completions`.
pub fn reply(body: &[u8], env: &Env<'_>) -> Reply {
    let plan = match plan(body, env.config, env.seq, env.now.secs) {
        Ok(plan) => plan,
        Err(e) => return reply::bad_request(Flavor::OpenAi, &e),
    };
    if let Some(early) = reply::early_reply(Flavor::OpenAi, plan.knobs.hangup, plan.knobs.error_status, &plan.model) {
        return early.tagged(plan.knobs.tag.clone());
    }
    let tag = plan.knobs.tag.clone();
    let k = &plan.knobs;
    let action = if plan.stream {
        Action::Stream(Stream {
            content_type: "text/event-stream",
            headers: vec![("cache-control", "no-cache".to_owned())],
            eager_head: true,
            timing: Timing {
                ttft: k.ttft,
                interval: k.interval,
                abort_after: k.abort_after,
                stall_after: k.stall_after,
                hold_open: k.hold_open,
                burst: k.burst,
            },
            script: Box::new(TextScript { plan, step: 0 }),
        })
    } else {
        let mut whole = Whole::json(200, "application/json", plan.body());
        whole.delay = k.whole_delay(plan.tokens);
        whole.abort = k.abort_after.is_some_and(|n| n <= plan.tokens);
        Action::Whole(whole)
    };
    Reply::new(Flavor::OpenAi, action).tagged(tag)
}

/// The streamed answer: one step per token (a chunk per choice), then the tail.
#[derive(Debug)]
pub struct TextScript {
    plan: TextPlan,
    step: u64,
}

impl Script for TextScript {
    fn next_phase(&self) -> Option<Phase> {
        match self.step.cmp(&self.plan.tokens) {
            std::cmp::Ordering::Less => Some(Phase::CONTENT),
            std::cmp::Ordering::Equal => Some(Phase::Tail),
            std::cmp::Ordering::Greater => None,
        }
    }

    fn render_next(&mut self, _now: Timestamp, frames: &mut Vec<Frame>) {
        let p = &self.plan;
        let choices = 0..p.choices;
        if self.step < p.tokens {
            let i = self.step;
            frames.extend(
                choices.map(|c| Frame::Data(p.chunk(c, &overrides::content_token(c, i, p.knobs.token_bytes), None))),
            );
        } else if self.step == p.tokens {
            frames.extend(choices.map(|c| Frame::Data(p.chunk(c, "", Some(p.finish_reason)))));
            if p.include_usage {
                frames.push(Frame::Data(p.usage_chunk()));
            }
            frames.push(Frame::Done);
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

    fn plan_of(body: &str) -> TextPlan {
        plan(body.as_bytes(), &MockConfig::for_tests(), 3, 50).unwrap()
    }

    #[test]
    fn prompts_and_validation() {
        assert_eq!(plan_of(r#"{"prompt":"0123456789ab"}"#).prompt_tokens, 3);
        let p = plan_of(r#"{"prompt":["abcdefgh","x"],"n":2}"#);
        assert_eq!((p.prompt_tokens, p.choices), (3, 4));
        assert_eq!(plan_of(r#"{"prompt":[1,2,3]}"#).prompt_tokens, 3);
        assert_eq!(plan_of(r#"{"prompt":[[1,2],[3]]}"#).choices, 2);
        for bad in [
            r#"{}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":7}"#,
            r#"{"prompt":[[]]}"#,
            r#"{"prompt":"x","n":0}"#,
            r#"{"prompt":"x","n":200}"#,
        ] {
            assert!(plan(bad.as_bytes(), &MockConfig::for_tests(), 1, 0).is_err(), "{bad}");
        }
        let p = plan_of(r#"{"prompt":"x","max_tokens":2,"mock":{"tokens":5}}"#);
        assert_eq!((p.tokens, p.finish_reason), (2, "length"));
    }

    #[test]
    fn body_and_stream_are_text_completion_shaped() {
        let p = plan_of(r#"{"model":"m","prompt":"x","mock":{"tokens":2}}"#);
        let v: Value = serde_json::from_str(&p.body()).unwrap();
        assert_eq!(
            v,
            json!({"id":"cmpl-mock-3","object":"text_completion","created":50,"model":"m","system_fingerprint":"fp_mock",
                   "choices":[{"text":"tok0 tok1 ","index":0,"logprobs":null,"finish_reason":"stop"}],
                   "usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})
        );

        let p = plan_of(
            r#"{"prompt":"x","stream":true,"n":2,"stream_options":{"include_usage":true},"mock":{"tokens":2}}"#,
        );
        let steps = collect(&mut TextScript { plan: p, step: 0 }, Timestamp::from_secs(0));
        assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), [Phase::CONTENT, Phase::CONTENT, Phase::Tail]);
        let Frame::Data(c) = &steps[0].1[1] else { panic!() };
        let c: Value = serde_json::from_str(c).unwrap();
        assert_eq!(c["choices"][0], json!({"text":"tok0-c1 ","index":1,"logprobs":null,"finish_reason":null}));
        assert_eq!((&c["object"], &c["usage"]), (&json!("text_completion"), &Value::Null));
        let tail = &steps[2].1;
        assert_eq!(tail.len(), 2 + 1 + 1);
        let Frame::Data(fin) = &tail[1] else { panic!() };
        let fin: Value = serde_json::from_str(fin).unwrap();
        assert_eq!((&fin["choices"][0]["text"], &fin["choices"][0]["finish_reason"]), (&json!(""), &json!("stop")));
        let Frame::Data(usage) = &tail[2] else { panic!() };
        let usage: Value = serde_json::from_str(usage).unwrap();
        assert_eq!((&usage["choices"], &usage["usage"]["completion_tokens"]), (&json!([]), &json!(4)));
        assert_eq!(tail[3], Frame::Done);
    }
}
