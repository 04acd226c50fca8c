//! `POST /v1/messages`: translated onto the normalized run for a provider
//! that does not speak the Messages API (the in-process mock; iop-mockprov
//! with its Messages routes off), and through the tunnel, byte for byte,
//! for one that does (iop-mockprov's native routes); count_tokens; errors
//! in Anthropic's shape; the model routes in both shapes.

use serde_json::{json, Value};

use crate::harness::*;

/// `(event name, data)` of each event of an SSE body, in order.
pub fn sse_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_owned();
            let data: String = e.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            let v: Value = serde_json::from_str(&data).unwrap_or_else(|err| panic!("event data `{data}`: {err}"));
            (name, v)
        })
        .collect()
}

/// The event names, each checked to equal its data's `type`.
fn names(events: &[(String, Value)]) -> Vec<String> {
    for (name, v) in events {
        assert_eq!(v["type"].as_str(), Some(name.as_str()), "event name and type differ: {v}");
    }
    events.iter().map(|(n, _)| n.clone()).collect()
}

/// An edge with node `n1` whose in-process mock streams `tokens` tokens
/// (reasoning first when `reasoning`), model `m`.
fn mock_setup(tokens: u32, reasoning: bool) -> (Edge, Proc) {
    let node = mock_node("n1", 8, 0, tokens, 0) + &format!("reasoning = {reasoning}\n");
    let edge = Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], ""));
    let n = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    (edge, n)
}

fn post(edge: &Edge, path: &str, body: &Value, headers: &[(&str, &str)]) -> Response {
    let mut h = vec![("anthropic-version", "2023-06-01")];
    h.extend_from_slice(headers);
    request(edge.http, "POST", path, Some(body.to_string().as_bytes()), &h)
}

/// A block's text, or a thinking block's thinking, from a stream:
/// `(block type, text)` per block in order.
fn blocks_of(events: &[(String, Value)]) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    for (name, v) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(v["index"].as_u64(), Some(blocks.len() as u64), "blocks are numbered in order");
                blocks.push((v["content_block"]["type"].as_str().unwrap().to_owned(), String::new()));
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap() as usize;
                let d = &v["delta"];
                let piece = match d["type"].as_str().unwrap() {
                    "text_delta" => d["text"].as_str(),
                    "thinking_delta" => d["thinking"].as_str(),
                    "input_json_delta" => d["partial_json"].as_str(),
                    "signature_delta" => Some(""),
                    other => panic!("unexpected delta {other}"),
                };
                blocks[i].1.push_str(piece.unwrap());
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn a_translated_stream_is_anthropics_exact_event_sequence() {
    let (edge, _node) = mock_setup(4, true);
    let body = json!({
        "model": "m", "max_tokens": 100, "stream": true,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
    });
    let r = post(&edge, "/v1/messages?beta=true", &body, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(r.header("request-id").is_some_and(|id| !id.is_empty()));
    // The system block's cache breakpoint could not be honoured: said so.
    assert!(r.header("iop-dropped").is_some_and(|d| d.contains("cache_control")), "{:?}", r.headers);
    let events = sse_events(&r.body);
    let seq = names(&events);
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(["content_block_delta"; 2]); // think0 think1
    expected.push("content_block_delta"); // its signature
    expected.extend(["content_block_stop", "content_block_start"]);
    expected.extend(["content_block_delta"; 4]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(seq, expected, "{events:#?}");
    assert_eq!(
        blocks_of(&events),
        [("thinking".to_owned(), "think0 think1 ".to_owned()), ("text".to_owned(), "tok0 tok1 tok2 tok3 ".to_owned())]
    );
    let start = &events[0].1["message"];
    assert_eq!((start["role"].as_str(), start["model"].as_str()), (Some("assistant"), Some("mock-m")));
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0, "{start}");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 4);
    assert!(delta["usage"]["input_tokens"].as_u64().unwrap() > 0, "{delta}");
}

#[test]
fn a_translated_answer_is_one_message_and_max_tokens_says_so() {
    let (edge, _node) = mock_setup(4, false);
    let body = json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let r = post(&edge, "/v1/messages", &body, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("request-id").is_some());
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"], json!([{"type": "text", "text": "tok0 tok1 "}]));
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["stop_sequence"], Value::Null);
    assert_eq!(m["usage"]["output_tokens"], 2);
    assert!(m["usage"]["input_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_translated_tool_use_streams_its_input_json_in_pieces() {
    let (edge, _node) = mock_setup(4, false);
    let tools = json!([{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}]);
    let ask = |stream: bool| {
        json!({"model": "m", "max_tokens": 50, "stream": stream, "tools": tools.clone(),
               "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "weather?"}]})
    };
    let r = post(&edge, "/v1/messages", &ask(true), &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = sse_events(&r.body);
    let pieces =
        events.iter().filter(|(n, v)| n == "content_block_delta" && v["delta"]["type"] == "input_json_delta").count();
    assert!(pieces >= 2, "the arguments arrive in pieces, each passed on: {events:#?}");
    let blocks = blocks_of(&events);
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    assert_eq!(blocks[0].0, "tool_use");
    let input: Value = serde_json::from_str(&blocks[0].1).unwrap();
    assert_eq!(input, json!({"city": "Paris", "n": 0}));
    let start = events.iter().find(|(n, _)| n == "content_block_start").unwrap();
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let tool_id = start.1["content_block"]["id"].as_str().unwrap().to_owned();
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    // Whole: the same call, its input parsed.
    let m = post(&edge, "/v1/messages", &ask(false), &[]).json();
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(m["content"][0]["type"], "tool_use");
    assert_eq!(m["content"][0]["input"], json!({"city": "Paris", "n": 0}));
    // The second turn: the tool's result answered.
    let second = json!({"model": "m", "max_tokens": 50, "tools": tools, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "sunny"}]},
    ]});
    let m = post(&edge, "/v1/messages", &second, &[]).json();
    assert_eq!(m["content"], json!([{"type": "text", "text": "tool said: sunny"}]), "{m}");
    assert_eq!(m["stop_reason"], "end_turn");
}

#[test]
fn bad_requests_get_anthropics_error_shape_and_status() {
    let (edge, _node) = mock_setup(4, false);
    let error_of = |r: &Response| {
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        (r.status, v["error"]["type"].as_str().unwrap().to_owned(), v["error"]["message"].as_str().unwrap().to_owned())
    };
    let user =
        |content: Value| json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]});
    // Unknown model.
    let r = post(&edge, "/v1/messages", &json!({"model": "nope", "max_tokens": 5, "messages": []}), &[]);
    assert_eq!(error_of(&r).0, 404);
    assert_eq!(error_of(&r).1, "not_found_error");
    // Not JSON.
    let r = request(edge.http, "POST", "/v1/messages", Some(b"{not json"), &[]);
    assert_eq!((error_of(&r).0, error_of(&r).1.as_str()), (400, "invalid_request_error"));
    // An unknown block type, named.
    let r = post(&edge, "/v1/messages", &user(json!([{"type": "hologram"}])), &[]);
    let (status, kind, msg) = error_of(&r);
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(msg.contains("messages.0.content.0"), "{msg}");
    // A tool_result without its tool_use.
    let r = post(
        &edge,
        "/v1/messages",
        &user(json!([{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}])),
        &[],
    );
    let (status, _, msg) = error_of(&r);
    assert_eq!(status, 400);
    assert!(msg.contains("tool_use_id"), "{msg}");
    // A wrong type.
    let r = post(&edge, "/v1/messages", &json!({"model": "m", "max_tokens": "five", "messages": []}), &[]);
    let (status, _, msg) = error_of(&r);
    assert_eq!(status, 400);
    assert!(msg.contains("max_tokens"), "{msg}");
    // An unknown path in the Messages family.
    let r = post(&edge, "/v1/messages/batches", &user(json!("x")), &[]);
    assert_eq!((error_of(&r).0, error_of(&r).1.as_str()), (404, "not_found_error"));
    // The edge and node are unharmed.
    let r = post(&edge, "/v1/messages", &user(json!("hi")), &[]);
    assert_eq!(r.status, 200);
}

#[test]
fn count_tokens_is_estimated_where_no_provider_counts() {
    let (edge, _node) = mock_setup(4, false);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "a fairly short question"}]});
    let r = post(&edge, "/v1/messages/count_tokens", &body, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("iop-token-count"), Some("estimate"));
    let n = r.json()["input_tokens"].as_u64().unwrap();
    assert!((5..40).contains(&n), "{n}");
    let r = post(
        &edge,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
        &[],
    );
    assert_eq!(r.status, 200);
    // Each route is counted under its own surface.
    let text = String::from_utf8(edge.admin("/metrics").body).unwrap();
    assert!(text.contains(r#"iop_edge_requests_total{model="m",surface="count_tokens",status="200"} 1"#), "{text}");
    assert!(text.contains(r#"iop_edge_requests_total{model="m",surface="messages",status="200"} 1"#), "{text}");
}

#[test]
fn models_answer_one_by_one_and_in_anthropics_shape() {
    let (edge, _node) = mock_setup(4, false);
    let r = request(edge.http, "GET", "/v1/models/m", None, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"id": "m", "object": "model", "created": 0, "owned_by": "iop"}));
    let r = request(edge.http, "GET", "/v1/models/none", None, &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let anthropic = [("anthropic-version", "2023-06-01")];
    let r = request(edge.http, "GET", "/v1/models", None, &anthropic);
    assert_eq!(
        r.json(),
        json!({"data": [{"type": "model", "id": "m", "display_name": "m", "created_at": "1970-01-01T00:00:00Z"}],
               "has_more": false, "first_id": "m", "last_id": "m"})
    );
    let r = request(edge.http, "GET", "/v1/models/m", None, &anthropic);
    assert_eq!(r.json()["type"], "model");
    let r = request(edge.http, "GET", "/v1/models/none", None, &anthropic);
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (404, Some("not_found_error")));
}

/// An edge whose provider `up` is iop-mockprov (started with `flags`)
/// speaking the Messages API natively (`native_apis`), model `gpt-test`.
fn native_setup(flags: &[&str]) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(flags);
    let config = edge_config(&mock.base_url(), "").replacen(
        "capacity = 16\n",
        "capacity = 16\nnative_apis = [\"messages\", \"responses\"]\n",
        1,
    );
    let edge = Edge::start(&config);
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn last(mock: &MockProv) -> Value {
    let r = request(mock.addr, "GET", "/last", None, &[]);
    assert_eq!(r.status, 200);
    r.json()
}

#[test]
fn a_native_provider_gets_the_request_through_the_tunnel_byte_for_byte() {
    let (mock, edge, _node) = native_setup(&["--tokens", "5"]);
    // Thinking blocks with signatures sent back, cache breakpoints, unknown
    // fields and odd spacing: all must reach the provider untouched.
    let sent = r#"{"model":"gpt-test" ,"max_tokens":64,"stream":STREAM,"thinking":{"type":"enabled","budget_tokens":1024},"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"sig-abc=="},{"type":"text","text":"a"}]},{"role":"user","content":"again"}],"context_management":{"edits":[]},"x_unknown":[1e400]}"#;
    for stream in ["true", "false"] {
        let body = sent.replace("STREAM", stream);
        let headers = [
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "interleaved-thinking-2025-05-14"),
            ("x-api-key", "the-clients-gateway-key"),
        ];
        let r = request(edge.http, "POST", "/v1/messages?beta=true", Some(body.as_bytes()), &headers);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let rec = last(&mock);
        let expected = body.replacen("\"gpt-test\"", "\"mock-upstream\"", 1);
        assert_eq!(rec["request_body"].as_str(), Some(expected.as_str()), "request bytes changed on the way");
        assert_eq!(rec["response_body_sha256"].as_str(), Some(sha256_hex(&r.body).as_str()), "answer bytes changed");
        let sent_headers: Vec<String> =
            rec["headers"].as_array().unwrap().iter().map(|h| h[0].as_str().unwrap().to_ascii_lowercase()).collect();
        assert!(sent_headers.contains(&"anthropic-beta".to_owned()), "{sent_headers:?}");
        assert!(sent_headers.contains(&"anthropic-version".to_owned()), "{sent_headers:?}");
        assert!(!sent_headers.contains(&"x-api-key".to_owned()), "the gateway's key must not reach the provider");
        assert!(r.header("request-id").is_some());
        if stream == "true" {
            let events = sse_events(&r.body);
            assert_eq!(events.last().map(|(n, _)| n.as_str()), Some("message_stop"));
            assert!(blocks_of(&events).iter().any(|(t, _)| t == "thinking"));
        } else {
            assert_eq!(r.json()["content"][0]["signature"].as_str().map(|s| s.starts_with("sig-")), Some(true));
        }
    }
    // count_tokens goes to the provider too: its own count, not an estimate.
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "count these words please"}]});
    let r = post(&edge, "/v1/messages/count_tokens", &ask, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("iop-token-count"), None);
    let direct = request(mock.addr, "POST", "/v1/messages/count_tokens", Some(ask.to_string().as_bytes()), &[]);
    assert_eq!(r.json(), direct.json());
}

#[test]
fn without_native_messages_the_same_mock_is_served_translated() {
    let mock = MockProv::start(&["--tokens", "3", "--without", "messages"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let body =
        json!({"model": "gpt-test", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&edge, "/v1/messages", &body, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = sse_events(&r.body);
    assert_eq!(blocks_of(&events), [("text".to_owned(), "tok0 tok1 tok2 ".to_owned())]);
    // It went to the provider as a chat completion.
    assert_eq!(last(&mock)["path"], "/v1/chat/completions");
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["usage"]["output_tokens"], 3);
}

#[test]
fn count_tokens_asks_the_providers_tokenizer_and_estimates_without_one() {
    let ask = json!({"model": "gpt-test", "system": "be brief",
                     "messages": [{"role": "user", "content": "count these words, please, all of them"}]});
    let answer = json!({"model": "gpt-test", "max_tokens": 5, "system": "be brief",
                        "messages": [{"role": "user", "content": "count these words, please, all of them"}]});
    // vLLM's /tokenize (the mock's): the provider's own count, which is
    // what the same prompt is charged as when answered.
    let mock = MockProv::start(&["--tokens", "3", "--without", "messages"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let r = post(&edge, "/v1/messages/count_tokens", &ask, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("iop-token-count"), None, "counted by the provider, not estimated");
    assert!(r.header("request-id").is_some());
    let counted = r.json()["input_tokens"].as_u64().unwrap();
    let m = post(&edge, "/v1/messages", &answer, &[]);
    assert_eq!(m.status, 200, "{}", String::from_utf8_lossy(&m.body));
    assert_eq!(Some(counted), m.json()["usage"]["input_tokens"].as_u64(), "count_tokens vs the answer's usage");
    // A server without a tokenizer (404): the estimate, said to be one.
    let mock = MockProv::start(&["--tokens", "3", "--without", "messages,tokenize"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let r = post(&edge, "/v1/messages/count_tokens", &ask, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("iop-token-count"), Some("estimate"));
    // A malformed count is the client's error, in Anthropic's shape.
    let bad = json!({"model": "gpt-test", "messages": [{"role": "user", "content": [{"type": "nope"}]}]});
    let r = post(&edge, "/v1/messages/count_tokens", &bad, &[]);
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (400, Some("invalid_request_error")));
}

#[test]
fn provider_failures_come_in_anthropics_shape_before_and_after_the_first_byte() {
    let body =
        json!({"model": "gpt-test", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for (flags, what) in [
        (&["--tokens", "6", "--without", "messages", "--abort-after", "2"][..], "cut"),
        (&["--without", "messages", "--error-status", "429"][..], "429"),
    ] {
        let mock = MockProv::start(flags);
        let edge = Edge::start(&edge_config(&mock.base_url(), ""));
        let _node = edge.node(NODE_TOKEN, &[]);
        edge.wait_nodes_ready(1);
        let r = post(&edge, "/v1/messages", &body, &[]);
        if what == "429" {
            assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
            assert_eq!(r.json()["error"]["type"], "rate_limit_error");
            assert!(r.header("retry-after").is_some());
            continue;
        }
        assert_eq!(r.status, 200);
        let events = sse_events(&r.body);
        let (name, last) = events.last().unwrap();
        assert_eq!(name, "error", "{events:#?}");
        assert_eq!(last["error"]["type"], "api_error");
        assert_eq!(blocks_of(&events), [("text".to_owned(), "tok0 tok1 ".to_owned())]);
    }
}

/// Runs `flows` of `scripts/anthropic_fidelity.py` with the official
/// `anthropic` SDK against `base` (the server root) asking for `model`.
pub fn anthropic_flows(base: &str, model: &str, flows: &str) -> Value {
    anthropic_flows_with(base, model, flows, &[])
}

/// [`anthropic_flows`] with extra environment (`IOP_TOOL_CHOICE`).
pub fn anthropic_flows_with(base: &str, model: &str, flows: &str, envs: &[(&str, &str)]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/anthropic_fidelity.py");
    let out = std::process::Command::new("python3")
        .args([script, base, model, flows])
        .envs(envs.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("python3: {e} (install the SDK with scripts/fetch-test-model.sh)"));
    assert!(out.status.success(), "anthropic_fidelity.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_no_exceptions(what: &str, v: &Value) {
    let failed: Vec<String> = v
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(flow, r)| r.get("exception").map(|e| format!("{flow}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{what}: flows failed:\n{}", failed.join("\n"));
}

const NATIVE_FLOWS: &str = "text,text_stream,system,max_tokens,image,thinking,tool_loop,count_tokens";

#[test]
#[ignore = "needs python3 with the anthropic SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_anthropic_sdk_sees_the_same_through_the_tunnel_as_from_the_provider() {
    let (mock, edge, _node) = native_setup(&["--tokens", "4"]);
    let direct = anthropic_flows(&format!("http://{}", mock.addr), "mock-upstream", NATIVE_FLOWS);
    let through = anthropic_flows(&format!("http://{}", edge.http), "gpt-test", NATIVE_FLOWS);
    assert_no_exceptions("direct", &direct);
    for flow in NATIVE_FLOWS.split(',') {
        assert_eq!(through[flow], direct[flow], "flow {flow}: the SDK saw something else through iop");
    }
    assert_eq!(through["thinking"]["blocks"], json!(["thinking", "text"]));
    assert_eq!(through["tool_loop"]["answer"], "tool said: sunny");
}

const TRANSLATED_FLOWS: &str =
    "text,text_stream,system,stop_sequences,max_tokens,image,thinking,tool_loop,error_not_found,error_invalid,count_tokens";

/// What every translated flow must show, whichever provider ran it;
/// `names_stops`: the provider says which stop sequence matched (as vLLM
/// does, and both mocks of it).
fn assert_translated(what: &str, v: &Value, thinks: bool, names_stops: bool) {
    assert_no_exceptions(what, v);
    // Reasoning a provider does (asked for or not) comes first as a
    // thinking block; the answer's text is the last block.
    let last = |m: &Value| m["content"].as_array().and_then(|c| c.last()).cloned().unwrap_or_default();
    assert_eq!(last(&v["text"])["type"], "text", "{what}: {v:#}");
    assert_eq!(v["text"]["stop_reason"], "end_turn", "{what}");
    assert!(v["text"]["usage"]["input_tokens"].as_u64().unwrap() > 0, "{what}");
    assert_eq!(v["text_stream"]["text"], last(&v["text_stream"]["final"])["text"], "{what}");
    assert_eq!(v["max_tokens"]["stop_reason"], "max_tokens", "{what}");
    assert_eq!(v["max_tokens"]["usage"]["output_tokens"], 2, "{what}");
    if thinks {
        assert_eq!(v["thinking"]["blocks"], json!(["thinking", "text"]), "{what}");
    }
    assert_eq!(v["tool_loop"]["stop_reason"], "tool_use", "{what}");
    assert_eq!(v["tool_loop"]["names"], json!(["get_weather"]), "{what}");
    assert_eq!(v["tool_loop"]["inputs"][0]["city"], "Paris", "{what}");
    assert_eq!(v["tool_loop"]["answer"], "tool said: sunny", "{what}");
    assert_eq!(v["error_not_found"], json!({"class": "NotFoundError", "status": 404, "type": "not_found_error"}));
    assert_eq!(v["error_invalid"], json!({"class": "BadRequestError", "status": 400, "type": "invalid_request_error"}));
    assert_eq!(v["count_tokens"]["positive"], true, "{what}");
    if names_stops {
        let m = &v["stop_sequences"];
        assert_eq!((&m["stop_reason"], &m["stop_sequence"]), (&json!("stop_sequence"), &json!("tok2")), "{what}");
        assert_eq!(last(m)["text"], "tok0 tok1 ", "{what}: the answer ends before the sequence");
    }
}

#[test]
#[ignore = "needs python3 with the anthropic SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_anthropic_sdk_gets_every_part_of_a_translated_answer() {
    // The in-process mock provider.
    let (edge, _node) = mock_setup(4, true);
    assert_translated("mock", &anthropic_flows(&format!("http://{}", edge.http), "m", TRANSLATED_FLOWS), true, true);
    // An OpenAI-compatible server without the Messages API, and Ollama
    // (which cannot be made to call a tool: asked with `auto`, its mock
    // calls one when tools are declared).
    for (kind, flags, envs) in [
        ("openai_compat", &[][..], &[][..]),
        ("ollama", &["--tool-calls", "1"][..], &[("IOP_TOOL_CHOICE", "auto")][..]),
    ] {
        let mut all = vec!["--tokens", "4", "--reasoning", "2", "--without", "messages"];
        all.extend_from_slice(flags);
        let mock = MockProv::start(&all);
        let edge = Edge::start(&one_provider_config(kind, &mock.base_for(kind), "", "mock-upstream"));
        let _node = edge.node(NODE_TOKEN, &[]);
        edge.wait_nodes_ready(1);
        let v = anthropic_flows_with(&format!("http://{}", edge.http), "m", TRANSLATED_FLOWS, envs);
        assert_translated(kind, &v, true, kind == "openai_compat");
    }
}

#[test]
fn a_strict_model_refuses_what_its_provider_cannot_honour() {
    let node = mock_node("n1", 8, 0, 4, 0);
    let models = [mock_model("m", &["n1"], ""), mock_model("s", &["n1"], "strict = true")];
    let edge = Edge::start(&pool_config(&[node], &models, ""));
    let _n = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let body = |model: &str| {
        json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
               "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    };
    let r = post(&edge, "/v1/messages", &body("m"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("iop-dropped"), Some("tools.web_search_20250305"));
    let r = post(&edge, "/v1/messages", &body("s"), &[]);
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("strict") && msg.contains("tools.web_search_20250305"), "{msg}");
    // The access log names what was left out of the lenient one.
    eventually(std::time::Duration::from_secs(5), "the access log line", || {
        edge.proc.log_text().contains("dropped=\"tools.web_search_20250305\"")
    });
}

#[test]
fn a_silent_model_gets_pings_between_its_events() {
    // A model that thinks for 6 s before its one token: the stream says
    // it is alive meanwhile (every 5 s), as Anthropic's does.
    let node = mock_node("n1", 8, 0, 1, 0) + "first_token_delay_ms = 6000\n";
    let edge = Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], ""));
    let _n = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let body = json!({"model": "m", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let r = post(&edge, "/v1/messages", &body, &[]);
    assert_eq!(r.status, 200);
    let seq = names(&sse_events(&r.body));
    let pings = seq.iter().filter(|n| *n == "ping").count();
    assert_eq!(pings, 2, "the first after message_start, one more while the model was silent: {seq:?}");
    assert_eq!(seq.last().map(String::as_str), Some("message_stop"));
}
