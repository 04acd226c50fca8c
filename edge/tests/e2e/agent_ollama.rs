//! The single-request coordinator on a provider of kind `ollama`: every
//! stage's chat request goes through the node's normalized path (the
//! `ollama` adapter translates it to `POST /api/chat` and maps Ollama's
//! answer back), played by `iop-mockprov --script` on its Ollama API. The
//! workspace tools run in a real `iop-node` in a scratch directory.

use serde_json::{json, Value};

use crate::agent::*;
use crate::harness::*;

/// [`setup_in`] on a provider of kind `ollama`: every stage goes through
/// the node's Ollama adapter (the normalized path).
pub fn setup_ollama(name: &str, scripts: &Value) -> Setup {
    let o = Options {
        kind: "ollama",
        upstream_model: "mock-llama",
        commands: r#"{ test = ["sh", "-c", "cat hello.txt && echo tested"] }"#,
        ..Options::default()
    };
    setup_in(&scratch(name), scripts, &o, |_, _| {})
}

/// Every model request the mock recorded: its path and JSON body.
fn mock_log(mock: &MockProv) -> Vec<(String, Value)> {
    let r = request(mock.addr, "GET", "/log", None, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|rec| {
            let body = rec["request_body"].as_str().expect("request_body");
            (rec["path"].as_str().unwrap().to_owned(), serde_json::from_str(body).expect("a JSON request"))
        })
        .collect()
}

fn complete_run() -> Value {
    json!({
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": "hello.txt", "content": "hello\n"})),
            call("workspace_command", json!({"command": "test"})),
            {"content": "Wrote hello.txt; `test` printed hello and tested."},
        ],
        "review": [verdict("approve", "done as planned")],
    })
}

#[test]
fn an_agent_on_ollama_plans_works_and_is_approved() {
    let s = setup_ollama("agent-ollama-ok", &json!({"scripts": {"ok": complete_run()}}));
    let r = ask(&s, "ok", false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let m = r.json();
    assert_eq!((&m["type"], &m["model"], &m["stop_reason"]), (&json!("message"), &json!("coder"), &json!("end_turn")));
    assert_eq!(m["content"][0]["text"], "Wrote hello.txt; `test` printed hello and tested.");
    assert_eq!(std::fs::read(s.root.join("hello.txt")).unwrap(), b"hello\n");
    assert_cleaned(&s.root);
    // Every stage's call went to Ollama's API: plan, three work turns, review.
    let log = mock_log(&s.mock);
    let paths: Vec<&str> = log.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["/api/chat"; 5], "{paths:?}");
    let stats = s.mock.stats();
    assert_eq!((stats["ollama_requests"].as_u64(), stats["requests"].as_u64()), (Some(5), Some(0)));
}

#[test]
fn an_agent_on_ollama_streams_a_repair_round() {
    let scripts = json!({"scripts": {"repair": {
        "plan": [plan_ok()],
        "work": [
            call("workspace_write", json!({"path": "hello.txt", "content": "draft\n"})),
            {"content": "first try"},
            call("workspace_write", json!({"path": "hello.txt", "content": "hello\n"})),
            {"content": "fixed after review"},
        ],
        "review": [verdict("repair", "the greeting is wrong"), verdict("approve", "ok now")],
    }}});
    let s = setup_ollama("agent-ollama-repair", &scripts);
    let r = ask(&s, "repair", true);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r);
    let stages: Vec<&str> = events
        .iter()
        .filter(|(e, d)| e == "ping" && d["type"] == "ping")
        .filter_map(|(_, d)| d["stage"].as_str())
        .collect();
    for want in ["planning", "working", "internal_tool", "reviewing", "repairing", "finalizing"] {
        assert!(stages.contains(&want), "stage {want} missing: {stages:?}");
    }
    assert_eq!(events.iter().filter(|(e, _)| e == "message_stop").count(), 1, "{events:?}");
    assert!(!events.iter().any(|(e, _)| e == "error"), "{events:?}");
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "fixed after review");
    let body = String::from_utf8_lossy(&r.body);
    for private in ["greeting", "draft", "first try", "hello.txt"] {
        assert!(!body.contains(private), "`{private}` reached the client:\n{body}");
    }
    assert_eq!(std::fs::read(s.root.join("hello.txt")).unwrap(), b"hello\n");
    assert_cleaned(&s.root);
    // Two reviews, four work turns, one plan: all on /api/chat.
    assert_eq!(s.mock.stats()["ollama_requests"].as_u64(), Some(7));
}

#[test]
fn malformed_answers_from_ollama_fail_as_malformed() {
    let scripts = json!({"scripts": {
        "malformed_plan": {"plan": [{"content": "I think we should"}]},
        // A call whose arguments are not a JSON object (Ollama's arguments
        // come as a string: the node passes the text on, the edge refuses it).
        "bad_call": {"plan": [plan_ok()], "work": [{"tool_calls": [{"name": "workspace_write", "arguments": "{\"path\":"}]}]},
        "bad_review": {
            "plan": [plan_ok()],
            "work": [{"content": "nothing to do"}],
            "review": [{"content": "{\"verdict\":\"maybe\",\"findings\":\"?\"}"}],
        },
        "provider": {"plan": [{"error": {"status": 500, "message": "boom"}}]},
    }});
    let s = setup_ollama("agent-ollama-malformed", &scripts);
    for (script, class) in [
        ("malformed_plan", "malformed"),
        ("bad_call", "malformed"),
        ("bad_review", "malformed"),
        ("provider", "provider"),
    ] {
        let r = ask(&s, script, false);
        assert_eq!(r.status, 500, "{script}: {}", String::from_utf8_lossy(&r.body));
        let e = r.json();
        assert_eq!((&e["type"], &e["error"]["type"]), (&json!("error"), &json!("api_error")), "{script}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`{class}`")), "{script}: {msg}");
        assert!(!msg.contains("I think") && !msg.contains("boom"), "{script}: the answer leaked: {msg}");
        assert_cleaned(&s.root);
    }
    assert!(!s.root.join("hello.txt").exists());
}

/// What the node made of each stage's OpenAI request, as the mock got it.
#[test]
fn the_node_sends_ollama_requests_with_format_and_tools() {
    let s = setup_ollama("agent-ollama-requests", &json!({"scripts": {"ok": complete_run()}}));
    let r = ask(&s, "ok", false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let log = mock_log(&s.mock);
    assert_eq!(log.len(), 5, "{log:?}");
    for (path, body) in &log {
        assert_eq!(path, "/api/chat");
        assert_eq!((&body["model"], &body["stream"]), (&json!("mock-llama"), &json!(false)), "{body}");
        for openai_only in ["response_format", "max_tokens", "tool_choice", "parallel_tool_calls", "reasoning_effort"] {
            assert!(body.get(openai_only).is_none(), "`{openai_only}` sent to Ollama: {body}");
        }
        assert!(body["options"]["num_predict"].as_u64().is_some_and(|n| n > 0), "{body}");
    }
    let (plan, work, review) = (&log[0].1, &log[1..4], &log[4].1);

    // Plan: Ollama's `format` is the plan schema itself (its name dropped), no tools.
    assert_eq!(
        plan["format"],
        json!({"type": "object", "properties": {"plan": {"type": "string"}, "verification": {"type": "string"}},
               "required": ["plan", "verification"], "additionalProperties": false})
    );
    assert!(plan.get("tools").is_none(), "{plan}");
    assert_eq!(plan["messages"][0]["role"], "system");
    assert!(plan["messages"][1]["content"].as_str().unwrap().contains("[script:ok]"));

    // Work: the workspace tools, no format, no thinking option.
    for (_, w) in work {
        assert!(w.get("format").is_none(), "{w}");
        assert!(w.get("think").is_none(), "work asked for thinking: {w}");
        assert!(w["options"].get("think").is_none() && w.get("reasoning").is_none(), "{w}");
        let tools: Vec<&str> =
            w["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
        for want in ["workspace_read", "workspace_list", "workspace_write", "workspace_command"] {
            assert!(tools.contains(&want), "{want} missing: {tools:?}");
        }
        assert!(w["tools"].as_array().unwrap().iter().all(|t| t["type"] == "function"));
    }
    // The second turn carries the first call, arguments as an object, and
    // its result as a `tool` message naming the tool.
    let messages = work[1].1["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").expect("the call's turn");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "workspace_write");
    assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], json!({"path": "hello.txt", "content": "hello\n"}));
    let result = messages.iter().find(|m| m["role"] == "tool").expect("the call's result");
    assert_eq!(result["tool_name"], "workspace_write");
    assert!(result["content"].is_string(), "{result}");
    // The third turn has both results.
    let tools = work[2].1["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(tools, 2);

    // Review: the review schema as `format`, no tools, no thinking.
    assert_eq!(review["format"]["properties"]["verdict"], json!({"type": "string", "enum": ["approve", "repair"]}));
    assert_eq!(review["format"]["required"], json!(["verdict", "findings"]));
    assert!(review.get("tools").is_none() && review.get("think").is_none(), "{review}");
    assert!(plan.get("think").is_none(), "{plan}");
}

/// The scripted NDJSON stream itself, read by the node's Ollama parser: a
/// client streaming a chat completion from the agent's model group gets the
/// content and the calls (an object's text; a raw string as it was).
#[test]
fn scripted_ollama_streams_are_what_the_node_reads() {
    let scripts = json!({"scripts": {"chat": {"work": [
        {"content": "let me look", "tool_calls": [
            {"name": "workspace_read", "arguments": {"path": "README.md"}},
            {"name": "workspace_write", "arguments": "{\"path\":"},
        ]},
        {"content": "cut short", "finish_reason": "length", "usage": {"prompt_tokens": 11, "completion_tokens": 2}},
    ]}}});
    let s = setup_ollama("agent-ollama-ndjson", &scripts);
    let body = |stream: bool| {
        json!({"model": "m", "stream": stream, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "[script:chat] go"}],
               "tools": [{"type": "function", "function": {"name": "workspace_read", "parameters": {"type": "object"}}}]})
    };
    let r = post_json(s.edge.http, "/v1/chat/completions", &body(true));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "let me look");
    let mut calls: Vec<(String, String)> = Vec::new();
    for c in chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten() {
        let i = c["index"].as_u64().unwrap() as usize;
        if calls.len() <= i {
            calls.resize(i + 1, Default::default());
        }
        if let Some(name) = c["function"]["name"].as_str() {
            calls[i].0.push_str(name);
        }
        calls[i].1.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
    }
    assert_eq!(calls.len(), 2, "{chunks:?}");
    assert_eq!(calls[0].0, "workspace_read");
    assert_eq!(serde_json::from_str::<Value>(&calls[0].1).unwrap(), json!({"path": "README.md"}));
    assert_eq!(calls[1], ("workspace_write".to_owned(), "{\"path\":".to_owned()));
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
    // Whole, with `done_reason: length` and the scripted counts.
    let r = post_json(s.edge.http, "/v1/chat/completions", &body(false));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(
        (&v["choices"][0]["message"]["content"], &v["choices"][0]["finish_reason"]),
        (&json!("cut short"), &json!("length"))
    );
    assert_eq!((v["usage"]["prompt_tokens"].as_u64(), v["usage"]["completion_tokens"].as_u64()), (Some(11), Some(2)));
    let log = mock_log(&s.mock);
    assert_eq!(
        log.iter().map(|(p, b)| (p.as_str(), b["stream"].clone())).collect::<Vec<_>>(),
        [("/api/chat", json!(true)), ("/api/chat", json!(false))]
    );
}
