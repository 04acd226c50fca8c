//! The streamed Messages answer, as named SSE events without `[DONE]`:
//! `message_start` (usage: the input tokens and `output_tokens: 1`) and
//! `ping` before the first-token delay; per content block a
//! `content_block_start`, its `content_block_delta`s (`thinking_delta`s then
//! one `signature_delta`, `text_delta`s, or `input_json_delta`s carrying the
//! tool input in fragments) and a `content_block_stop`; then `message_delta`
//! (stop reason and the output tokens) and `message_stop`.

use super::clock::Timestamp;
use super::json::json_str;
use super::messages::{Block, MessagesPlan};
use super::reply::{Frame, Phase, Script};
use super::tool_calls;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Lead,
    /// `content_block_start` of block `b`.
    Start(u64),
    /// Delta `k` of block `b`.
    Delta(u64, u64),
    /// The end of block `b` (its signature first, for thinking).
    Stop(u64),
    Tail,
    Over,
}

/// The streamed answer of one plan.
#[derive(Debug)]
pub struct MessagesScript {
    plan: MessagesPlan,
    stage: Stage,
}

impl MessagesScript {
    /// The script of `plan`.
    pub fn new(plan: MessagesPlan) -> Self {
        Self { plan, stage: Stage::Lead }
    }

    fn block_or_tail(&self, b: u64) -> Stage {
        if b < self.plan.blocks() {
            Stage::Start(b)
        } else {
            Stage::Tail
        }
    }

    fn delta(&self, b: u64, k: u64) -> Frame {
        let p = &self.plan;
        let delta = match p.block(b) {
            Block::Thinking => {
                format!("{{\"type\":\"thinking_delta\",\"thinking\":{}}}", json_str(&p.thinking_token(k)))
            }
            Block::Text => format!("{{\"type\":\"text_delta\",\"text\":{}}}", json_str(&p.text_piece(k))),
            Block::ToolUse(i) => {
                format!("{{\"type\":\"input_json_delta\",\"partial_json\":{}}}", json_str(&tool_calls::fragment(i, k)))
            }
        };
        block_delta(b, &delta)
    }

    fn start(&self, b: u64) -> Frame {
        let p = &self.plan;
        let block = match p.block(b) {
            Block::Thinking => r#"{"type":"thinking","thinking":"","signature":""}"#.to_owned(),
            Block::Text => r#"{"type":"text","text":""}"#.to_owned(),
            Block::ToolUse(i) => {
                let (name, id) = p.tool_use(i);
                tool_calls::anthropic_tool_use(&id, name, "{}")
            }
        };
        Frame::Event(
            "content_block_start",
            format!("{{\"type\":\"content_block_start\",\"index\":{b},\"content_block\":{block}}}"),
        )
    }
}

fn block_delta(b: u64, delta: &str) -> Frame {
    Frame::Event("content_block_delta", format!("{{\"type\":\"content_block_delta\",\"index\":{b},\"delta\":{delta}}}"))
}

impl Script for MessagesScript {
    fn next_phase(&self) -> Option<Phase> {
        let p = &self.plan;
        match self.stage {
            Stage::Lead => Some(Phase::Lead),
            // A tool use's head is paced like chat's, but not counted.
            Stage::Start(b) if matches!(p.block(b), Block::ToolUse(_)) => Some(Phase::SIDE),
            Stage::Start(_) | Stage::Stop(_) => Some(Phase::FOLLOW),
            Stage::Delta(b, _) if p.block(b) == Block::Thinking => Some(Phase::SIDE),
            Stage::Delta(..) => Some(Phase::CONTENT),
            Stage::Tail => Some(Phase::Tail),
            Stage::Over => None,
        }
    }

    fn render_next(&mut self, _now: Timestamp, frames: &mut Vec<Frame>) {
        let p = &self.plan;
        self.stage = match self.stage {
            Stage::Lead => {
                let message = p.message("[]", None, 1);
                frames.push(Frame::Event(
                    "message_start",
                    format!("{{\"type\":\"message_start\",\"message\":{message}}}"),
                ));
                frames.push(Frame::Event("ping", r#"{"type":"ping"}"#.to_owned()));
                self.block_or_tail(0)
            }
            Stage::Start(b) => {
                frames.push(self.start(b));
                if p.deltas(p.block(b)) > 0 {
                    Stage::Delta(b, 0)
                } else {
                    Stage::Stop(b)
                }
            }
            Stage::Delta(b, k) => {
                frames.push(self.delta(b, k));
                if k + 1 < p.deltas(p.block(b)) {
                    Stage::Delta(b, k + 1)
                } else {
                    Stage::Stop(b)
                }
            }
            Stage::Stop(b) => {
                if p.block(b) == Block::Thinking {
                    let signature =
                        format!("{{\"type\":\"signature_delta\",\"signature\":{}}}", json_str(&p.signature()));
                    frames.push(block_delta(b, &signature));
                }
                frames.push(Frame::Event(
                    "content_block_stop",
                    format!("{{\"type\":\"content_block_stop\",\"index\":{b}}}"),
                ));
                self.block_or_tail(b + 1)
            }
            Stage::Tail => {
                frames.push(Frame::Event(
                    "message_delta",
                    format!(
                        "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":{},\"stop_sequence\":null}},\
                         \"usage\":{{\"output_tokens\":{}}}}}",
                        json_str(p.stop_reason),
                        p.output_tokens()
                    ),
                ));
                frames.push(Frame::Event("message_stop", r#"{"type":"message_stop"}"#.to_owned()));
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
    use crate::mockprov::messages::plan;
    use crate::mockprov::reply::collect;
    use crate::mockprov::MockConfig;
    use serde_json::{json, Value};

    /// Every event of the stream of `body`: phase, name, data.
    fn events(body: &str) -> Vec<(Phase, &'static str, Value)> {
        let p = plan(body.as_bytes(), &MockConfig::for_tests(), 3).unwrap();
        collect(&mut MessagesScript::new(p), Timestamp::from_secs(0))
            .into_iter()
            .flat_map(|(phase, frames)| {
                frames.into_iter().map(move |f| match f {
                    Frame::Event(name, data) => {
                        let v: Value = serde_json::from_str(&data).unwrap();
                        assert_eq!(v["type"], name, "type names the event");
                        (phase, name, v)
                    }
                    other => panic!("{other:?}"),
                })
            })
            .collect()
    }

    #[test]
    fn thinking_then_text_in_order() {
        let ev = events(
            r#"{"model":"m","max_tokens":99,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},
                "messages":[{"role":"user","content":"12345678"}],"mock":{"tokens":2,"reasoning":2}}"#,
        );
        let names: Vec<&str> = ev.iter().map(|e| e.1).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!((ev[0].0, ev[1].0), (Phase::Lead, Phase::Lead));
        assert_eq!(
            ev[0].2["message"],
            json!({"id":"msg_mock_3","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,
                "stop_sequence":null,"usage":{"input_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}})
        );
        assert_eq!(ev[2].2["content_block"], json!({"type":"thinking","thinking":"","signature":""}));
        assert_eq!(ev[3].2["delta"], json!({"type":"thinking_delta","thinking":"think0 "}));
        assert_eq!(ev[3].0, Phase::SIDE);
        assert_eq!(ev[5].2["delta"], json!({"type":"signature_delta","signature":"sig-9132291d4a359ae0"}));
        assert_eq!((ev[6].2["index"].as_u64(), ev[7].2["index"].as_u64()), (Some(0), Some(1)));
        assert_eq!(ev[7].2["content_block"], json!({"type":"text","text":""}));
        assert_eq!((ev[8].0, &ev[8].2["delta"]), (Phase::CONTENT, &json!({"type":"text_delta","text":"tok0 "})));
        assert_eq!(
            ev[11].2,
            json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":4}})
        );
        assert_eq!(ev[12].0, Phase::Tail);
    }

    #[test]
    fn tool_use_input_reassembles_to_the_whole_answers_input() {
        let body = r#"{"model":"m","max_tokens":9,"stream":true,"tools":[{"name":"lookup","input_schema":{}}],
            "messages":[{"role":"user","content":"x"}],"mock":{"tool_calls":2}}"#;
        let ev = events(body);
        let whole: Value =
            serde_json::from_str(&plan(body.as_bytes(), &MockConfig::for_tests(), 3).unwrap().body()).unwrap();
        let mut blocks: BTreeMap<u64, (Value, String)> = BTreeMap::new();
        for (phase, name, v) in &ev[2..ev.len() - 2] {
            let i = v["index"].as_u64().unwrap();
            match *name {
                "content_block_start" => {
                    assert_eq!(*phase, Phase::SIDE);
                    assert_eq!(v["content_block"]["input"], json!({}));
                    blocks.insert(i, (v["content_block"].clone(), String::new()));
                }
                "content_block_delta" => {
                    assert_eq!((*phase, &v["delta"]["type"]), (Phase::CONTENT, &json!("input_json_delta")));
                    blocks.get_mut(&i).unwrap().1.push_str(v["delta"]["partial_json"].as_str().unwrap());
                }
                _ => assert_eq!(*name, "content_block_stop"),
            }
        }
        assert_eq!(blocks.len(), 2);
        for (i, (mut block, json)) in blocks {
            block["input"] = serde_json::from_str(&json).unwrap();
            assert_eq!(block, whole["content"][i as usize]);
        }
        assert_eq!(ev[ev.len() - 2].2["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn an_empty_answer_has_no_blocks() {
        let ev = events(
            r#"{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":0}}"#,
        );
        let names: Vec<&str> = ev.iter().map(|e| e.1).collect();
        assert_eq!(names, ["message_start", "ping", "message_delta", "message_stop"]);
    }
}
