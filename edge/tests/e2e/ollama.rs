//! Chat completions and embeddings through edge → node → the `ollama`
//! adapter → iop-mockprov's Ollama API (`/api/chat`, `/api/embed`): the
//! normalized path. The client sees OpenAI's shapes; `GET /last` on the
//! mock shows the Ollama request the node made of the client's.

use serde_json::{json, Value};

use crate::harness::*;

const MODEL: &str = "llama-test";
const UPSTREAM: &str = "mock-llama";

fn setup(mock_flags: &[&str]) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(mock_flags);
    let config = format!(
        r#"
workers = 2
[http]
listen = "127.0.0.1:0"
max_body_bytes = 65536
[node_listener]
listen = "127.0.0.1:0"
[[nodes]]
id = "n1"
token = "{NODE_TOKEN}"
[[nodes.providers]]
id = "ollama"
kind = "ollama"
base_url = "http://{}"
capacity = 8
[[models]]
name = "{MODEL}"
node = "n1"
provider = "ollama"
upstream_model = "{UPSTREAM}"
"#,
        mock.addr
    );
    let edge = Edge::start(&config);
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

/// The mock's record of the last model request: its path and JSON body.
fn last(mock: &MockProv) -> (String, Value) {
    let r = request(mock.addr, "GET", "/last", None, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let rec = r.json();
    let body = serde_json::from_str(rec["request_body"].as_str().expect("request_body")).expect("request JSON");
    (rec["path"].as_str().unwrap_or_default().to_owned(), body)
}

fn chat(edge: &Edge, body: Value) -> Response {
    post_json(edge.http, "/v1/chat/completions", &body)
}

/// The chunks of an SSE answer ending with `[DONE]`.
fn chunks(r: &Response) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    // The answer names the model that answered, as a tunnel's does.
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == UPSTREAM), "{chunks:?}");
    chunks
}

fn delta_text(chunks: &[Value], field: &str) -> String {
    chunks.iter().filter_map(|c| c["choices"][0]["delta"][field].as_str()).collect()
}

fn finish_reason(chunks: &[Value]) -> Option<String> {
    chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned))
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

const WEATHER_TOOL: &str = r#"[{"type":"function","function":{"name":"get_weather","description":"Current weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer"}},"required":["city"]}}}]"#;

fn tools() -> Value {
    serde_json::from_str(WEATHER_TOOL).unwrap()
}

#[test]
fn ollama_streamed_chat_with_usage_and_translated_fields() {
    let (mock, edge, _node) = setup(&["--tokens", "3"]);
    let r = chat(
        &edge,
        json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
               "messages": user("hello there, ollama"), "temperature": 0.5, "seed": 7, "stop": ["\n\n"],
               "max_completion_tokens": 64, "max_tokens": 1, "response_format": {"type": "json_object"},
               "keep_alive": "5m"}),
    );
    let chunks = chunks(&r);
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(delta_text(&chunks, "content"), "tok0 tok1 tok2 ");
    assert_eq!(finish_reason(&chunks).as_deref(), Some("stop"));
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 3);
    let prompt = usage_chunk["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= 1);
    assert_eq!(usage_chunk["usage"]["total_tokens"], prompt + 3);

    let (path, sent) = last(&mock);
    assert_eq!(path, "/api/chat");
    assert_eq!(
        sent,
        json!({"model": UPSTREAM, "stream": true, "format": "json", "keep_alive": "5m",
               "messages": [{"role": "user", "content": "hello there, ollama"}],
               "options": {"temperature": 0.5, "seed": 7, "stop": ["\n\n"], "num_predict": 64}})
    );
}

#[test]
fn ollama_non_streamed_chat_with_reasoning_and_length() {
    let (mock, edge, _node) = setup(&["--tokens", "5"]);
    let r = chat(
        &edge,
        json!({"model": MODEL, "messages": user("think first"), "reasoning_effort": "high", "max_tokens": 4,
               "mock": {"reasoning": 2}}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!((&v["object"], &v["model"]), (&json!("chat.completion"), &json!(UPSTREAM)));
    let message = &v["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["reasoning_content"], "think0 think1 ");
    // num_predict caps thinking and content together.
    assert_eq!(message["content"], "tok0 tok1 ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= 1);
    let (_, sent) = last(&mock);
    assert_eq!((&sent["think"], &sent["options"]["num_predict"]), (&json!("high"), &json!(4)));
    assert_eq!(sent["mock"], json!({"reasoning": 2}), "unknown fields reach the provider");
    assert_eq!(sent["stream"], false, "a whole answer is asked whole");

    // Streamed, the reasoning arrives as reasoning_content deltas first.
    let r = chat(
        &edge,
        json!({"model": MODEL, "stream": true, "messages": user("x"), "think": true, "mock": {"reasoning": 2, "tokens": 1}}),
    );
    let chunks = chunks(&r);
    assert_eq!(delta_text(&chunks, "reasoning_content"), "think0 think1 ");
    assert_eq!(delta_text(&chunks, "content"), "tok0 ");
    let first_content = chunks.iter().position(|c| c["choices"][0]["delta"]["content"] == "tok0 ").unwrap();
    let last_reasoning =
        chunks.iter().rposition(|c| c["choices"][0]["delta"]["reasoning_content"].is_string()).unwrap();
    assert!(last_reasoning < first_content);
    assert!(chunks.iter().all(|c| c.get("usage").is_none_or(Value::is_null)), "no usage chunk unless asked");
}

/// The tool calls of a non-streamed answer, checked to be OpenAI-shaped.
fn check_calls(calls: &Value) -> Vec<(String, Value)> {
    calls
        .as_array()
        .expect("tool_calls")
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function");
            assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).expect("JSON arguments");
            (c["function"]["name"].as_str().unwrap().to_owned(), args)
        })
        .collect()
}

#[test]
fn ollama_tool_calls_and_the_second_turn() {
    let (mock, edge, _node) = setup(&["--tokens", "3"]);
    let ask =
        json!({"model": MODEL, "messages": user("weather in Paris?"), "tools": tools(), "mock": {"tool_calls": 2}});
    let expected = vec![
        ("get_weather".to_owned(), json!({"city": "Paris", "n": 0})),
        ("get_weather".to_owned(), json!({"city": "Paris", "n": 1})),
    ];

    // Not streamed.
    let r = chat(&edge, ask.clone());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(check_calls(&choice["message"]["tool_calls"]), expected);
    let ids: Vec<&str> =
        choice["message"]["tool_calls"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_ne!(ids[0], ids[1]);
    let (_, sent) = last(&mock);
    assert_eq!(sent["tools"], tools());

    // Streamed: each call whole, with its index.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks(&chat(&edge, streamed));
    assert_eq!(finish_reason(&chunks).as_deref(), Some("tool_calls"));
    let mut calls: Vec<(u64, String, String)> = Vec::new();
    for c in &chunks {
        for tc in c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap();
            let piece = tc["function"]["arguments"].as_str().unwrap_or_default();
            match calls.iter_mut().find(|(i, _, _)| *i == index) {
                Some(call) => call.2.push_str(piece),
                None => calls.push((index, tc["function"]["name"].as_str().unwrap().to_owned(), piece.to_owned())),
            }
        }
    }
    let calls: Vec<(String, Value)> =
        calls.into_iter().map(|(_, name, args)| (name, serde_json::from_str(&args).unwrap())).collect();
    assert_eq!(calls, expected);

    // The second turn: the assistant's calls and a tool result.
    let assistant = v["choices"][0]["message"].clone();
    let turn = json!({"model": MODEL, "tools": tools(), "messages": [
        {"role": "user", "content": "weather in Paris?"},
        assistant,
        {"role": "tool", "tool_call_id": ids[0], "content": "11 degrees"},
    ]});
    let r = chat(&edge, turn);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "tool said: 11 degrees");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (_, sent) = last(&mock);
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(
        messages[1]["tool_calls"][0],
        json!({"id": ids[0], "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 0}}})
    );
    assert_eq!(
        messages[2],
        json!({"role": "tool", "content": "11 degrees", "tool_call_id": ids[0], "tool_name": "get_weather"})
    );
}

#[test]
fn ollama_embeddings_match_the_direct_call() {
    use base64::Engine;
    let (mock, edge, _node) = setup(&[]);
    let direct =
        post_json(mock.addr, "/api/embed", &json!({"model": UPSTREAM, "input": ["alpha", "beta"], "dimensions": 6}));
    assert_eq!(direct.status, 200);
    let direct = direct.json();

    let r =
        post_json(edge.http, "/v1/embeddings", &json!({"model": MODEL, "input": ["alpha", "beta"], "dimensions": 6}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!((&v["object"], &v["model"]), (&json!("list"), &json!(UPSTREAM)));
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, item) in data.iter().enumerate() {
        assert_eq!((&item["object"], &item["index"]), (&json!("embedding"), &json!(i)));
        let got: Vec<f32> = serde_json::from_value(item["embedding"].clone()).unwrap();
        let want: Vec<f32> = serde_json::from_value(direct["embeddings"][i].clone()).unwrap();
        assert_eq!(got, want, "vector {i}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], direct["prompt_eval_count"]);
    let (path, sent) = last(&mock);
    assert_eq!(path, "/api/embed");
    assert_eq!(sent, json!({"model": UPSTREAM, "input": ["alpha", "beta"], "dimensions": 6}));

    // base64: the same floats, little-endian.
    let r = post_json(
        edge.http,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": "alpha", "encoding_format": "base64", "dimensions": 6}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let b64 = r.json()["data"][0]["embedding"].as_str().unwrap().to_owned();
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
    let got: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let want: Vec<f32> = serde_json::from_value(direct["embeddings"][0].clone()).unwrap();
    assert_eq!(got, want);

    // Token arrays cannot be sent to Ollama.
    let r = post_json(edge.http, "/v1/embeddings", &json!({"model": MODEL, "input": [[1, 2, 3]]}));
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "invalid_request");
}

#[test]
fn ollama_errors_and_refusals() {
    let (mock, edge, _node) = setup(&[]);
    // Refused on the node: Ollama never sees it.
    for (field, value) in [("n", json!(2)), ("logprobs", json!(true))] {
        let mut body = json!({"model": MODEL, "messages": user("x")});
        body[field] = value;
        for stream in [false, true] {
            body["stream"] = json!(stream);
            let r = chat(&edge, body.clone());
            assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
            let e = &r.json()["error"];
            assert_eq!(
                (&e["type"], &e["code"], &e["param"]),
                (&json!("invalid_request_error"), &json!("invalid_request"), &json!(field))
            );
            assert!(e["message"].as_str().unwrap().contains(&format!("`{field}`")), "{e}");
        }
    }
    assert_eq!(request(mock.addr, "GET", "/last", None, &[]).status, 404, "no request reached the mock");

    // A missing model: Ollama's 404 and message pass through.
    for stream in [false, true] {
        let r = chat(
            &edge,
            json!({"model": MODEL, "stream": stream, "messages": user("x"), "mock": {"error_status": 404}}),
        );
        assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
        let e = &r.json()["error"];
        assert_eq!(e["message"], format!("model \"{UPSTREAM}\" not found, try pulling it first"));
        assert_eq!((&e["type"], &e["code"]), (&json!("invalid_request_error"), &json!("upstream_status")));
    }
    let r =
        post_json(edge.http, "/v1/embeddings", &json!({"model": MODEL, "input": "x", "mock": {"error_status": 404}}));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["message"], format!("model '{UPSTREAM}' not found"));

    // A 503 with Retry-After.
    let r = chat(&edge, json!({"model": MODEL, "messages": user("x"), "mock": {"error_status": 503}}));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("retry-after").is_some());

    // The provider hangs up before answering.
    let r = chat(&edge, json!({"model": MODEL, "messages": user("x"), "mock": {"hangup": true}}));
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));

    // A stream cut after two lines ends with an error event, no [DONE].
    let r = chat(
        &edge,
        json!({"model": MODEL, "stream": true, "messages": user("x"), "mock": {"tokens": 5, "abort_after": 2}}),
    );
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    assert_ne!(data.last().map(String::as_str), Some("[DONE]"));
    let last_event: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last_event["error"]["code"], "upstream_protocol", "{data:?}");
}
