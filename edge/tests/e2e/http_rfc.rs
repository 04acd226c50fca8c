//! HTTP/1.x details the RFCs require of the client listener, with raw
//! sockets: an HTTP/1.0 client's streams are close-delimited (it has no
//! chunked coding), it never gets `100 Continue`, an HTTP/1.1 request needs
//! exactly one valid `Host`, and an absolute-form target is routed by its
//! path (RFC 9112 §3.2, §6.3, §7.1; RFC 9110 §10.1.1).

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use serde_json::{json, Value};

use crate::harness::*;

/// Edge, node and an `iop-mockprov` provider: the tunnel path (`gpt-test`).
fn tunnel_setup() -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(&["--tokens", "4", "--token-interval-ms", "10"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

/// Edge and a node with the in-process mock: the normalized path (`m`).
fn normalized_setup() -> (Edge, Proc) {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 8, 0, 4, 10)], &[mock_model("m", &["n1"], "")], ""));
    let node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    (edge, node)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Everything the server sends until it closes (a read timing out fails:
/// the connection must close by itself).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap_or_else(|e| panic!("the server did not close ({e}): {raw:?}"));
    raw
}

/// Sends `raw` on a fresh connection and reads until the server closes.
fn exchange(addr: SocketAddr, raw: &str) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(raw.as_bytes()).unwrap();
    read_to_close(&mut s)
}

/// The lower-cased head and the raw body of a response.
fn split(raw: &[u8]) -> (String, &[u8]) {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    (String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase(), &raw[at + 4..])
}

fn post(version: &str, target: &str, extra: &str, body: &str) -> String {
    format!(
        "POST {target} HTTP/{version}\r\n{extra}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A close-delimited SSE answer: no framing header, `connection: close`,
/// the events as raw bytes (no chunk-size lines) ending with `[DONE]`.
fn assert_close_delimited_sse(raw: &[u8]) -> &[u8] {
    let (head, body) = split(raw);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(!head.contains("transfer-encoding"), "an HTTP/1.0 client cannot read chunked: {head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let text = String::from_utf8_lossy(body);
    assert!(text.starts_with("data: {"), "chunk framing in the body: {text:?}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text:?}");
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    assert!(events.iter().all(|e| e.starts_with("data: ")), "{events:?}");
    let contents = events.iter().filter(|e| e.contains("tok")).count();
    assert!(contents >= 4, "{events:?}");
    body
}

#[test]
fn http_rfc_streams_to_http_1_0_are_close_delimited_on_the_tunnel() {
    let (mock, edge, _node) = tunnel_setup();
    // Usage asked for by the client: nothing is hidden, so the body must be
    // the provider's bytes exactly.
    let body = r#"{"model":"gpt-test","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#;
    let raw = exchange(edge.http, &post("1.0", "/v1/chat/completions", "", body));
    let got = assert_close_delimited_sse(&raw);
    let rec = request(mock.addr, "GET", "/last", None, &[]).json();
    assert_eq!(rec["complete"], true, "{rec:#}");
    assert_eq!(rec["response_body_sha256"].as_str(), Some(sha256_hex(got).as_str()), "not the provider's bytes");
    // The same request over HTTP/1.1 is chunked, as before.
    let mut s = connect(edge.http);
    s.write_all(post("1.1", "/v1/chat/completions", "host: t\r\nconnection: close\r\n", body).as_bytes()).unwrap();
    let raw = read_to_close(&mut s);
    let (head, _) = split(&raw);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    edge.assert_idle();
}

#[test]
fn http_rfc_streams_to_http_1_0_are_close_delimited_on_the_normalized_path() {
    let (edge, _node) = normalized_setup();
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    // Keep-alive asked for: a close-delimited body must still end with the
    // connection.
    let raw = exchange(edge.http, &post("1.0", "/v1/chat/completions", "connection: keep-alive\r\n", &body));
    let got = String::from_utf8_lossy(assert_close_delimited_sse(&raw)).to_string();
    assert!(got.contains("tok0 ") && got.contains("tok3 "), "{got}");
    edge.assert_idle();
}

#[test]
fn http_rfc_admin_events_to_http_1_0_are_raw() {
    let (edge, _node) = normalized_setup();
    let mut s = connect(edge.http);
    let auth = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
    s.write_all(format!("GET /admin/v1/events HTTP/1.0\r\n{auth}\r\n").as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&raw).contains(": connected") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    let (head, body) = split(&raw);
    assert!(head.starts_with("http/1.1 200") && !head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, b": connected\n\n");
}

#[test]
fn http_rfc_http_1_0_never_gets_100_continue() {
    let (edge, _node) = normalized_setup();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let sent = |version: &str| {
        let mut s = connect(edge.http);
        let host = if version == "1.1" { "host: t\r\n" } else { "" };
        let req = post(
            version,
            "/v1/chat/completions",
            &format!("{host}expect: 100-continue\r\nconnection: close\r\n"),
            &body,
        );
        // The head only: the client waits for the interim answer (or not).
        s.write_all(&req.as_bytes()[..req.len() - body.len()]).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
        let mut first = [0u8; 256];
        let interim = match s.read(&mut first) {
            Ok(n) => first[..n].to_vec(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Vec::new(),
            Err(e) => panic!("{e}"),
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let rest = read_to_close(&mut s);
        (interim, rest)
    };
    // HTTP/1.1 (the control): the 100 comes before the body is sent.
    let (interim, _) = sent("1.1");
    assert!(interim.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"), "{:?}", String::from_utf8_lossy(&interim));
    // HTTP/1.0: nothing until the body; then the final answer first.
    let (interim, rest) = sent("1.0");
    assert!(interim.is_empty(), "an interim answer to HTTP/1.0: {:?}", String::from_utf8_lossy(&interim));
    assert!(rest.starts_with(b"HTTP/1.1 200 OK\r\n"), "{:?}", String::from_utf8_lossy(&rest));
    assert!(!String::from_utf8_lossy(&rest).contains("100 Continue"));
    let (_, body) = split(&rest);
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 tok3 ");
}

#[test]
fn http_rfc_host_is_required_once_on_http_1_1() {
    let (edge, _node) = normalized_setup();
    for (what, head) in [
        ("no host", "GET /healthz HTTP/1.1\r\n\r\n"),
        ("two hosts", "GET /healthz HTTP/1.1\r\nhost: a\r\nhost: a\r\n\r\n"),
        ("two hosts, apart", "GET /healthz HTTP/1.1\r\nhost: a\r\nx-other: 1\r\nHost: b\r\n\r\n"),
        ("an invalid host", "GET /healthz HTTP/1.1\r\nhost: a b\r\n\r\n"),
        ("userinfo in host", "GET /healthz HTTP/1.1\r\nhost: user@a\r\n\r\n"),
    ] {
        let raw = exchange(edge.http, head);
        let (head, body) = split(&raw);
        assert!(head.starts_with("http/1.1 400"), "{what}: {head}");
        assert!(head.contains("connection: close"), "{what}: {head}");
        let v: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["error"]["code"], "malformed_request", "{what}: {v}");
    }
    // HTTP/1.0 predates Host; a valid one, an empty one and a port are fine on 1.1.
    for head in [
        "GET /healthz HTTP/1.0\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nhost: example:8080\r\nconnection: close\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nhost:\r\nconnection: close\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nhost: [::1]\r\nconnection: close\r\n\r\n",
    ] {
        let raw = exchange(edge.http, head);
        assert!(raw.starts_with(b"HTTP/1.1 200 OK\r\n"), "{head:?}: {:?}", String::from_utf8_lossy(&raw));
    }
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let raw = exchange(edge.http, &post("1.0", "/v1/chat/completions", "", &body));
    let (head, body) = split(&raw);
    assert!(head.starts_with("http/1.1 200") && head.contains("content-length:"), "{head}");
    assert_eq!(
        serde_json::from_slice::<Value>(body).unwrap()["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 tok3 "
    );
}

#[test]
fn http_rfc_absolute_form_targets_are_routed_by_their_path() {
    let (edge, _node) = normalized_setup();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let raw = exchange(
        edge.http,
        &post("1.1", "http://example/v1/chat/completions", "host: example\r\nconnection: close\r\n", &body),
    );
    let (head, got) = split(&raw);
    assert!(head.starts_with("http/1.1 200"), "{head}: {}", String::from_utf8_lossy(got));
    let v: Value = serde_json::from_slice(got).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 tok3 ");
    // Streamed, with a query and the scheme in capitals; and a GET route.
    let stream = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let r = parse_response(&exchange(
        edge.http,
        &post("1.1", "HTTP://example:80/v1/chat/completions?x=1", "host: example\r\nconnection: close\r\n", &stream),
    ));
    assert_eq!(r.status, 200);
    assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
    let raw =
        exchange(edge.http, "GET http://example/v1/models HTTP/1.1\r\nhost: example\r\nconnection: close\r\n\r\n");
    let r = parse_response(&raw);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["data"].as_array().unwrap().iter().any(|m| m["id"] == "m"), "{}", r.json());
    // Host is still required on HTTP/1.1; the authority must be a host.
    for head in [
        "GET http://example/v1/models HTTP/1.1\r\n\r\n",
        "GET http://user@example/v1/models HTTP/1.1\r\nhost: example\r\n\r\n",
    ] {
        let raw = exchange(edge.http, head);
        assert!(raw.starts_with(b"HTTP/1.1 400 "), "{head:?}: {:?}", String::from_utf8_lossy(&raw));
    }
    edge.assert_idle();
}
