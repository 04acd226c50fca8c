//! The whole `response`, and that it is what a client makes of the stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use iop_core::exec::{codes, ExecEvent, FailureSource, Part, RunFailure, Usage};
use serde_json::{json, Value};

use super::super::MAX_OUTPUT_BYTES;
use super::*;
use crate::surface::openai::responses::stream::tests::{accumulate, complete, d, meta, response, sse, tool};

fn aggregate(events: Vec<ExecEvent>) -> ResponseAggregate {
    let mut agg = ResponseAggregate::new(meta());
    let n = events.len();
    for (i, ev) in events.into_iter().enumerate() {
        assert_eq!(agg.on_event(ev).unwrap(), i + 1 == n, "event {i}");
    }
    agg
}

fn written(agg: &ResponseAggregate) -> String {
    let mut out = BytesMut::new();
    agg.write(&mut out);
    String::from_utf8(out.to_vec()).unwrap()
}

fn value(agg: &ResponseAggregate) -> Value {
    serde_json::from_str(&written(agg)).unwrap()
}

#[test]
fn text_only_written_exactly() {
    let usage = Usage { input_tokens: 9, output_tokens: 3, reasoning_tokens: None, cached_input_tokens: Some(4) };
    let agg = aggregate(vec![
        ExecEvent::Start { model: "up\"m".into() },
        ExecEvent::content(""),
        ExecEvent::content("he said \"hi\"\n"),
        ExecEvent::content("é"),
        complete("stop", Some(usage)),
    ]);
    assert_eq!(agg.model(), "up\"m");
    assert_eq!(
        written(&agg),
        concat!(
            r#"{"id":"resp_r1","object":"response","created_at":7,"status":"completed","background":false,"#,
            r#""error":null,"incomplete_details":null,"model":"up\"m","instructions":"be \"brief\"","#,
            r#""max_output_tokens":64,"parallel_tool_calls":true,"previous_response_id":"resp_0","reasoning":{"effort":null,"summary":null},"#,
            r#""store":false,"temperature":0.5,"text":{"format":{"type":"text"}},"tool_choice":"auto","#,
            r#""tools":[{"name":"weather","parameters":{"type":"object"},"type":"function"}],"top_p":null,"#,
            r#""user":null,"metadata":{"k":"v"},"output":[{"id":"msg_r1_0","type":"message","status":"completed","#,
            r#""content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"he said \"hi\"\né"}],"#,
            r#""role":"assistant"}],"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4,"#,
            r#""cache_write_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"#,
            r#""total_tokens":12}}"#
        )
    );
}

#[test]
fn reasoning_then_text_with_the_asked_model_and_unknown_usage() {
    let agg = aggregate(vec![
        ExecEvent::reasoning("let me"),
        ExecEvent::reasoning(" think"),
        ExecEvent::content("42"),
        complete("stop", None),
    ]);
    assert_eq!(agg.model(), "");
    assert_eq!(
        value(&agg),
        response(
            "asked",
            "completed",
            json!([
                {"id": "rs_r1_0", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "let me think"}]},
                {"id": "msg_r1_1", "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "42"}]},
            ]),
            Value::Null,
        )
    );
}

#[test]
fn text_then_two_tool_calls_in_many_fragments() {
    let args0 = r#"{"city": "Paris \"centre\"", "days": [1, 2, 3]}"#;
    let mut evs = vec![ExecEvent::content("Checking."), tool(0, "call_a", "weather", "")];
    evs.extend(args0.as_bytes().chunks(3).map(|p| tool(0, "", "", std::str::from_utf8(p).unwrap())));
    evs.push(tool(1, "", "crm__lookup", ""));
    evs.extend(["{", "\"q\"", ":", "\"x\"", "}"].map(|p| tool(1, "", "", p)));
    evs.push(complete("tool_calls", None));
    let v = value(&aggregate(evs));
    assert_eq!(
        v["output"],
        json!([
            {"id": "msg_r1_0", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Checking."}]},
            {"id": "fc_r1_1", "type": "function_call", "status": "completed", "arguments": args0,
                "call_id": "call_a", "name": "weather"},
            {"id": "fc_r1_2", "type": "function_call", "status": "completed", "arguments": "{\"q\":\"x\"}",
                "call_id": "call_r1_1", "name": "lookup", "namespace": "crm"},
        ])
    );
    assert_eq!(v["status"], "completed");
}

#[test]
fn a_refusal_and_an_incomplete_answer() {
    let usage = Usage { input_tokens: 100, output_tokens: 7, reasoning_tokens: Some(2), cached_input_tokens: Some(60) };
    let v = value(&aggregate(vec![
        ExecEvent::content("Hm. "),
        d(0, Part::Refusal("no".into())),
        complete("length", Some(usage)),
    ]));
    assert_eq!(
        (&v["status"], &v["incomplete_details"]),
        (&json!("incomplete"), &json!({"reason": "max_output_tokens"}))
    );
    assert_eq!(
        v["output"],
        json!([{"id": "msg_r1_0", "type": "message", "status": "incomplete", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Hm. "},
                {"type": "refusal", "refusal": "no"}]}])
    );
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 0},
            "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 107})
    );
}

#[test]
fn failures_end_the_aggregate() {
    let mut agg = ResponseAggregate::new(meta());
    assert!(!agg.on_event(ExecEvent::content("par")).unwrap());
    let f = RunFailure::new(codes::UPSTREAM_STATUS, 429, FailureSource::Provider, "slow down");
    assert_eq!(agg.on_event(ExecEvent::Error(f.clone())).unwrap_err(), f);
    assert_eq!(agg.on_event(ExecEvent::Cancelled { reason: "drain".into() }).unwrap_err().status, 503);
    let e = agg.on_event(ExecEvent::Embeddings(Vec::new())).unwrap_err();
    assert_eq!((e.code, e.status), (codes::UPSTREAM_PROTOCOL, 502));
}

/// The same events, streamed and gathered as a client does, or aggregated:
/// the same response.
#[test]
fn the_aggregate_is_what_a_client_makes_of_the_stream() {
    let usage =
        Some(Usage { input_tokens: 30, output_tokens: 8, reasoning_tokens: Some(3), cached_input_tokens: Some(4) });
    let runs: Vec<Vec<ExecEvent>> = vec![
        vec![ExecEvent::Start { model: "up".into() }, ExecEvent::content("a"), complete("stop", usage)],
        vec![
            ExecEvent::reasoning("r1"),
            ExecEvent::content("t1"),
            ExecEvent::reasoning("r2"),
            d(1, Part::Content("not mine".into())),
            d(0, Part::Refusal("no".into())),
            ExecEvent::content("t2"),
            complete("stop", usage),
        ],
        vec![
            ExecEvent::content("x"),
            tool(0, "a", "f", "{\"x\":"),
            tool(1, "", "crm__lookup", "{\"y\":"),
            tool(0, "", "", "1}"),
            ExecEvent::content("after"),
            tool(1, "", "", "2}"),
            tool(2, "", "h", ""),
            complete("tool_calls", usage),
        ],
        vec![ExecEvent::reasoning("cut"), tool(0, "a", "f", "{\"x\""), complete("length", None)],
        vec![
            ExecEvent::ChoiceFinish { choice: 0, finish_reason: "content_filter".into(), stop_sequence: None },
            complete("stop", usage),
        ],
    ];
    for events in runs {
        let streamed = accumulate(&sse(events.clone()));
        assert_eq!(streamed, value(&aggregate(events)));
    }
}

#[test]
fn oversized_answers_are_refused() {
    let mut agg = ResponseAggregate::new(meta());
    let big = "z".repeat(MAX_OUTPUT_BYTES / 2 + 1);
    assert!(!agg.on_event(ExecEvent::content(big.clone())).unwrap());
    assert!(!agg.on_event(d(0, Part::Refusal(big))).unwrap());
    assert_eq!(agg.on_event(complete("stop", None)).unwrap_err().source, FailureSource::Edge);
}
