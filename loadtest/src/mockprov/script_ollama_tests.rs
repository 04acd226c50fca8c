use super::*;
use crate::mockprov::reply::collect;
use crate::mockprov::{script, MockConfig};
use serde_json::json;

const FILE: &str = r#"{"scripts": {
    "a": {
        "plan": [{"content": "{\"plan\":\"p\",\"verification\":\"v\"}"},
                 {"content": "{\"plan\":\"p2\",\"verification\":\"v2\"}"}],
        "work": [
            {"content": "on it", "tool_calls": [
                {"name": "workspace_write", "arguments": {"path": "x", "content": "1"}},
                {"name": "workspace_read", "arguments": "{\"path\": "},
                {"name": "workspace_list", "arguments": "{\n  \"path\": \"\"\n}"},
                {"name": "workspace_list"}]},
            {"content": "done", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
        ],
        "review": [{"error": {"status": 503, "message": "busy"}, "delay_ms": 20},
                   {"content": "{\"verdict\":\"approve\",\"findings\":\"ok\"}", "finish_reason": "length"}]
    }
}}"#;

const NOW: Timestamp = Timestamp { secs: 1_700_000_000, nanos: 0 };

fn scripts() -> Scripts {
    Scripts::parse(FILE).unwrap()
}

/// The schema the node sends as `format` for a stage's `response_format`.
fn schema(keys: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> =
        keys.iter().map(|k| ((*k).to_owned(), json!({"type": "string"}))).collect();
    json!({"type": "object", "properties": properties, "required": keys, "additionalProperties": false})
}

/// An `/api/chat` body as the node writes it; `stream: None` leaves it out.
fn request(format: Option<Value>, stream: Option<bool>) -> String {
    let mut body = json!({"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "do it [script:a]"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "result", "tool_name": "f"},
    ], "model": "llama3.2"});
    if let Some(f) = format {
        body["format"] = f;
    }
    if let Some(s) = stream {
        body["stream"] = json!(s);
    }
    body.to_string()
}

fn answer(scripts: &Scripts, body: &str) -> Option<Reply> {
    let config = MockConfig::for_tests();
    reply(scripts, body.as_bytes(), &Env { config: &config, seq: 9, now: NOW })
}

fn whole(reply: Option<Reply>) -> Whole {
    let reply = reply.expect("scripted");
    assert_eq!(reply.flavor, Flavor::Ollama);
    match reply.action {
        Action::Whole(w) => w,
        other => panic!("not a whole answer: {other:?}"),
    }
}

fn whole_json(reply: Option<Reply>) -> Value {
    let w = whole(reply);
    assert_eq!((w.status, w.content_type), (200, OLLAMA_JSON));
    assert!(!w.body.contains('\n'));
    serde_json::from_str(&w.body).unwrap()
}

/// Every NDJSON line (one per step) as written.
fn raw_lines(reply: Option<Reply>) -> (Stream, Vec<(Phase, String)>) {
    let Some(Action::Stream(mut s)) = reply.map(|r| r.action) else { panic!("not a stream") };
    let lines = collect(s.script.as_mut(), NOW)
        .into_iter()
        .map(|(phase, frames)| {
            let [Frame::Line(line)] = frames.as_slice() else { panic!("{frames:?}") };
            assert!(!line.contains('\n'), "{line}");
            (phase, line.clone())
        })
        .collect();
    (s, lines)
}

/// Every NDJSON line (one per step), parsed.
fn lines(reply: Option<Reply>) -> (Stream, Vec<(Phase, Value)>) {
    let (s, raw) = raw_lines(reply);
    (s, raw.into_iter().map(|(phase, line)| (phase, serde_json::from_str(&line).unwrap())).collect())
}

#[test]
fn stage_comes_from_the_format_schema() {
    assert_eq!(Stage::of_ollama(Some(&schema(&["plan", "verification"])), None), Stage::Plan);
    assert_eq!(Stage::of_ollama(Some(&schema(&["verdict", "findings"])), None), Stage::Review);
    assert_eq!(Stage::of_ollama(Some(&schema(&["answer"])), None), Stage::Work);
    assert_eq!(Stage::of_ollama(Some(&json!("json")), None), Stage::Work);
    assert_eq!(Stage::of_ollama(Some(&json!({"type": "object"})), None), Stage::Work);
    assert_eq!(Stage::of_ollama(Some(&json!({"properties": ["plan"]})), None), Stage::Work);
    assert_eq!(Stage::of_ollama(None, None), Stage::Work);
    // The OpenAI names, when a response_format is there.
    let rf = |name: &str| json!({"type": "json_schema", "json_schema": {"name": name, "schema": {}}});
    assert_eq!(Stage::of_ollama(None, Some(&rf("iop_plan"))), Stage::Plan);
    assert_eq!(Stage::of_ollama(Some(&json!("json")), Some(&rf("iop_review"))), Stage::Review);
    assert_eq!(Stage::of_ollama(Some(&schema(&["verdict"])), Some(&rf("other"))), Stage::Review);
    // Picked per stage through the whole reply.
    let s = scripts();
    let v = whole_json(answer(&s, &request(Some(schema(&["plan", "verification"])), Some(false))));
    assert_eq!(v["message"]["content"], r#"{"plan":"p","verification":"v"}"#);
    let w = whole(answer(&s, &request(Some(schema(&["verdict", "findings"])), Some(false))));
    assert_eq!(w.status, 503);
}

#[test]
fn content_streams_as_ndjson_by_default() {
    let s = scripts();
    let (stream, l) = lines(answer(&s, &request(Some(schema(&["plan", "verification"])), None)));
    assert_eq!(
        (stream.content_type, stream.eager_head, stream.timing.ttft),
        ("application/x-ndjson", false, Duration::ZERO)
    );
    assert_eq!(l.len(), 4, "three content lines and the final one: {l:?}");
    assert_eq!(
        l[0].1,
        json!({"model": "llama3.2", "created_at": "2023-11-14T22:13:20Z",
               "message": {"role": "assistant", "content": "{\"plan\":\"p\""}, "done": false})
    );
    let text: String = l[..3].iter().map(|(_, v)| v["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, r#"{"plan":"p","verification":"v"}"#);
    assert!(l[..3].iter().all(|(phase, v)| *phase == Phase::FOLLOW && v["done"] == false));
    let (phase, last) = &l[3];
    assert_eq!(*phase, Phase::Tail);
    assert_eq!(
        (&last["done"], &last["done_reason"], &last["message"]),
        (&json!(true), &json!("stop"), &json!({"role": "assistant", "content": ""}))
    );
    // A token per four characters: the messages' (3 + 16 + 0 + 6) and the answer's (31).
    assert_eq!((last["prompt_eval_count"].as_u64(), last["eval_count"].as_u64()), (Some(6), Some(7)));
    // Ollama's field order (its Go structs').
    let (_, raw) = raw_lines(answer(&s, &request(Some(schema(&["plan", "verification"])), None)));
    let final_line = &raw.last().unwrap().1;
    let keys = [
        "model",
        "created_at",
        "message",
        "done",
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ];
    let at: Vec<usize> = keys.iter().map(|k| final_line.find(&format!("\"{k}\":")).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{final_line}");
    assert_eq!(last.as_object().unwrap().len(), keys.len());
}

#[test]
fn tool_calls_come_whole_in_one_line_with_object_arguments() {
    let s = scripts();
    let (_, l) = lines(answer(&s, &request(None, Some(true))));
    // Content "on it" in three pieces, the calls, the final line.
    assert_eq!(l.len(), 5, "{l:?}");
    let text: Vec<&str> = l[..3].iter().map(|(_, v)| v["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, ["on", " i", "t"]);
    assert!(l[..3].iter().all(|(_, v)| v["message"].get("tool_calls").is_none()));
    assert_eq!(
        l[3].1["message"],
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "function": {"index": 0, "name": "workspace_write", "arguments": {"path": "x", "content": "1"}}},
            {"id": "call_2", "function": {"index": 1, "name": "workspace_read", "arguments": "{\"path\": "}},
            {"id": "call_3", "function": {"index": 2, "name": "workspace_list", "arguments": {"path": ""}}},
            {"id": "call_4", "function": {"index": 3, "name": "workspace_list", "arguments": {}}},
        ]}),
        "an object's text goes as the object, compact; any other text as a string"
    );
    assert_eq!(l[3].1["done"], false);
    assert_eq!((&l[4].1["done"], &l[4].1["done_reason"]), (&json!(true), &json!("stop")));
    assert_eq!(l[4].1["message"], json!({"role": "assistant", "content": ""}));
    // Unscripted usage: the content's 5 characters and the arguments as scripted (26 + 9 + 16 + 2), a token per four.
    assert_eq!(l[4].1["eval_count"].as_u64(), Some(14));
}

#[test]
fn whole_answers_usage_and_length() {
    let s = scripts();
    let work = request(None, Some(false));
    let v = whole_json(answer(&s, &work));
    let calls = v["message"]["tool_calls"].as_array().unwrap();
    assert_eq!((v["message"]["content"].as_str(), calls.len()), (Some("on it"), 4));
    assert_eq!(calls[0]["function"]["arguments"], json!({"path": "x", "content": "1"}));
    assert_eq!((&v["done"], &v["done_reason"]), (&json!(true), &json!("stop")), "tool calls stop, as Ollama's do");
    let v = whole_json(answer(&s, &work));
    assert_eq!(
        (&v["model"], &v["created_at"], &v["message"]),
        (&json!("llama3.2"), &json!("2023-11-14T22:13:20Z"), &json!({"role": "assistant", "content": "done"}))
    );
    assert_eq!((v["prompt_eval_count"].as_u64(), v["eval_count"].as_u64()), (Some(7), Some(3)), "scripted usage");
    // `finish_reason: length` is Ollama's `done_reason: length`.
    let review = request(Some(schema(&["verdict", "findings"])), Some(false));
    let _busy = answer(&s, &review);
    let v = whole_json(answer(&s, &review));
    assert_eq!(v["done_reason"], "length");
    assert_eq!(v["message"]["content"], r#"{"verdict":"approve","findings":"ok"}"#);
}

#[test]
fn errors_and_exhaustion_are_ollama_shaped() {
    let s = scripts();
    let review = request(Some(schema(&["verdict", "findings"])), None);
    let w = whole(answer(&s, &review));
    assert_eq!((w.status, w.content_type, w.delay), (503, OLLAMA_JSON, Duration::from_millis(20)));
    assert_eq!(serde_json::from_str::<Value>(&w.body).unwrap(), json!({"error": "busy"}));
    let _ = answer(&s, &review);
    let w = whole(answer(&s, &review));
    assert_eq!((w.status, w.delay), (500, Duration::ZERO));
    assert_eq!(serde_json::from_str::<Value>(&w.body).unwrap(), json!({"error": "script a stage review exhausted"}));
}

#[test]
fn one_set_of_cursors_serves_both_apis() {
    let s = scripts();
    let config = MockConfig::for_tests();
    let env = Env { config: &config, seq: 1, now: NOW };
    let openai = r#"{"messages":[{"role":"user","content":"[script:a]"}],"response_format":{"type":"json_schema",
        "json_schema":{"name":"iop_plan","schema":{}}}}"#;
    let Some(Action::Whole(w)) = script::reply(&s, openai.as_bytes(), &env).map(|r| r.action) else { panic!() };
    assert!(w.body.contains(r#"\"plan\":\"p\""#), "{}", w.body);
    let v = whole_json(answer(&s, &request(Some(schema(&["plan", "verification"])), Some(false))));
    assert_eq!(v["message"]["content"], r#"{"plan":"p2","verification":"v2"}"#);
}

#[test]
fn unscripted_requests_are_left_to_the_endpoint() {
    let s = scripts();
    assert!(answer(&s, r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).is_none());
    assert!(answer(&s, r#"{"model":"m","messages":[{"role":"user","content":"[script:zz]"}]}"#).is_none());
    assert!(answer(&s, "not json [script:a]").is_none());
    // No model: the mock's own name.
    let v = whole_json(answer(&s, r#"{"stream":false,"messages":[{"role":"user","content":"[script:a]"}]}"#));
    assert_eq!(v["model"], "mock");
}

#[test]
fn a_delay_is_a_silent_upstream() {
    let s =
        Scripts::parse(r#"{"scripts":{"d":{"work":[{"content":"x","delay_ms":30},{"content":"y","delay_ms":30}]}}}"#)
            .unwrap();
    let body = |stream: bool| format!(r#"{{"model":"m","stream":{stream},"messages":[{{"content":"[script:d]"}}]}}"#);
    let (stream, l) = lines(answer(&s, &body(true)));
    assert_eq!((stream.timing.ttft, l.len()), (Duration::from_millis(30), 2));
    let w = whole(answer(&s, &body(false)));
    assert_eq!(w.delay, Duration::from_millis(30));
    let v: Value = serde_json::from_str(&w.body).unwrap();
    assert_eq!(v["created_at"], "2023-11-14T22:13:20.03Z");
    assert!(v["total_duration"].as_u64().unwrap() > 30_000_000);
}
