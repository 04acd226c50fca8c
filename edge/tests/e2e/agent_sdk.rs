//! The single-request coordinator driven by the official `anthropic` Python
//! SDK (`scripts/agent_sdk.py`): an agent's answer read buffered, as a
//! `messages.stream(...)` (events, `text_stream`, `get_final_message()`) and
//! as raw `create(stream=True)` events, with the stage envelope in between;
//! a failed run raises the SDK's errors, promptly; every run leaves the
//! file it wrote and no job directory.

use std::{
    io::Read,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::agent::*;

/// Longest one SDK run may take: a hang is a failure, not a stuck test.
const SDK_DEADLINE: Duration = Duration::from_secs(60);

/// The events a streamed agent answer carries besides the stage envelope,
/// as the SDK's `messages.stream(...)` yields them (`text` is its own).
const STREAM_EVENTS: [&str; 7] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "text",
    "content_block_stop",
    "message_delta",
    "message_stop",
];

/// The task text of `script`: the mock answers it from that script.
fn task_text(script: &str) -> String {
    format!("[script:{script}] Write {script}.txt and say what you did.")
}

/// The Work stage's final report of `script`: what the client must get.
fn report(script: &str) -> String {
    format!("Wrote {script}.txt; it says {script}.")
}

/// A script that plans, writes `NAME.txt`, reports and is approved.
fn writes(script: &str) -> Value {
    json!({
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": format!("{script}.txt"), "content": format!("{script}\n")})),
            {"content": report(script)},
        ],
        "review": [verdict("approve", "done as planned")],
    })
}

/// Runs `scripts/agent_sdk.py` in `mode` against the agent `coder` of `s`
/// with the task of `script`; fails the test if it takes longer than
/// [`SDK_DEADLINE`].
fn agent_sdk(s: &Setup, mode: &str, script: &str, envs: &[(&str, &str)]) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/agent_sdk.py");
    let base = format!("http://{}", s.edge.http);
    let mut child = Command::new("python3")
        .args([path, &base, "coder", mode, &task_text(script)])
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e} (install the SDK with scripts/fetch-test-model.sh)"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > SDK_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.join().unwrap();
            panic!("{mode} {script}: the SDK hung for {SDK_DEADLINE:?}:\n{}", String::from_utf8_lossy(&err));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(status.success(), "agent_sdk.py {mode} {script} failed:\n{}", String::from_utf8_lossy(&err));
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{mode} {script}: {e}: {}", String::from_utf8_lossy(&out)))
}

/// The event types the SDK yielded for `v`.
fn events_of(v: &Value) -> Vec<&str> {
    v["events"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect()
}

/// No exception, the report as the text, `end_turn`.
fn assert_answer(what: &str, v: &Value, script: &str) {
    assert!(v.get("exception").is_none(), "{what}: the SDK raised: {v:#}");
    assert_eq!(v["text"], report(script), "{what}: {v:#}");
    assert_eq!(v["stop_reason"], "end_turn", "{what}: {v:#}");
}

fn assert_wrote(s: &Setup, script: &str) {
    let file = s.root.join(format!("{script}.txt"));
    assert_eq!(std::fs::read(&file).unwrap(), format!("{script}\n").as_bytes(), "{script}");
    assert_cleaned(&s.root);
}

#[test]
#[ignore = "needs python3 with the anthropic SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_anthropic_sdk_reads_an_agents_answer_buffered_and_streamed() {
    let modes = ["buffered", "stream_events", "stream_text", "raw_stream"];
    let scripts: serde_json::Map<String, Value> =
        modes.iter().map(|m| (format!("sdk_{m}"), writes(&format!("sdk_{m}")))).collect();
    let s = setup("agent-sdk-ok", &json!({"scripts": scripts}), "");

    // Buffered: one `Message`.
    let v = agent_sdk(&s, "buffered", "sdk_buffered", &[]);
    assert_answer("buffered", &v, "sdk_buffered");
    assert_eq!(
        (&v["class"], &v["type"], &v["role"], &v["model"]),
        (&json!("Message"), &json!("message"), &json!("assistant"), &json!("coder")),
        "{v:#}"
    );
    assert_eq!((&v["content_types"], &v["stop_sequence"]), (&json!(["text"]), &Value::Null), "{v:#}");
    assert_wrote(&s, "sdk_buffered");

    // `messages.stream(...)` iterated: the events of one text block, the
    // stage pings in between dropped by the SDK, and the final message and
    // text are the report.
    let v = agent_sdk(&s, "stream_events", "sdk_stream_events", &[]);
    assert_answer("stream_events", &v, "sdk_stream_events");
    assert_eq!(events_of(&v), STREAM_EVENTS, "{v:#}");
    assert_eq!(v["streamed_text"], report("sdk_stream_events"), "{v:#}");
    assert_eq!(v["final_text"], report("sdk_stream_events"), "{v:#}");
    assert_eq!((&v["class"], &v["model"]), (&json!("ParsedMessage"), &json!("coder")), "{v:#}");
    // The stages ride `ping` events, which the SDK drops: it yields the
    // standard events only (an unknown event type would reach it as a
    // `RawMessageStartEvent` whose `message` is None).
    assert!(v["events"].as_array().unwrap().iter().all(|e| e != "stage" && e != "ping"), "{v:#}");
    assert_wrote(&s, "sdk_stream_events");

    // `text_stream` yields the report; `get_final_message()` agrees.
    let v = agent_sdk(&s, "stream_text", "sdk_stream_text", &[]);
    assert_answer("stream_text", &v, "sdk_stream_text");
    assert_eq!(v["text_stream"], report("sdk_stream_text"), "{v:#}");
    assert_wrote(&s, "sdk_stream_text");

    // Raw events (`create(stream=True)`): the same, unaccumulated.
    let v = agent_sdk(&s, "raw_stream", "sdk_raw_stream", &[]);
    assert_answer("raw_stream", &v, "sdk_raw_stream");
    let raw: Vec<&str> = STREAM_EVENTS.iter().copied().filter(|e| *e != "text").collect();
    assert_eq!(events_of(&v), raw, "{v:#}");
    assert_wrote(&s, "sdk_raw_stream");
}

#[test]
#[ignore = "needs python3 with the anthropic SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_anthropic_sdk_raises_an_agents_failure_and_does_not_hang() {
    let boom = json!({"error": {"status": 500, "message": "boom"}});
    let fails_in_plan = json!({"plan": [boom]});
    // Fails after a tool ran, so the stream has carried several stages.
    let fails_in_work = |script: &str| {
        json!({
            "plan": [plan_ok()],
            "work": [
                call("workspace_write", json!({"path": format!("{script}.txt"), "content": format!("{script}\n")})),
                boom,
            ],
        })
    };
    let scripts = json!({"scripts": {
        "fail_buffered": fails_in_plan,
        "fail_stream_events": fails_in_work("fail_stream_events"),
        "fail_stream_text": fails_in_plan,
        "fail_raw_stream": fails_in_work("fail_raw_stream"),
    }});
    let s = setup("agent-sdk-fail", &scripts, "");
    let class_named = |v: &Value| {
        let msg = v["message"].as_str().unwrap_or_default();
        assert!(msg.contains("`provider`"), "the failure's class is named: {v:#}");
        assert!(!msg.contains("boom"), "the provider's own message stays private: {v:#}");
    };

    // Buffered: the 500 is `InternalServerError` with the Anthropic body.
    let v = agent_sdk(&s, "buffered", "fail_buffered", &[]);
    assert_eq!((&v["exception"], &v["status"]), (&json!("InternalServerError"), &json!(500)), "{v:#}");
    assert_eq!(v["body"]["type"], "error", "{v:#}");
    assert_eq!(v["body"]["error"]["type"], "api_error", "{v:#}");
    class_named(&v);
    assert_cleaned(&s.root);

    // Streamed: the answer's status is 200, so the `error` event is raised
    // while iterating as a plain `APIStatusError` (status 200) carrying the
    // event's body, after `message_start` and the stages and before any text.
    for (mode, script) in [
        ("stream_events", "fail_stream_events"),
        ("stream_text", "fail_stream_text"),
        ("raw_stream", "fail_raw_stream"),
    ] {
        let v = agent_sdk(&s, mode, script, &[]);
        assert_eq!((&v["exception"], &v["status"]), (&json!("APIStatusError"), &json!(200)), "{mode}: {v:#}");
        let bases = v["bases"].as_array().unwrap();
        assert!(bases.contains(&json!("APIError")), "{mode}: {v:#}");
        assert_eq!(v["body"]["type"], "error", "{mode}: {v:#}");
        assert_eq!(v["body"]["error"]["type"], "api_error", "{mode}: {v:#}");
        class_named(&v);
        if mode != "stream_text" {
            // (`stream_text` records no events.)
            assert_eq!(events_of(&v), ["message_start"], "{mode}: {v:#}");
        }
        assert_cleaned(&s.root);
    }
    // The file written before the failure stays; only job directories go.
    for script in ["fail_stream_events", "fail_raw_stream"] {
        assert_wrote(&s, script);
    }

    // Refused before any run (a workspace the agent may not use): 400,
    // `BadRequestError`, buffered and when the stream is opened.
    for mode in ["buffered", "stream_text"] {
        let v = agent_sdk(&s, mode, "unused", &[("IOP_WORKSPACE", "elsewhere")]);
        assert_eq!((&v["exception"], &v["status"]), (&json!("BadRequestError"), &json!(400)), "{mode}: {v:#}");
        assert_eq!(v["body"]["error"]["type"], "invalid_request_error", "{mode}: {v:#}");
        assert_cleaned(&s.root);
    }
}
