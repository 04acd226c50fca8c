//! The whole `message`, and that it is what a client makes of the stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use iop_core::exec::{codes, ExecEvent, FailureSource, Part, RunFailure, Usage};
use serde_json::{json, Value};

use super::*;
use crate::surface::anthropic::stream::tests::{accumulate, complete, d, sse, tool};

fn aggregate(stop_sequences: &[&str], events: Vec<ExecEvent>) -> MessageAggregate {
    let mut agg = MessageAggregate::new(stop_sequences.iter().map(|s| (*s).to_owned()).collect());
    let n = events.len();
    for (i, ev) in events.into_iter().enumerate() {
        assert_eq!(agg.on_event(ev).unwrap(), i + 1 == n, "event {i}");
    }
    agg
}

fn written(agg: &MessageAggregate) -> String {
    let mut out = BytesMut::new();
    agg.write(&mut out, "msg_r1", "asked");
    String::from_utf8(out.to_vec()).unwrap()
}

fn value(agg: &MessageAggregate) -> Value {
    serde_json::from_str(&written(agg)).unwrap()
}

#[test]
fn text_only_in_anthropics_key_order() {
    let usage = Usage { input_tokens: 9, output_tokens: 3, ..Default::default() };
    let agg = aggregate(
        &[],
        vec![
            ExecEvent::Start { model: "up\"m".into() },
            ExecEvent::content(""),
            ExecEvent::content("he said \"hi\"\n"),
            ExecEvent::content("é"),
            complete("stop", Some(usage)),
        ],
    );
    assert_eq!(agg.model(), "up\"m");
    assert_eq!(
        written(&agg),
        r#"{"id":"msg_r1","type":"message","role":"assistant","model":"up\"m","content":[{"type":"text","text":"he said \"hi\"\né"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":3}}"#
    );
}

#[test]
fn thinking_then_text_with_the_fallback_model_and_unknown_usage() {
    let agg = aggregate(
        &[],
        vec![
            ExecEvent::reasoning("let me"),
            ExecEvent::reasoning(" think"),
            ExecEvent::content("42"),
            complete("stop", None),
        ],
    );
    assert_eq!(agg.model(), "");
    assert_eq!(
        value(&agg),
        json!({"id": "msg_r1", "type": "message", "role": "assistant", "model": "asked",
            "content": [{"type": "thinking", "thinking": "let me think", "signature": ""}, {"type": "text", "text": "42"}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}})
    );
}

#[test]
fn text_then_two_tool_calls_in_many_fragments() {
    let args0 = r#"{"city": "Paris \"centre\"", "days": [1, 2, 3]}"#;
    let mut evs = vec![ExecEvent::content("Checking."), tool(0, "call_a", "weather", "")];
    evs.extend(args0.as_bytes().chunks(3).map(|p| tool(0, "", "", std::str::from_utf8(p).unwrap())));
    evs.push(tool(1, "", "search", ""));
    evs.extend(["{", "\"q\"", ":", "\"x\"", "}"].map(|p| tool(1, "", "", p)));
    evs.push(complete("tool_calls", None));
    let v = value(&aggregate(&[], evs));
    assert_eq!(
        v["content"],
        json!([
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris \"centre\"", "days": [1, 2, 3]}},
            {"type": "tool_use", "id": "toolu_r1_1", "name": "search", "input": {"q": "x"}},
        ])
    );
    assert_eq!(v["stop_reason"], "tool_use");
}

#[test]
fn tool_inputs_that_are_not_objects_are_kept_as_text() {
    let v = value(&aggregate(
        &[],
        vec![
            tool(0, "a", "f", ""),
            tool(1, "b", "g", "{\"cut\": "),
            tool(2, "c", "h", "[1]"),
            complete("tool_calls", None),
        ],
    ));
    assert_eq!(v["content"][0]["input"], json!({}));
    assert_eq!(v["content"][1]["input"], json!("{\"cut\": "));
    assert_eq!(v["content"][2]["input"], json!("[1]"));
}

#[test]
fn usage_with_cached_tokens() {
    let usage = Usage { input_tokens: 100, output_tokens: 7, reasoning_tokens: Some(2), cached_input_tokens: Some(60) };
    let v = value(&aggregate(&[], vec![ExecEvent::content("a"), complete("length", Some(usage))]));
    assert_eq!(v["usage"], json!({"input_tokens": 40, "output_tokens": 7, "cache_read_input_tokens": 60}));
    assert_eq!(v["stop_reason"], "max_tokens");
}

#[test]
fn failures_end_the_aggregate() {
    let mut agg = MessageAggregate::new(Vec::new());
    assert!(!agg.on_event(ExecEvent::content("par")).unwrap());
    let f = RunFailure::new(codes::UPSTREAM_STATUS, 429, FailureSource::Provider, "slow down");
    assert_eq!(agg.on_event(ExecEvent::Error(f.clone())).unwrap_err(), f);
    assert_eq!(agg.on_event(ExecEvent::Cancelled { reason: "drain".into() }).unwrap_err().status, 503);
    let e = agg.on_event(ExecEvent::Embeddings(Vec::new())).unwrap_err();
    assert_eq!((e.code, e.status), (codes::UPSTREAM_PROTOCOL, 502));
}

#[test]
fn finish_reasons_become_stop_reasons() {
    let stop = |events: Vec<ExecEvent>, seqs: &[&str]| {
        let v = value(&aggregate(seqs, events));
        (v["stop_reason"].clone(), v["stop_sequence"].clone())
    };
    for (finish, want) in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        ("eos", "end_turn"),
    ] {
        assert_eq!(stop(vec![complete(finish, None)], &[]), (json!(want), Value::Null), "{finish}");
    }
    let evs = vec![
        ExecEvent::ChoiceFinish { choice: 1, finish_reason: "tool_calls".into(), stop_sequence: None },
        ExecEvent::ChoiceFinish { choice: 0, finish_reason: "length".into(), stop_sequence: None },
        complete("stop", None),
    ];
    assert_eq!(stop(evs, &[]), (json!("max_tokens"), Value::Null));
    assert_eq!(
        stop(vec![d(0, Part::Refusal("no".into())), complete("stop", None)], &[]),
        (json!("refusal"), Value::Null)
    );
    assert_eq!(stop(vec![complete("###", None)], &["###"]), (json!("stop_sequence"), json!("###")));
    let named = ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: Some("END".into()) };
    assert_eq!(stop(vec![named, complete("stop", None)], &["END"]), (json!("stop_sequence"), json!("END")));
    assert_eq!(stop(vec![tool(0, "c", "f", "{}"), complete("stop", None)], &[]), (json!("tool_use"), Value::Null));
}

/// The same events, streamed and gathered as a client does, or aggregated:
/// the same message.
#[test]
fn the_aggregate_is_what_a_client_makes_of_the_stream() {
    let usage =
        Some(Usage { input_tokens: 30, output_tokens: 8, reasoning_tokens: None, cached_input_tokens: Some(4) });
    let runs: Vec<Vec<ExecEvent>> = vec![
        vec![ExecEvent::Start { model: "up".into() }, ExecEvent::content("a"), complete("stop", usage)],
        vec![
            ExecEvent::reasoning("r1"),
            ExecEvent::content("t1"),
            ExecEvent::reasoning("r2"),
            d(1, Part::Content("not mine".into())),
            d(0, Part::Refusal("no".into())),
            complete("stop", usage),
        ],
        vec![
            ExecEvent::content("x"),
            tool(0, "a", "f", "{\"x\":"),
            tool(1, "", "g", "{\"y\":"),
            tool(0, "", "", "1}"),
            ExecEvent::content("after"),
            tool(1, "", "", "2}"),
            tool(2, "", "h", ""),
            complete("tool_calls", usage),
        ],
    ];
    for events in runs {
        let streamed = accumulate(&sse(&[], events.clone()));
        assert_eq!(streamed, value(&aggregate(&[], events)));
    }
}

#[test]
fn oversized_answers_are_refused() {
    let mut agg = MessageAggregate::new(Vec::new());
    let big = "z".repeat(MAX_AGGREGATE_BYTES / 2 + 1);
    assert!(!agg.on_event(ExecEvent::content(big.clone())).unwrap());
    assert!(!agg.on_event(ExecEvent::content(big)).unwrap());
    assert_eq!(agg.on_event(complete("stop", None)).unwrap_err().source, FailureSource::Edge);
}
