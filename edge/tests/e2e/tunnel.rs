//! The provider tunnel, byte for byte: what the client receives through
//! edge → node → iop-mockprov is exactly what the mock wrote (compared by
//! SHA-256 with the mock's own record, `GET /last`), and what the mock
//! received is exactly what the client sent but for `model`.

use std::io::{Read, Write};

use serde_json::{json, Value};

use crate::harness::*;

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn setup(flags: &[&str]) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(flags);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

/// POSTs `body` (raw, as given) to `path` on a fresh connection.
fn post_raw(edge: &Edge, path: &str, body: &str, headers: &[(&str, &str)]) -> Response {
    request(edge.http, "POST", path, Some(body.as_bytes()), headers)
}

fn last(mock: &MockProv) -> Value {
    let r = request(mock.addr, "GET", "/last", None, &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Checks both directions of one exchange: the mock got `sent` with only
/// the model changed (and, for `stream_usage_injected`, include_usage
/// added), and the client got exactly the mock's bytes.
fn assert_faithful(mock: &MockProv, r: &Response, sent: &str) {
    let rec = last(mock);
    assert_eq!(rec["complete"], true, "{rec:#}");
    let expected = sent.replacen("\"gpt-test\"", "\"mock-upstream\"", 1);
    assert_eq!(rec["request_body"].as_str(), Some(expected.as_str()), "request bytes changed on the way");
    assert_eq!(
        rec["response_body_sha256"].as_str(),
        Some(sha256_hex(&r.body).as_str()),
        "the client's body differs from the provider's ({} vs {} bytes):\n{}",
        r.body.len(),
        rec["response_body_bytes"],
        String::from_utf8_lossy(&r.body[..r.body.len().min(2000)])
    );
    assert_eq!(r.status as u64, rec["response_status"].as_u64().unwrap());
}

#[test]
fn every_route_relays_the_providers_bytes_exactly() {
    let (mock, edge, _node) = setup(&["--tokens", "6"]);
    // Odd spacing, key order, unknown fields and integers beyond u64 must
    // all reach the provider untouched.
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"z_last_first":1,  "model" : "gpt-test","messages":[{"role":"user","content":"hé \"x\"","name":"n"}],"seed":123456789012345678901234567890,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"properties":{"b":{},"a":{}}}}}}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"n":2,"logprobs":true,"top_logprobs":2}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-test","messages":[{"role":"user","content":"x"}],"mock":{"refusal":"I can't do that"}}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"mock":{"tool_calls":2}}"#,
        ),
        ("/v1/completions", r#"{"model":"gpt-test","prompt":"once upon","max_tokens":4}"#),
        (
            "/v1/completions",
            r#"{"model":"gpt-test","prompt":"x","stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        ("/v1/embeddings", r#"{"model":"gpt-test","input":["a","bb"],"encoding_format":"float"}"#),
        ("/v1/embeddings", r#"{"model":"gpt-test","input":"c","encoding_format":"base64"}"#),
        ("/v1/responses", r#"{"model":"gpt-test","input":"hello"}"#),
        ("/v1/responses", r#"{"model":"gpt-test","input":"hello","stream":true}"#),
    ];
    for (path, body) in cases {
        let r = post_raw(&edge, path, body, &[]);
        assert_eq!(r.status, 200, "{path} {body}: {}", String::from_utf8_lossy(&r.body));
        assert_faithful(&mock, &r, body);
        // The provider's headers reach the client.
        assert!(r.header("x-request-id").is_some_and(|v| v.starts_with("req_mock_")), "{:?}", r.headers);
        assert!(r.header("x-ratelimit-remaining-requests").is_some(), "{:?}", r.headers);
        assert!(r.header("openai-processing-ms").is_some(), "{:?}", r.headers);
    }
    edge.assert_idle();
}

#[test]
fn client_headers_reach_the_provider_minus_hop_by_hop_and_credentials() {
    let (mock, edge, _node) = setup(&[]);
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"x"}]}"#;
    let r = post_raw(
        &edge,
        "/v1/chat/completions",
        body,
        &[
            ("authorization", "Bearer client-key"),
            ("x-stainless-lang", "python"),
            ("openai-organization", "org-1"),
            ("keep-alive", "timeout=5"),
            ("idempotency-key", "k1"),
        ],
    );
    assert_eq!(r.status, 200);
    let rec = last(&mock);
    let headers: Vec<(String, String)> = rec["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h[0].as_str().unwrap().to_ascii_lowercase(), h[1].as_str().unwrap().to_owned()))
        .collect();
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    assert_eq!(get("x-stainless-lang"), Some("python"));
    assert_eq!(get("openai-organization"), Some("org-1"));
    assert_eq!(get("idempotency-key"), Some("k1"));
    assert!(get("keep-alive").is_none() && get("connection") != Some("close"), "{headers:?}");
    // The client's credential never reaches the provider (the provider has none configured).
    assert!(get("authorization").is_none(), "{headers:?}");
    // The edge added a request id for the provider.
    assert!(get("x-request-id").is_some_and(|v| !v.is_empty()), "{headers:?}");
}

#[test]
fn provider_errors_pass_through_with_body_and_retry_after() {
    let (mock, edge, _node) = setup(&[]);
    for (status, stream) in [(429u16, false), (503, true), (400, false)] {
        let body = format!(
            r#"{{"model":"gpt-test","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"x"}}],"mock":{{"error_status":{status}}}}}"#
        );
        let r = post_raw(&edge, "/v1/chat/completions", &body, &[]);
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        assert_faithful(&mock, &r, &body);
        let err = r.json();
        assert!(err["error"]["code"].is_string() && err["error"]["type"].is_string(), "{err}");
        if status != 400 {
            assert_eq!(r.header("retry-after"), Some("7"), "{:?}", r.headers);
            assert_eq!(r.header("retry-after-ms"), Some("7000"), "{:?}", r.headers);
        }
    }
    edge.assert_idle();
}

#[test]
fn usage_is_accounted_and_hidden_only_when_the_edge_asked_for_it() {
    let (mock, edge, _node) = setup(&["--tokens", "3"]);
    let mut events = edge.events();
    let hidden = r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
    let r = post_raw(&edge, "/v1/chat/completions", hidden, &[]);
    assert_eq!(r.status, 200);
    let rec = last(&mock);
    assert!(rec["request_body"].as_str().unwrap().ends_with(r#","stream_options":{"include_usage":true}}"#), "{rec:#}");
    assert!(
        !r.sse_data().iter().any(|d| d.contains("\"usage\":{")),
        "the usage chunk reached a client that did not ask"
    );
    let t = events.wait("run_terminal", std::time::Duration::from_secs(5), |e| e["path"] == "tunnel");
    assert_eq!(t["usage"]["output_tokens"], 3, "{t}");

    let asked = r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#;
    let r = post_raw(&edge, "/v1/chat/completions", asked, &[]);
    assert_faithful(&mock, &r, asked);
    assert!(r.sse_data().iter().any(|d| d.contains("\"usage\":{")));
    let snap = edge.wait_snapshot(std::time::Duration::from_secs(5), "usage counted for both", |s| {
        model_of(s, "gpt-test")["usage"]["reported"] == 2
    });
    assert_eq!(model_of(&snap, "gpt-test")["usage"]["output_tokens"], 6, "{snap:#}");
}

#[test]
fn a_provider_reset_mid_stream_ends_the_client_stream_cleanly() {
    let (_mock, edge, _node) = setup(&["--tokens", "20", "--abort-after", "3"]);
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let body = r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#;
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
    // Read until the chunked body's last chunk: the edge must end it (no hang).
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.ends_with(b"0\r\n\r\n") {
        let n = s.read(&mut buf).expect("the stream ended without its last chunk");
        assert!(n > 0, "closed before the last chunk");
        raw.extend_from_slice(&buf[..n]);
    }
    let r = parse_response(&raw);
    let data = r.sse_data();
    assert!(data.iter().filter(|d| d.contains("tok")).count() >= 3, "{data:?}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(last["error"]["message"].is_string(), "a final error event tells the client: {data:?}");
    assert!(!data.iter().any(|d| d == "[DONE]"));
    edge.assert_idle();
}

#[test]
fn routes_an_openai_provider_cannot_serve_through_a_mock_are_refused() {
    // The in-process mock runs normalized: chat and embeddings, and the
    // Responses and Messages APIs translated; legacy completions not.
    let edge = Edge::start(&pool_config(&[mock_node("n1", 4, 0, 3, 0)], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let r = post_json(edge.http, "/v1/completions", &json!({"model": "m", "prompt": "x"}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "unsupported_endpoint");
    edge.assert_idle();
}

#[test]
fn a_slow_tunnel_reader_gets_every_byte_while_fast_tunnels_run() {
    // ~11 MB of unpaced SSE for the slow reader: many credit windows, and
    // long stalls between its reads, so its queued chunks get compacted too.
    // It asks for usage itself, so nothing is hidden: the bytes must match.
    let (mock, edge, _node) = setup(&["--tokens", "2000"]);
    let slow_body = r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"slow"}],"mock":{"tokens":40000}}"#;
    let addr = edge.http;
    // Far slower than the provider writes, and often past the edge's 20 ms
    // stall mark.
    let slow = std::thread::spawn(move || {
        read_slowly(addr, "/v1/chat/completions", slow_body, |read| {
            std::time::Duration::from_millis(if read % 7 == 0 { 30 } else { 2 })
        })
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let r = post_raw(
            &edge,
            "/v1/chat/completions",
            r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"fast"}]}"#,
            &[],
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "the fast tunnel waited: {:?}",
            started.elapsed()
        );
    }
    let r = slow.join().unwrap();
    assert_eq!(r.status, 200);
    // Byte for byte what the provider sent for it.
    let log = request(mock.addr, "GET", "/log", None, &[]).json();
    let rec = log
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["request_body"].as_str().is_some_and(|b| b.contains("slow")))
        .unwrap();
    assert_eq!(rec["complete"], true, "{rec}");
    assert_eq!(rec["response_body_sha256"].as_str(), Some(sha256_hex(&r.body).as_str()), "{} bytes", r.body.len());
    assert!(r.body.len() > 8_000_000, "{} bytes", r.body.len());
    edge.assert_idle();
}
