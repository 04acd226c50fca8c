use super::*;
use crate::mockprov::reply::collect;
use crate::mockprov::MockConfig;
use serde_json::json;

const FILE: &str = r#"{"scripts": {
    "a": {
        "plan": [{"content": "{\"plan\":\"p\",\"verification\":\"v\"}"}],
        "work": [
            {"tool_calls": [{"name": "workspace_write", "arguments": {"path": "x", "content": "1"}},
                            {"name": "workspace_read", "arguments": "{\"path\": "}]},
            {"content": "done", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
        ],
        "review": [{"error": {"status": 503, "message": "busy"}, "delay_ms": 20},
                   {"content": "{\"verdict\":\"approve\",\"findings\":\"ok\"}", "finish_reason": "length"}]
    },
    "b": {"work": [{"content": "b0"}, {"content": "b1"}]}
}}"#;

fn scripts() -> Scripts {
    Scripts::parse(FILE).unwrap()
}

fn request(marker: &str, rf: Option<&str>, stream: bool) -> String {
    let rf = rf.map_or_else(String::new, |name| {
        format!(r#","response_format":{{"type":"json_schema","json_schema":{{"name":"{name}","strict":true,"schema":{{}}}}}}"#)
    });
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"sys"}},{{"role":"user","content":"do it {marker}"}}],
            "stream":{stream},"stream_options":{{"include_usage":true}}{rf}}}"#
    )
}

fn answer(scripts: &Scripts, body: &str) -> Option<Reply> {
    let config = MockConfig::for_tests();
    let env = Env { config: &config, seq: 9, now: Timestamp::from_secs(100) };
    reply(scripts, body.as_bytes(), &env)
}

fn whole(reply: Option<Reply>) -> Whole {
    match reply.map(|r| r.action) {
        Some(Action::Whole(w)) => w,
        other => panic!("not a whole answer: {other:?}"),
    }
}

/// Every SSE step, chunks parsed (`[DONE]` as a string).
fn streamed(reply: Option<Reply>) -> (Stream, Vec<(Phase, Vec<Value>)>) {
    let Some(Action::Stream(mut s)) = reply.map(|r| r.action) else { panic!("not a stream") };
    let steps = collect(s.script.as_mut(), Timestamp::from_secs(0))
        .into_iter()
        .map(|(phase, frames)| {
            let chunks = frames
                .into_iter()
                .map(|f| match f {
                    Frame::Data(j) => serde_json::from_str(&j).unwrap(),
                    Frame::Done => json!("[DONE]"),
                    other => panic!("unexpected frame {other:?}"),
                })
                .collect();
            (phase, chunks)
        })
        .collect();
    (s, steps)
}

#[test]
fn stage_comes_from_the_json_schema_name() {
    let rf = |name: &str| json!({"type": "json_schema", "json_schema": {"name": name, "strict": true}});
    assert_eq!(Stage::of(Some(&rf("iop_plan"))), Stage::Plan);
    assert_eq!(Stage::of(Some(&rf("iop_review"))), Stage::Review);
    assert_eq!(Stage::of(Some(&rf("other"))), Stage::Work);
    assert_eq!(Stage::of(Some(&json!({"type": "json_object"}))), Stage::Work);
    assert_eq!(Stage::of(None), Stage::Work);
}

#[test]
fn markers_in_any_role_string_or_parts() {
    assert_eq!(marker("x [script:a] y [script:b]"), Some("a"));
    assert_eq!(marker("[script:] [script:ok]"), Some("ok"));
    assert_eq!((marker("[script:open"), marker("none")), (None, None));
    let s = scripts();
    let parts = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"go "},{"type":"text","text":"[script:b]"}]}]}"#;
    assert!(whole(answer(&s, parts)).body.contains("\"content\":\"b0\""));
    let tool =
        r#"{"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"c","content":"[script:b]"}]}"#;
    assert!(whole(answer(&s, tool)).body.contains("\"content\":\"b1\""));
    // No marker, a marker naming no script, a body that does not parse: not scripted.
    assert!(answer(&s, r#"{"messages":[{"role":"user","content":"x"}]}"#).is_none());
    assert!(answer(&s, &request("[script:zz]", None, false)).is_none());
    assert!(answer(&s, "not json [script:a]").is_none());
}

#[test]
fn cursors_are_per_script_and_stage() {
    let s = scripts();
    assert_eq!(s.next("b", Stage::Work).unwrap().unwrap().content.as_deref(), Some("b0"));
    assert_eq!(s.next("a", Stage::Work).unwrap().unwrap().tool_calls.len(), 2);
    assert_eq!(
        s.next("a", Stage::Plan).unwrap().unwrap().content.as_deref(),
        Some(r#"{"plan":"p","verification":"v"}"#)
    );
    assert_eq!(s.next("b", Stage::Work).unwrap().unwrap().content.as_deref(), Some("b1"));
    assert_eq!(s.next("a", Stage::Work).unwrap().unwrap().content.as_deref(), Some("done"));
    assert_eq!(s.next("b", Stage::Work).unwrap(), Err(Exhausted));
    assert_eq!(s.next("b", Stage::Plan).unwrap(), Err(Exhausted), "an absent stage is empty");
    assert!(s.next("c", Stage::Work).is_none());
}

#[test]
fn an_exhausted_stage_is_a_loud_500() {
    let s = scripts();
    let plan = request("[script:a]", Some("iop_plan"), false);
    assert_eq!(whole(answer(&s, &plan)).status, 200);
    let w = whole(answer(&s, &plan));
    assert_eq!(w.status, 500);
    let v: Value = serde_json::from_str(&w.body).unwrap();
    assert_eq!(v["error"]["message"], "script a stage plan exhausted");
    assert_eq!((&v["error"]["type"], &v["error"]["code"]), (&json!("server_error"), &json!("script_exhausted")));
}

#[test]
fn errors_delays_finish_reasons_and_usage() {
    let s = scripts();
    let review = request("[script:a]", Some("iop_review"), true);
    let w = whole(answer(&s, &review));
    assert_eq!((w.status, w.delay), (503, Duration::from_millis(20)));
    let v: Value = serde_json::from_str(&w.body).unwrap();
    assert_eq!((&v["error"]["message"], &v["error"]["type"]), (&json!("busy"), &json!("server_error")));
    let (_, steps) = streamed(answer(&s, &review));
    let text: String =
        steps.iter().flat_map(|(_, c)| c).filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, r#"{"verdict":"approve","findings":"ok"}"#);
    let tail = &steps.last().unwrap().1;
    assert_eq!(tail[0]["choices"][0]["finish_reason"], "length");

    let work = request("[script:a]", None, false);
    let _calls = answer(&s, &work);
    let v: Value = serde_json::from_str(&whole(answer(&s, &work)).body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "done");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!((v["usage"]["prompt_tokens"].as_u64(), v["usage"]["completion_tokens"].as_u64()), (Some(7), Some(3)));
}

#[test]
fn tool_calls_whole() {
    let s = scripts();
    let w = whole(answer(&s, &request("[script:a]", None, false)));
    let v: Value = serde_json::from_str(&w.body).unwrap();
    assert_eq!((&v["id"], &v["model"], &v["created"]), (&json!("chatcmpl-mock-9"), &json!("m"), &json!(100)));
    let c = &v["choices"][0];
    assert_eq!((&c["finish_reason"], &c["message"]["content"]), (&json!("tool_calls"), &Value::Null));
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["function"]["name"], "workspace_write");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "x", "content": "1"}));
    assert_eq!(
        (&calls[1]["id"], &calls[1]["function"]["arguments"]),
        (&json!("call_2"), &json!("{\"path\": ")),
        "a raw string goes as is"
    );
}

#[test]
fn tool_calls_streamed() {
    let s = scripts();
    let (stream, steps) = streamed(answer(&s, &request("[script:a]", None, true)));
    assert_eq!((stream.content_type, stream.eager_head), ("text/event-stream", false));
    assert_eq!(steps[0].1[0]["choices"][0]["delta"], json!({"role": "assistant", "content": null}));
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for (phase, chunks) in &steps[1..steps.len() - 1] {
        assert_eq!(*phase, Phase::FOLLOW);
        let tc = &chunks[0]["choices"][0]["delta"]["tool_calls"][0];
        let i = usize::try_from(tc["index"].as_u64().unwrap()).unwrap();
        if let Some(id) = tc["id"].as_str() {
            assert_eq!((i, tc["function"]["arguments"].as_str()), (calls.len(), Some("")));
            calls.push((id.to_owned(), tc["function"]["name"].as_str().unwrap().to_owned(), String::new()));
        } else {
            calls[i].2.push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!((calls[0].0.as_str(), calls[0].1.as_str()), ("call_1", "workspace_write"));
    assert_eq!(serde_json::from_str::<Value>(&calls[0].2).unwrap(), json!({"path": "x", "content": "1"}));
    assert_eq!((calls[1].0.as_str(), calls[1].2.as_str()), ("call_2", "{\"path\": "));
    let (phase, tail) = steps.last().unwrap();
    assert_eq!(*phase, Phase::Tail);
    assert_eq!(tail[0]["choices"][0]["finish_reason"], "tool_calls");
    // Unscripted usage: a token per four characters of the arguments (26 + 9) and of the messages (3 + 16).
    assert_eq!((&tail[1]["choices"], tail[1]["usage"]["completion_tokens"].as_u64()), (&json!([]), Some(8)));
    assert_eq!(tail[1]["usage"]["prompt_tokens"].as_u64(), Some(4));
    assert_eq!(tail[2], "[DONE]");
}

#[test]
fn content_streams_in_a_few_deltas_and_usage_only_when_asked() {
    assert_eq!(pieces("abcdefg"), ["abc", "def", "g"]);
    assert_eq!(pieces("ab"), ["a", "b"]);
    assert_eq!(pieces("é€"), ["é", "€"]);
    assert!(pieces("").is_empty());
    let s = scripts();
    let body = r#"{"messages":[{"role":"user","content":"[script:a]"}],"response_format":{"type":"json_schema",
        "json_schema":{"name":"iop_plan"}},"stream":true}"#;
    let (_, steps) = streamed(answer(&s, body));
    assert_eq!(steps[0].1[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let deltas: Vec<&str> = steps[1..steps.len() - 1]
        .iter()
        .map(|(_, c)| c[0]["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(deltas.len(), 3);
    assert_eq!(deltas.concat(), r#"{"plan":"p","verification":"v"}"#);
    let tail = &steps.last().unwrap().1;
    assert_eq!((tail.len(), &tail[0]["choices"][0]["finish_reason"]), (2, &json!("stop")), "no usage chunk");
    assert!(tail[0].get("usage").is_none());
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let bad = |text: &str| Scripts::parse(text).unwrap_err();
    assert!(bad("{").starts_with("not a script file"), "{}", bad("{"));
    assert!(bad(r#"{"scripts":{"a":{"plan":[{"contnet":"x"}]}}}"#).contains("unknown field `contnet`"));
    assert!(bad(r#"{"scripts":{"a":{"plans":[]}}}"#).contains("unknown field `plans`"));
    assert_eq!(
        bad(r#"{"scripts":{"a":{"work":[{},{"error":{"status":200}}]}}}"#),
        r#"script "a" work[1]: error.status 200 is not in 400..=599"#
    );
    assert!(bad(r#"{"scripts":{"a]":{}}}"#).contains("marker"));
    let e = Scripts::load(Path::new("/nonexistent/iop-script.json")).unwrap_err();
    assert!(e.to_string().starts_with("script file /nonexistent/iop-script.json: cannot read it"), "{e}");
}
