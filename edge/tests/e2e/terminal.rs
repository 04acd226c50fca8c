//! A stream ends at its terminal event: a provider that keeps its
//! connection open after `data: [DONE]`, `response.completed` or Ollama's
//! `done` line does not hold the client's answer or the capacity lease; the
//! node closes that provider connection (never reuses it). And the node's
//! pooled upstream connections that the provider closed do not linger in
//! CLOSE_WAIT until the next request.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

/// Far beyond what the test allows: without the end at the terminal event,
/// only this stall timeout would end the answers.
const STALL_MS: u64 = 15_000;

fn setup(kind: &str, mock_flags: &[&str]) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(mock_flags);
    let extra = format!("response_stall_timeout_ms = {STALL_MS}");
    let config = one_provider_config(kind, &mock.base_for(kind), &extra, "mock");
    let edge = Edge::start(&config);
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

fn timed_post(edge: &Edge, path: &str, body: &Value) -> (Response, Duration) {
    let started = Instant::now();
    let r = post_json(edge.http, path, body);
    (r, started.elapsed())
}

#[test]
fn tunnelled_streams_end_at_their_terminal_event_though_the_provider_stays_open() {
    let (mock, edge, _node) = setup("openai_compat", &[]);
    let user = json!([{"role": "user", "content": "x"}]);
    let cases = [
        ("/v1/chat/completions", json!({"model": "m", "stream": true, "messages": user}), "chat"),
        (
            "/v1/chat/completions",
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": user}),
            "chat-usage",
        ),
        ("/v1/completions", json!({"model": "m", "stream": true, "prompt": "x"}), "completions"),
        ("/v1/responses", json!({"model": "m", "stream": true, "input": "x"}), "responses"),
    ];
    for (path, mut body, tag) in cases {
        body["mock"] = json!({"tokens": 3, "hold_open": true, "tag": tag});
        let (r, took) = timed_post(&edge, path, &body);
        assert_eq!(r.status, 200, "{tag}: {}", String::from_utf8_lossy(&r.body));
        assert!(took < Duration::from_secs(2), "{tag}: the answer ended after {took:?}");
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert!(!text.contains("\"error\":{"), "{tag}: an error event: {text}");
        let data = r.sse_data();
        if path == "/v1/responses" {
            let last: Value = serde_json::from_str(data.last().expect("events")).expect("event JSON");
            assert_eq!(last["type"], "response.completed", "{tag}: {text}");
        } else {
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{tag}: {text}");
        }
        // The node left the provider's open connection at once.
        mock.wait_closed(tag);
    }
    // Every lease came back; the usage was still accounted.
    edge.assert_idle();
    let stats = mock.stats();
    assert_eq!(stats["streams_completed"], 4, "{stats}");
    assert_eq!(stats["early_closed"], 4, "{stats}");
    // A held connection is never reused: each request opened its own.
    assert!(stats["connections_accepted"].as_u64().unwrap_or(0) >= 4, "{stats}");
}

#[test]
fn a_normalized_ollama_stream_ends_at_its_done_line_though_the_provider_stays_open() {
    let (mock, edge, _node) = setup("ollama", &[]);
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}],
        "mock": {"tokens": 3, "hold_open": true, "tag": "ollama"}});
    let (r, took) = timed_post(&edge, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(took < Duration::from_secs(2), "the answer ended after {took:?}");
    assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
    mock.wait_closed("ollama");
    edge.assert_idle();
}

/// TCP connections whose remote end is `port`, in `state` (the kernel's
/// hex code: `01` established, `08` CLOSE_WAIT), from `/proc/net/tcp{,6}`:
/// only the node connects to the mock's port while this is asked.
fn sockets_to(port: u16, state: &str) -> usize {
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2].ends_with(&port) && f[3] == state
        })
        .count()
}

#[test]
fn pooled_upstream_connections_the_provider_closes_are_reaped() {
    // The mock closes a connection idle for 300 ms (a server's keep-alive timeout).
    let (mock, edge, _node) = setup("openai_compat", &["--keepalive-timeout-ms", "300"]);
    let port = mock.addr.port();
    // Several at once, so the node pools several connections.
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let addr = edge.http;
            std::thread::spawn(move || {
                let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "mock": {"ttft_ms": 200}});
                post_json(addr, "/v1/chat/completions", &body).status
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    let pooled = sockets_to(port, "01");
    assert!(pooled >= 2, "the node pooled its provider connections: {pooled}");
    // The mock closes them after 300 ms; the node notices without a request.
    eventually(Duration::from_secs(4), "no node socket left in CLOSE_WAIT or open to the provider", || {
        sockets_to(port, "08") == 0 && sockets_to(port, "01") == 0
    });
    // Nothing was lost: the next request opens a fresh connection.
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200);
}
