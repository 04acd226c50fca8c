//! End-to-end tests of the `iop-mockprov` binary over plain std sockets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::MockProv;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use iop_core::http::{parse_response_head, BodyDecoder, Limits, ResponseHead};
use iop_core::sse::{SseEvent, SseParser};
use serde_json::Value;

impl MockProv {
    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn stats(&self) -> Value {
        let res = self.request("GET", "/stats", None);
        assert_eq!(res.head.status, 200);
        serde_json::from_slice(&res.body).unwrap()
    }

    /// One request on a fresh connection (`connection: close`).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        let mut s = self.connect();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        Response::parse(&raw)
    }
}

struct Response {
    head: ResponseHead,
    body: Vec<u8>,
    /// The body ended with its framing (not cut by a close).
    complete: bool,
}

impl Response {
    fn parse(raw: &[u8]) -> Self {
        let mut buf = BytesMut::from(raw);
        let head = parse_response_head(&mut buf, &Limits::default(), false).unwrap().expect("complete head");
        let mut dec = BodyDecoder::new(head.body, 1 << 24);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut buf).unwrap() {
            body.extend_from_slice(&d);
        }
        let complete = dec.is_done() || dec.finish_on_eof().is_ok();
        Self { head, body, complete }
    }

    fn events(&self) -> Vec<SseEvent> {
        let mut p = SseParser::new(1 << 20);
        p.push(&self.body);
        let mut out = Vec::new();
        while let Some(e) = p.next_event().unwrap() {
            out.push(e);
        }
        out
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

fn chunk(e: &SseEvent) -> Value {
    serde_json::from_str(&e.data).unwrap_or_else(|err| panic!("{err}: {:?}", e.data))
}

fn poll_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

#[test]
fn streamed_answer_has_openai_shape() {
    let mock = MockProv::start(&["--tokens", "4", "--model", "default-model"]);
    let res = mock.request(
        "POST",
        "/v1/chat/completions",
        Some(
            r#"{"model":"llama","messages":[{"role":"user","content":"hello world, hello!"}],"stream":true,
               "stream_options":{"include_usage":true},"mock":{"reasoning":2}}"#,
        ),
    );
    assert_eq!(res.head.status, 200);
    assert_eq!(res.head.header("content-type"), Some(&b"text/event-stream"[..]));
    assert_eq!(res.head.header("transfer-encoding"), Some(&b"chunked"[..]));
    assert!(res.complete);
    let events = res.events();
    assert_eq!(events.len(), 1 + 2 + 4 + 1 + 1 + 1, "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(chunk).collect();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], "llama");
        assert_eq!(c["id"], chunks[0]["id"]);
        assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-mock-"));
        assert!(c["created"].as_u64().is_some());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"], serde_json::json!({"role": "assistant", "content": ""}));
    assert_eq!(chunks[0]["choices"][0]["index"], 0);
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
    for i in 0..2 {
        assert_eq!(chunks[1 + i]["choices"][0]["delta"]["reasoning_content"], format!("think{i} "));
    }
    for i in 0..4 {
        assert_eq!(chunks[3 + i]["choices"][0]["delta"]["content"], format!("tok{i} "));
        assert_eq!(chunks[3 + i]["choices"][0]["finish_reason"], Value::Null);
    }
    assert_eq!(chunks[7]["choices"][0]["delta"], serde_json::json!({}));
    assert_eq!(chunks[7]["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[8];
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 4);
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert_eq!(usage["usage"]["total_tokens"], 10);
    assert_eq!(usage["usage"]["completion_tokens_details"]["reasoning_tokens"], 2);
    assert_eq!(events.last().unwrap().data, "[DONE]");

    // Without include_usage there is no usage chunk; max_tokens caps with "length".
    let res = mock.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":2}"#),
    );
    let events = res.events();
    assert_eq!(events.len(), 1 + 2 + 1 + 1);
    assert_eq!(chunk(&events[3])["choices"][0]["finish_reason"], "length");
    assert_eq!(chunk(&events[0])["model"], "default-model");

    let stats = mock.stats();
    assert_eq!(stats["requests"], 2);
    assert_eq!(stats["streams_started"], 2);
    assert_eq!(stats["streams_completed"], 2);
    assert_eq!(stats["active_streams"], 0);
    assert_eq!(stats["early_closed"], 0);
}

#[test]
fn non_streamed_error_and_other_endpoints() {
    let mock = MockProv::start(&["--tokens", "3", "--reasoning", "1"]);
    let res =
        mock.request("POST", "/v1/chat/completions", Some(r#"{"model":"m","messages":[{"content":"abcdefgh"}]}"#));
    assert_eq!(res.head.status, 200);
    assert!(res.head.header("content-length").is_some());
    let v = res.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "think0 ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let res = mock.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"error_status":429}}"#),
    );
    assert_eq!(res.head.status, 429);
    assert_eq!(
        res.json(),
        serde_json::json!({"error": {"message": "mock provider error", "type": "mock_error", "code": 429}})
    );

    for (body, what) in [("{not json", "bad json"), (r#"{"model":"m"}"#, "missing messages")] {
        let res = mock.request("POST", "/v1/chat/completions", Some(body));
        assert_eq!(res.head.status, 400, "{what}");
        assert!(res.json()["error"]["message"].is_string(), "{what}");
    }
    assert_eq!(mock.request("GET", "/healthz", None).body, b"ok");
    assert_eq!(mock.request("GET", "/v1/models", None).json()["data"][0]["id"], "mock");
    assert_eq!(mock.request("GET", "/nope", None).head.status, 404);
    assert_eq!(mock.request("GET", "/v1/chat/completions", None).head.status, 405);
    assert_eq!(mock.request("POST", "/healthz", None).head.status, 405);
}

#[test]
fn error_status_flag_applies_to_chat() {
    let mock = MockProv::start(&["--error-status", "503"]);
    let res = mock.request("POST", "/v1/chat/completions", Some(r#"{"messages":[{"content":"x"}],"stream":true}"#));
    assert_eq!(res.head.status, 503);
    assert_eq!(res.json()["error"]["code"], 503);
    assert_eq!(mock.request("GET", "/healthz", None).head.status, 200);
}

#[test]
fn abort_after_closes_without_finish() {
    let mock = MockProv::start(&["--tokens", "10", "--abort-after", "3"]);
    let res = mock.request("POST", "/v1/chat/completions", Some(r#"{"messages":[{"content":"x"}],"stream":true}"#));
    assert_eq!(res.head.status, 200);
    assert!(!res.complete, "the chunked body must be cut short");
    let events = res.events();
    assert_eq!(events.len(), 1 + 3, "{events:?}");
    assert!(events.iter().all(|e| e.data != "[DONE]" && chunk(e)["choices"][0]["finish_reason"].is_null()));
    // A per-request override wins over the flag.
    let res = mock.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"abort_after":100,"tokens":2}}"#),
    );
    assert!(res.complete);
    assert_eq!(res.events().last().unwrap().data, "[DONE]");
    let stats = mock.stats();
    assert_eq!(stats["aborted"], 1);
    assert_eq!(stats["early_closed"], 0);
}

#[test]
fn client_close_mid_stream_is_seen_promptly_io_uring() {
    client_close_mid_stream(false);
}

#[test]
fn client_close_mid_stream_is_seen_promptly_epoll() {
    client_close_mid_stream(true);
}

fn client_close_mid_stream(legacy: bool) {
    let mock = MockProv::start_on(&["--token-interval-ms", "50", "--tokens", "1000"], legacy);
    let mut s = mock.connect();
    let body = r#"{"messages":[{"content":"x"}],"stream":true}"#;
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    // Wait until tokens flow, then hang up.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("tok1 ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(mock.stats()["active_streams"], 1);
    let closed_at = Instant::now();
    drop(s);
    assert!(
        poll_until(Duration::from_secs(1), || mock.stats()["early_closed"] == 1),
        "early_closed not reported: {}",
        mock.stats()
    );
    assert!(closed_at.elapsed() < Duration::from_secs(1));
    let stats = mock.stats();
    assert_eq!(stats["active_streams"], 0);
    assert_eq!(stats["streams_completed"], 0);
}

#[test]
fn keep_alive_pipelining_chunked_bodies_and_bad_input_io_uring() {
    keep_alive_pipelining_chunked_bodies_and_bad_input(false);
}

#[test]
fn keep_alive_pipelining_chunked_bodies_and_bad_input_epoll() {
    keep_alive_pipelining_chunked_bodies_and_bad_input(true);
}

fn keep_alive_pipelining_chunked_bodies_and_bad_input(legacy: bool) {
    let mock = MockProv::start_on(&["--tokens", "2"], legacy);
    let mut s = mock.connect();
    let body = r#"{"messages":[{"content":"x"}]}"#;
    // Two pipelined requests on one connection; the second has a chunked body.
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {len}\r\n\r\n{body}\
         POST /v1/chat/completions HTTP/1.1\r\nhost: m\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {half:x}\r\n{a}\r\n{rest:x}\r\n{b}\r\n0\r\n\r\n",
        len = body.len(),
        half = 10,
        a = &body[..10],
        rest = body.len() - 10,
        b = &body[10..],
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut buf = BytesMut::from(&raw[..]);
    for _ in 0..2 {
        let head = parse_response_head(&mut buf, &Limits::default(), false).unwrap().unwrap();
        assert_eq!(head.status, 200);
        let mut dec = BodyDecoder::new(head.body, 1 << 20);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut buf).unwrap() {
            body.extend_from_slice(&d);
        }
        assert!(dec.is_done());
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 ");
    }
    assert!(buf.is_empty());

    // A paced stream with the next request pipelined behind it: the bytes read
    // while the stream watched the socket must serve the second request.
    let mut s = mock.connect();
    let stream_body = r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"token_interval_ms":5,"tokens":3}}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {}\r\n\r\n{stream_body}\
         GET /healthz HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n",
        stream_body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut buf = BytesMut::from(&raw[..]);
    let head = parse_response_head(&mut buf, &Limits::default(), false).unwrap().unwrap();
    let mut dec = BodyDecoder::new(head.body, 1 << 20);
    while dec.decode(&mut buf).unwrap().is_some() {}
    assert!(dec.is_done());
    let res = Response::parse(&buf);
    assert_eq!((res.head.status, res.body.as_slice()), (200, &b"ok"[..]));

    // Garbage, an endless header and an oversized body are refused; the server lives on.
    let cases: [(Vec<u8>, u16); 3] = [
        (b"\x00\x01garbage\r\n\r\n".to_vec(), 400),
        ([&b"GET / HTTP/1.1\r\nx: "[..], &[b'a'; 20_000]].concat(), 431),
        (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 999999999\r\n\r\n".to_vec(), 413),
    ];
    for (input, status) in cases {
        let mut s = mock.connect();
        s.write_all(&input).unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let res = Response::parse(&raw);
        assert_eq!(res.head.status, status);
        assert!(!res.head.keep_alive);
    }
    assert_eq!(mock.request("GET", "/healthz", None).body, b"ok");
}
