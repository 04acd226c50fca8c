//! The exchange log behind `GET /last` and `GET /log`: for the last
//! [`CAPACITY`] model requests, what came in (method, target, headers with
//! their names as received, the raw body) and what went out (status, head,
//! and the SHA-256 of the exact entity bytes written, chunked framing
//! removed). Gateway tests compare these with what their client saw.
//!
//! The hot path stays cheap: the request head and body are kept as the
//! connection already holds them (reference-counted), header lists are only
//! parsed when a record is rendered, and the response is hashed
//! incrementally as it is written ([`BodyHasher`]).

use std::collections::VecDeque;

use bytes::Bytes;
use iop_core::http::HeaderName;
use ring::digest;
use serde::Serialize;

use super::json::{hex, sha256};

/// Records kept.
pub const CAPACITY: usize = 64;
/// Larger request bodies are recorded as digest and length only.
pub const MAX_KEPT_BODY: usize = 1 << 20;

/// The request headers of a record.
#[derive(Debug, Clone)]
pub enum RequestHeaders {
    /// The head as received (request line, header lines, blank line).
    Raw(Bytes),
    /// Parsed pairs, names lower-cased (when the raw head was not available).
    Parsed(Vec<(HeaderName, Bytes)>),
}

#[derive(Debug, Clone)]
enum RequestBody {
    Kept(Bytes),
    Digest { sha: [u8; 32], len: usize },
}

/// One request and its answer.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// Sequence number of the model request (`x-request-id: req_mock_<id>`).
    pub id: u64,
    method: String,
    target: String,
    headers: RequestHeaders,
    body: RequestBody,
    response_status: Option<u16>,
    response_head: Option<Bytes>,
    response_sha: Option<[u8; 32]>,
    response_bytes: u64,
    complete: bool,
    finished: bool,
}

impl Exchange {
    /// A request that has just arrived (no answer yet).
    pub fn new(id: u64, method: &str, target: &str, headers: RequestHeaders, body: Bytes) -> Self {
        let body = if body.len() > MAX_KEPT_BODY {
            RequestBody::Digest { sha: sha256(&body), len: body.len() }
        } else {
            RequestBody::Kept(body)
        };
        Self {
            id,
            method: method.to_owned(),
            target: target.to_owned(),
            headers,
            body,
            response_status: None,
            response_head: None,
            response_sha: None,
            response_bytes: 0,
            complete: false,
            finished: false,
        }
    }

    /// The response head was written: its status and its bytes.
    pub fn set_response_head(&mut self, status: u16, head: Bytes) {
        self.response_status = Some(status);
        self.response_head = Some(head);
    }

    /// The exchange is over: digest and length of the entity bytes written,
    /// and whether the answer was written to its end.
    pub fn finish(&mut self, sha: [u8; 32], bytes: u64, complete: bool) {
        self.response_sha = Some(sha);
        self.response_bytes = bytes;
        self.complete = complete;
        self.finished = true;
    }

    /// A write that was counted as complete failed after all.
    pub fn mark_incomplete(&mut self) {
        self.complete = false;
    }

    /// The record as JSON, keys in a fixed order.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.view()).unwrap_or_else(|_| "null".to_owned())
    }

    fn view(&self) -> RecordJson<'_> {
        let headers = match &self.headers {
            RequestHeaders::Raw(raw) => head_fields(raw),
            RequestHeaders::Parsed(pairs) => {
                pairs.iter().map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v).into_owned())).collect()
            }
        };
        let (request_body, request_body_bytes, request_body_sha256) = match &self.body {
            RequestBody::Kept(b) => (Some(String::from_utf8_lossy(b).into_owned()), b.len(), hex(&sha256(b))),
            RequestBody::Digest { sha, len } => (None, *len, hex(sha)),
        };
        RecordJson {
            id: self.id,
            method: &self.method,
            path: &self.target,
            headers,
            request_body,
            request_body_bytes,
            request_body_sha256,
            response_status: self.response_status,
            response_headers: self.response_head.as_deref().map(head_fields).unwrap_or_default(),
            response_body_sha256: self.response_sha.map(|s| hex(&s)),
            response_body_bytes: self.response_bytes,
            complete: self.complete,
            finished: self.finished,
        }
    }
}

#[derive(Serialize)]
struct RecordJson<'a> {
    id: u64,
    method: &'a str,
    path: &'a str,
    headers: Vec<(String, String)>,
    request_body: Option<String>,
    request_body_bytes: usize,
    request_body_sha256: String,
    response_status: Option<u16>,
    response_headers: Vec<(String, String)>,
    response_body_sha256: Option<String>,
    response_body_bytes: u64,
    complete: bool,
    finished: bool,
}

/// The header lines of an HTTP head (its first line skipped), names as they
/// are written, values without surrounding whitespace.
pub fn head_fields(raw: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(raw)
        .split('\n')
        .skip(1)
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
        .collect()
}

/// The last [`CAPACITY`] exchanges, oldest first.
#[derive(Debug, Default)]
pub struct ExchangeLog {
    entries: VecDeque<Exchange>,
}

impl ExchangeLog {
    /// Adds a new exchange, dropping the oldest beyond [`CAPACITY`].
    pub fn push(&mut self, exchange: Exchange) {
        if self.entries.len() >= CAPACITY {
            self.entries.pop_front();
        }
        self.entries.push_back(exchange);
    }

    /// The exchange `id`, if it is still kept.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Exchange> {
        self.entries.iter_mut().rev().find(|e| e.id == id)
    }

    /// `GET /last`: the most recent exchange.
    pub fn last_json(&self) -> Option<String> {
        self.entries.back().map(Exchange::to_json)
    }

    /// `GET /log`: every kept exchange, oldest first.
    pub fn log_json(&self) -> String {
        let views: Vec<RecordJson<'_>> = self.entries.iter().map(Exchange::view).collect();
        serde_json::to_string(&views).unwrap_or_else(|_| "[]".to_owned())
    }
}

/// SHA-256 and length of a response body, fed as it is written.
pub struct BodyHasher {
    ctx: digest::Context,
    bytes: u64,
}

impl std::fmt::Debug for BodyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyHasher").field("bytes", &self.bytes).finish()
    }
}

impl Default for BodyHasher {
    fn default() -> Self {
        Self { ctx: digest::Context::new(&digest::SHA256), bytes: 0 }
    }
}

impl BodyHasher {
    /// Feeds written entity bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.ctx.update(data);
        self.bytes += data.len() as u64;
    }

    /// Digest and length of everything fed.
    pub fn finish(self) -> ([u8; 32], u64) {
        let mut sha = [0u8; 32];
        sha.copy_from_slice(self.ctx.finish().as_ref());
        (sha, self.bytes)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn exchange(id: u64, body: &[u8]) -> Exchange {
        let raw =
            Bytes::from_static(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Mixed-Case:  v 1 \r\n\r\n");
        Exchange::new(id, "POST", "/v1/chat/completions?x=1", RequestHeaders::Raw(raw), Bytes::copy_from_slice(body))
    }

    #[test]
    fn records_request_and_response() {
        let mut e = exchange(3, b"{\"a\":1}");
        assert!(e.to_json().starts_with(r#"{"id":3,"method":"POST","path":"#), "declared order");
        let v: Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["headers"], json!([["Host", "a"], ["X-Mixed-Case", "v 1"]]));
        assert_eq!(
            (v["path"].as_str(), v["request_body"].as_str()),
            (Some("/v1/chat/completions?x=1"), Some("{\"a\":1}"))
        );
        assert_eq!(v["request_body_sha256"], hex(&sha256(b"{\"a\":1}")));
        assert_eq!(
            (&v["response_status"], &v["response_body_sha256"], &v["finished"]),
            (&Value::Null, &Value::Null, &json!(false))
        );

        e.set_response_head(200, Bytes::from_static(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"));
        let mut h = BodyHasher::default();
        h.update(b"data: ");
        h.update(b"[DONE]\n\n");
        let (sha, n) = h.finish();
        e.finish(sha, n, true);
        let v: Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!((v["response_status"].as_u64(), v["response_body_bytes"].as_u64()), (Some(200), Some(14)));
        assert_eq!(v["response_headers"], json!([["content-type", "text/event-stream"]]));
        assert_eq!(v["response_body_sha256"], hex(&sha256(b"data: [DONE]\n\n")));
        assert_eq!((&v["complete"], &v["finished"]), (&json!(true), &json!(true)));
        e.mark_incomplete();
        assert!(e.to_json().contains("\"complete\":false"));
        assert_eq!(hex(&BodyHasher::default().finish().0), EMPTY_SHA);

        let parsed = Exchange::new(
            1,
            "GET",
            "/",
            RequestHeaders::Parsed(vec![(HeaderName::from_static("host"), Bytes::from_static(b"x"))]),
            Bytes::new(),
        );
        let v: Value = serde_json::from_str(&parsed.to_json()).unwrap();
        assert_eq!((&v["headers"], &v["request_body_sha256"]), (&json!([["host", "x"]]), &json!(EMPTY_SHA)));
    }

    #[test]
    fn large_bodies_keep_only_their_digest() {
        let big = vec![b'a'; MAX_KEPT_BODY + 1];
        let v: Value = serde_json::from_str(&exchange(1, &big).to_json()).unwrap();
        assert_eq!((&v["request_body"], v["request_body_bytes"].as_u64()), (&Value::Null, Some(big.len() as u64)));
        assert_eq!(v["request_body_sha256"], hex(&sha256(&big)));
        // Invalid UTF-8 is recorded lossily (the digest is of the raw bytes).
        let v: Value = serde_json::from_str(&exchange(1, b"\xff{}").to_json()).unwrap();
        assert_eq!(v["request_body"], "\u{fffd}{}");
        assert_eq!(v["request_body_sha256"], hex(&sha256(b"\xff{}")));
    }

    #[test]
    fn log_is_bounded_and_ordered() {
        let mut log = ExchangeLog::default();
        assert!(log.last_json().is_none());
        assert_eq!(log.log_json(), "[]");
        for id in 1..=CAPACITY as u64 + 6 {
            log.push(exchange(id, b"{}"));
        }
        let all: Value = serde_json::from_str(&log.log_json()).unwrap();
        let ids: Vec<u64> = all.as_array().unwrap().iter().map(|e| e["id"].as_u64().unwrap()).collect();
        assert_eq!(ids, (7..=CAPACITY as u64 + 6).collect::<Vec<_>>());
        let last: Value = serde_json::from_str(&log.last_json().unwrap()).unwrap();
        assert_eq!(last["id"], CAPACITY as u64 + 6);
        assert!(log.get_mut(3).is_none());
        assert!(log.get_mut(10).is_some());
    }

    #[test]
    fn head_fields_handle_bare_lf_and_odd_lines() {
        assert_eq!(
            head_fields(b"GET / HTTP/1.1\nA: 1\nb:2\n\nbody: no"),
            [("A".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert!(head_fields(b"").is_empty());
    }
}
