//! The Messages event stream, parsed back and compared event by event.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use iop_core::exec::{codes, Delta, ExecEvent, FailureSource, Part, RunFailure, ToolCallDelta, Usage};
use serde_json::{json, Value};

use super::*;

pub(in crate::surface::anthropic) fn d(choice: u32, part: Part) -> ExecEvent {
    ExecEvent::Delta(Delta { choice, part, logprobs: None })
}

pub(in crate::surface::anthropic) fn tool(index: u32, id: &str, name: &str, arguments: &str) -> ExecEvent {
    let c = ToolCallDelta { index, id: id.into(), kind: String::new(), name: name.into(), arguments: arguments.into() };
    d(0, Part::ToolCall(Box::new(c)))
}

pub(in crate::surface::anthropic) fn complete(finish: &str, usage: Option<Usage>) -> ExecEvent {
    ExecEvent::Complete { finish_reason: finish.into(), usage }
}

/// The events' SSE, split into events: each exactly `event: <name>` and one
/// `data:` line whose JSON `type` is the name. Only the last event may end
/// the stream.
pub(in crate::surface::anthropic) fn sse(stop_sequences: &[&str], events: Vec<ExecEvent>) -> Vec<Value> {
    let seqs = stop_sequences.iter().map(|s| (*s).to_owned()).collect();
    let mut enc = MessagesEncoder::new("msg_r1", "asked", 12, seqs);
    let mut out = BytesMut::new();
    let n = events.len();
    for (i, ev) in events.into_iter().enumerate() {
        let ended = enc.event(&mut out, ev);
        assert_eq!(ended, i + 1 == n, "event {i} of {n} ended: {ended}");
    }
    parse(&out)
}

pub(in crate::surface::anthropic) fn parse(out: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(out).unwrap();
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.strip_suffix("\n\n")
        .unwrap()
        .split("\n\n")
        .map(|event| {
            let lines: Vec<&str> = event.split('\n').collect();
            let [name, data] = lines[..] else { panic!("{event:?}") };
            let name = name.strip_prefix("event: ").unwrap();
            let v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(v["type"], name, "{event}");
            v
        })
        .collect()
}

/// What an SDK makes of the events: the message, its blocks' deltas
/// applied (tool inputs parsed from the joined `partial_json`) and the
/// final `message_delta` laid over it.
pub(in crate::surface::anthropic) fn accumulate(events: &[Value]) -> Value {
    let mut message = Value::Null;
    let mut json_bufs: Vec<String> = Vec::new();
    for ev in events {
        match ev["type"].as_str().unwrap() {
            "message_start" => message = ev["message"].clone(),
            "content_block_start" => {
                let content = message["content"].as_array_mut().unwrap();
                assert_eq!(ev["index"], content.len());
                content.push(ev["content_block"].clone());
                json_bufs.push(String::new());
            }
            "content_block_delta" => {
                let i = ev["index"].as_u64().unwrap() as usize;
                let block = &mut message["content"][i];
                let delta = &ev["delta"];
                let field = match delta["type"].as_str().unwrap() {
                    "text_delta" => "text",
                    "thinking_delta" => "thinking",
                    "signature_delta" => "signature",
                    "input_json_delta" => {
                        json_bufs[i].push_str(delta["partial_json"].as_str().unwrap());
                        continue;
                    }
                    other => panic!("{other}"),
                };
                let text = [block[field].as_str().unwrap(), delta[field].as_str().unwrap()].concat();
                block[field] = json!(text);
            }
            "content_block_stop" => {
                let i = ev["index"].as_u64().unwrap() as usize;
                assert!(i < json_bufs.len());
            }
            "message_delta" => {
                for (k, v) in ev["delta"].as_object().unwrap() {
                    message[k] = v.clone();
                }
                for (k, v) in ev["usage"].as_object().unwrap() {
                    message["usage"][k] = v.clone();
                }
            }
            // SDKs parse the joined pieces as they come; whole at the end.
            "message_stop" => {
                for (i, buf) in json_bufs.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
                    message["content"][i]["input"] = serde_json::from_str(buf).unwrap();
                }
            }
            "ping" => {}
            other => panic!("{other}"),
        }
    }
    message
}

fn start(model: &str, input: u64) -> Value {
    json!({"type": "message_start", "message": {"id": "msg_r1", "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": 0}}})
}

fn ping() -> Value {
    json!({"type": "ping"})
}

fn block_start(index: u32, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn delta(index: u32, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn block_stop(index: u32) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn message_delta(stop_reason: &str, stop_sequence: Value, usage: Value) -> Value {
    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}, "usage": usage})
}

fn stop() -> Value {
    json!({"type": "message_stop"})
}

#[test]
fn text_only() {
    let events = sse(
        &[],
        vec![
            ExecEvent::Start { model: "up\"m".into() },
            ExecEvent::content(""),
            ExecEvent::content("he said \"hi\"\n"),
            ExecEvent::content("é"),
            complete("stop", Some(Usage { input_tokens: 9, output_tokens: 3, ..Default::default() })),
        ],
    );
    assert_eq!(
        events,
        vec![
            start("up\"m", 12),
            ping(),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "he said \"hi\"\n"})),
            delta(0, json!({"type": "text_delta", "text": "é"})),
            block_stop(0),
            message_delta("end_turn", Value::Null, json!({"input_tokens": 9, "output_tokens": 3})),
            stop(),
        ]
    );
}

#[test]
fn thinking_then_text_and_the_asked_model_without_a_start() {
    let events = sse(
        &[],
        vec![
            ExecEvent::reasoning("let me"),
            ExecEvent::reasoning(" think"),
            ExecEvent::content("42"),
            complete("stop", None),
        ],
    );
    assert_eq!(
        events,
        vec![
            start("asked", 12),
            ping(),
            block_start(0, json!({"type": "thinking", "thinking": "", "signature": ""})),
            delta(0, json!({"type": "thinking_delta", "thinking": "let me"})),
            delta(0, json!({"type": "thinking_delta", "thinking": " think"})),
            delta(0, json!({"type": "signature_delta", "signature": ""})),
            block_stop(0),
            block_start(1, json!({"type": "text", "text": ""})),
            delta(1, json!({"type": "text_delta", "text": "42"})),
            block_stop(1),
            // Unknown usage: no invented input count.
            message_delta("end_turn", Value::Null, json!({"output_tokens": 0})),
            stop(),
        ]
    );
    // A start naming no model names the asked one too.
    let events = sse(&[], vec![ExecEvent::Start { model: String::new() }, complete("stop", None)]);
    assert_eq!(events[0], start("asked", 12));
}

/// Arguments cut into pieces of `n` bytes (on char boundaries).
fn pieces(s: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in s.chars() {
        cur.push(ch);
        if cur.len() >= n {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[test]
fn text_then_two_tool_calls_in_many_fragments() {
    let args0 = r#"{"city": "Paris \"centre\"", "days": [1, 2, 3], "note": "é\n"}"#;
    let args1 = r#"{"q":"x"}"#;
    let mut evs = vec![ExecEvent::Start { model: "m".into() }, ExecEvent::content("Checking.")];
    evs.push(tool(0, "call_a", "weather", ""));
    evs.extend(pieces(args0, 3).iter().map(|p| tool(0, "", "", p)));
    // No id from the provider: one is made up; an empty fragment sends nothing.
    evs.push(tool(1, "", "search", ""));
    evs.extend(pieces(args1, 1).iter().map(|p| tool(1, "", "", p)));
    evs.push(ExecEvent::ChoiceFinish { choice: 0, finish_reason: "tool_calls".into(), stop_sequence: None });
    evs.push(complete("stop", None));
    let events = sse(&[], evs);

    let heads: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] != "content_block_delta" || e["delta"]["type"] != "input_json_delta")
        .cloned()
        .collect();
    assert_eq!(
        heads,
        vec![
            start("m", 12),
            ping(),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Checking."})),
            block_stop(0),
            block_start(1, json!({"type": "tool_use", "id": "call_a", "name": "weather", "input": {}})),
            block_stop(1),
            block_start(2, json!({"type": "tool_use", "id": "toolu_r1_1", "name": "search", "input": {}})),
            block_stop(2),
            message_delta("tool_use", Value::Null, json!({"output_tokens": 0})),
            stop(),
        ]
    );
    // Every fragment went out, in order, unmerged, inside its block.
    for (index, args, size) in [(1, args0, 3), (2, args1, 1)] {
        let partial: Vec<String> = events
            .iter()
            .filter(|e| e["index"] == index && e["delta"]["type"] == "input_json_delta")
            .map(|e| e["delta"]["partial_json"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(partial, pieces(args, size));
        assert_eq!(partial.concat(), args);
        let at = |v: Value| events.iter().position(|e| *e == v).unwrap();
        let first = events.iter().position(|e| e["index"] == index).unwrap();
        assert_eq!(first, at(block_start(index, events[first]["content_block"].clone())));
        let last = events.iter().rposition(|e| e["index"] == index).unwrap();
        assert_eq!(last, at(block_stop(index)));
    }
    let message = accumulate(&events);
    assert_eq!(message["content"][1]["input"], serde_json::from_str::<Value>(args0).unwrap());
    assert_eq!(message["content"][2]["input"], json!({"q": "x"}));
}

#[test]
fn interleaved_tool_fragments_reach_their_own_block() {
    let events = sse(
        &[],
        vec![
            tool(0, "a", "f", "{\"x\":"),
            tool(1, "b", "g", "{\"y\":"),
            tool(0, "", "", "1}"),
            tool(1, "", "", "2}"),
            complete("tool_calls", None),
        ],
    );
    let message = accumulate(&events);
    assert_eq!(message["content"][0]["input"], json!({"x": 1}));
    assert_eq!(message["content"][1]["input"], json!({"y": 2}));
    assert_eq!(message["content"].as_array().unwrap().len(), 2);
}

#[test]
fn usage_with_cached_tokens() {
    let usage = Usage { input_tokens: 100, output_tokens: 7, reasoning_tokens: Some(2), cached_input_tokens: Some(60) };
    let events = sse(&[], vec![ExecEvent::content("a"), complete("length", Some(usage))]);
    assert_eq!(
        events[events.len() - 2],
        message_delta(
            "max_tokens",
            Value::Null,
            json!({"input_tokens": 40, "output_tokens": 7, "cache_read_input_tokens": 60})
        )
    );
    // No cache report: no cache field.
    let usage = Usage { input_tokens: 5, output_tokens: 1, ..Default::default() };
    let events = sse(&[], vec![complete("stop", Some(usage))]);
    assert_eq!(events[2]["usage"], json!({"input_tokens": 5, "output_tokens": 1}));
}

#[test]
fn an_error_after_the_start_ends_the_stream() {
    let f = RunFailure::new(codes::UPSTREAM_STATUS, 429, FailureSource::Provider, "slow \"down\"");
    let mut enc = MessagesEncoder::new("msg_r1", "asked", 12, Vec::new());
    let mut out = BytesMut::new();
    assert!(!enc.event(&mut out, ExecEvent::content("par")));
    assert!(enc.event(&mut out, ExecEvent::Error(f)));
    let len = out.len();
    // Nothing after the end.
    assert!(enc.event(&mut out, ExecEvent::content("more")));
    assert!(enc.event(&mut out, complete("stop", None)));
    assert_eq!(out.len(), len);
    assert_eq!(
        parse(&out),
        vec![
            start("asked", 12),
            ping(),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "par"})),
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow \"down\""}}),
        ]
    );

    // The node's cancel, embeddings and a long message, each ending the stream.
    let events =
        sse(&[], vec![ExecEvent::Start { model: "m".into() }, ExecEvent::Cancelled { reason: "drain".into() }]);
    assert_eq!(events[2]["error"]["type"], "overloaded_error");
    assert!(events[2]["error"]["message"].as_str().unwrap().contains("drain"));
    let events = sse(&[], vec![ExecEvent::Embeddings(Vec::new())]);
    assert_eq!(events[2]["error"]["type"], "api_error");
    let long = RunFailure::new(codes::INTERNAL, 500, FailureSource::Node, "x".repeat(10_000));
    let events = sse(&[], vec![ExecEvent::Error(long)]);
    let message = events[2]["error"]["message"].as_str().unwrap();
    assert!(message.len() <= MAX_MESSAGE_BYTES + 3 && message.ends_with('…'));
}

#[test]
fn finish_reasons_become_stop_reasons() {
    let end = |events: Vec<ExecEvent>, seqs: &[&str]| {
        let events = sse(seqs, events);
        events[events.len() - 2]["delta"].clone()
    };
    let sd = |reason: &str, seq: Value| json!({"stop_reason": reason, "stop_sequence": seq});
    for (finish, want) in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        ("eos", "end_turn"),
    ] {
        assert_eq!(end(vec![complete(finish, None)], &[]), sd(want, Value::Null), "{finish}");
    }
    // Choice 0's own finish wins over the terminal's; other choices count for nothing.
    let evs = vec![
        ExecEvent::ChoiceFinish { choice: 1, finish_reason: "tool_calls".into(), stop_sequence: None },
        ExecEvent::ChoiceFinish { choice: 0, finish_reason: "length".into(), stop_sequence: None },
        complete("stop", None),
    ];
    assert_eq!(end(evs, &[]), sd("max_tokens", Value::Null));
    // A refusal's text is a text block, and the stop reason says refusal.
    let events = sse(&[], vec![d(0, Part::Refusal("I can't".into())), complete("stop", None)]);
    assert_eq!(events[2], block_start(0, json!({"type": "text", "text": ""})));
    assert_eq!(events[3], delta(0, json!({"type": "text_delta", "text": "I can't"})));
    assert_eq!(events[5]["delta"], sd("refusal", Value::Null));
    // The matched sequence as the finish reason (some servers send it).
    assert_eq!(end(vec![complete("###", None)], &["END", "###"]), sd("stop_sequence", json!("###")));
    // The sequence the provider named beside a plain stop (vLLM's `stop_reason`).
    let named = ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: Some("END".into()) };
    assert_eq!(end(vec![named, complete("stop", None)], &["END", "###"]), sd("stop_sequence", json!("END")));
    // `stop` beside tool calls (OpenAI's answer to a named tool_choice).
    assert_eq!(end(vec![tool(0, "c", "f", "{}"), complete("stop", None)], &[]), sd("tool_use", Value::Null));
}

#[test]
fn other_choices_are_not_rendered_and_ping_is_an_event() {
    let events = sse(
        &[],
        vec![
            d(1, Part::Content("other".into())),
            d(0, Part::Content("mine".into())),
            d(2, Part::Reasoning("other".into())),
            complete("stop", None),
        ],
    );
    let texts: Vec<&Value> = events.iter().filter(|e| e["type"] == "content_block_delta").collect();
    assert_eq!(texts, vec![&delta(0, json!({"type": "text_delta", "text": "mine"}))]);
    assert_eq!(events.iter().filter(|e| e["type"] == "content_block_start").count(), 1);

    let mut enc = MessagesEncoder::new("msg_r1", "m", 0, Vec::new());
    let mut out = BytesMut::new();
    enc.ping(&mut out);
    assert_eq!(&out[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

#[test]
fn large_pieces_are_written_whole() {
    let big = "y".repeat(40_000);
    let events = sse(&[], vec![ExecEvent::content(big.clone()), complete("stop", None)]);
    assert_eq!(events[3]["delta"]["text"], json!(big));
}

#[test]
fn a_token_read_in_place_writes_its_events() {
    crate::surface::encode::check_text_writes_its_event(|| MessagesEncoder::new("msg_r1", "m", 0, Vec::new()));
}
