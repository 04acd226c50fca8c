//! The streamed `chat.completion.chunk` answer: the JSON of every chunk and
//! the [`ChatScript`] that orders them. For `n` > 1 each step carries one
//! chunk per choice (choice 0 first), as OpenAI interleaves them.
//!
//! Order: the role chunk of every choice (lead, before the first-token
//! delay); reasoning chunks; then content tokens, refusal pieces or tool
//! calls (for each call a head chunk with id, type, name and empty arguments,
//! then one chunk per argument fragment); then the finish chunk of every
//! choice, the usage chunk when `stream_options.include_usage` is true, and
//! `[DONE]`.

use super::chat::{Answer, Plan};
use super::chat_body::usage_json;
use super::clock::Timestamp;
use super::json::{json_opt_str, json_str};
use super::reply::{Frame, Phase, Script, SERVICE_TIER, SYSTEM_FINGERPRINT};
use super::{logprobs, overrides, tool_calls};

/// Builds the JSON of every chunk of one streamed answer; the shared prefix
/// is rendered once.
#[derive(Debug)]
pub struct Chunks {
    /// `{"id":..,"object":"chat.completion.chunk","created":..,"model":..,...,`
    head: String,
    /// `,"usage":null}` when the stream ends with a usage chunk (OpenAI puts
    /// the null on every other chunk then), else `}`.
    tail: &'static str,
}

impl Chunks {
    /// Chunk builder for `plan`.
    pub fn new(plan: &Plan) -> Self {
        let head = format!(
            "{{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"service_tier\":{},\
             \"system_fingerprint\":{},",
            json_str(&plan.id),
            plan.created,
            json_str(&plan.model),
            json_str(SERVICE_TIER),
            json_str(SYSTEM_FINGERPRINT),
        );
        Self { head, tail: if plan.include_usage { ",\"usage\":null}" } else { "}" } }
    }

    fn choice(&self, index: u64, delta: &str, logprobs: Option<&str>, finish_reason: Option<&str>) -> String {
        self.choice_stopped(index, delta, logprobs, finish_reason, "")
    }

    /// A choice with `stop` (`,"stop_reason":…` or nothing) after its finish reason.
    fn choice_stopped(
        &self,
        index: u64,
        delta: &str,
        logprobs: Option<&str>,
        finish_reason: Option<&str>,
        stop: &str,
    ) -> String {
        format!(
            "{}\"choices\":[{{\"index\":{index},\"delta\":{delta},\"logprobs\":{},\"finish_reason\":{}{stop}}}]{}",
            self.head,
            logprobs.unwrap_or("null"),
            json_opt_str(finish_reason),
            self.tail
        )
    }

    /// The first chunk of a choice: the assistant role, with empty content
    /// (or null content for refusals and tool calls, as OpenAI sends).
    pub fn role(&self, index: u64, answer: &Answer) -> String {
        let delta = match answer {
            Answer::Tokens | Answer::Text(_) => r#"{"role":"assistant","content":""}"#,
            Answer::Refusal(_) => r#"{"role":"assistant","content":null,"refusal":""}"#,
            Answer::ToolCalls { .. } => r#"{"role":"assistant","content":null}"#,
        };
        self.choice(index, delta, None, None)
    }

    /// A content delta, with its logprobs object if any.
    pub fn content(&self, index: u64, text: &str, logprobs: Option<&str>) -> String {
        self.choice(index, &format!("{{\"content\":{}}}", json_str(text)), logprobs, None)
    }

    /// A refusal delta.
    pub fn refusal(&self, index: u64, text: &str, logprobs: Option<&str>) -> String {
        self.choice(index, &format!("{{\"refusal\":{}}}", json_str(text)), logprobs, None)
    }

    /// A reasoning delta.
    pub fn reasoning(&self, index: u64, text: &str) -> String {
        self.choice(index, &format!("{{\"reasoning_content\":{}}}", json_str(text)), None, None)
    }

    /// A tool-call delta (head or argument fragment, see [`tool_calls`]).
    pub fn tool_call(&self, index: u64, delta: &str) -> String {
        self.choice(index, delta, None, None)
    }

    /// The finish chunk: empty delta and the finish reason, and the stop
    /// string that ended the answer as vLLM names it (`stop_reason`).
    pub fn finish(&self, index: u64, finish_reason: &str, stop_reason: Option<&str>) -> String {
        let stop = stop_reason.map_or_else(String::new, |s| format!(",\"stop_reason\":{}", json_str(s)));
        self.choice_stopped(index, "{}", None, Some(finish_reason), &stop)
    }

    /// The usage chunk (`choices: []`).
    pub fn usage(&self, plan: &Plan) -> String {
        format!("{}\"choices\":[],\"usage\":{}}}", self.head, usage_json(plan))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Lead,
    Body(u64),
    Tail,
    Over,
}

/// The streamed answer of one plan.
#[derive(Debug)]
pub struct ChatScript {
    plan: Plan,
    chunks: Chunks,
    stage: Stage,
}

impl ChatScript {
    /// The script of `plan`.
    pub fn new(plan: Plan) -> Self {
        let chunks = Chunks::new(&plan);
        Self { plan, chunks, stage: Stage::Lead }
    }

    /// Steps between the lead and the tail (per choice).
    fn body_steps(&self) -> u64 {
        let body = match self.plan.answer {
            Answer::ToolCalls { calls, .. } => calls * (tool_calls::FRAGMENTS + 1),
            _ => self.plan.content,
        };
        self.plan.reasoning + body
    }

    /// The phase of body step `k`.
    fn body_phase(&self, k: u64) -> Phase {
        let p = &self.plan;
        if k < p.reasoning {
            return Phase::SIDE;
        }
        match p.answer {
            Answer::ToolCalls { .. } if (k - p.reasoning).is_multiple_of(tool_calls::FRAGMENTS + 1) => Phase::SIDE,
            _ => Phase::CONTENT,
        }
    }

    /// The chunk of body step `k` for choice `c`.
    fn body_chunk(&self, k: u64, c: u64) -> String {
        let p = &self.plan;
        if k < p.reasoning {
            return self.chunks.reasoning(c, &overrides::reasoning_token(c, k));
        }
        let b = k - p.reasoning;
        let logprobs_of = |text: &str, refusal: bool| {
            p.logprobs.map(|top| logprobs::choice_logprobs(&[logprobs::token_entry(text, b, top)], refusal))
        };
        match &p.answer {
            Answer::Tokens | Answer::Text(_) => {
                let text = p.piece(c, b);
                self.chunks.content(c, &text, logprobs_of(&text, false).as_deref())
            }
            Answer::Refusal(_) => {
                let text = p.piece(c, b);
                self.chunks.refusal(c, &text, logprobs_of(&text, true).as_deref())
            }
            Answer::ToolCalls { name, .. } => {
                let (call, r) = (b / (tool_calls::FRAGMENTS + 1), b % (tool_calls::FRAGMENTS + 1));
                if r == 0 {
                    let id = tool_calls::call_id(p.seq, c, call);
                    self.chunks.tool_call(c, &tool_calls::openai_head_delta(&id, name, call))
                } else {
                    self.chunks
                        .tool_call(c, &tool_calls::openai_fragment_delta(call, &tool_calls::fragment(call, r - 1)))
                }
            }
        }
    }
}

impl Script for ChatScript {
    fn next_phase(&self) -> Option<Phase> {
        match self.stage {
            Stage::Lead => Some(Phase::Lead),
            Stage::Body(k) => Some(self.body_phase(k)),
            Stage::Tail => Some(Phase::Tail),
            Stage::Over => None,
        }
    }

    fn render_next(&mut self, _now: Timestamp, frames: &mut Vec<Frame>) {
        let choices = 0..self.plan.choices;
        self.stage = match self.stage {
            Stage::Lead => {
                frames.extend(choices.map(|c| Frame::Data(self.chunks.role(c, &self.plan.answer))));
                if self.body_steps() == 0 {
                    Stage::Tail
                } else {
                    Stage::Body(0)
                }
            }
            Stage::Body(k) => {
                frames.extend(choices.map(|c| Frame::Data(self.body_chunk(k, c))));
                if k + 1 >= self.body_steps() {
                    Stage::Tail
                } else {
                    Stage::Body(k + 1)
                }
            }
            Stage::Tail => {
                let stop = self.plan.stop_reason.as_deref();
                frames.extend(choices.map(|c| Frame::Data(self.chunks.finish(c, self.plan.finish_reason, stop))));
                if self.plan.include_usage {
                    frames.push(Frame::Data(self.chunks.usage(&self.plan)));
                }
                frames.push(Frame::Done);
                Stage::Over
            }
            Stage::Over => Stage::Over,
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::mockprov::chat::plan;
    use crate::mockprov::reply::collect;
    use crate::mockprov::MockConfig;
    use serde_json::{json, Value};

    /// Every step of the stream of `body`, each chunk parsed (`[DONE]` as a string).
    fn steps(body: &str) -> Vec<(Phase, Vec<Value>)> {
        let p = plan(body.as_bytes(), &MockConfig::for_tests(), 5, 100).unwrap();
        collect(&mut ChatScript::new(p), Timestamp::from_secs(0))
            .into_iter()
            .map(|(phase, frames)| {
                let chunks = frames
                    .into_iter()
                    .map(|f| match f {
                        Frame::Data(json) => serde_json::from_str(&json).unwrap(),
                        Frame::Done => json!("[DONE]"),
                        other => panic!("unexpected frame {other:?}"),
                    })
                    .collect();
                (phase, chunks)
            })
            .collect()
    }

    #[test]
    fn plain_stream_order_and_metadata() {
        let s = steps(r#"{"messages":[{"content":"x"}],"mock":{"tokens":2,"reasoning":1},"stream":true}"#);
        let phases: Vec<Phase> = s.iter().map(|(p, _)| *p).collect();
        assert_eq!(phases, [Phase::Lead, Phase::SIDE, Phase::CONTENT, Phase::CONTENT, Phase::Tail]);
        for (_, chunks) in &s[..4] {
            assert_eq!(chunks[0]["system_fingerprint"], "fp_mock");
            assert_eq!(chunks[0]["service_tier"], "default");
            assert!(chunks[0].get("usage").is_none());
        }
        let tail = &s[4].1;
        assert_eq!(tail.len(), 2, "finish and [DONE], no usage chunk unless include_usage");
        assert_eq!((&tail[0]["choices"][0]["finish_reason"], &tail[1]), (&json!("stop"), &json!("[DONE]")));
    }

    #[test]
    fn include_usage_puts_null_usage_on_every_chunk_and_a_usage_chunk_last() {
        let s = steps(
            r#"{"messages":[{"content":"x"}],"mock":{"tokens":2},"stream":true,"stream_options":{"include_usage":true}}"#,
        );
        let chunks: Vec<&Value> = s.iter().flat_map(|(_, c)| c).collect();
        let (usage, rest) = chunks[..chunks.len() - 1].split_last().unwrap();
        for c in rest {
            assert_eq!(c["usage"], Value::Null);
            assert!(c.get("usage").is_some());
        }
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn tool_call_fragments_reassemble_per_index() {
        let s = steps(
            r#"{"messages":[{"role":"user","content":"x"}],"stream":true,"mock":{"tool_calls":3,"tool_name":"lookup"}}"#,
        );
        assert_eq!(s[0].1[0]["choices"][0]["delta"], json!({"role":"assistant","content":null}));
        let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
        let mut order = Vec::new();
        for (phase, chunks) in &s[1..s.len() - 1] {
            let delta = &chunks[0]["choices"][0]["delta"];
            let tc = &delta["tool_calls"][0];
            let i = tc["index"].as_u64().unwrap();
            order.push(i);
            if let Some(id) = tc["id"].as_str() {
                assert_eq!(*phase, Phase::SIDE, "heads are not counted");
                assert_eq!((tc["type"].as_str(), tc["function"]["arguments"].as_str()), (Some("function"), Some("")));
                let name = tc["function"]["name"].as_str().unwrap().to_owned();
                assert!(calls.insert(i, (id.to_owned(), name, String::new())).is_none());
            } else {
                assert_eq!(*phase, Phase::CONTENT);
                assert_eq!(tc.as_object().unwrap().len(), 2, "index and function only: {tc}");
                calls.get_mut(&i).unwrap().2.push_str(tc["function"]["arguments"].as_str().unwrap());
            }
        }
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "calls stream one after the other: {order:?}");
        assert_eq!(calls.len(), 3);
        for (i, (id, name, args)) in &calls {
            assert_eq!((id.clone(), name.as_str()), (format!("call_5_{i}"), "lookup"));
            let v: Value = serde_json::from_str(args).unwrap();
            assert_eq!(v, json!({"city":"Paris","n":i}));
        }
        let tail = &s.last().unwrap().1;
        assert_eq!(tail[0]["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_tool_result_gets_text_that_echoes_it() {
        let s = steps(
            r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[]},
                {"role":"tool","tool_call_id":"call_1_0","content":"11 degrees"}],"stream":true,"mock":{"tool_calls":2}}"#,
        );
        let text: String = s[1..s.len() - 1]
            .iter()
            .map(|(_, c)| c[0]["choices"][0]["delta"]["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "tool said: 11 degrees");
        assert_eq!(s.last().unwrap().1[0]["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn refusal_streams_refusal_fragments() {
        let s = steps(r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"refusal":"I can't help with that."}}"#);
        assert_eq!(s[0].1[0]["choices"][0]["delta"], json!({"role":"assistant","content":null,"refusal":""}));
        let text: String = s[1..s.len() - 1]
            .iter()
            .map(|(_, c)| {
                let delta = &c[0]["choices"][0]["delta"];
                assert!(delta.get("content").is_none());
                delta["refusal"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(text, "I can't help with that.");
        assert_eq!(s.last().unwrap().1[0]["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn n_choices_interleave_per_token_with_their_own_finish() {
        let s = steps(
            r#"{"messages":[{"content":"x"}],"stream":true,"n":3,"mock":{"tokens":2},"stream_options":{"include_usage":true}}"#,
        );
        assert_eq!(s.len(), 1 + 2 + 1);
        for (_, chunks) in &s[..3] {
            let idx: Vec<u64> = chunks.iter().map(|c| c["choices"][0]["index"].as_u64().unwrap()).collect();
            assert_eq!(idx, [0, 1, 2]);
        }
        let texts: Vec<&str> = s[1].1.iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
        assert_eq!(texts, ["tok0 ", "tok0-c1 ", "tok0-c2 "]);
        let tail = &s[3].1;
        assert_eq!(tail.len(), 3 + 1 + 1);
        for (c, chunk) in tail[..3].iter().enumerate() {
            assert_eq!(
                (chunk["choices"][0]["index"].as_u64(), chunk["choices"][0]["finish_reason"].as_str()),
                (Some(c as u64), Some("stop"))
            );
        }
        assert_eq!(tail[3]["usage"]["completion_tokens"], 6, "usage counts all choices");
    }

    #[test]
    fn logprobs_ride_on_every_content_chunk() {
        let s = steps(
            r#"{"messages":[{"content":"x"}],"stream":true,"logprobs":true,"top_logprobs":2,"mock":{"tokens":3,"reasoning":1}}"#,
        );
        assert_eq!(s[0].1[0]["choices"][0]["logprobs"], Value::Null);
        assert_eq!(s[1].1[0]["choices"][0]["logprobs"], Value::Null, "reasoning has none");
        for (i, (_, chunks)) in s[2..5].iter().enumerate() {
            let lp = &chunks[0]["choices"][0]["logprobs"];
            assert_eq!(lp["refusal"], Value::Null);
            let entry = &lp["content"][0];
            assert_eq!(entry["token"], format!("tok{i} "));
            assert_eq!(entry["logprob"].as_f64(), Some(crate::mockprov::logprobs::logprob(i as u64)));
            assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
            assert_eq!(entry["bytes"], json!(format!("tok{i} ").bytes().collect::<Vec<_>>()));
        }
        // The override forces them on without top_logprobs.
        let s = steps(r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"tokens":1,"logprobs":true}}"#);
        assert_eq!(s[1].1[0]["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json!([]));
    }
}
