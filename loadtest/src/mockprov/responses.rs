//! `POST /v1/responses`, the Responses API: one assistant message with one
//! `output_text` part. Streamed (`"stream": true`) as named SSE events, each
//! `data:` carrying `type` and a `sequence_number` from 0, without `[DONE]`:
//! `response.created`, `response.in_progress` (both before the first-token
//! delay), `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per token, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done` and
//! `response.completed` (`response.incomplete` when `max_output_tokens` cut
//! the answer).

use serde::Deserialize;
use serde_json::Value;

use super::clock::Timestamp;
use super::json::{json_opt_str, json_str};
use super::overrides::{self, content_chars, BadRequest, Knobs, MockOverrides};
use super::reply::{self, Action, Env, Flavor, Frame, Phase, Reply, Script, Stream, Timing, Whole, SERVICE_TIER};

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

/// Everything needed to answer one Responses request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsePlan {
    /// `resp_mock_<seq>`.
    pub id: String,
    /// `msg_mock_<seq>`, the output message.
    pub message_id: String,
    /// Model echoed.
    pub model: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `"stream": true`.
    pub stream: bool,
    /// Echoed `instructions`.
    pub instructions: Option<String>,
    /// Echoed `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens (after the cap).
    pub tokens: u64,
    /// `max_output_tokens` cut the answer.
    pub incomplete: bool,
    /// The merged knobs.
    pub knobs: Knobs,
}

/// Characters of a Responses `input`: a string, or the text of its items.
fn input_chars(input: &Value) -> usize {
    match input {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(|item| item.get("content").map_or(0, content_chars)).sum(),
        _ => 0,
    }
}

/// Validates a Responses request and plans the answer.
pub fn plan(body: &[u8], config: &super::MockConfig, seq: u64, created_at: u64) -> Result<ResponsePlan, BadRequest> {
    let req: ResponsesRequest =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
    if let Some(input) = &req.input {
        if !(input.is_string() || input.is_array()) {
            return Err(BadRequest("'input' must be a string or an array of input items".into()));
        }
    }
    let knobs = Knobs::resolve(req.mock, config)?;
    let chars = req.input.as_ref().map_or(0, input_chars) + req.instructions.as_ref().map_or(0, |s| s.chars().count());
    let cap = req.max_output_tokens.unwrap_or(u64::MAX);
    Ok(ResponsePlan {
        id: format!("resp_mock_{seq}"),
        message_id: format!("msg_mock_{seq}"),
        model: req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| config.model.clone()),
        created_at,
        stream: req.stream.unwrap_or(false),
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        input_tokens: overrides::prompt_tokens(chars),
        tokens: knobs.tokens.min(cap),
        incomplete: knobs.tokens > cap,
        knobs,
    })
}

/// How far the response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// `response.created` / `response.in_progress`: no output, no usage.
    InProgress,
    /// Completed (or incomplete after `max_output_tokens`).
    Done,
}

impl ResponsePlan {
    /// Text of output token `i`.
    pub fn token(&self, i: u64) -> String {
        overrides::content_token(0, i, self.knobs.token_bytes)
    }

    /// The whole output text.
    pub fn text(&self) -> String {
        (0..self.tokens).map(|i| self.token(i)).collect()
    }

    fn final_status(&self) -> &'static str {
        if self.incomplete {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn part(&self, text: &str) -> String {
        format!("{{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":{}}}", json_str(text))
    }

    /// The output message item (without content while in progress).
    fn item(&self, state: State, text: &str) -> String {
        let (status, content) = match state {
            State::InProgress => ("in_progress", String::new()),
            State::Done => (self.final_status(), self.part(text)),
        };
        format!(
            "{{\"id\":{},\"type\":\"message\",\"status\":{},\"content\":[{content}],\"role\":\"assistant\"}}",
            json_str(&self.message_id),
            json_str(status)
        )
    }

    /// The `response` object.
    pub fn response(&self, state: State, text: &str) -> String {
        let (status, incomplete, completed_at, output, usage) = match state {
            State::InProgress => {
                ("in_progress", "null".to_owned(), "null".to_owned(), String::new(), "null".to_owned())
            }
            State::Done => (
                self.final_status(),
                if self.incomplete { r#"{"reason":"max_output_tokens"}"#.to_owned() } else { "null".to_owned() },
                self.created_at.to_string(),
                self.item(State::Done, text),
                format!(
                    "{{\"input_tokens\":{},\"input_tokens_details\":{{\"cached_tokens\":0,\"cache_write_tokens\":0}},\"output_tokens\":{},\
                     \"output_tokens_details\":{{\"reasoning_tokens\":0}},\"total_tokens\":{}}}",
                    self.input_tokens,
                    self.tokens,
                    self.input_tokens + self.tokens
                ),
            ),
        };
        format!(
            "{{\"id\":{},\"object\":\"response\",\"created_at\":{},\"status\":{},\"background\":false,\"completed_at\":{completed_at},\
             \"error\":null,\"incomplete_details\":{incomplete},\"instructions\":{},\"max_output_tokens\":{},\"model\":{},\
             \"output\":[{output}],\"parallel_tool_calls\":true,\"previous_response_id\":null,\
             \"reasoning\":{{\"effort\":null,\"summary\":null}},\"service_tier\":{},\"store\":false,\"temperature\":1.0,\
             \"text\":{{\"format\":{{\"type\":\"text\"}}}},\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,\
             \"truncation\":\"disabled\",\"usage\":{usage},\"user\":null,\"metadata\":{{}}}}",
            json_str(&self.id),
            self.created_at,
            json_str(status),
            json_opt_str(self.instructions.as_deref()),
            self.max_output_tokens.map_or_else(|| "null".to_owned(), |n| n.to_string()),
            json_str(&self.model),
            json_str(SERVICE_TIER),
        )
    }
}

/// `POST /v1/responses`.
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
            script: Box::new(ResponseScript { plan, step: 0, seq: 0 }),
        })
    } else {
        let mut whole = Whole::json(200, "application/json", plan.response(State::Done, &plan.text()));
        whole.delay = k.whole_delay(plan.tokens);
        whole.abort = k.abort_after.is_some_and(|n| n <= plan.tokens);
        Action::Whole(whole)
    };
    Reply::new(Flavor::OpenAi, action).tagged(tag)
}

/// The streamed events. Steps: 0 lead (created, in_progress), 1 item added,
/// 2 part added, then one per token, then the tail.
#[derive(Debug)]
pub struct ResponseScript {
    plan: ResponsePlan,
    step: u64,
    /// Next `sequence_number`.
    seq: u64,
}

impl ResponseScript {
    fn event(&mut self, name: &'static str, fields: &str) -> Frame {
        let seq = self.seq;
        self.seq += 1;
        Frame::Event(name, format!("{{\"type\":{},\"sequence_number\":{seq},{fields}}}", json_str(name)))
    }

    fn at(&self) -> String {
        format!("\"item_id\":{},\"output_index\":0,\"content_index\":0", json_str(&self.plan.message_id))
    }
}

impl Script for ResponseScript {
    fn next_phase(&self) -> Option<Phase> {
        match self.step {
            0 => Some(Phase::Lead),
            1 | 2 => Some(Phase::FOLLOW),
            s if s < 3 + self.plan.tokens => Some(Phase::CONTENT),
            s if s == 3 + self.plan.tokens => Some(Phase::Tail),
            _ => None,
        }
    }

    fn render_next(&mut self, _now: Timestamp, frames: &mut Vec<Frame>) {
        let p = self.plan.clone();
        match self.step {
            0 => {
                let r = p.response(State::InProgress, "");
                let created = self.event("response.created", &format!("\"response\":{r}"));
                let in_progress = self.event("response.in_progress", &format!("\"response\":{r}"));
                frames.extend([created, in_progress]);
            }
            1 => {
                let item = p.item(State::InProgress, "");
                frames.push(self.event("response.output_item.added", &format!("\"output_index\":0,\"item\":{item}")));
            }
            2 => {
                let fields = format!("{},\"part\":{}", self.at(), p.part(""));
                frames.push(self.event("response.content_part.added", &fields));
            }
            s if s < 3 + p.tokens => {
                let fields = format!("{},\"delta\":{},\"logprobs\":[]", self.at(), json_str(&p.token(s - 3)));
                frames.push(self.event("response.output_text.delta", &fields));
            }
            s if s == 3 + p.tokens => {
                let text = p.text();
                let done = format!("{},\"text\":{},\"logprobs\":[]", self.at(), json_str(&text));
                let part = format!("{},\"part\":{}", self.at(), p.part(&text));
                let item = format!("\"output_index\":0,\"item\":{}", p.item(State::Done, &text));
                let last = if p.incomplete { "response.incomplete" } else { "response.completed" };
                let response = format!("\"response\":{}", p.response(State::Done, &text));
                let events = [
                    self.event("response.output_text.done", &done),
                    self.event("response.content_part.done", &part),
                    self.event("response.output_item.done", &item),
                    self.event(last, &response),
                ];
                frames.extend(events);
            }
            _ => {}
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

    fn plan_of(body: &str) -> ResponsePlan {
        plan(body.as_bytes(), &MockConfig::for_tests(), 6, 77).unwrap()
    }

    fn events(body: &str) -> Vec<(Phase, &'static str, Value)> {
        let mut script = ResponseScript { plan: plan_of(body), step: 0, seq: 0 };
        collect(&mut script, Timestamp::from_secs(0))
            .into_iter()
            .flat_map(|(phase, frames)| {
                frames.into_iter().map(move |f| match f {
                    Frame::Event(name, data) => (phase, name, serde_json::from_str::<Value>(&data).unwrap()),
                    other => panic!("{other:?}"),
                })
            })
            .collect()
    }

    #[test]
    fn body_is_a_completed_response() {
        let p = plan_of(
            r#"{"model":"gpt","input":[{"role":"user","content":[{"type":"input_text","text":"12345678"}]}],"mock":{"tokens":2}}"#,
        );
        let v: Value = serde_json::from_str(&p.response(State::Done, &p.text())).unwrap();
        assert_eq!(
            (&v["id"], &v["object"], &v["status"]),
            (&json!("resp_mock_6"), &json!("response"), &json!("completed"))
        );
        assert_eq!(
            (&v["model"], &v["created_at"], &v["incomplete_details"]),
            (&json!("gpt"), &json!(77), &Value::Null)
        );
        assert_eq!(
            v["output"],
            json!([{"id":"msg_mock_6","type":"message","status":"completed","role":"assistant",
                    "content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"tok0 tok1 "}]}])
        );
        assert_eq!((v["usage"]["input_tokens"].as_u64(), v["usage"]["output_tokens"].as_u64()), (Some(2), Some(2)));
        assert_eq!(v["usage"]["total_tokens"], 4);

        let p = plan_of(r#"{"input":"x","max_output_tokens":1,"instructions":"be brief","mock":{"tokens":3}}"#);
        let v: Value = serde_json::from_str(&p.response(State::Done, &p.text())).unwrap();
        assert_eq!(
            (&v["status"], &v["incomplete_details"]["reason"]),
            (&json!("incomplete"), &json!("max_output_tokens"))
        );
        assert_eq!((&v["instructions"], &v["max_output_tokens"]), (&json!("be brief"), &json!(1)));
        assert_eq!(v["output"][0]["content"][0]["text"], "tok0 ");
        assert!(plan(br#"{"input":7}"#, &MockConfig::for_tests(), 1, 0).is_err());
    }

    #[test]
    fn stream_events_come_in_order_with_sequence_numbers() {
        let ev = events(r#"{"input":"hi","stream":true,"mock":{"tokens":3}}"#);
        let names: Vec<&str> = ev.iter().map(|e| e.1).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, name, data)) in ev.iter().enumerate() {
            assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(*name), Some(i as u64)));
        }
        assert_eq!(
            (ev[0].0, ev[1].0, ev[2].0, ev[4].0, ev[10].0),
            (Phase::Lead, Phase::Lead, Phase::FOLLOW, Phase::CONTENT, Phase::Tail)
        );
        assert_eq!(
            (&ev[0].2["response"]["status"], &ev[0].2["response"]["output"]),
            (&json!("in_progress"), &json!([]))
        );
        assert_eq!(
            ev[2].2["item"],
            json!({"id":"msg_mock_6","type":"message","status":"in_progress","content":[],"role":"assistant"})
        );
        let deltas: String = ev[4..7].iter().map(|e| e.2["delta"].as_str().unwrap().to_owned()).collect();
        assert_eq!(deltas, "tok0 tok1 tok2 ");
        assert_eq!(
            (&ev[4].2["item_id"], &ev[4].2["output_index"], &ev[4].2["content_index"]),
            (&json!("msg_mock_6"), &json!(0), &json!(0))
        );
        assert_eq!(ev[7].2["text"], "tok0 tok1 tok2 ");
        assert_eq!(ev[8].2["part"]["text"], "tok0 tok1 tok2 ");
        assert_eq!(ev[9].2["item"]["status"], "completed");
        assert_eq!(ev[10].2["response"]["status"], "completed");
        assert_eq!(ev[10].2["response"]["usage"]["output_tokens"], 3);

        let ev = events(r#"{"input":"hi","stream":true,"max_output_tokens":1,"mock":{"tokens":3}}"#);
        assert_eq!(ev.last().unwrap().1, "response.incomplete");
        assert_eq!(ev.last().unwrap().2["response"]["status"], "incomplete");
    }
}
