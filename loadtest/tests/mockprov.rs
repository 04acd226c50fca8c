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
