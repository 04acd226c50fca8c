//! Completions through edge → node → openai_compat → iop-mockprov: the
//! provider tunnel, so what the client reads is what the provider wrote
//! (its `model` is the upstream model name, as from the provider directly).

use serde_json::json;

use crate::harness::*;

fn setup(mock_flags: &[&str], envs: &[(&str, &str)]) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(mock_flags);
    let edge = Edge::start_with_env(&edge_config(&mock.base_url(), ""), envs);
    let node = edge.node(NODE_TOKEN, envs);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

fn check_stream(edge: &Edge) {
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hello world, how are you"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "mock-upstream"));
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(text, "tok0 tok1 tok2 tok3 tok4 ");
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("stop"));
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert!(usage["prompt_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(chunks.last().unwrap()["choices"].as_array().unwrap().len(), 0);
}

#[test]
fn streamed_completion_through_openai_compat() {
    let (_mock, edge, _node) = setup(&["--tokens", "5"], &[]);
    check_stream(&edge);
}

#[test]
fn streamed_completion_on_the_epoll_driver() {
    let envs = [("MONOIO_FORCE_LEGACY_DRIVER", "1")];
    let (_mock, edge, _node) = setup(&["--tokens", "5"], &envs);
    assert!(edge.proc.log_text().contains("epoll"), "edge should log the epoll driver");
    check_stream(&edge);
}

#[test]
fn non_streamed_completion_with_usage_and_reasoning() {
    let (_mock, edge, _node) = setup(&["--tokens", "3", "--reasoning", "2"], &[]);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "mock-upstream");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "think0 think1 ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens_details"]["reasoning_tokens"], 2);
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() >= 3);
}

#[test]
fn max_tokens_caps_the_completion() {
    let (_mock, edge, _node) = setup(&["--tokens", "10"], &[]);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn model_list_health_and_readiness() {
    let (_mock, edge, mut node) = setup(&[], &[]);
    let r = request(edge.http, "GET", "/v1/models", None, &[]);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "gpt-test");
    let h = request(edge.http, "GET", "/healthz", None, &[]).json();
    assert_eq!(h["status"], "ok");
    assert_eq!((h["providers"].as_u64(), h["providers_available"].as_u64()), (Some(1), Some(1)), "{h}");
    let r = request(edge.http, "GET", "/readyz", None, &[]);
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ok")));

    // No node, no provider that can take traffic: alive, not ready.
    node.kill9();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = request(edge.http, "GET", "/readyz", None, &[]);
        if r.status == 503 {
            assert_eq!(r.json()["status"], "no_provider_available");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still ready without a node: {}", r.json());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = request(edge.http, "GET", "/healthz", None, &[]);
    assert_eq!((r.status, r.json()["providers_available"].as_u64()), (200, Some(0)));
    assert_eq!(request(edge.http, "POST", "/readyz", Some(b"{}"), &[]).status, 405);
}

#[test]
fn every_worker_core_serves_clients() {
    let (_mock, edge, _node) = setup(&[], &[]);
    // SO_REUSEPORT spreads connections by their 4-tuple; 64 connections all
    // landing on one of two cores would be a 2^-63 fluke.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let h = request(edge.http, "GET", "/healthz", None, &[]).json();
        seen.insert(h["worker"].as_u64().unwrap());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn chunked_request_body_and_no_usage_unless_asked() {
    use std::io::{Read, Write};
    let (_mock, edge, _node) = setup(&["--tokens", "2"], &[]);
    let body = json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let (a, b) = body.split_at(body.len() / 2);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let r = parse_response(&raw);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    // The edge asked the provider for usage (to account it) and kept the
    // usage chunk from this client; chunks say `"usage": null` as OpenAI's
    // do once usage is on, which SDKs read as "no usage".
    let chunks: Vec<serde_json::Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["usage"].is_null()), "usage chunk only with include_usage: {data:?}");
    assert!(chunks.iter().all(|c| !c["choices"].as_array().unwrap().is_empty()), "{data:?}");
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    use std::io::{Read, Write};
    let (_mock, edge, _node) = setup(&["--tokens", "2"], &[]);
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}).to_string();
    for _ in 0..3 {
        let req =
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).unwrap();
        // Read exactly one Content-Length response.
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let len: usize =
            head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse().unwrap()).unwrap();
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 ");
    }
}

#[test]
fn a_request_after_a_stream_on_its_connection_is_read_whole_however_long_its_head() {
    use std::io::{Read, Write};
    // While a stream is answered a small read watches for the client
    // leaving; the next request's head lands there first and must be read
    // on, not cut at that read's size.
    let (_mock, edge, _node) = setup(&["--tokens", "2"], &[]);
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let stream =
        json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let req =
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{stream}", stream.len());
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"0\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).contains("data: [DONE]"));
    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let pad = "p".repeat(3000);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-pad: {pad}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("tok0 tok1 ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "no answer to the second request: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
}

#[test]
fn client_disconnect_mid_stream_closes_the_upstream_connection() {
    use std::io::{Read, Write};
    let (mock, edge, _node) = setup(&["--tokens", "1000", "--token-interval-ms", "50"], &[]);
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    let body = json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    // Wait until content is flowing, then hang up.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("tok1 ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(mock.stats()["early_closed"], 0);
    drop(s);
    let start = std::time::Instant::now();
    eventually(std::time::Duration::from_secs(1), "upstream connection closed early", || {
        mock.stats()["early_closed"] == 1
    });
    println!("upstream closed {:?} after the client left", start.elapsed());
    // The tunnel's lease came back, once: nothing in use, no guard alive.
    edge.wait_snapshot(std::time::Duration::from_secs(5), "lease released", |s| {
        provider_of(s, "n1", "up")["live_leases"] == 0
    });
    edge.assert_idle();
}

#[test]
fn upstream_abort_mid_stream_ends_with_an_error_event() {
    let (_mock, edge, _node) = setup(&["--tokens", "10", "--abort-after", "3"], &[]);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    let last: serde_json::Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(last["error"]["message"].is_string(), "last event should be an error: {data:?}");
    assert!(!data.iter().any(|d| d == "[DONE]"), "no [DONE] after an error terminal");
}
