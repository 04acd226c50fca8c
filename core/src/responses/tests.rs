#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use super::*;

fn translate_with(req: &Value, opts: &Options) -> (Value, Translated) {
    let t = to_chat(&serde_json::to_vec(req).unwrap(), "target", opts).unwrap();
    (serde_json::from_slice(&t.body).unwrap(), t)
}

fn translate(req: &Value) -> (Value, Translated) {
    translate_with(req, &Options::default())
}

fn body(req: &Value) -> Value {
    translate(req).0
}

fn refuse(raw: &[u8]) -> Invalid {
    to_chat(raw, "target", &Options::default())
        .err()
        .unwrap_or_else(|| panic!("accepted {}", String::from_utf8_lossy(raw)))
}

fn refuse_json(req: &Value) -> Invalid {
    refuse(&serde_json::to_vec(req).unwrap())
}

/// A minimal valid request with `extra` fields merged in.
fn req(extra: Value) -> Value {
    let mut r = json!({"model": "gpt-5", "input": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

const TOOL_NAMES: [&str; 12] = [
    "shell",
    "apply_patch",
    "update_plan",
    "view_image",
    "read_file",
    "list_dir",
    "grep_files",
    "write_stdin",
    "exec_command",
    "list_mcp_resources",
    "read_mcp_resource",
    "request_user_input",
];

fn schema() -> Value {
    json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
           "additionalProperties": false})
}

#[test]
fn a_codex_request() {
    let mut tools: Vec<Value> = TOOL_NAMES
        .iter()
        .map(|n| {
            json!({"type": "function", "name": n, "description": format!("the {n} tool"), "strict": false,
                        "parameters": schema()})
        })
        .collect();
    tools.push(json!({"type": "namespace", "name": "mcp__github__", "description": "GitHub tools",
    "tools": [
        {"type": "function", "name": "create_issue", "description": "open an issue",
         "strict": false, "parameters": schema()},
        {"type": "function", "name": "get_issue", "parameters": schema()}
    ]}));
    tools.push(json!({"type": "web_search", "external_web_access": false}));
    let reasoning_item = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}],
                                "encrypted_content": "gAAAAB..."});
    let request = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "<environment_context>cwd /src</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test."}]},
            reasoning_item,
            {"type": "function_call", "id": "fc_1", "name": "shell", "call_id": "call_1",
             "arguments": "{\"command\":[\"cargo\",\"test\"]}"},
            {"type": "function_call", "id": "fc_2", "name": "read_file", "call_id": "call_2",
             "arguments": "{\"path\":\"src/lib.rs\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "test a ... FAILED"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "fn a() {}"}]},
            reasoning_item,
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": [
                {"type": "output_text", "text": "I'll file an issue, then patch.", "annotations": []}]},
            {"type": "function_call", "name": "create_issue", "namespace": "mcp__github__", "call_id": "call_3",
             "arguments": "{\"title\":\"a fails\"}"},
            {"type": "function_call_output", "call_id": "call_3", "output": "#42"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
            {"role": "user", "content": "Go on."}
        ],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "high", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "5f0c-session",
        "text": {"verbosity": "low"}
    });
    let (out, t) = translate(&request);
    let mut want_tools: Vec<Value> = TOOL_NAMES
        .iter()
        .map(|n| {
            json!({"type": "function", "function": {"name": n, "description": format!("the {n} tool"),
                                                          "strict": false, "parameters": schema()}})
        })
        .collect();
    want_tools.push(json!({"type": "function", "function": {"name": "mcp__github__create_issue",
                           "description": "open an issue", "strict": false, "parameters": schema()}}));
    want_tools
        .push(json!({"type": "function", "function": {"name": "mcp__github__get_issue", "parameters": schema()}}));
    let want = json!({
        "model": "target",
        "stream": true,
        "stream_options": {"include_usage": true},
        "tools": want_tools,
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning_effort": "high",
        "messages": [
            {"role": "system", "content": "You are Codex, a coding agent."},
            {"role": "system", "content": "<permissions instructions>sandbox: workspace-write</permissions instructions>"},
            {"role": "user", "content": "<environment_context>cwd /src</environment_context>"},
            {"role": "user", "content": "Fix the failing test."},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "shell", "arguments": "{\"command\":[\"cargo\",\"test\"]}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "read_file", "arguments": "{\"path\":\"src/lib.rs\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "test a ... FAILED"},
            {"role": "tool", "tool_call_id": "call_2", "content": "fn a() {}"},
            {"role": "assistant", "content": "I'll file an issue, then patch.", "tool_calls": [
                {"id": "call_3", "type": "function",
                 "function": {"name": "mcp__github__create_issue", "arguments": "{\"title\":\"a fails\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": "#42"},
            {"role": "user", "content": "Go on."}
        ]
    });
    assert_eq!(out, want);
    assert!(t.stream);
    assert_eq!(t.input_from, 1);
    assert_eq!(t.prompt_cache_key.as_deref(), Some("5f0c-session"));
    assert_eq!(
        t.namespaced,
        [
            ("mcp__github__create_issue".into(), "mcp__github__".into(), "create_issue".into()),
            ("mcp__github__get_issue".into(), "mcp__github__".into(), "get_issue".into())
        ]
    );
    assert_eq!(
        t.dropped,
        [
            "include.reasoning.encrypted_content",
            "item.web_search_call",
            "namespace.description",
            "reasoning.summary",
            "reasoning_items",
            "text.verbosity",
            "tools.web_search"
        ]
    );
    let e = &t.echo;
    assert_eq!(e.instructions.as_deref(), Some("You are Codex, a coding agent."));
    assert_eq!((e.max_output_tokens, e.temperature, e.top_p), (None, None, None));
    assert!(!e.parallel_tool_calls && !e.store);
    assert_eq!(e.tool_choice, "auto");
    assert_eq!(e.tools, request["tools"]);
    assert_eq!(e.text, json!({"verbosity": "low", "format": {"type": "text"}}));
    assert_eq!(e.reasoning, json!({"effort": "high", "summary": "auto"}));
    assert_eq!(e.metadata, Value::Null);
    assert_eq!((e.user.as_deref(), e.previous_response_id.as_deref()), (None, None));
    // The history the WebSocket mode keeps: the input's messages, without
    // the instructions.
    let history = history_of(&t);
    assert_eq!(history.len(), 9);
    assert_eq!(history[..], want["messages"].as_array().unwrap()[1..]);
}

#[test]
fn a_minimal_request_and_its_echo() {
    let (out, t) = translate(&req(json!({})));
    assert_eq!(out, json!({"model": "target", "messages": [{"role": "user", "content": "hi"}]}));
    assert!(!t.stream && t.dropped.is_empty() && t.namespaced.is_empty() && t.prompt_cache_key.is_none());
    let e = &t.echo;
    assert_eq!(e.instructions, None);
    assert!(e.parallel_tool_calls && !e.store);
    // Not sent: null (the edge writes what that means).
    assert_eq!([&e.tool_choice, &e.tools, &e.text, &e.reasoning, &e.metadata], [&Value::Null; 5]);
    // `null` is absent; so are the defaults that ask nothing; an empty
    // `instructions` adds no message (but is echoed).
    let nulls = req(json!({"stream": null, "tools": null, "tool_choice": null, "temperature": null, "text": null,
                           "reasoning": null, "include": null, "store": false, "previous_response_id": null,
                           "truncation": "disabled", "background": false, "unknown": null, "instructions": ""}));
    let (again, t) = translate(&nulls);
    assert_eq!(again, out);
    assert!(t.dropped.is_empty(), "{:?}", t.dropped);
    assert_eq!(t.echo.instructions.as_deref(), Some(""));
}

#[test]
fn sampling_limits_and_labels() {
    let (out, t) = translate(&req(json!({
        "max_output_tokens": 500, "temperature": 0.2, "top_p": 1, "user": "u1", "metadata": {"k": "v"},
        "safety_identifier": "sid", "client_metadata": {"a": "b"}, "prompt_cache_key": "pck",
        "service_tier": "flex", "truncation": "auto", "background": true, "top_logprobs": 3,
        "stream_options": {"include_obfuscation": false}, "brand_new": 1,
        "include": ["message.output_text.logprobs", "file_search_call.results"],
        "reasoning": {"effort": "minimal", "generate_summary": "concise"}
    })));
    assert_eq!(
        out,
        json!({"model": "target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500,
               "temperature": 0.2, "top_p": 1, "user": "u1", "reasoning_effort": "minimal"})
    );
    assert_eq!(
        t.dropped,
        [
            "background",
            "brand_new",
            "include.file_search_call.results",
            "include.message.output_text.logprobs",
            "reasoning.generate_summary",
            "service_tier",
            "stream_options",
            "top_logprobs",
            "truncation"
        ]
    );
    let e = &t.echo;
    assert_eq!((e.max_output_tokens, e.temperature, e.top_p), (Some(500), Some(0.2), Some(1.0)));
    assert_eq!(e.user.as_deref(), Some("u1"));
    assert_eq!(e.metadata, json!({"k": "v"}));
    assert_eq!(e.reasoning, json!({"effort": "minimal", "summary": null}));
    for effort in ["none", "low", "medium", "xhigh"] {
        assert_eq!(body(&req(json!({"reasoning": {"effort": effort}})))["reasoning_effort"], effort);
    }
}

#[test]
fn structured_output() {
    let s = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let (out, t) = translate(&req(json!({"text": {"format": {"type": "json_schema", "name": "answer",
                                                              "description": "the answer", "schema": s,
                                                              "strict": true}}})));
    assert_eq!(
        out["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "answer", "description": "the answer",
                                                      "schema": s, "strict": true}})
    );
    assert!(t.dropped.is_empty());
    assert_eq!(t.echo.text["format"]["name"], "answer");
    let out = body(&req(json!({"text": {"format": {"type": "json_object"}}})));
    assert_eq!(out["response_format"], json!({"type": "json_object"}));
    let (out, t) = translate(&req(json!({"text": {"format": {"type": "text"}, "verbosity": "high"}})));
    assert!(out.get("response_format").is_none());
    assert_eq!(t.dropped, ["text.verbosity"]);
}

#[test]
fn images() {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let data_url = format!("data:image/png;base64,{png}");
    let (out, t) = translate(&req(json!({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is in these?"},
        {"type": "input_image", "image_url": data_url, "detail": "high"},
        {"type": "input_image", "image_url": "https://example.com/a.jpg"},
        {"type": "input_image", "file_id": "file-1"},
        {"type": "input_file", "file_id": "file-2"}
    ]}]})));
    assert_eq!(
        out["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": data_url, "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
        ]}])
    );
    assert_eq!(t.dropped, ["input_file", "input_image.file_id"]);

    let opts = Options { max_image_bytes: 7, ..Options::default() };
    let image = |data: &str| {
        let r = req(json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": format!("data:image/gif;base64,{data}")}]}]}));
        to_chat(&serde_json::to_vec(&r).unwrap(), "t", &opts)
    };
    assert!(image("AAAAAAAA").is_ok()); // 6 bytes
    assert!(image("AAAAAAAAAA==").is_ok()); // 7: padding is not data
    let e = image("AAAAAAAAAAA=").err().unwrap(); // 8
    assert_eq!((e.status, e.param.as_str()), (413, "input.0.content.0.image_url"));
    assert!(e.message.contains("8 bytes"), "{}", e.message);
}

#[test]
fn namespaces_and_tool_choice() {
    let tools = json!([
        {"type": "function", "name": "fs__read", "parameters": {}},
        {"type": "namespace", "name": "fs", "description": "", "tools": [
            {"type": "function", "name": "read", "parameters": {}, "defer_loading": true},
            {"name": "write"},
            {"type": "custom", "name": "patch"}
        ]},
        {"type": "file_search", "vector_store_ids": ["vs"]}
    ]);
    let choose = |c: Value| {
        let (out, t) = translate(&req(json!({"tools": tools, "tool_choice": c, "parallel_tool_calls": true})));
        (out.get("tool_choice").cloned(), t)
    };
    let (choice, t) = choose(json!("required"));
    assert_eq!(choice, Some(json!("required")));
    // A plain function keeps its name; the namespace's `read` gets a
    // hashed one, `write` the plain flat name.
    let read = &t.namespaced[0].0;
    assert!(read.starts_with("fs__read_") && read.len() == 17, "{read}");
    assert_eq!(t.namespaced[1], ("fs__write".into(), "fs".into(), "write".into()));
    assert_eq!(t.dropped, ["tool.defer_loading", "tools.custom", "tools.file_search"]);
    let (out, _) = translate(&req(json!({"tools": tools, "parallel_tool_calls": true})));
    let names: Vec<&str> =
        out["tools"].as_array().unwrap().iter().map(|f| f["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fs__read", read.as_str(), "fs__write"]);
    assert_eq!(out["parallel_tool_calls"], true);

    assert_eq!(
        choose(json!({"type": "function", "name": "fs__read"})).0,
        Some(json!({"type": "function", "function": {"name": "fs__read"}}))
    );
    assert_eq!(
        choose(json!({"type": "function", "name": "read", "namespace": "fs"})).0,
        Some(json!({"type": "function", "function": {"name": read}}))
    );
    for (c, name) in [
        (json!({"type": "allowed_tools", "mode": "auto", "tools": []}), "tool_choice.allowed_tools"),
        (json!({"type": "file_search"}), "tool_choice.file_search"),
        (json!({"type": "custom", "name": "patch"}), "tool_choice.custom"),
    ] {
        let (choice, t) = choose(c);
        assert!(choice.is_none() && t.dropped.contains(&name.to_owned()), "{:?}", t.dropped);
    }
    // With hosted tools only: no tools, no `parallel_tool_calls`; a forced
    // choice goes with them.
    let (out, t) = translate(&req(json!({"tools": [{"type": "web_search"}], "tool_choice": "required",
                                         "parallel_tool_calls": false})));
    assert!(out.get("tools").is_none() && out.get("tool_choice").is_none() && out.get("parallel_tool_calls").is_none());
    assert_eq!(t.dropped, ["tool_choice", "tools.web_search"]);
    assert!(!t.echo.parallel_tool_calls);
    assert_eq!(t.echo.tool_choice, "required");
}

#[test]
fn calls_join_their_message_and_answer_the_history() {
    let history = vec![
        json!({"role": "user", "content": "list"}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "h1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}),
    ];
    let opts = Options { history: history.clone(), previous_found: true, ..Options::default() };
    let (out, t) = translate_with(
        &req(json!({"instructions": "sys", "previous_response_id": "resp_1", "input": [
            {"type": "function_call_output", "call_id": "h1", "output": "a b"},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{}", "namespace": "fs"},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "https://a/b.png"},
                {"type": "output_text", "text": "y"}]},
            {"type": "function_call_output", "call_id": "c1", "output": ""}
        ]})),
        &opts,
    );
    assert_eq!(
        out["messages"],
        json!([
            {"role": "system", "content": "sys"},
            history[0], history[1],
            {"role": "tool", "tool_call_id": "h1", "content": "a b"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "assistant", "content": "no", "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "fs__cat", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": "x\ny"},
            {"role": "tool", "tool_call_id": "c1", "content": ""}
        ])
    );
    assert_eq!(t.input_from, 3);
    assert_eq!(t.namespaced, [("fs__cat".into(), "fs".into(), "cat".into())]);
    assert_eq!(t.dropped, ["function_call_output.input_image"]);
    assert_eq!(t.echo.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(history_of(&t).len(), 5);
    // The history alone is a conversation to answer.
    let (out, _) = translate_with(&json!({"model": "m", "previous_response_id": "resp_1"}), &opts);
    assert_eq!(out["messages"], json!(history));
    // A call of the history is not joined by the input's first call.
    let (out, _) = translate_with(
        &req(json!({"input": [{"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}]})),
        &opts,
    );
    assert_eq!(out["messages"].as_array().unwrap().len(), 3);
}

#[test]
fn items_left_out_by_type() {
    let (out, t) = translate(&req(json!({"input": [
        {"type": "item_reference", "id": "msg_0"},
        {"type": "custom_tool_call", "call_id": "k", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "k", "output": "ok"},
        {"type": "compaction", "encrypted_content": "e"},
        {"type": "message", "role": "system", "phase": "x", "content": [{"type": "input_text", "text": "s", "x": 1}]},
        {"type": "message", "role": "user", "content": []}
    ]})));
    assert_eq!(out["messages"], json!([{"role": "system", "content": "s"}, {"role": "user", "content": ""}]));
    assert_eq!(
        t.dropped,
        [
            "input_text.x",
            "item.compaction",
            "item.custom_tool_call",
            "item.custom_tool_call_output",
            "item.item_reference",
            "message.phase"
        ]
    );
}

#[test]
fn refusals() {
    let fc = |id: &str| json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"});
    let out = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "x"});
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"input": "x"}), "model", "field required"),
        (req(json!({"model": 3})), "model", "must be a string"),
        (json!({"model": "m"}), "input", "field required"),
        (req(json!({"input": [{"type": "reasoning", "summary": []}]})), "input", "no item the provider can read"),
        (req(json!({"input": 5})), "input", "string or an array"),
        (req(json!({"input": ["hi"]})), "input.0", "must be an object"),
        (req(json!({"input": [{"content": "x"}]})), "input.0.type", "field required"),
        (req(json!({"input": [{"type": "video"}]})), "input.0.type", "unknown input item type \"video\""),
        (req(json!({"input": [{"role": "tool", "content": "x"}]})), "input.0.role", "must be one of"),
        (req(json!({"input": [{"role": "user"}]})), "input.0.content", "field required"),
        (req(json!({"input": [{"role": "user", "content": 1}]})), "input.0.content", "string or an array"),
        (
            req(json!({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]})),
            "input.0.content.0.type",
            "unknown content part type",
        ),
        (
            req(json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]})),
            "input.0.content.0.text",
            "must be a string",
        ),
        (
            req(
                json!({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "https://a"}]}]}),
            ),
            "input.0.content.0.type",
            "only allowed in user messages",
        ),
        (
            req(json!({"input": [{"role": "user", "content": [{"type": "input_image", "detail": "low"}]}]})),
            "input.0.content.0.image_url",
            "field required",
        ),
        (
            req(
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/x"}]}]}),
            ),
            "input.0.content.0.image_url",
            "http(s) URL or a base64 data URL",
        ),
        (
            req(
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png,xx"}]}]}),
            ),
            "input.0.content.0.image_url",
            "must be base64",
        ),
        (req(json!({"input": [out("c1")]})), "input.0.call_id", "no function_call with call_id `c1`"),
        (req(json!({"input": [out("c1"), fc("c1")]})), "input.0.call_id", "no function_call with call_id `c1`"),
        (req(json!({"input": [fc("c1"), out("c1"), out("c1")]})), "input.2.call_id", "a second function_call_output"),
        (req(json!({"input": [fc("c1"), fc("c1")]})), "input.1.call_id", "a second function_call"),
        (
            req(json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]})),
            "input.0.arguments",
            "must be a string",
        ),
        (
            req(json!({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})),
            "input.0.name",
            "field required",
        ),
        (
            req(json!({"input": [fc("c"), {"type": "function_call_output", "call_id": "c", "output": 3}]})),
            "input.1.output",
            "string or an array",
        ),
        (
            req(json!({"input": [fc("c"), {"type": "function_call_output", "call_id": "c",
                                           "output": [{"type": "audio"}]}]})),
            "input.1.output.0.type",
            "unknown content part type",
        ),
        (req(json!({"store": true})), "store", "keeps no responses"),
        (req(json!({"store": "no"})), "store", "must be a boolean"),
        (req(json!({"previous_response_id": "resp_1"})), "previous_response_id", "no response store"),
        (req(json!({"previous_response_id": 1})), "previous_response_id", "must be a string"),
        (req(json!({"conversation": "conv_1"})), "conversation", "keeps no conversations"),
        (req(json!({"prompt": {"id": "pmpt_1"}})), "prompt", "keeps no conversations or prompts"),
        (req(json!({"instructions": ["x"]})), "instructions", "must be a string"),
        (req(json!({"stream": "yes"})), "stream", "must be a boolean"),
        (req(json!({"temperature": "hot"})), "temperature", "must be a number"),
        (req(json!({"max_output_tokens": 0})), "max_output_tokens", "positive integer"),
        (req(json!({"max_output_tokens": -5})), "max_output_tokens", "positive integer"),
        (req(json!({"parallel_tool_calls": 1})), "parallel_tool_calls", "must be a boolean"),
        (req(json!({"user": 1})), "user", "must be a string"),
        (req(json!({"metadata": []})), "metadata", "must be an object"),
        (req(json!({"client_metadata": "x"})), "client_metadata", "must be an object"),
        (req(json!({"prompt_cache_key": 1})), "prompt_cache_key", "must be a string"),
        (req(json!({"include": "reasoning.encrypted_content"})), "include", "must be an array"),
        (req(json!({"include": [1]})), "include.0", "must be a string"),
        (req(json!({"reasoning": {"effort": "max"}})), "reasoning.effort", "must be one of"),
        (req(json!({"reasoning": "high"})), "reasoning", "must be an object"),
        (req(json!({"text": {"format": {"type": "regex"}}})), "text.format.type", "must be \"text\""),
        (req(json!({"text": {"format": {"type": "json_schema", "schema": {}}}})), "text.format.name", "field required"),
        (
            req(json!({"text": {"format": {"type": "json_schema", "name": "a", "schema": true}}})),
            "text.format.schema",
            "must be an object",
        ),
        (req(json!({"tools": {}})), "tools", "must be an array"),
        (req(json!({"tools": [{"name": "f"}]})), "tools.0.type", "field required"),
        (req(json!({"tools": [{"type": "function"}]})), "tools.0.name", "field required"),
        (
            req(json!({"tools": [{"type": "function", "name": "f", "parameters": []}]})),
            "tools.0.parameters",
            "must be an object",
        ),
        (
            req(json!({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]})),
            "tools.1.name",
            "a second tool",
        ),
        (req(json!({"tools": [{"type": "namespace", "name": "n"}]})), "tools.0.tools", "field required"),
        (
            req(json!({"tools": [{"type": "namespace", "name": "n", "tools": [{"name": "f"}, {"name": "f"}]}]})),
            "tools.0.tools.1.name",
            "a second function named \"f\" in namespace \"n\"",
        ),
        (req(json!({"tool_choice": "any"})), "tool_choice", "must be \"auto\""),
        (req(json!({"tool_choice": 1})), "tool_choice", "string or an object"),
        (
            req(
                json!({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}),
            ),
            "tool_choice.name",
            "no function tool",
        ),
        (req(json!({"tool_choice": {"type": "function", "name": "f"}})), "tool_choice.name", "no function tool"),
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
        (b"[1]", "", "expected a JSON object"),
        (b"{\"model\":", "", "invalid request body"),
        (b"{\"model\":\"a\",\"input\":\"x\",\"model\":\"b\"}", "model", "given twice"),
        (b"{\"\\u0069nput\":\"x\",\"input\":\"y\"}", "input", "given twice"),
    ] {
        let e = refuse(raw);
        assert_eq!((e.status, e.param.as_str()), (400, param), "{}: {e}", String::from_utf8_lossy(raw));
        assert!(e.message.contains(needle), "{}: {e}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn a_string_input_is_carried_as_sent_after_the_instructions() {
    let raw = br#"{"model":"m","instructions":"sys","input":"caf\u00e9 \"q\"\n","store":false}"#;
    let t = to_chat(raw, "target", &Options::default()).unwrap();
    let body: Value = serde_json::from_slice(&t.body).unwrap();
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "café \"q\"\n"}])
    );
    assert_eq!(t.input_from, 1);
    let e = to_chat(br#"{"model":"m","input":"\udc00"}"#, "target", &Options::default()).unwrap_err();
    assert_eq!((e.status, e.param.as_str()), (400, ""), "{e}");
}

#[test]
fn the_places_of_a_first_read_translate_as_the_body_does() {
    for raw in [
        &br#"{"model":"m","instructions":"i","input":"q","store":false,"x":null,"y":2}"#[..],
        br#"{"model":"m","input":[{"role":"user","content":"q"}],"\u0069nput":"r"}"#,
        br#"{"model":"m","input":"q","tools":[{"type":"function","name":"f","parameters":{}}],"tool_choice":"auto"}"#,
    ] {
        let Ok(top) = crate::request::Top::parse_keeping(raw) else {
            // A known key given twice: the first read refuses it either way.
            assert!(crate::request::Top::parse(raw).is_err(), "{}", String::from_utf8_lossy(raw));
            continue;
        };
        let at = to_chat_at(raw, top.fields.as_ref(), "target", &Options::default());
        assert_eq!(at, to_chat(raw, "target", &Options::default()), "{}", String::from_utf8_lossy(raw));
    }
}
