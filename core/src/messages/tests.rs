#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use super::*;

fn translate(req: &Value) -> (Value, Translated) {
    let t = to_chat(&serde_json::to_vec(req).unwrap(), "target", &Limits::default()).unwrap();
    (serde_json::from_slice(&t.body).unwrap(), t)
}

fn body(req: &Value) -> Value {
    translate(req).0
}

fn refuse(raw: &[u8]) -> Invalid {
    to_chat(raw, "target", &Limits::default())
        .err()
        .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(raw)))
}

fn refuse_json(req: &Value) -> Invalid {
    refuse(&serde_json::to_vec(req).unwrap())
}

/// A minimal valid request with `extra` fields merged in.
fn req(extra: Value) -> Value {
    let mut r = json!({"model": "claude", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

const TOOL_NAMES: [&str; 10] =
    ["Read", "Write", "Edit", "Glob", "Grep", "Bash", "LS", "TodoWrite", "WebFetch", "NotebookEdit"];

#[test]
fn a_coding_agent_request() {
    let mut tools: Vec<Value> = TOOL_NAMES
        .iter()
        .map(|n| {
            json!({"name": n, "description": format!("the {n} tool"),
                   "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}})
        })
        .collect();
    tools[9]["cache_control"] = json!({"type": "ephemeral"});
    tools[0]["type"] = json!("custom");
    tools.push(json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 5}));
    tools.push(json!({"type": "bash_20250124", "name": "bash"}));
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let request = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": tools,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "stop_sequences": ["</done>", "STOP"],
        "temperature": 1,
        "top_k": 40,
        "metadata": {"user_id": "user_abc"},
        "context_management": {"edits": []},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>cwd /src</system-reminder>"},
                {"type": "text", "text": "Fix the bug in main.rs; here is the screenshot:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"},
                 "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig"},
                {"type": "text", "text": "I'll read the file and list the dir."},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "src/main.rs"}},
                {"type": "tool_use", "id": "toolu_2", "name": "LS", "input": {"path": "src"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() {}"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "permission denied"},
                             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]},
                {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "toolu_3", "name": "Edit", "input": {"path": "src/main.rs", "n": 1}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Thanks"}
        ]
    });
    let (out, t) = translate(&request);
    let want_tools: Vec<Value> = TOOL_NAMES
        .iter()
        .map(|n| {
            json!({"type": "function", "function": {"name": n, "description": format!("the {n} tool"),
                   "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
        })
        .collect();
    let want = json!({
        "model": "target",
        "max_tokens": 32000,
        "stream": true,
        "stream_options": {"include_usage": true},
        "tools": want_tools,
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning_effort": "medium",
        "stop": ["</done>", "STOP"],
        "temperature": 1,
        "top_k": 40,
        "user": "user_abc",
        "messages": [
            {"role": "system", "content": "You are a coding agent.\nBe brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>cwd /src</system-reminder>"},
                {"type": "text", "text": "Fix the bug in main.rs; here is the screenshot:"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
            ]},
            {"role": "assistant", "content": "I'll read the file and list the dir.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "Read", "arguments": "{\"path\":\"src/main.rs\"}"}},
                {"id": "toolu_2", "type": "function", "function": {"name": "LS", "arguments": "{\"path\":\"src\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "fn main() {}"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: permission denied"},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_3", "type": "function", "function": {"name": "Edit", "arguments": "{\"n\":1,\"path\":\"src/main.rs\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "toolu_3", "content": ""},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Thanks"}
        ]
    });
    assert_eq!(out, want);
    assert!(t.stream && t.thinking);
    assert_eq!(t.stop_sequences, ["</done>", "STOP"]);
    assert_eq!(
        t.dropped,
        [
            "cache_control",
            "context_management",
            "thinking_blocks",
            "tool_result.image",
            "tools.bash_20250124",
            "tools.web_search_20250305"
        ]
    );
}

#[test]
fn a_minimal_request() {
    let (out, t) = translate(&req(json!({})));
    assert_eq!(out, json!({"model": "target", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}));
    assert!(!t.stream && !t.thinking && t.dropped.is_empty() && t.stop_sequences.is_empty());
    // `null` is absent; an empty system adds no message.
    let nulls = req(json!({"stream": null, "system": "", "tools": null, "tool_choice": null, "stop_sequences": null,
                           "temperature": null, "metadata": null, "thinking": null, "unknown": null}));
    assert_eq!(translate(&nulls).0, out);
}

#[test]
fn tool_choice_variants() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let choice = |c: Value| {
        let out = body(&req(json!({"tools": tools, "tool_choice": c})));
        (out.get("tool_choice").cloned(), out.get("parallel_tool_calls").cloned())
    };
    assert_eq!(choice(json!({"type": "auto"})), (Some(json!("auto")), None));
    assert_eq!(
        choice(json!({"type": "any", "disable_parallel_tool_use": true})),
        (Some(json!("required")), Some(json!(false)))
    );
    assert_eq!(choice(json!({"type": "none", "disable_parallel_tool_use": true})), (Some(json!("none")), None));
    assert_eq!(
        choice(json!({"type": "tool", "name": "f", "disable_parallel_tool_use": false})),
        (Some(json!({"type": "function", "function": {"name": "f"}})), None)
    );
    // Forcing a hosted tool, or any tool when only hosted ones were given:
    // the choice goes with them.
    let hosted = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    for c in [json!({"type": "tool", "name": "web_search"}), json!({"type": "any"})] {
        let (out, t) = translate(&req(json!({"tools": hosted, "tool_choice": c})));
        assert!(out.get("tools").is_none() && out.get("tool_choice").is_none(), "{out}");
        assert_eq!(t.dropped, ["tool_choice", "tools.web_search_20250305"]);
    }
    let (out, t) = translate(&req(json!({"tools": hosted, "tool_choice": {"type": "auto"}})));
    assert!(out.get("tool_choice").is_none());
    assert_eq!(t.dropped, ["tools.web_search_20250305"]);
    // Tool extras: `strict` kept, others named.
    let (out, t) =
        translate(&req(json!({"tools": [{"type": "custom", "name": "f", "input_schema": {}, "strict": true,
                                                     "defer_loading": true}]})));
    assert_eq!(
        out["tools"],
        json!([{"type": "function", "function": {"name": "f", "parameters": {}, "strict": true}}])
    );
    assert_eq!(t.dropped, ["tool.defer_loading"]);
}

#[test]
fn thinking_and_effort() {
    let effort = |extra: Value| {
        let (out, t) = translate(&req(extra));
        (out.get("reasoning_effort").and_then(Value::as_str).map(str::to_owned), t.thinking)
    };
    let s = |e: &str| Some(e.to_owned());
    for (budget, want) in [(1024, "low"), (4095, "low"), (4096, "medium"), (16383, "medium"), (16384, "high")] {
        assert_eq!(effort(json!({"thinking": {"type": "enabled", "budget_tokens": budget}})), (s(want), true));
    }
    assert_eq!(effort(json!({"thinking": {"type": "disabled"}})), (s("none"), false));
    assert_eq!(effort(json!({"thinking": {"type": "adaptive"}})), (None, true));
    assert_eq!(
        effort(json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}})),
        (s("high"), true)
    );
    assert_eq!(
        effort(json!({"thinking": {"type": "enabled", "budget_tokens": 50000}, "output_config": {"effort": "low"}})),
        (s("low"), true)
    );
    assert_eq!(
        effort(json!({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}})),
        (s("none"), false)
    );
    assert_eq!(effort(json!({"output_config": {"effort": "medium"}})), (s("medium"), false));
}

#[test]
fn structured_output() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    let want = json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}});
    let out = body(&req(json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}})));
    assert_eq!(out["response_format"], want);
    let out = body(&req(json!({"output_format": {"type": "json_schema", "schema": schema}})));
    assert_eq!(out["response_format"], want);
    let (out, t) = translate(&req(json!({"output_format": {"type": "json_schema", "schema": {}},
                                          "output_config": {"format": {"type": "json_schema", "schema": schema},
                                                            "task_budget": {"type": "tokens", "total": 1}}})));
    assert_eq!(out["response_format"], want);
    assert_eq!(t.dropped, ["output_config.task_budget", "output_format"]);
}

#[test]
fn left_out_by_name() {
    let (out, t) = translate(&req(json!({
        "container": "c", "mcp_servers": [], "service_tier": "auto", "inference_geo": "us", "brand_new": 1,
        "metadata": {"user_id": "u", "session": "s"},
        "messages": [
            {"role": "user", "name": "x", "content": [
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
                {"type": "image", "source": {"type": "file", "file_id": "f1"}},
                {"type": "text", "text": "q", "citations": [{"type": "char_location"}]}
            ]},
            {"role": "assistant", "content": [
                {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
                {"type": "thinking", "thinking": "t", "signature": "s"}
            ]},
            {"role": "user", "content": [{"type": "search_result", "source": "s", "title": "t", "content": []}]}
        ]
    })));
    assert_eq!(
        out["messages"],
        json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}])
    );
    assert_eq!(out["user"], "u");
    assert_eq!(
        t.dropped,
        [
            "block.document",
            "block.search_result",
            "block.server_tool_use",
            "block.web_search_tool_result",
            "brand_new",
            "container",
            "image.source.file",
            "inference_geo",
            "mcp_servers",
            "message.name",
            "metadata.session",
            "service_tier",
            "text.citations",
            "thinking_blocks"
        ]
    );
}

#[test]
fn tool_results_come_first_and_errors_read_as_errors() {
    let out = body(&req(json!({"messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "a", "is_error": true}
        ]}
    ]})));
    assert_eq!(
        out["messages"],
        json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "Error"},
            {"role": "user", "content": "before"}
        ])
    );
}

#[test]
fn an_image_at_the_limit_passes_and_one_byte_more_is_413() {
    let limits = Limits { max_image_bytes: 7 };
    let image = |data: &str| {
        let r = req(json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": data}}]}]}));
        to_chat(&serde_json::to_vec(&r).unwrap(), "t", &limits)
    };
    assert!(image("AAAAAAAA").is_ok()); // 6 bytes
    assert!(image("AAAAAAAAAA==").is_ok()); // 7: padding is not data
    let e = image("AAAAAAAAAAA=").err().unwrap(); // 8
    assert_eq!((e.status, e.param.as_str()), (413, "messages.0.content.0.source.data"));
    assert!(e.message.contains("8 bytes"), "{}", e.message);
}

#[test]
fn refusals() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"max_tokens": 1, "messages": []}), "model", "field required"),
        (req(json!({"model": 3})), "model", "must be a string"),
        (json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}), "max_tokens", "field required"),
        (req(json!({"max_tokens": 0})), "max_tokens", "positive integer"),
        (req(json!({"max_tokens": "5"})), "max_tokens", "positive integer"),
        (req(json!({"max_tokens": 1.5})), "max_tokens", "positive integer"),
        (req(json!({"messages": []})), "messages", "at least one"),
        (req(json!({"messages": {"role": "user"}})), "messages", "must be an array"),
        (req(json!({"messages": ["hi"]})), "messages.0", "must be an object"),
        (
            req(json!({"messages": [{"role": "system", "content": "x"}]})),
            "messages.0.role",
            "\"user\" or \"assistant\"",
        ),
        (req(json!({"messages": [{"role": "user"}]})), "messages.0.content", "field required"),
        (req(json!({"messages": [{"role": "user", "content": 5}]})), "messages.0.content", "string or an array"),
        (
            req(json!({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]})),
            "messages.0.content.0.type",
            "unknown content block type \"video\"",
        ),
        (
            req(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})),
            "messages.0.content.0.type",
            "field required",
        ),
        (
            req(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})),
            "messages.0.content.0.text",
            "must be a string",
        ),
        (
            req(json!({"messages": [{"role": "user", "content": "x"},
                                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]})),
            "messages.1.content.0.tool_use_id",
            "no tool_use with id `t1`",
        ),
        (
            req(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"},
                                             {"type": "tool_result", "tool_use_id": "t1"}]}]})),
            "messages.1.content.1.tool_use_id",
            "a second tool_result",
        ),
        (
            req(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": "no result"}]})),
            "messages.0.content.0.id",
            "no tool_result",
        ),
        (
            req(json!({"messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": "y"},
                                                  {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]})),
            "messages.1.content.1.id",
            "no tool_result",
        ),
        (
            req(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "{}"}]}]})),
            "messages.0.content.0.input",
            "must be an object",
        ),
        (
            req(
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
            ),
            "messages.0.content.0.type",
            "only allowed in assistant messages",
        ),
        (
            req(json!({"messages": [{"role": "assistant", "content": [
                {"type": "image", "source": {"type": "url", "url": "u"}}]}]})),
            "messages.0.content.0.type",
            "only allowed in user messages",
        ),
        (
            req(json!({"messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": ""}}]}]})),
            "messages.0.content.0.source.media_type",
            "must be one of",
        ),
        (
            req(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "s3"}}]}]})),
            "messages.0.content.0.source.type",
            "\"base64\", \"url\" or \"file\"",
        ),
        (
            req(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": "yes"}]}]})),
            "messages.1.content.0.is_error",
            "must be a boolean",
        ),
        (
            req(json!({"messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "audio"}]}]}]})),
            "messages.1.content.0.content.0.type",
            "unknown tool_result content block type",
        ),
        (req(json!({"system": [{"type": "image"}]})), "system.0.type", "of type \"text\""),
        (req(json!({"system": 5})), "system", "string or an array"),
        (req(json!({"stream": "yes"})), "stream", "must be a boolean"),
        (req(json!({"temperature": "hot"})), "temperature", "must be a number"),
        (req(json!({"top_k": -1})), "top_k", "non-negative integer"),
        (req(json!({"stop_sequences": ["a", 1]})), "stop_sequences.1", "must be a string"),
        (req(json!({"metadata": {"user_id": 7}})), "metadata.user_id", "must be a string"),
        (req(json!({"tools": [{"name": "f"}]})), "tools.0.input_schema", "field required"),
        (req(json!({"tools": [{"name": "f", "input_schema": []}]})), "tools.0.input_schema", "must be an object"),
        (
            req(json!({"tools": [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}]})),
            "tools.1.name",
            "a second tool",
        ),
        (req(json!({"tool_choice": {"type": "function"}})), "tool_choice.type", "must be one of"),
        (req(json!({"tool_choice": {"type": "tool", "name": "g"}})), "tool_choice.name", "no tool named \"g\""),
        (req(json!({"thinking": {"type": "enabled"}})), "thinking.budget_tokens", "field required"),
        (req(json!({"thinking": {"type": "on"}})), "thinking.type", "must be one of"),
        (req(json!({"output_config": {"effort": "extreme"}})), "output_config.effort", "must be one of"),
        (req(json!({"output_config": {"format": {"type": "regex"}}})), "output_config.format.type", "json_schema"),
    ];
    for (request, param, needle) in cases {
        let e = refuse_json(&request);
        assert_eq!((e.status, e.param.as_str()), (400, param), "{request}: {e}");
        assert!(e.message.contains(needle) && e.message.starts_with(param), "{request}: {e}");
    }
}

#[test]
fn bodies_that_are_not_an_object_or_repeat_a_key() {
    for (raw, param, needle) in [
        (&b""[..], "", "empty"),
        (b"  \n", "", "empty"),
        (b"[1]", "", "expected a JSON object"),
        (b"\"x\"", "", "expected a JSON object"),
        (b"{\"model\":", "", "invalid request body"),
        (b"{\"model\":\"a\"} x", "", "trailing"),
        (b"\xff", "", "expected a JSON object"),
        (b"{\"model\":\"a\",\"max_tokens\":1,\"model\":\"b\"}", "model", "given twice"),
        // The same key spelled with an escape is the same key.
        (b"{\"m\\u0065ssages\":[],\"messages\":[]}", "messages", "given twice"),
        // A syntax error after the duplicate still reads as one.
        (b"{\"a\":1,\"a\":2,", "", "invalid request body"),
    ] {
        let e = refuse(raw);
        assert_eq!((e.status, e.param.as_str()), (400, param), "{}: {e}", String::from_utf8_lossy(raw));
        assert!(e.message.contains(needle), "{}: {e}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn long_client_strings_are_cut_in_messages_and_names() {
    let long = "é".repeat(100);
    let (_, t) = translate(&req(json!({ long.clone(): 1 })));
    assert_eq!(t.dropped, ["é".repeat(32)]);
    let e = refuse_json(&req(json!({"messages": [{"role": "user", "content": [{"type": long}]}]})));
    assert!(e.message.len() < 150, "{e}");
}

#[test]
fn string_contents_are_carried_as_sent_and_escapes_still_checked() {
    // Escapes other than `\u` are copied as written; `\u` ones are read.
    let raw = br#"{"model":"m","max_tokens":5,"system":"be \"brief\"\n","messages":[
        {"role":"user","content":"caf\u00e9 \ud83d\ude00"},
        {"role":"assistant","content":"ok\t a\\b\/c"},
        {"role":"user","content":"", "role":"user"}]}"#;
    let t = to_chat(raw, "target", &Limits::default()).unwrap();
    let sent: Value = serde_json::from_slice(&t.body).unwrap();
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "be \"brief\"\n"},
            {"role": "user", "content": "café 😀"},
            {"role": "assistant", "content": "ok\t a\\b/c"},
            {"role": "user", "content": ""},
        ])
    );
    assert!(t.body.windows(7).any(|w| w == br#"a\\b\/c"#), "copied as written");
    // A lone surrogate is refused as a JSON tree refuses it.
    for content in [r#""\ud800""#, r#""x\udc00y""#] {
        let raw = format!(r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":{content}}}]}}"#);
        let e = refuse(raw.as_bytes());
        assert_eq!((e.status, e.param.as_str()), (400, ""), "{content}: {e}");
        // No position: one counted from the string's start would mislead.
        assert!(e.message.starts_with("invalid request body: ") && !e.message.contains(" column "), "{e}");
    }
    // A raw control character or invalid UTF-8 in a string is refused.
    for content in [&b"\"a\nb\""[..], b"\"a\xffb\""] {
        let mut raw = br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"#.to_vec();
        raw.extend_from_slice(content);
        raw.extend_from_slice(b"}]}");
        assert_eq!(refuse(&raw).status, 400, "{}", String::from_utf8_lossy(content));
    }
    // A number a tree cannot hold, read only when taken, is refused as before.
    let e = refuse(br#"{"model":"m","max_tokens":5,"temperature":1e999,"messages":[{"role":"user","content":"a"}]}"#);
    assert_eq!(e.message, "invalid request body: number out of range");
    // An empty system string adds no message; nesting too deep is refused.
    let t = body(&req(json!({"system": ""})));
    assert_eq!(t["messages"].as_array().unwrap().len(), 1);
    let deep = format!(r#"{{"model":"m","max_tokens":5,"messages":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    assert_eq!(refuse(deep.as_bytes()).status, 400);
}

#[test]
fn many_keys_cost_no_square_and_a_repeat_among_them_is_found() {
    // 60 000 top-level keys: a scan per key would be 1.8e9 compares.
    let mut raw = String::from(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi""#);
    for k in 0..60_000 {
        raw.push_str(&format!(r#","x{k}":0"#));
    }
    raw.push_str("}],");
    for k in 0..60_000 {
        raw.push_str(&format!(r#""k{k}":0,"#));
    }
    let t = to_chat(format!("{raw}\"end\":1}}").as_bytes(), "target", &Limits::default()).unwrap();
    // `end`, `k0`.., `message.x0`..
    assert_eq!(t.dropped.len(), 1 + 60_000 + 60_000, "{:?}", &t.dropped[..3]);
    let e = refuse(format!("{raw}\"k59999\":1}}").as_bytes());
    assert_eq!((e.status, e.param.as_str()), (400, "k59999"), "{e}");
}

#[test]
fn the_places_of_a_first_read_translate_as_the_body_does() {
    for raw in [
        &br#"{"model":"m","max_tokens":5,"system":"s","messages":[{"role":"user","content":"hi"}],"x":1}"#[..],
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"}],"k":1,"\u006b":2}"#,
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"}],"max_tokens":6}"#,
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"t"}]}]}"#,
    ] {
        let Ok(top) = crate::request::Top::parse_keeping(raw) else {
            // A known key given twice: the first read refuses it either way.
            assert!(crate::request::Top::parse(raw).is_err(), "{}", String::from_utf8_lossy(raw));
            continue;
        };
        let at = to_chat_at(raw, top.fields.as_ref(), "target", &Limits::default());
        assert_eq!(at, to_chat(raw, "target", &Limits::default()), "{}", String::from_utf8_lossy(raw));
    }
}
