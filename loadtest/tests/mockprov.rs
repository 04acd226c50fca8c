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
    /// `GET /last`.
    fn last(&self) -> Value {
        let res = self.request("GET", "/last", None);
        assert_eq!(res.head.status, 200, "{}", String::from_utf8_lossy(&res.body));
        res.json()
    }

    /// `GET /log`.
    fn log(&self) -> Vec<Value> {
        let res = self.request("GET", "/log", None);
        assert_eq!(res.head.status, 200);
        serde_json::from_slice(&res.body).unwrap()
    }

    /// Writes `raw` on a fresh connection and reads until the server closes.
    fn raw(&self, raw: &[u8]) -> Vec<u8> {
        let mut s = self.connect();
        s.write_all(raw).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

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
    /// The head as received (names in their own case).
    raw_head: String,
    head: ResponseHead,
    body: Vec<u8>,
    /// The body ended with its framing (not cut by a close).
    complete: bool,
}

impl Response {
    fn parse(raw: &[u8]) -> Self {
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").map_or(raw.len(), |e| e + 4);
        let raw_head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut buf = BytesMut::from(raw);
        let head = parse_response_head(&mut buf, &Limits::default(), false).unwrap().expect("complete head");
        let mut dec = BodyDecoder::new(head.body, 1 << 24);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut buf).unwrap() {
            body.extend_from_slice(&d);
        }
        let complete = dec.is_done() || dec.finish_on_eof().is_ok();
        Self { raw_head, head, body, complete }
    }

    /// Header lines of the head as written, in order.
    fn header_pairs(&self) -> Vec<(String, String)> {
        self.raw_head
            .split("\r\n")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.to_owned(), v.trim().to_owned())
            })
            .collect()
    }

    fn header_str(&self, name: &str) -> Option<&str> {
        self.head.header(name).map(|v| std::str::from_utf8(v).unwrap())
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

fn sha_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A request with the given extra header lines (`Name: value\r\n` each).
fn post(path: &str, extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: mock\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `/last` (or a `/log` entry) describes exactly the exchange `res` (answer to `body`).
fn assert_recorded(rec: &Value, path: &str, body: &str, res: &Response, complete: bool) {
    assert_eq!((rec["method"].as_str(), rec["path"].as_str()), (Some("POST"), Some(path)), "{rec}");
    assert_eq!(rec["request_body"].as_str(), Some(body), "byte for byte");
    assert_eq!(rec["request_body_sha256"], sha_hex(body.as_bytes()));
    assert_eq!(rec["response_status"], res.head.status);
    let headers: Vec<(String, String)> = serde_json::from_value(rec["response_headers"].clone()).unwrap();
    assert_eq!(headers, res.header_pairs());
    assert_eq!(rec["response_body_sha256"], sha_hex(&res.body), "hash of the de-chunked body");
    assert_eq!(rec["response_body_bytes"], res.body.len());
    assert_eq!((rec["complete"].as_bool(), rec["finished"].as_bool()), (Some(complete), Some(true)), "{rec}");
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
        serde_json::json!({"error": {"message": "mock provider error", "type": "rate_limit_error", "param": null,
                                     "code": "rate_limit_exceeded"}})
    );
    assert_eq!(res.head.header("retry-after"), Some(&b"7"[..]));
    assert_eq!(res.head.header("retry-after-ms"), Some(&b"7000"[..]));

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
    assert_eq!(res.json()["error"]["type"], "server_error");
    assert_eq!(res.json()["error"]["code"], "mock_error");
    assert_eq!(mock.request("GET", "/healthz", None).head.status, 200);
}

/// `burst`: a stream's tokens leave in groups, each group in one write after
/// `burst` intervals, so a reader finds them together.
#[test]
fn burst_writes_several_tokens_at_once() {
    let mock = MockProv::start(&[]);
    let mut s = mock.connect();
    let body = r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"tokens":8,"token_interval_ms":40,"burst":4}}"#;
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
    // When the reader had seen 1..=8 tokens.
    let (mut seen, mut text, mut buf) = (Vec::new(), String::new(), [0u8; 65536]);
    let started = Instant::now();
    while seen.len() < 8 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended after {} tokens: {text}", seen.len());
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        let now = started.elapsed();
        while seen.len() < text.matches("tok").count().min(8) {
            seen.push(now);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // Each group of four together; the second 4 × 40 ms after the first.
    assert!(ms(seen[3] - seen[0]) < 20.0, "the first burst was spread: {seen:?}");
    assert!(ms(seen[7] - seen[4]) < 20.0, "the second burst was spread: {seen:?}");
    assert!(ms(seen[4] - seen[3]) >= 120.0, "the bursts were not paced 4 × 40 ms apart: {seen:?}");
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

/// A tagged request whose client leaves mid-answer is listed at `/closes`
/// with the instant (wall clock) the mock saw the close; complete or
/// untagged answers are not.
#[test]
fn closes_lists_tagged_early_closes() {
    let mock = MockProv::start(&["--token-interval-ms", "20", "--tokens", "1000", "--no-record"]);
    let closes =
        |mock: &MockProv| -> Vec<Value> { serde_json::from_slice(&mock.request("GET", "/closes", None).body).unwrap() };
    assert!(closes(&mock).is_empty());
    // Complete, tagged: not listed.
    let done = mock.request(
        "POST",
        "/v1/chat/completions",
        Some(r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"tokens":2,"tag":"whole"}}"#),
    );
    assert!(done.complete);
    let mut left_at = Vec::new();
    for (path, body) in [
        ("/v1/chat/completions", r#"{"messages":[{"content":"x"}],"stream":true,"mock":{"tag":"sse-1"}}"#),
        ("/api/chat", r#"{"model":"m","messages":[{"content":"x"}],"mock":{"tag":"ndjson-1"}}"#),
        ("/v1/chat/completions", r#"{"messages":[{"content":"x"}],"stream":true}"#),
        ("/v1/chat/completions", r#"{"messages":[{"content":"x"}],"mock":{"tag":"whole-1"}}"#),
    ] {
        let before = mock.stats()["model_requests"].as_u64().unwrap();
        let mut s = mock.connect();
        write!(s, "POST {path} HTTP/1.1\r\nhost: mock\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
        if body.contains("stream\":true") || path == "/api/chat" {
            // Wait for the first token.
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains("tok0 ") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "stream ended early");
                seen.extend_from_slice(&buf[..n]);
            }
        } else {
            // A whole answer (1000 tokens × 20 ms): wait until the mock has the request.
            assert!(poll_until(Duration::from_secs(5), || mock.stats()["model_requests"].as_u64() > Some(before)));
        }
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        drop(s);
        left_at.push(at);
    }
    assert!(poll_until(Duration::from_secs(5), || closes(&mock).len() == 3), "{:?}", closes(&mock));
    let list = closes(&mock);
    let tags: Vec<&str> = list.iter().map(|c| c["tag"].as_str().unwrap()).collect();
    assert_eq!(tags, ["sse-1", "ndjson-1", "whole-1"]);
    for (c, at) in list.iter().zip([left_at[0], left_at[1], left_at[3]]) {
        let closed = c["closed_unix_ns"].as_u64().unwrap();
        assert!(closed >= at && closed - at < 1_000_000_000, "{c} vs {at}");
        assert!(c["id"].as_u64().unwrap() >= 2);
    }
    assert!(poll_until(Duration::from_secs(5), || mock.stats()["early_closed"] == 4), "{}", mock.stats());
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

#[test]
fn last_records_the_exchange_byte_for_byte() {
    let mock = MockProv::start(&["--tokens", "3"]);
    assert_eq!(mock.request("GET", "/last", None).head.status, 404, "nothing recorded yet");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"marker-1 \u00e9 é"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    let res = Response::parse(&mock.raw(&post(
        "/v1/chat/completions",
        "X-Test-Marker: abc\r\nContent-Type: application/json\r\n",
        body,
    )));
    assert_eq!(res.head.status, 200);
    assert!(res.complete);
    assert!(res.body.ends_with(b"data: [DONE]\n\n"));
    let rec = mock.last();
    assert_recorded(&rec, "/v1/chat/completions", body, &res, true);
    assert_eq!(rec["id"], 1);
    let headers: Vec<(String, String)> = serde_json::from_value(rec["headers"].clone()).unwrap();
    let want: Vec<(String, String)> = [
        ("Host", "mock"),
        ("X-Test-Marker", "abc"),
        ("Content-Type", "application/json"),
        ("Content-Length", &body.len().to_string()),
        ("Connection", "close"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(headers, want, "in order, names as received");
    assert_eq!(res.header_str("x-request-id"), Some("req_mock_1"));
    assert!(res.header_str("openai-processing-ms").unwrap().parse::<u64>().is_ok());
    assert_eq!(res.header_str("x-ratelimit-limit-requests"), Some("1000"));
    assert_eq!(res.header_str("x-ratelimit-remaining-requests"), Some("999"));

    // Non-streamed, then metadata endpoints (not recorded), then a configured error.
    let body2 = r#"{"messages":[{"role":"user","content":"marker-2"}]}"#;
    let res2 = Response::parse(&mock.raw(&post("/v1/chat/completions", "", body2)));
    assert_eq!(res2.head.status, 200);
    assert_recorded(&mock.last(), "/v1/chat/completions", body2, &res2, true);
    assert_eq!(mock.request("GET", "/v1/models", None).head.status, 200);
    assert_eq!(mock.request("GET", "/healthz", None).head.status, 200);
    let body3 = r#"{"messages":[{"content":"marker-3"}],"mock":{"error_status":503}}"#;
    let res3 = Response::parse(&mock.raw(&post("/v1/chat/completions", "", body3)));
    assert_eq!(res3.head.status, 503);
    assert_eq!((res3.header_str("retry-after"), res3.header_str("x-request-id")), (Some("7"), Some("req_mock_3")));
    assert_recorded(&mock.last(), "/v1/chat/completions", body3, &res3, true);

    // An aborted stream is recorded as incomplete, with the bytes that were written.
    let body4 = r#"{"messages":[{"content":"marker-4"}],"stream":true,"mock":{"abort_after":2}}"#;
    let res4 = Response::parse(&mock.raw(&post("/v1/chat/completions", "", body4)));
    assert!(!res4.complete);
    assert_recorded(&mock.last(), "/v1/chat/completions", body4, &res4, false);

    // A hang-up has no response at all.
    let body5 = r#"{"messages":[{"content":"marker-5"}],"mock":{"hangup":true}}"#;
    assert!(mock.raw(&post("/v1/chat/completions", "", body5)).is_empty());
    let rec = mock.last();
    assert_eq!((&rec["response_status"], &rec["response_headers"]), (&Value::Null, &serde_json::json!([])));
    assert_eq!((rec["response_body_bytes"].as_u64(), rec["complete"].as_bool()), (Some(0), Some(false)));

    let log = mock.log();
    let markers: Vec<&str> = log.iter().map(|r| r["request_body"].as_str().unwrap()).collect();
    assert_eq!(markers, [body, body2, body3, body4, body5], "oldest first, model requests only");
    assert_recorded(&log[0], "/v1/chat/completions", body, &res, true);
}

#[test]
fn log_keeps_the_last_64_and_no_record_turns_it_off() {
    let mock = MockProv::start(&["--tokens", "1"]);
    let mut s = mock.connect();
    for i in 0..70 {
        let body = format!(r#"{{"messages":[{{"content":"n{i}"}}]}}"#);
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {}\r\n\r\n{body}", body.len())
            .unwrap();
    }
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    assert!(raw.ends_with(b"ok"));
    let log = mock.log();
    assert_eq!(log.len(), 64);
    assert_eq!(log[0]["request_body"], r#"{"messages":[{"content":"n6"}]}"#);
    assert_eq!(log[63]["id"], 70);
    // A body above 1 MiB keeps only its digest and length.
    let big = format!(r#"{{"messages":[{{"content":"{}"}}]}}"#, "a".repeat(1 << 20));
    let res = Response::parse(&mock.raw(&post("/v1/chat/completions", "", &big)));
    assert_eq!(res.head.status, 200);
    let rec = mock.last();
    assert_eq!((&rec["request_body"], rec["request_body_bytes"].as_u64()), (&Value::Null, Some(big.len() as u64)));
    assert_eq!(rec["request_body_sha256"], sha_hex(big.as_bytes()));

    let quiet = MockProv::start(&["--no-record"]);
    let res = quiet.request("POST", "/v1/chat/completions", Some(r#"{"messages":[{"content":"x"}]}"#));
    assert_eq!(res.head.status, 200);
    assert_eq!(quiet.request("GET", "/last", None).head.status, 404);
    assert!(quiet.log().is_empty());
}

/// POSTs `body` to `path` on a fresh connection; the answer and the `/last` record of it.
fn exchange(mock: &MockProv, path: &str, body: &str) -> (Response, Value) {
    let res = Response::parse(&mock.raw(&post(path, "Content-Type: application/json\r\n", body)));
    let rec = mock.last();
    assert_recorded(&rec, path, body, &res, true);
    (res, rec)
}

fn sse_data(res: &Response) -> Vec<Value> {
    res.events().iter().filter(|e| e.data != "[DONE]").map(chunk).collect()
}

fn ndjson(res: &Response) -> Vec<Value> {
    let text = std::str::from_utf8(&res.body).unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect()
}

#[test]
fn chat_tool_calls_two_turn_loop_refusal_n_and_logprobs() {
    let mock = MockProv::start(&["--tokens", "3"]);
    // Turn 1: streamed parallel tool calls.
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather"}}],"mock":{"tool_calls":2}}"#;
    let (res, _) = exchange(&mock, "/v1/chat/completions", body);
    let chunks = sse_data(&res);
    let mut args = [String::new(), String::new()];
    let mut ids = [String::new(), String::new()];
    for c in &chunks {
        for tc in c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if let Some(id) = tc["id"].as_str() {
                ids[i] = id.to_owned();
                assert_eq!(tc["function"]["name"], "get_weather");
            }
            args[i].push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(ids, ["call_1_0", "call_1_1"]);
    for (i, a) in args.iter().enumerate() {
        assert_eq!(serde_json::from_str::<Value>(a).unwrap(), serde_json::json!({"city": "Paris", "n": i}));
    }
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    // Turn 2: the tool result comes back; the answer is text that echoes it.
    let body = r#"{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"n\":0}"}}]},{"role":"tool","tool_call_id":"call_1_0","content":"11 degrees"}],"mock":{"tool_calls":2}}"#;
    let (res, _) = exchange(&mock, "/v1/chat/completions", body);
    let v = res.json();
    assert_eq!(v["choices"][0]["message"]["content"], "tool said: 11 degrees");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Refusal, non-streamed and streamed.
    let (res, _) =
        exchange(&mock, "/v1/chat/completions", r#"{"messages":[{"content":"x"}],"mock":{"refusal":"No."}}"#);
    let m = &res.json()["choices"][0]["message"];
    assert_eq!((&m["content"], &m["refusal"]), (&Value::Null, &serde_json::json!("No.")));
    let (res, _) = exchange(
        &mock,
        "/v1/chat/completions",
        r#"{"stream":true,"messages":[{"content":"x"}],"mock":{"refusal":"I will not."}}"#,
    );
    let refusal: String =
        sse_data(&res).iter().filter_map(|c| c["choices"][0]["delta"]["refusal"].as_str().map(str::to_owned)).collect();
    assert_eq!(refusal, "I will not.");

    // n = 2 with logprobs, streamed with usage.
    let body = r#"{"stream":true,"n":2,"logprobs":true,"top_logprobs":2,"stream_options":{"include_usage":true},"messages":[{"content":"x"}]}"#;
    let (res, _) = exchange(&mock, "/v1/chat/completions", body);
    let chunks = sse_data(&res);
    let mut text = [String::new(), String::new()];
    let mut finishes = 0;
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(
            (&c["system_fingerprint"], &c["service_tier"], &c["usage"]),
            (&serde_json::json!("fp_mock"), &serde_json::json!("default"), &Value::Null)
        );
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if let Some(t) = choice["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            text[i].push_str(t);
            assert_eq!(choice["logprobs"]["content"][0]["token"], t);
            assert_eq!(choice["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap().len(), 2);
        }
        finishes += usize::from(choice["finish_reason"] == "stop");
    }
    assert_eq!(text, ["tok0 tok1 tok2 ", "tok0-c1 tok1-c1 tok2-c1 "]);
    assert_eq!(finishes, 2);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 6);
    let v = mock.request("POST", "/v1/chat/completions", Some(r#"{"n":3,"messages":[{"content":"x"}]}"#)).json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 9);
}

#[test]
fn legacy_completions_streamed_and_not() {
    let mock = MockProv::start(&["--tokens", "3"]);
    let (res, rec) =
        exchange(&mock, "/v1/completions", r#"{"model":"inst","prompt":"Say this is a test","max_tokens":2}"#);
    assert_eq!(res.header_str("content-type"), Some("application/json"));
    assert_eq!(res.header_str("x-request-id"), Some(format!("req_mock_{}", rec["id"]).as_str()));
    let v = res.json();
    assert_eq!((&v["object"], &v["model"]), (&serde_json::json!("text_completion"), &serde_json::json!("inst")));
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-mock-"));
    assert_eq!(v["choices"][0]["text"], "tok0 tok1 ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);

    let body = r#"{"prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}"#;
    let (res, _) = exchange(&mock, "/v1/completions", body);
    assert_eq!(res.header_str("content-type"), Some("text/event-stream"));
    assert_eq!(res.events().last().unwrap().data, "[DONE]");
    let chunks = sse_data(&res);
    assert_eq!(chunks.len(), 3 * 2 + 2 + 1);
    let mut text = [String::new(), String::new()];
    for c in &chunks[..8] {
        assert_eq!(c["object"], "text_completion");
        let ch = &c["choices"][0];
        text[ch["index"].as_u64().unwrap() as usize].push_str(ch["text"].as_str().unwrap());
    }
    assert_eq!(text, ["tok0 tok1 tok2 ", "tok0-c1 tok1-c1 tok2-c1 "]);
    assert_eq!(
        (chunks[6]["choices"][0]["finish_reason"].as_str(), chunks[7]["choices"][0]["finish_reason"].as_str()),
        (Some("stop"), Some("stop"))
    );
    assert_eq!(
        (&chunks[8]["choices"], &chunks[8]["usage"]["completion_tokens"]),
        (&serde_json::json!([]), &serde_json::json!(6))
    );
    // Without include_usage, no usage chunk; errors and bad prompts as OpenAI.
    let (res, _) = exchange(&mock, "/v1/completions", r#"{"prompt":"x","stream":true}"#);
    assert!(sse_data(&res).iter().all(|c| c.get("usage").is_none() && !c["choices"].as_array().unwrap().is_empty()));
    let (res, _) = exchange(&mock, "/v1/completions", r#"{"prompt":"x","mock":{"error_status":429}}"#);
    assert_eq!((res.head.status, res.header_str("retry-after-ms")), (429, Some("7000")));
    let (res, _) = exchange(&mock, "/v1/completions", r#"{"model":"m"}"#);
    assert_eq!(res.head.status, 400);
    assert_eq!(mock.stats()["completions_requests"], 5);
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("bad base64 {c}"),
    };
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n = quad.iter().filter(|&&c| c != b'=').fold(0u32, |n, &c| (n << 6) | u32::from(val(c))) << (6 * pad);
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

#[test]
fn embeddings_openai_and_ollama() {
    let mock = MockProv::start(&[]);
    let (res, _) = exchange(&mock, "/v1/embeddings", r#"{"model":"text-embedding-3-small","input":["hello","world"]}"#);
    let v = res.json();
    assert_eq!((&v["object"], &v["model"]), (&serde_json::json!("list"), &serde_json::json!("text-embedding-3-small")));
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        (&v["data"][1]["object"], &v["data"][1]["index"]),
        (&serde_json::json!("embedding"), &serde_json::json!(1))
    );
    let floats: Vec<f32> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(floats.len(), 8);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= 2);
    assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
    // Deterministic, and base64 carries the same little-endian f32s.
    let (res, _) = exchange(&mock, "/v1/embeddings", r#"{"input":"hello","encoding_format":"base64"}"#);
    let bytes = base64_decode(res.json()["data"][0]["embedding"].as_str().unwrap());
    let decoded: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(decoded, floats);
    let (res, _) = exchange(&mock, "/v1/embeddings", r#"{"input":[[1,2,3]],"dimensions":16}"#);
    assert_eq!(res.json()["data"][0]["embedding"].as_array().unwrap().len(), 16);
    let (res, _) = exchange(&mock, "/v1/embeddings", r#"{"input":""}"#);
    assert_eq!(res.head.status, 400);

    let (res, _) = exchange(&mock, "/api/embed", r#"{"model":"all-minilm","input":["hello","x"]}"#);
    assert_eq!(res.header_str("content-type"), Some("application/json; charset=utf-8"));
    assert!(res.header_str("x-request-id").is_none(), "Ollama sends no OpenAI headers");
    let v = res.json();
    assert_eq!(v["model"], "all-minilm");
    let first: Vec<f32> = serde_json::from_value(v["embeddings"][0].clone()).unwrap();
    assert_eq!(first, floats, "same text, same vector on both APIs");
    assert!(v["total_duration"].as_u64().is_some() && v["load_duration"].as_u64().is_some());
    assert_eq!(v["prompt_eval_count"], 2);
    let (res, _) = exchange(&mock, "/api/embed", r#"{"input":"x"}"#);
    assert_eq!((res.head.status, res.json()), (400, serde_json::json!({"error": "model is required"})));
    let stats = mock.stats();
    assert_eq!((stats["embeddings_requests"].as_u64(), stats["ollama_requests"].as_u64()), (Some(4), Some(2)));
}

#[test]
fn responses_api_streamed_and_not() {
    let mock = MockProv::start(&["--tokens", "3"]);
    let (res, _) =
        exchange(&mock, "/v1/responses", r#"{"model":"gpt-4.1","input":"Tell me a story","instructions":"short"}"#);
    let v = res.json();
    assert_eq!(
        (&v["object"], &v["status"], &v["model"]),
        (&serde_json::json!("response"), &serde_json::json!("completed"), &serde_json::json!("gpt-4.1"))
    );
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let msg = &v["output"][0];
    assert_eq!(
        (&msg["type"], &msg["role"], &msg["status"]),
        (&serde_json::json!("message"), &serde_json::json!("assistant"), &serde_json::json!("completed"))
    );
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        msg["content"][0],
        serde_json::json!({"type":"output_text","annotations":[],"logprobs":[],"text":"tok0 tok1 tok2 "})
    );
    let u = &v["usage"];
    assert_eq!(
        (u["output_tokens"].as_u64(), u["total_tokens"].as_u64()),
        (Some(3), Some(u["input_tokens"].as_u64().unwrap() + 3))
    );
    assert_eq!(v["instructions"], "short");

    let (res, _) = exchange(&mock, "/v1/responses", r#"{"input":[{"role":"user","content":"hi"}],"stream":true}"#);
    assert_eq!(res.header_str("content-type"), Some("text/event-stream"));
    let events = res.events();
    assert!(events.iter().all(|e| e.data != "[DONE]"), "the Responses API sends no [DONE]");
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, e) in events.iter().enumerate() {
        let d = chunk(e);
        assert_eq!((d["type"].as_str(), d["sequence_number"].as_u64()), (e.event.as_deref(), Some(i as u64)));
    }
    let text: String = events[4..7].iter().map(|e| chunk(e)["delta"].as_str().unwrap().to_owned()).collect();
    assert_eq!(text, "tok0 tok1 tok2 ");
    assert_eq!(chunk(&events[10])["response"]["output"][0]["content"][0]["text"], text);
    // Cut by max_output_tokens: incomplete; aborted streams are recorded incomplete.
    let (res, _) = exchange(&mock, "/v1/responses", r#"{"input":"x","stream":true,"max_output_tokens":1}"#);
    assert_eq!(res.events().last().unwrap().event.as_deref(), Some("response.incomplete"));
    let body = r#"{"input":"x","stream":true,"mock":{"abort_after":1}}"#;
    let res = Response::parse(&mock.raw(&post("/v1/responses", "", body)));
    assert!(!res.complete);
    assert_recorded(&mock.last(), "/v1/responses", body, &res, false);
    assert_eq!(mock.stats()["responses_requests"], 4);
}

#[test]
fn ollama_chat_streamed_and_not() {
    let mock = MockProv::start(&["--tokens", "3", "--model", "llama3.2"]);
    let (res, _) = exchange(
        &mock,
        "/api/chat",
        r#"{"model":"llama3.2","messages":[{"role":"user","content":"why is the sky blue?"}]}"#,
    );
    assert_eq!(res.head.status, 200);
    assert_eq!(res.header_str("content-type"), Some("application/x-ndjson"));
    assert_eq!(res.header_str("transfer-encoding"), Some("chunked"));
    let lines = ndjson(&res);
    assert_eq!(lines.len(), 3 + 1);
    for (i, l) in lines[..3].iter().enumerate() {
        assert_eq!(l["model"], "llama3.2");
        assert!(l["created_at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(
            (&l["message"], &l["done"]),
            (&serde_json::json!({"role":"assistant","content":format!("tok{i} ")}), &serde_json::json!(false))
        );
    }
    let last = &lines[3];
    assert_eq!((&last["done"], &last["done_reason"]), (&serde_json::json!(true), &serde_json::json!("stop")));
    for key in
        ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"]
    {
        assert!(last[key].as_u64().is_some(), "{key}: {last}");
    }
    assert_eq!(last["eval_count"], 3);

    // Thinking first, capped by num_predict.
    let (res, _) = exchange(
        &mock,
        "/api/chat",
        r#"{"model":"qwen3","think":true,"options":{"num_predict":5},"messages":[{"role":"user","content":"x"}],"mock":{"reasoning":2}}"#,
    );
    let lines = ndjson(&res);
    let thinking: String = lines.iter().filter_map(|l| l["message"]["thinking"].as_str().map(str::to_owned)).collect();
    let content: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap().to_owned()).collect();
    assert_eq!((thinking.as_str(), content.as_str()), ("think0 think1 ", "tok0 tok1 tok2 "));
    assert_eq!(lines[0]["message"]["content"], "");
    let (res, _) =
        exchange(&mock, "/api/chat", r#"{"model":"m","options":{"num_predict":2},"messages":[{"content":"x"}]}"#);
    assert_eq!(ndjson(&res).last().unwrap()["done_reason"], "length");

    // Tool calls, whole, when the request has tools; then the second turn.
    let tools = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]"#;
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"weather in Paris?"}}],"tools":{tools},"mock":{{"tool_calls":2}}}}"#
    );
    let (res, _) = exchange(&mock, "/api/chat", &body);
    let lines = ndjson(&res);
    assert_eq!(lines.len(), 2);
    let calls = lines[0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1]["function"],
        serde_json::json!({"index":1,"name":"get_weather","arguments":{"city":"Paris","n":1}})
    );
    let body = format!(
        r#"{{"model":"m","stream":false,"tools":{tools},"mock":{{"tool_calls":2}},"messages":[{{"role":"user","content":"weather in Paris?"}},{{"role":"assistant","content":"","tool_calls":[{{"function":{{"name":"get_weather","arguments":{{"city":"Paris"}}}}}}]}},{{"role":"tool","content":"11 degrees","tool_name":"get_weather"}}]}}"#
    );
    let (res, _) = exchange(&mock, "/api/chat", &body);
    assert_eq!(res.header_str("content-type"), Some("application/json; charset=utf-8"));
    assert!(res.head.header("content-length").is_some());
    let v = res.json();
    assert_eq!(
        (&v["message"]["content"], &v["done"]),
        (&serde_json::json!("tool said: 11 degrees"), &serde_json::json!(true))
    );

    // Non-streamed plain answer, errors as Ollama sends them, an aborted stream.
    let (res, _) =
        exchange(&mock, "/api/chat", r#"{"model":"m","stream":false,"messages":[{"role":"user","content":"x"}]}"#);
    let v = res.json();
    assert_eq!(v["message"], serde_json::json!({"role":"assistant","content":"tok0 tok1 tok2 "}));
    assert_eq!((&v["done_reason"], &v["eval_count"]), (&serde_json::json!("stop"), &serde_json::json!(3)));
    let (res, _) =
        exchange(&mock, "/api/chat", r#"{"model":"x","messages":[{"content":"x"}],"mock":{"error_status":404}}"#);
    assert_eq!(
        (res.head.status, res.json()),
        (404, serde_json::json!({"error": "model \"x\" not found, try pulling it first"}))
    );
    let (res, _) = exchange(&mock, "/api/chat", r#"{"messages":[{"content":"x"}]}"#);
    assert_eq!((res.head.status, res.json()), (400, serde_json::json!({"error": "model is required"})));
    let body = r#"{"model":"m","messages":[{"content":"x"}],"mock":{"abort_after":1}}"#;
    let res = Response::parse(&mock.raw(&post("/api/chat", "", body)));
    assert!(!res.complete);
    assert_eq!(String::from_utf8_lossy(&res.body).lines().count(), 1);
    assert_recorded(&mock.last(), "/api/chat", body, &res, false);
    let stats = mock.stats();
    assert_eq!((stats["ollama_requests"].as_u64(), stats["requests"].as_u64()), (Some(9), Some(0)));
    assert_eq!(stats["aborted"], 1);
}

#[test]
fn ollama_model_endpoints() {
    let mock = MockProv::start(&["--model", "llama3.2"]);
    let res = mock.request("GET", "/api/tags", None);
    assert_eq!((res.head.status, res.header_str("content-type")), (200, Some("application/json; charset=utf-8")));
    let m = &res.json()["models"][0];
    assert_eq!(
        (&m["name"], &m["model"]),
        (&serde_json::json!("llama3.2:latest"), &serde_json::json!("llama3.2:latest"))
    );
    assert!(m["size"].as_u64().is_some() && m["digest"].as_str().is_some() && m["details"]["family"].is_string());
    assert!(m["modified_at"].as_str().is_some());
    let m = &mock.request("GET", "/api/ps", None).json()["models"][0];
    assert!(m["expires_at"].as_str().unwrap().ends_with('Z'));
    assert!(m["size_vram"].as_u64().is_some());
    let v = mock.request("POST", "/api/show", Some(r#"{"model":"llama3.2"}"#)).json();
    assert_eq!(v["capabilities"], serde_json::json!(["completion", "tools"]));
    for key in ["modelfile", "parameters", "template"] {
        assert!(v[key].is_string(), "{key}");
    }
    assert!(v["details"].is_object() && v["model_info"].is_object());
    let res = mock.request("POST", "/api/show", Some("{}"));
    assert_eq!((res.head.status, res.json()), (400, serde_json::json!({"error": "model is required"})));
    assert!(mock.request("GET", "/api/version", None).json()["version"].is_string());
    assert_eq!(mock.request("GET", "/api/chat", None).head.status, 405);
    assert_eq!(mock.request("GET", "/last", None).head.status, 404, "metadata requests are not recorded");
}

/// Time until the first response byte of `body` posted to `path`, and the whole response.
fn first_byte_after(mock: &MockProv, path: &str, body: &str) -> (Duration, Response) {
    let mut s = mock.connect();
    let started = Instant::now();
    s.write_all(&post(path, "", body)).unwrap();
    let mut first = [0u8; 1];
    s.read_exact(&mut first).unwrap();
    let ttfb = started.elapsed();
    let mut raw = first.to_vec();
    s.read_to_end(&mut raw).unwrap();
    (ttfb, Response::parse(&raw))
}

#[test]
fn ttft_delays_ollama_heads_but_not_openai_heads() {
    let mock = MockProv::start(&["--tokens", "2", "--ttft-ms", "300"]);
    let (ttfb, res) =
        first_byte_after(&mock, "/v1/chat/completions", r#"{"stream":true,"messages":[{"content":"x"}]}"#);
    assert!(ttfb < Duration::from_millis(250), "OpenAI-style head and role chunk come at once: {ttfb:?}");
    assert!(res.complete);
    let (ttfb, res) = first_byte_after(&mock, "/api/chat", r#"{"model":"m","messages":[{"content":"x"}]}"#);
    assert!(ttfb >= Duration::from_millis(300), "Ollama writes its head with the first line: {ttfb:?}");
    assert_eq!(ndjson(&res).len(), 3);
}

/// The header lines an Anthropic SDK sends.
const ANTHROPIC_HEADERS: &str = "Content-Type: application/json\r\nx-api-key: sk-ant-test\r\n\
    anthropic-version: 2023-06-01\r\nanthropic-beta: interleaved-thinking-2025-05-14\r\n";

/// POSTs `body` to `path` with [`ANTHROPIC_HEADERS`]; the answer and its `/last` record.
fn anthropic_exchange(mock: &MockProv, path: &str, body: &str) -> (Response, Value) {
    let res = Response::parse(&mock.raw(&post(path, ANTHROPIC_HEADERS, body)));
    let rec = mock.last();
    assert_recorded(&rec, path, body, &res, true);
    let headers: Vec<(String, String)> = serde_json::from_value(rec["headers"].clone()).unwrap();
    for (name, value) in [("anthropic-version", "2023-06-01"), ("anthropic-beta", "interleaved-thinking-2025-05-14")] {
        assert!(headers.contains(&(name.to_owned(), value.to_owned())), "{name} recorded: {headers:?}");
    }
    (res, rec)
}

#[test]
fn anthropic_messages_with_thinking_and_tool_use_streamed_and_not() {
    let mock = MockProv::start(&["--tokens", "3"]);
    let request = |stream: bool| {
        format!(
            r#"{{"model":"claude-test","max_tokens":4096,"stream":{stream},"system":"You check the weather.",
                "thinking":{{"type":"enabled","budget_tokens":2048}},"stop_sequences":["END"],
                "tools":[{{"name":"get_forecast","description":"d","input_schema":{{"type":"object"}}}}],
                "messages":[{{"role":"user","content":[{{"type":"text","text":"Weather in Paris?"}}]}}],
                "mock":{{"tool_calls":2,"reasoning":3}}}}"#
        )
    };

    let (res, _) = anthropic_exchange(&mock, "/v1/messages", &request(false));
    assert_eq!(res.head.status, 200);
    assert_eq!(res.header_str("content-type"), Some("application/json"));
    let request_id = res.header_str("request-id").unwrap();
    assert!(request_id.starts_with("req_mock_"), "{request_id}");
    let whole = res.json();
    assert_eq!(
        (&whole["type"], &whole["role"], &whole["model"]),
        (&serde_json::json!("message"), &serde_json::json!("assistant"), &serde_json::json!("claude-test"))
    );
    assert!(whole["id"].as_str().unwrap().starts_with("msg_mock_"));
    assert_eq!((&whole["stop_reason"], &whole["stop_sequence"]), (&serde_json::json!("tool_use"), &Value::Null));
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], "think0 think1 think2 ");
    assert!(!content[0]["signature"].as_str().unwrap().is_empty());
    for (i, block) in content[1..].iter().enumerate() {
        assert_eq!(
            (&block["type"], &block["name"]),
            (&serde_json::json!("tool_use"), &serde_json::json!("get_forecast"))
        );
        assert!(block["id"].as_str().unwrap().starts_with("toolu_mock_"));
        assert_eq!(block["input"], serde_json::json!({"city": "Paris", "n": i}));
    }
    let input_tokens = whole["usage"]["input_tokens"].as_u64().unwrap();
    let output_tokens = whole["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(output_tokens, 3 + 2 * 9, "thinking tokens and the tool inputs' fragments");

    // count_tokens agrees with the answer's input tokens (for the same body).
    let (res, _) = anthropic_exchange(&mock, "/v1/messages/count_tokens", &request(false));
    assert_eq!(res.json(), serde_json::json!({"input_tokens": input_tokens}));
    assert!(res.header_str("request-id").is_some());

    let (res, _) = anthropic_exchange(&mock, "/v1/messages", &request(true));
    assert_eq!(res.head.status, 200);
    assert_eq!(res.header_str("content-type"), Some("text/event-stream"));
    assert!(res.header_str("request-id").unwrap().starts_with("req_mock_"));
    let events = res.events();
    assert!(events.iter().all(|e| e.data != "[DONE]"), "Anthropic sends no [DONE]");
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    let mut want = vec!["message_start", "ping"];
    // Thinking: start, 3 thinking deltas, the signature, stop; each tool use: start, 9 fragments, stop.
    want.extend(["content_block_start"].into_iter().chain(["content_block_delta"; 4]).chain(["content_block_stop"]));
    for _ in 0..2 {
        want.extend(
            ["content_block_start"].into_iter().chain(["content_block_delta"; 9]).chain(["content_block_stop"]),
        );
    }
    want.extend(["message_delta", "message_stop"]);
    assert_eq!(names, want);
    let data: Vec<Value> = events.iter().map(chunk).collect();
    for (e, d) in events.iter().zip(&data) {
        assert_eq!(d["type"].as_str(), e.event.as_deref(), "the data's type names the event");
    }
    let start = &data[0]["message"];
    assert_eq!((&start["content"], &start["stop_reason"]), (&serde_json::json!([]), &Value::Null));
    assert_eq!(start["usage"]["input_tokens"].as_u64(), Some(input_tokens), "as the whole answer reports");
    assert_eq!(start["usage"]["output_tokens"], 1);
    assert_eq!(start["model"], "claude-test");

    // Reassemble the blocks from the deltas.
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    for d in &data[2..data.len() - 2] {
        let index = d["index"].as_u64().unwrap() as usize;
        match d["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!(index, blocks.len(), "blocks open in order");
                blocks.push(d["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let delta = &d["delta"];
                let block = &mut blocks[index];
                match delta["type"].as_str().unwrap() {
                    "thinking_delta" => {
                        let text = block["thinking"].as_str().unwrap().to_owned() + delta["thinking"].as_str().unwrap();
                        block["thinking"] = text.into();
                    }
                    "signature_delta" => block["signature"] = delta["signature"].clone(),
                    "input_json_delta" => partial[index].push_str(delta["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                if blocks[index]["type"] == "tool_use" {
                    blocks[index]["input"] = serde_json::from_str(&partial[index]).unwrap();
                }
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[0]["thinking"], content[0]["thinking"]);
    assert!(!blocks[0]["signature"].as_str().unwrap().is_empty());
    assert!(partial[1].len() > 1 && data.iter().filter(|d| d["delta"]["type"] == "input_json_delta").count() == 18);
    for (streamed, whole) in blocks[1..].iter().zip(&content[1..]) {
        assert_eq!((&streamed["input"], &streamed["name"]), (&whole["input"], &whole["name"]), "same tool input");
    }
    let delta = &data[data.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(output_tokens));

    // max_tokens caps with "max_tokens"; error overrides answer in Anthropic's shape.
    let (res, _) = anthropic_exchange(
        &mock,
        "/v1/messages",
        r#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let v = res.json();
    assert_eq!(
        (&v["stop_reason"], &v["content"][0]["text"]),
        (&serde_json::json!("max_tokens"), &serde_json::json!("tok0 tok1 "))
    );
    let (res, _) = anthropic_exchange(
        &mock,
        "/v1/messages",
        r#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"mock":{"error_status":429}}"#,
    );
    assert_eq!((res.head.status, res.header_str("retry-after")), (429, Some("7")));
    assert_eq!(
        res.json(),
        serde_json::json!({"type":"error","error":{"type":"rate_limit_error","message":"mock provider error"}})
    );
    let res =
        mock.request("POST", "/v1/messages", Some(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#));
    assert_eq!(res.head.status, 400);
    assert_eq!(res.json()["error"]["type"], "invalid_request_error");
    let stats = mock.stats();
    assert_eq!((stats["messages_requests"].as_u64(), stats["count_tokens_requests"].as_u64()), (Some(5), Some(1)));
}

#[test]
fn without_turns_native_routes_into_unknown_paths() {
    let messages = r#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
    let mock = MockProv::start(&["--without", "messages"]);
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let res = mock.request("POST", path, Some(messages));
        assert_eq!(res.head.status, 404, "{path}");
        assert_eq!(res.json(), mock.request("POST", "/v1/nope", Some(messages)).json(), "as an unknown path");
    }
    assert_eq!(mock.request("POST", "/v1/responses", Some(r#"{"input":"x"}"#)).head.status, 200);
    assert_eq!(
        mock.request("POST", "/v1/chat/completions", Some(r#"{"messages":[{"content":"x"}]}"#)).head.status,
        200
    );
    assert_eq!(mock.stats()["messages_requests"], 0);

    let mock = MockProv::start(&["--without", "messages,responses"]);
    assert_eq!(mock.request("POST", "/v1/responses", Some(r#"{"input":"x"}"#)).head.status, 404);
    assert_eq!(mock.request("POST", "/v1/messages", Some(messages)).head.status, 404);
    let mock = MockProv::start(&[]);
    assert_eq!(mock.request("POST", "/v1/messages", Some(messages)).head.status, 200);
}

/// A file in the temp directory, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("iop-mockprov-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const SCRIPT: &str = r#"{"scripts": {"t1": {
    "plan": [{"content": "{\"plan\":\"write a\",\"verification\":\"cat a\"}"}],
    "work": [
        {"tool_calls": [{"name": "workspace_write", "arguments": {"path": "a", "content": "x"}}]},
        {"content": "wrote a; cat a showed x"}
    ],
    "review": [{"content": "{\"verdict\":\"approve\",\"findings\":\"done\"}", "delay_ms": 150}]
}}}"#;

/// A coordinator-style chat request: `rf` names the json_schema (plan,
/// review) or is `None` (work, with tools); `extra` messages follow the task.
fn staged(rf: Option<&str>, extra: &str, stream: bool) -> String {
    let tail = match rf {
        Some(name) => format!(
            r#""response_format":{{"type":"json_schema","json_schema":{{"name":"{name}","strict":true,"schema":{{"type":"object"}}}}}}"#
        ),
        None => {
            r#""tools":[{"type":"function","function":{"name":"workspace_write"}}],"tool_choice":"auto""#.to_owned()
        }
    };
    format!(
        r#"{{"model":"g","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"system","content":"stage"}},{{"role":"user","content":[{{"type":"text","text":"task [script:t1]"}}]}}{extra}],{tail}}}"#
    )
}

#[test]
fn script_answers_plan_work_and_review_in_order() {
    let file = TempFile::new("script.json", SCRIPT);
    let mock = MockProv::start(&["--script", file.path()]);
    let path = "/v1/chat/completions";
    let content = |res: &Response| -> String {
        sse_data(res).iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect()
    };

    // Plan, streamed as the node's openai-compatible adapter asks.
    let (res, _) = exchange(&mock, path, &staged(Some("iop_plan"), "", true));
    assert_eq!(content(&res), r#"{"plan":"write a","verification":"cat a"}"#);
    let chunks = sse_data(&res);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "stop");
    assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().is_some());
    assert_eq!(res.events().last().unwrap().data, "[DONE]");

    // Work, turn 1 (whole): a tool call.
    let (res, rec) = exchange(&mock, path, &staged(None, "", false));
    let c = &res.json()["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(
        (&call["id"], &call["function"]["name"]),
        (&serde_json::json!("call_1"), &serde_json::json!("workspace_write"))
    );
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, serde_json::json!({"path": "a", "content": "x"}));
    let sent: Value = serde_json::from_str(rec["request_body"].as_str().unwrap()).unwrap();
    assert!(sent.get("reasoning_effort").is_none(), "the record shows what the work request carried");

    // Work, turn 2 (streamed), after the tool result: the report.
    let turn = r#",{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"workspace_write","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"ok"}"#;
    let (res, _) = exchange(&mock, path, &staged(None, turn, true));
    assert_eq!(content(&res), "wrote a; cat a showed x");

    // Review, after its delay.
    let started = Instant::now();
    let (res, _) = exchange(&mock, path, &staged(Some("iop_review"), "", false));
    assert!(started.elapsed() >= Duration::from_millis(150), "{:?}", started.elapsed());
    assert_eq!(res.json()["choices"][0]["message"]["content"], r#"{"verdict":"approve","findings":"done"}"#);

    // A stage asked once too often fails loudly; unscripted requests are generated as ever.
    let res = mock.request("POST", path, Some(&staged(Some("iop_review"), "", false)));
    assert_eq!(res.head.status, 500);
    assert_eq!(res.json()["error"]["message"], "script t1 stage review exhausted");
    let res = mock.request(
        "POST",
        path,
        Some(r#"{"messages":[{"role":"user","content":"[script:nope]"}],"mock":{"tokens":2}}"#),
    );
    assert_eq!(res.json()["choices"][0]["message"]["content"], "tok0 tok1 ");
}

#[test]
fn a_bad_script_file_stops_the_mock_naming_it() {
    let file = TempFile::new("bad-script.json", r#"{"scripts": {"t": {"plan": [{"contnet": "x"}]}}}"#);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iop-mockprov"))
        .args(["--listen", "127.0.0.1:0", "--script", file.path()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "never announced");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("script file {}", file.path())) && err.contains("unknown field `contnet`"), "{err}");
}
