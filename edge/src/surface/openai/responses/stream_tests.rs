//! The Responses event stream, parsed back and compared event by event.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use iop_core::exec::{codes, Delta, ExecEvent, FailureSource, Part, ProviderError, RunFailure, ToolCallDelta, Usage};
use serde_json::{json, Value};

use super::super::Echo;
use super::*;
use crate::surface::openai::error::MAX_MESSAGE_BYTES;

pub(in crate::surface::openai::responses) fn d(choice: u32, part: Part) -> ExecEvent {
    ExecEvent::Delta(Delta { choice, part, logprobs: None })
}

pub(in crate::surface::openai::responses) fn tool(index: u32, id: &str, name: &str, arguments: &str) -> ExecEvent {
    let c = ToolCallDelta { index, id: id.into(), kind: String::new(), name: name.into(), arguments: arguments.into() };
    d(0, Part::ToolCall(Box::new(c)))
}

pub(in crate::surface::openai::responses) fn complete(finish: &str, usage: Option<Usage>) -> ExecEvent {
    ExecEvent::Complete { finish_reason: finish.into(), usage }
}

/// The request's echo: a bit of everything.
pub(in crate::surface::openai::responses) fn meta() -> ResponseMeta {
    ResponseMeta {
        id: "resp_r1".into(),
        model: "asked".into(),
        created_at: 7,
        echo: Echo {
            instructions: Some("be \"brief\"".into()),
            max_output_tokens: Some(64),
            temperature: Some(0.5),
            top_p: None,
            parallel_tool_calls: true,
            tool_choice: json!("auto"),
            tools: json!([{"type": "function", "name": "weather", "parameters": {"type": "object"}}]),
            text: json!({"format": {"type": "text"}}),
            reasoning: Value::Null,
            metadata: json!({"k": "v"}),
            store: false,
            user: None,
            previous_response_id: Some("resp_0".into()),
        },
        namespaced: vec![("crm__lookup".into(), "crm".into(), "lookup".into())],
    }
}

/// The `response` object for [`meta`] in `status`, with its output and usage.
pub(in crate::surface::openai::responses) fn response(model: &str, status: &str, output: Value, usage: Value) -> Value {
    json!({"id": "resp_r1", "object": "response", "created_at": 7, "status": status, "background": false,
        "error": null, "incomplete_details": null, "model": model,
        "instructions": "be \"brief\"", "max_output_tokens": 64, "parallel_tool_calls": true,
        "previous_response_id": "resp_0", "reasoning": {"effort": null, "summary": null}, "store": false, "temperature": 0.5,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "top_p": null, "user": null, "metadata": {"k": "v"}, "output": output, "usage": usage})
}

/// The events' SSE, split into events: each exactly `event: <name>` and one
/// `data:` line whose JSON `type` is the name and whose `sequence_number`
/// counts from 0 (checked, then left out). Only the last event may end the
/// stream.
pub(in crate::surface::openai::responses) fn sse(events: Vec<ExecEvent>) -> Vec<Value> {
    let mut enc = ResponsesEncoder::new(meta());
    let mut out = BytesMut::new();
    let n = events.len();
    for (i, ev) in events.into_iter().enumerate() {
        let ended = enc.event(&mut out, ev);
        assert_eq!(ended, i + 1 == n, "event {i} of {n} ended: {ended}");
    }
    parse(&out)
}

pub(in crate::surface::openai::responses) fn parse(out: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(out).unwrap();
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.strip_suffix("\n\n")
        .unwrap()
        .split("\n\n")
        .enumerate()
        .map(|(i, event)| {
            let lines: Vec<&str> = event.split('\n').collect();
            let [name, data] = lines[..] else { panic!("{event:?}") };
            let name = name.strip_prefix("event: ").unwrap();
            let mut v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(v["type"], name, "{event}");
            assert_eq!(v["sequence_number"], i, "{event}");
            v.as_object_mut().unwrap().remove("sequence_number");
            v
        })
        .collect()
}

/// What a client makes of the events: the output rebuilt from each item's
/// `added`, its parts and deltas (every `.done` checked against what the
/// deltas built), and the terminal's response, whose output must be the
/// rebuilt one. The terminal's response.
pub(in crate::surface::openai::responses) fn accumulate(events: &[Value]) -> Value {
    let mut output: Vec<Value> = Vec::new();
    let mut done: Vec<bool> = Vec::new();
    let mut final_response = Value::Null;
    assert_eq!(events[0]["type"], "response.created");
    let id = events[0]["response"]["id"].clone();
    for ev in events {
        let kind = ev["type"].as_str().unwrap();
        let at = ev["output_index"].as_u64().map(|i| i as usize);
        let item = at.and_then(|i| output.get(i).cloned());
        if let (Some(item), Some(item_id)) = (&item, ev.get("item_id")) {
            assert_eq!(&item["id"], item_id, "{ev}");
        }
        let part = |field: &str| {
            let ci = ev["content_index"].as_u64().unwrap() as usize;
            (format!("/{}/content/{ci}/{field}", at.unwrap()), ci)
        };
        let mut out = Value::Array(output.clone());
        match kind {
            "response.created" | "response.in_progress" => {
                assert_eq!(ev["response"]["status"], "in_progress");
                assert_eq!(ev["response"]["output"], json!([]));
                assert_eq!(ev["response"]["usage"], Value::Null);
            }
            "response.output_item.added" => {
                assert_eq!(at, Some(output.len()), "{ev}");
                assert!(ev["item"]["status"] == "in_progress" || ev["item"]["type"] == "reasoning");
                output.push(ev["item"].clone());
                done.push(false);
                continue;
            }
            "response.content_part.added" => {
                let content = out[at.unwrap()]["content"].as_array_mut().unwrap();
                assert_eq!(ev["content_index"], content.len());
                content.push(ev["part"].clone());
            }
            "response.output_text.delta" | "response.reasoning_text.delta" | "response.refusal.delta" => {
                let field = if kind == "response.refusal.delta" { "refusal" } else { "text" };
                let text = out.pointer_mut(&part(field).0).unwrap();
                *text = json!([text.as_str().unwrap(), ev["delta"].as_str().unwrap()].concat());
            }
            "response.function_call_arguments.delta" => {
                let args = &mut out[at.unwrap()]["arguments"];
                *args = json!([args.as_str().unwrap(), ev["delta"].as_str().unwrap()].concat());
            }
            "response.output_text.done" | "response.reasoning_text.done" => {
                assert_eq!(out.pointer(&part("text").0).unwrap(), &ev["text"]);
            }
            "response.refusal.done" => assert_eq!(out.pointer(&part("refusal").0).unwrap(), &ev["refusal"]),
            "response.content_part.done" => {
                let (path, ci) = part("");
                assert_eq!(out[at.unwrap()]["content"][ci], ev["part"], "{path}");
            }
            "response.function_call_arguments.done" => {
                assert_eq!(out[at.unwrap()]["arguments"], ev["arguments"]);
            }
            "response.output_item.done" => {
                let i = at.unwrap();
                assert!(!done[i], "done twice: {ev}");
                done[i] = true;
                let mut built = out[i].clone();
                if built.get("status").is_some() {
                    built["status"] = ev["item"]["status"].clone();
                }
                assert_eq!(built, ev["item"]);
                out[i] = ev["item"].clone();
            }
            "response.completed" | "response.incomplete" => {
                assert!(done.iter().all(|d| *d), "an item was left open");
                assert_eq!(ev["response"]["output"], out);
                final_response = ev["response"].clone();
            }
            "response.failed" => final_response = ev["response"].clone(),
            other => panic!("{other}"),
        }
        if let Some(r) = ev.get("response") {
            assert_eq!(r["id"], id);
        }
        output = out.as_array().unwrap().clone();
    }
    final_response
}

fn added(index: usize, item: Value) -> Value {
    json!({"type": "response.output_item.added", "output_index": index, "item": item})
}

fn item_done(index: usize, item: Value) -> Value {
    json!({"type": "response.output_item.done", "output_index": index, "item": item})
}

fn message(index: usize, status: &str, content: Value) -> Value {
    json!({"id": format!("msg_r1_{index}"), "type": "message", "status": status, "content": content, "role": "assistant"})
}

fn reasoning(index: usize, content: Value) -> Value {
    json!({"id": format!("rs_r1_{index}"), "type": "reasoning", "summary": [], "content": content})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

fn at(kind: &str, id: &str, index: usize, content_index: usize, fields: Value) -> Value {
    let mut v = json!({"type": kind, "item_id": id, "output_index": index, "content_index": content_index});
    for (k, x) in fields.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn created(model: &str) -> [Value; 2] {
    let r = response(model, "in_progress", json!([]), Value::Null);
    [json!({"type": "response.created", "response": r}), json!({"type": "response.in_progress", "response": r})]
}

fn terminal(kind: &str, response: Value) -> Value {
    json!({"type": kind, "response": response})
}

fn usage(input: u64, cached: u64, output: u64, reasoning: u64) -> Value {
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output})
}

#[test]
fn text_only() {
    let events = sse(vec![
        ExecEvent::Start { model: "up\"m".into() },
        ExecEvent::content(""),
        ExecEvent::content("he said \"hi\"\n"),
        ExecEvent::content("é"),
        complete("stop", Some(Usage { input_tokens: 9, output_tokens: 3, ..Default::default() })),
    ]);
    let whole = "he said \"hi\"\né";
    let mut want = created("up\"m").to_vec();
    want.extend([
        added(0, message(0, "in_progress", json!([]))),
        at("response.content_part.added", "msg_r1_0", 0, 0, json!({"part": text_part("")})),
        at("response.output_text.delta", "msg_r1_0", 0, 0, json!({"delta": "he said \"hi\"\n", "logprobs": []})),
        at("response.output_text.delta", "msg_r1_0", 0, 0, json!({"delta": "é", "logprobs": []})),
        at("response.output_text.done", "msg_r1_0", 0, 0, json!({"text": whole, "logprobs": []})),
        at("response.content_part.done", "msg_r1_0", 0, 0, json!({"part": text_part(whole)})),
        item_done(0, message(0, "completed", json!([text_part(whole)]))),
        terminal(
            "response.completed",
            response(
                "up\"m",
                "completed",
                json!([message(0, "completed", json!([text_part(whole)]))]),
                usage(9, 0, 3, 0),
            ),
        ),
    ]);
    assert_eq!(events, want);
    accumulate(&events);
}

#[test]
fn the_wire_form_of_an_event() {
    let mut enc = ResponsesEncoder::new(meta());
    let mut out = BytesMut::new();
    enc.event(&mut out, ExecEvent::Start { model: "m".into() });
    out.clear();
    enc.event(&mut out, ExecEvent::content("hi"));
    let text = std::str::from_utf8(&out).unwrap();
    assert!(
        text.ends_with(concat!(
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_r1_0\",",
            "\"output_index\":0,\"content_index\":0,\"delta\":\"hi\",\"logprobs\":[]}\n\n"
        )),
        "{text}"
    );
}

#[test]
fn reasoning_then_text_and_the_asked_model_without_a_start() {
    let events = sse(vec![
        ExecEvent::reasoning("let me"),
        ExecEvent::reasoning(" think"),
        ExecEvent::content("42"),
        complete("stop", None),
    ]);
    let rs = |text: &str| json!({"type": "reasoning_text", "text": text});
    let mut want = created("asked").to_vec();
    want.extend([
        added(0, reasoning(0, json!([]))),
        at("response.content_part.added", "rs_r1_0", 0, 0, json!({"part": rs("")})),
        at("response.reasoning_text.delta", "rs_r1_0", 0, 0, json!({"delta": "let me"})),
        at("response.reasoning_text.delta", "rs_r1_0", 0, 0, json!({"delta": " think"})),
        at("response.reasoning_text.done", "rs_r1_0", 0, 0, json!({"text": "let me think"})),
        at("response.content_part.done", "rs_r1_0", 0, 0, json!({"part": rs("let me think")})),
        item_done(0, reasoning(0, json!([rs("let me think")]))),
        added(1, message(1, "in_progress", json!([]))),
        at("response.content_part.added", "msg_r1_1", 1, 0, json!({"part": text_part("")})),
        at("response.output_text.delta", "msg_r1_1", 1, 0, json!({"delta": "42", "logprobs": []})),
        at("response.output_text.done", "msg_r1_1", 1, 0, json!({"text": "42", "logprobs": []})),
        at("response.content_part.done", "msg_r1_1", 1, 0, json!({"part": text_part("42")})),
        item_done(1, message(1, "completed", json!([text_part("42")]))),
        // Unknown usage: null.
        terminal(
            "response.completed",
            response(
                "asked",
                "completed",
                json!([reasoning(0, json!([rs("let me think")])), message(1, "completed", json!([text_part("42")]))]),
                Value::Null,
            ),
        ),
    ]);
    assert_eq!(events, want);
    accumulate(&events);
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

fn call(index: usize, status: &str, arguments: &str, call_id: &str, name: &str) -> Value {
    json!({"id": format!("fc_r1_{index}"), "type": "function_call", "status": status, "arguments": arguments,
        "call_id": call_id, "name": name})
}

#[test]
fn text_then_two_tool_calls_in_many_fragments() {
    let args0 = r#"{"city": "Paris \"centre\"", "days": [1, 2, 3], "note": "é\n"}"#;
    let args1 = r#"{"q":"x"}"#;
    let mut evs = vec![ExecEvent::Start { model: "m".into() }, ExecEvent::content("Checking.")];
    evs.push(tool(0, "call_a", "weather", ""));
    evs.extend(pieces(args0, 3).iter().map(|p| tool(0, "", "", p)));
    // No id from the provider: one is made up; a namespaced tool gets its
    // own name and namespace back; an empty fragment sends nothing.
    evs.push(tool(1, "", "crm__lookup", ""));
    evs.extend(pieces(args1, 1).iter().map(|p| tool(1, "", "", p)));
    evs.push(ExecEvent::ChoiceFinish { choice: 0, finish_reason: "tool_calls".into(), stop_sequence: None });
    evs.push(complete("stop", None));
    let events = sse(evs);

    let heads: Vec<Value> =
        events.iter().filter(|e| !e["type"].as_str().unwrap().ends_with(".delta")).cloned().collect();
    let lookup = |status: &str, args: &str| {
        let mut c = call(2, status, args, "call_r1_1", "lookup");
        c["namespace"] = json!("crm");
        c
    };
    let msg = message(0, "completed", json!([text_part("Checking.")]));
    let mut want = created("m").to_vec();
    want.extend([
        added(0, message(0, "in_progress", json!([]))),
        at("response.content_part.added", "msg_r1_0", 0, 0, json!({"part": text_part("")})),
        at("response.output_text.done", "msg_r1_0", 0, 0, json!({"text": "Checking.", "logprobs": []})),
        at("response.content_part.done", "msg_r1_0", 0, 0, json!({"part": text_part("Checking.")})),
        item_done(0, msg.clone()),
        added(1, call(1, "in_progress", "", "call_a", "weather")),
        added(2, lookup("in_progress", "")),
        // Calls end with the run (a provider may interleave their fragments).
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_r1_1", "output_index": 1, "arguments": args0}),
        item_done(1, call(1, "completed", args0, "call_a", "weather")),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_r1_2", "output_index": 2, "arguments": args1}),
        item_done(2, lookup("completed", args1)),
        terminal(
            "response.completed",
            response(
                "m",
                "completed",
                json!([msg, call(1, "completed", args0, "call_a", "weather"), lookup("completed", args1)]),
                Value::Null,
            ),
        ),
    ]);
    assert_eq!(heads, want);
    // Every fragment went out, in order, unmerged, between its item's added
    // and done.
    for (index, args, size) in [(1, args0, 3), (2, args1, 1)] {
        let deltas: Vec<&Value> = events
            .iter()
            .filter(|e| e["output_index"] == index && e["type"] == "response.function_call_arguments.delta")
            .collect();
        let partial: Vec<String> = deltas.iter().map(|e| e["delta"].as_str().unwrap().to_owned()).collect();
        assert_eq!(partial, pieces(args, size));
        assert!(deltas.iter().all(|e| e["item_id"] == format!("fc_r1_{index}") && e.get("content_index").is_none()));
        let first = events.iter().position(|e| e["output_index"] == index).unwrap();
        assert_eq!(events[first]["type"], "response.output_item.added");
        let last = events.iter().rposition(|e| e["output_index"] == index).unwrap();
        assert_eq!(events[last]["type"], "response.output_item.done");
    }
    accumulate(&events);
}

#[test]
fn interleaved_tool_fragments_and_text_between_them() {
    let events = sse(vec![
        tool(0, "a", "f", "{\"x\":"),
        tool(1, "b", "g", "{\"y\":"),
        tool(0, "", "", "1}"),
        ExecEvent::content("between"),
        tool(1, "", "", "2}"),
        complete("tool_calls", None),
    ]);
    let r = accumulate(&events);
    assert_eq!(
        r["output"],
        json!([
            call(0, "completed", "{\"x\":1}", "a", "f"),
            call(1, "completed", "{\"y\":2}", "b", "g"),
            message(2, "completed", json!([text_part("between")])),
        ])
    );
}

#[test]
fn a_refusal_is_a_part_of_the_message() {
    let events = sse(vec![
        ExecEvent::content("Hm. "),
        d(0, Part::Refusal("I can't".into())),
        d(0, Part::Refusal(" help.".into())),
        complete("stop", None),
    ]);
    let refusal = |text: &str| json!({"type": "refusal", "refusal": text});
    let content = json!([text_part("Hm. "), refusal("I can't help.")]);
    let mut want = created("asked").to_vec();
    want.extend([
        added(0, message(0, "in_progress", json!([]))),
        at("response.content_part.added", "msg_r1_0", 0, 0, json!({"part": text_part("")})),
        at("response.output_text.delta", "msg_r1_0", 0, 0, json!({"delta": "Hm. ", "logprobs": []})),
        at("response.output_text.done", "msg_r1_0", 0, 0, json!({"text": "Hm. ", "logprobs": []})),
        at("response.content_part.done", "msg_r1_0", 0, 0, json!({"part": text_part("Hm. ")})),
        at("response.content_part.added", "msg_r1_0", 0, 1, json!({"part": refusal("")})),
        at("response.refusal.delta", "msg_r1_0", 0, 1, json!({"delta": "I can't"})),
        at("response.refusal.delta", "msg_r1_0", 0, 1, json!({"delta": " help."})),
        at("response.refusal.done", "msg_r1_0", 0, 1, json!({"refusal": "I can't help."})),
        at("response.content_part.done", "msg_r1_0", 0, 1, json!({"part": refusal("I can't help.")})),
        item_done(0, message(0, "completed", content.clone())),
        terminal(
            "response.completed",
            response("asked", "completed", json!([message(0, "completed", content)]), Value::Null),
        ),
    ]);
    assert_eq!(events, want);
    accumulate(&events);
}

#[test]
fn max_tokens_make_the_response_incomplete() {
    let u = Usage { input_tokens: 100, output_tokens: 7, reasoning_tokens: Some(2), cached_input_tokens: Some(60) };
    let events = sse(vec![ExecEvent::reasoning("r"), ExecEvent::content("a"), complete("length", Some(u))]);
    let n = events.len();
    let content = json!([text_part("a")]);
    assert_eq!(events[n - 2], item_done(1, message(1, "incomplete", content.clone())));
    let mut r = response(
        "asked",
        "incomplete",
        json!([reasoning(0, json!([{"type": "reasoning_text", "text": "r"}])), message(1, "incomplete", content)]),
        usage(100, 60, 7, 2),
    );
    r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    assert_eq!(events[n - 1], terminal("response.incomplete", r));
    accumulate(&events);

    // Choice 0's own finish wins over the terminal's; other choices count for nothing.
    let events = sse(vec![
        ExecEvent::ChoiceFinish { choice: 1, finish_reason: "length".into(), stop_sequence: None },
        ExecEvent::ChoiceFinish { choice: 0, finish_reason: "content_filter".into(), stop_sequence: None },
        complete("stop", None),
    ]);
    assert_eq!(events[2]["type"], "response.incomplete");
    assert_eq!(events[2]["response"]["incomplete_details"], json!({"reason": "content_filter"}));
    for finish in ["stop", "tool_calls", "eos", ""] {
        let events = sse(vec![complete(finish, None)]);
        assert_eq!((events[2]["type"].as_str(), events.len()), (Some("response.completed"), 3), "{finish}");
    }
}

#[test]
fn an_error_after_the_start_fails_the_response() {
    let f = RunFailure::new(codes::UPSTREAM_STATUS, 429, FailureSource::Provider, "slow \"down\"");
    let mut enc = ResponsesEncoder::new(meta());
    let mut out = BytesMut::new();
    assert!(!enc.event(&mut out, ExecEvent::content("par")));
    assert!(enc.event(&mut out, ExecEvent::Error(f)));
    let len = out.len();
    // Nothing after the end.
    assert!(enc.event(&mut out, ExecEvent::content("more")));
    assert!(enc.event(&mut out, complete("stop", None)));
    assert_eq!(out.len(), len);
    let mut failed = response("asked", "failed", json!([]), Value::Null);
    failed["error"] = json!({"code": "rate_limit_exceeded", "message": "slow \"down\""});
    let mut want = created("asked").to_vec();
    want.extend([
        added(0, message(0, "in_progress", json!([]))),
        at("response.content_part.added", "msg_r1_0", 0, 0, json!({"part": text_part("")})),
        at("response.output_text.delta", "msg_r1_0", 0, 0, json!({"delta": "par", "logprobs": []})),
        terminal("response.failed", failed),
    ]);
    let events = parse(&out);
    assert_eq!(events, want);
    accumulate(&events);

    // The node's cancel, embeddings, a provider's own code and a long
    // message, each ending the stream with a code clients know.
    let events = sse(vec![ExecEvent::Start { model: "m".into() }, ExecEvent::Cancelled { reason: "drain".into() }]);
    let error = &events[2]["response"]["error"];
    assert_eq!(error["code"], "server_error");
    assert!(error["message"].as_str().unwrap().contains("drain"));
    let events = sse(vec![ExecEvent::Embeddings(Vec::new())]);
    assert_eq!(
        (events[2]["type"].as_str(), events[2]["response"]["error"]["code"].as_str()),
        (Some("response.failed"), Some("server_error"))
    );
    let prompt = RunFailure::new(codes::UPSTREAM_STATUS, 400, FailureSource::Provider, "flagged")
        .with_provider(Some(ProviderError { code: Some("invalid_prompt".into()), ..Default::default() }), None);
    assert_eq!(sse(vec![ExecEvent::Error(prompt)])[2]["response"]["error"]["code"], "invalid_prompt");
    let long = RunFailure::new(codes::INTERNAL, 500, FailureSource::Node, "x".repeat(10_000));
    let events = sse(vec![ExecEvent::Error(long)]);
    let message = events[2]["response"]["error"]["message"].as_str().unwrap();
    assert!(message.len() <= MAX_MESSAGE_BYTES + 3 && message.ends_with('…'));
}

#[test]
fn other_choices_are_not_rendered() {
    let events = sse(vec![
        d(1, Part::Content("other".into())),
        d(0, Part::Content("mine".into())),
        d(2, Part::Reasoning("other".into())),
        tool(0, "c", "f", "{}").clone(),
        d(3, Part::ToolCall(Box::new(ToolCallDelta { index: 0, name: "g".into(), ..Default::default() }))),
        complete("stop", None),
    ]);
    let r = accumulate(&events);
    assert_eq!(
        r["output"],
        json!([message(0, "completed", json!([text_part("mine")])), call(1, "completed", "{}", "c", "f")])
    );
}

#[test]
fn echo_defaults_for_a_request_that_set_nothing() {
    let mut enc =
        ResponsesEncoder::new(ResponseMeta { id: "resp_x\"y".into(), model: "m".into(), ..Default::default() });
    let mut out = BytesMut::new();
    enc.event(&mut out, ExecEvent::content("a"));
    let events = parse(&out);
    let r = &events[0]["response"];
    assert_eq!(r["id"], "resp_x\"y");
    assert_eq!((&r["tool_choice"], &r["tools"]), (&json!("auto"), &json!([])));
    assert_eq!((&r["instructions"], &r["temperature"]), (&Value::Null, &Value::Null));
    assert_eq!((&r["metadata"], &r["text"]), (&json!({}), &json!({"format": {"type": "text"}})));
    assert_eq!(r["reasoning"], json!({"effort": null, "summary": null}));
    assert_eq!(events[2]["item"]["id"], "msg_x\"y_0");
}

#[test]
fn large_pieces_are_written_whole() {
    let big = "y".repeat(40_000);
    let events = sse(vec![ExecEvent::content(big.clone()), complete("stop", None)]);
    assert_eq!(events[4]["delta"], json!(big));
    assert_eq!(accumulate(&events)["output"][0]["content"][0]["text"], json!(big));
}

#[test]
fn a_token_read_in_place_writes_its_events() {
    crate::surface::encode::check_text_writes_its_event(|| ResponsesEncoder::new(meta()));
}
