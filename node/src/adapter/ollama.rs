//! Ollama's native API: chat runs as `POST {base_url}/api/chat` (an NDJSON
//! stream when the client streams, else one JSON object),
//! embeddings runs as `POST {base_url}/api/embed`, and a few read-only
//! model-management calls for operators ([`OllamaAdapter::native_api`]).
//!
//! The OpenAI request is translated by `ollama_request` (which
//! refuses what Ollama cannot honour) and the answer mapped by
//! `ollama_stream`; this module does the HTTP: timeouts, status
//! errors, bounded reads.

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    config::{Secret, UpstreamUrl},
    exec::{codes, ExecEvent, FailureSource, RunFailure},
};

use super::{
    ollama_request::{chat_body, embed_body, ChatBody},
    ollama_stream::{embed_events, ChatStream, LineSplitter, MAX_LINE_BYTES},
    openai_compat::{drain, emit_all, emit_read, is_json, Halt},
    openai_stream::{protocol, retry_after_ms, status_failure, Flow},
};
use crate::{
    run::{EventSink, Operation, RunSpec},
    upstream::{Request, Response, UpstreamClient},
};

/// Most of a non-2xx body read for its error message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most of a JSON (non-NDJSON) chat answer accepted.
const MAX_JSON_BODY: usize = 16 * 1024 * 1024;
/// Most of an `/api/embed` answer accepted (about 400 vectors of 4096
/// dimensions as JSON text).
const MAX_EMBED_BODY: usize = 32 * 1024 * 1024;
/// Most of a native API answer accepted (`/api/show` carries the template
/// and the model's metadata).
const MAX_NATIVE_BODY: usize = 4 * 1024 * 1024;
/// Upper bound of a native API call (also bounded by the provider's
/// `request_timeout_sec`).
/// Bound for one native API call: under the edge's 10 s command timeout,
/// so a slow Ollama gets its own 504 rather than the edge's.
const NATIVE_API_TIMEOUT: Duration = Duration::from_secs(8);
/// The native API calls operators may make: read-only ones.
pub const NATIVE_API_ALLOWED: &[(&str, &str)] = &[("GET", "/api/tags"), ("GET", "/api/ps"), ("POST", "/api/show")];

/// An Ollama server.
#[derive(Debug)]
pub struct OllamaAdapter {
    id: String,
    url: UpstreamUrl,
    /// `{prefix}/api/chat`.
    chat_path: String,
    /// `{prefix}/api/embed`.
    embed_path: String,
    /// `Bearer <key>` (for an Ollama behind an authenticating proxy), never
    /// logged (Secret's Debug prints ***).
    authorization: Option<Secret>,
    max_concurrency: u32,
    request_timeout: Duration,
    client: UpstreamClient,
    /// TLS of an https Ollama (behind a proxy).
    tls: Option<iop_core::net::tls::ClientTls>,
}

impl OllamaAdapter {
    /// An Ollama server at `url` (its root, e.g. `http://127.0.0.1:11434`),
    /// sending requests through `client`.
    pub fn new(
        id: String,
        url: UpstreamUrl,
        api_key: Option<&str>,
        max_concurrency: u32,
        request_timeout: Duration,
        client: UpstreamClient,
    ) -> Self {
        let prefix = url.path_prefix.trim_end_matches('/');
        let chat_path = format!("{prefix}/api/chat");
        let embed_path = format!("{prefix}/api/embed");
        let authorization = api_key.map(|k| Secret::new(format!("Bearer {k}")));
        Self { id, url, chat_path, embed_path, authorization, max_concurrency, request_timeout, client, tls: None }
    }

    /// The same adapter, with TLS for its https URL.
    pub fn with_tls(mut self, tls: Option<iop_core::net::tls::ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    /// Provider id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Concurrent runs admitted.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// The upstream client (and its pool).
    pub fn client(&self) -> &UpstreamClient {
        &self.client
    }

    /// Its health probe: Ollama's model list.
    pub(super) fn probe(&self) -> super::health::Probe<'_> {
        super::health::Probe {
            client: &self.client,
            url: &self.url,
            tls: self.tls.as_ref(),
            authorization: self.authorization.as_ref().map(|a| a.expose()),
            list: "/api/tags",
            provider: &self.id,
        }
    }

    /// Runs one chat completion or embeddings request for `spec`.
    pub async fn execute<S: EventSink>(&self, spec: RunSpec, sink: &mut S) {
        let attempt = async {
            match spec.operation {
                Operation::Chat => self.chat(&spec, sink).await,
                Operation::Embeddings => self.embed(&spec, sink).await,
                // Ollama has no tokenizer endpoint (the adapter enum answers first).
                Operation::Tokenize => Err(Halt::Fail(super::tokenize::unsupported(&self.id))),
            }
        };
        let failure = match iop_core::rt::time::timeout(self.request_timeout, attempt).await {
            Ok(Ok(())) | Ok(Err(Halt::Sink)) => return,
            Ok(Err(Halt::Fail(f))) => f,
            // The attempt (and its connection) was dropped.
            Err(_) => timeout_failure(self.request_timeout),
        };
        tracing::debug!(run_id = %spec.run_id, provider = %self.id, code = failure.code, status = failure.status, "run failed");
        let _ = sink.emit(ExecEvent::Error(failure)).await;
    }

    /// Posts to `/api/chat` and emits everything, the terminal included,
    /// except for the failures it returns.
    async fn chat<S: EventSink>(&self, spec: &RunSpec, sink: &mut S) -> Result<(), Halt> {
        let ChatBody { body, stream } = chat_body(&spec.body, &spec.target).map_err(Halt::Fail)?;
        let accept: &[u8] = if stream { b"application/x-ndjson" } else { b"application/json" };
        let mut resp = self.post(&self.chat_path, &body, accept, spec).await?;
        // Sent: not kept while the answer streams.
        drop(body);
        let mut state = ChatStream::new(&spec.run_id, &spec.target);
        let mut out = Vec::new();
        if is_json(&resp) {
            let (body, truncated) =
                resp.read_to_end(MAX_JSON_BODY).await.map_err(|e| Halt::Fail(protocol(e.to_string())))?;
            if truncated {
                return Err(Halt::Fail(protocol(format!("upstream answer exceeds {MAX_JSON_BODY} bytes"))));
            }
            state.on_body(&body, &mut out);
            return emit_all(sink, &mut out).await;
        }
        let mut lines = LineSplitter::new(MAX_LINE_BYTES);
        loop {
            // Emitted: the events' room goes back while the provider thinks
            // (kept by this core for the next read of any stream).
            crate::spare::keep_events(std::mem::take(&mut out));
            let eof = match resp.chunk().await {
                Ok(Some(bytes)) => {
                    lines.push(&bytes);
                    false
                }
                Ok(None) => true,
                Err(e) => return Err(Halt::Fail(protocol(format!("upstream stream broke: {e}")))),
            };
            out = crate::spare::events();
            let flow = emit_read(sink, &mut out, |out| {
                let line = if eof { lines.finish() } else { lines.next_line() };
                line.map(|line| line.map(|line| state.on_line(&line, out)))
            })
            .await?;
            if flow == Flow::Done {
                drain(&mut resp).await;
                return Ok(());
            }
            if eof {
                state.on_eof(&mut out);
                return emit_all(sink, &mut out).await;
            }
        }
    }

    /// Posts to `/api/embed` and emits the vectors and the terminal.
    async fn embed<S: EventSink>(&self, spec: &RunSpec, sink: &mut S) -> Result<(), Halt> {
        let (body, inputs) = embed_body(&spec.body, &spec.target).map_err(Halt::Fail)?;
        let mut resp = self.post(&self.embed_path, &body, b"application/json", spec).await?;
        let (body, truncated) =
            resp.read_to_end(MAX_EMBED_BODY).await.map_err(|e| Halt::Fail(protocol(e.to_string())))?;
        if truncated {
            return Err(Halt::Fail(protocol(format!("upstream embeddings answer exceeds {MAX_EMBED_BODY} bytes"))));
        }
        let mut out = embed_events(&body, &spec.target, inputs);
        emit_all(sink, &mut out).await
    }

    /// Sends one POST; a non-2xx answer is the failure it returns.
    async fn post(&self, path: &str, body: &[u8], accept: &[u8], spec: &RunSpec) -> Result<Response, Halt> {
        let run_id = &spec.run_id;
        let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json"), ("accept", accept)];
        // A leased credential (managed mode) before the configured one.
        if let Some(auth) = spec.credential.as_ref().or(self.authorization.as_ref()) {
            headers.push(("authorization", auth.expose().as_bytes()));
        }
        let req = Request {
            method: "POST",
            host: &self.url.host,
            port: self.url.port,
            target: path,
            headers: &headers,
            body,
            tls: self.tls.as_ref(),
        };
        let mut resp = self.send(&req, run_id).await.map_err(Halt::Fail)?;
        let status = resp.status();
        if !(200..=299).contains(&status) {
            // An unreadable error body still leaves the status to report.
            let retry = retry_after_ms(resp.header("retry-after-ms"), resp.header("retry-after"));
            let body = resp.read_to_end(MAX_ERROR_BODY).await.map(|(b, _)| b).unwrap_or_default();
            return Err(Halt::Fail(status_failure(status, &body, retry)));
        }
        Ok(resp)
    }

    /// Sends `req`; connect errors never carry the provider's address.
    async fn send(&self, req: &Request<'_>, run_id: &str) -> Result<Response, RunFailure> {
        super::send_upstream(&self.client, req, &self.id, run_id).await
    }

    /// One of Ollama's read-only model-management calls, for operators:
    /// `GET /api/tags`, `GET /api/ps` or `POST /api/show` (with `body`);
    /// anything else is refused (400). Returns the provider's status and
    /// body as it answered (at most 4 MiB), errors included.
    pub async fn native_api(&self, method: &str, path: &str, body: Option<Bytes>) -> Result<(u16, Bytes), RunFailure> {
        if !NATIVE_API_ALLOWED.contains(&(method, path)) {
            let allowed: Vec<String> = NATIVE_API_ALLOWED.iter().map(|(m, p)| format!("{m} {p}")).collect();
            let msg = format!(
                "`{} {}` is not an allowed Ollama call; allowed: {}",
                clip(method),
                clip(path),
                allowed.join(", ")
            );
            return Err(RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, msg));
        }
        let target = format!("{}{path}", self.url.path_prefix.trim_end_matches('/'));
        let body = if method == "POST" { body.unwrap_or_default() } else { Bytes::new() };
        let mut headers: Vec<(&str, &[u8])> = vec![("accept", b"application/json")];
        if method == "POST" {
            headers.push(("content-type", b"application/json"));
        }
        if let Some(auth) = &self.authorization {
            headers.push(("authorization", auth.expose().as_bytes()));
        }
        let req = Request {
            method,
            host: &self.url.host,
            port: self.url.port,
            target: &target,
            headers: &headers,
            body: &body,
            tls: self.tls.as_ref(),
        };
        let call = async {
            let mut resp = self.send(&req, "-").await?;
            let status = resp.status();
            let (body, truncated) = resp.read_to_end(MAX_NATIVE_BODY).await.map_err(|e| protocol(e.to_string()))?;
            if truncated {
                return Err(protocol(format!("upstream answer exceeds {MAX_NATIVE_BODY} bytes")));
            }
            Ok((status, body))
        };
        let limit = self.request_timeout.min(NATIVE_API_TIMEOUT);
        iop_core::rt::time::timeout(limit, call).await.unwrap_or_else(|_| Err(timeout_failure(limit)))
    }
}

fn timeout_failure(limit: Duration) -> RunFailure {
    RunFailure::new(
        codes::UPSTREAM_TIMEOUT,
        504,
        FailureSource::Provider,
        format!("upstream did not finish within {} ms", limit.as_millis()),
    )
}

/// At most 128 bytes of client input in a message.
fn clip(s: &str) -> &str {
    match s.char_indices().map(|(i, c)| i + c.len_utf8()).take_while(|end| *end <= 128).last() {
        Some(end) => &s[..end],
        None => "",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::{Delta, Part, ToolCallDelta, Usage};
    use serde_json::{json, Value};

    use super::*;
    use crate::{
        adapter::tests::{spec_body, VecSink},
        upstream::test_server::{with_body, Event, Reply, TestServer},
    };

    fn adapter(server: &TestServer, timeout: Duration) -> OllamaAdapter {
        let url = UpstreamUrl {
            tls: false,
            host: "127.0.0.1".into(),
            port: server.addr.port(),
            path_prefix: "/ollama".into(),
        };
        OllamaAdapter::new("ol".into(), url, Some("sk-test"), 4, timeout, UpstreamClient::default())
    }

    fn run(a: &OllamaAdapter, spec: RunSpec) -> Vec<ExecEvent> {
        iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            a.execute(spec, &mut sink).await;
            sink.events
        })
        .unwrap()
    }

    fn chat_spec(body: Value) -> RunSpec {
        spec_body("llama3.2", &body.to_string())
    }

    fn embed_spec(body: Value) -> RunSpec {
        RunSpec { operation: Operation::Embeddings, ..chat_spec(body) }
    }

    fn failure(evs: &[ExecEvent]) -> &RunFailure {
        match evs.last() {
            Some(ExecEvent::Error(f)) => f,
            other => panic!("expected an error terminal, got {other:?} in {evs:?}"),
        }
    }

    /// A chunked NDJSON answer, one line per chunk (`open`: no last chunk).
    fn ndjson(lines: &[&str], open: bool) -> Vec<u8> {
        let mut out =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for l in lines {
            let data = format!("{l}\n");
            out.extend_from_slice(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes());
        }
        if !open {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        out
    }

    const LINES: &[&str] = &[
        r#"{"model":"llama3.2","created_at":"t","message":{"role":"assistant","content":"","thinking":"hm"},"done":false}"#,
        r#"{"model":"llama3.2","created_at":"t","message":{"role":"assistant","content":"tok0 "},"done":false}"#,
        r#"{"model":"llama3.2","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":5,"eval_count":2}"#,
    ];

    fn expected() -> Vec<ExecEvent> {
        vec![
            ExecEvent::Start { model: "llama3.2".into() },
            ExecEvent::reasoning("hm"),
            ExecEvent::content("tok0 "),
            ExecEvent::Complete {
                finish_reason: "stop".into(),
                usage: Some(Usage { input_tokens: 5, output_tokens: 2, ..Default::default() }),
            },
        ]
    }

    fn request_of(server: &TestServer) -> (String, Value) {
        loop {
            if let Event::Request { head, body, .. } = server.next_event() {
                return (head, serde_json::from_slice(&body).unwrap());
            }
        }
    }

    #[test]
    fn chat_streams_translates_and_reuses_the_connection() {
        let server = TestServer::start(vec![Reply::keep(ndjson(LINES, false)), Reply::keep(ndjson(LINES, false))]);
        let a = adapter(&server, Duration::from_secs(10));
        let body = json!({"model": "public", "stream": true, "max_completion_tokens": 8, "temperature": 0,
                          "reasoning_effort": "high", "messages": [{"role": "user", "content": "hi"}]});
        let (first, second, idle) = iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            a.execute(chat_spec(body.clone()), &mut sink).await;
            let first = sink.events;
            let mut sink = VecSink::default();
            a.execute(chat_spec(body), &mut sink).await;
            (first, sink.events, a.client().idle_connections("127.0.0.1", server.addr.port()))
        })
        .unwrap();
        assert_eq!(first, expected());
        assert_eq!(second, expected());
        assert_eq!(idle, 1, "connection parked after the second run");
        assert_eq!(server.next_event(), Event::Accepted(0));
        let (head, sent) = request_of(&server);
        assert!(head.starts_with("POST /ollama/api/chat HTTP/1.1\r\n"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nauthorization: bearer sk-test"), "{head}");
        assert!(lower.contains("\r\naccept: application/x-ndjson"), "{head}");
        assert!(lower.contains("\r\ncontent-type: application/json"), "{head}");
        assert_eq!(
            sent,
            json!({"model": "llama3.2", "stream": true, "think": "high", "messages": [{"role": "user", "content": "hi"}],
                   "options": {"num_predict": 8, "temperature": 0}})
        );
        assert!(matches!(server.next_event(), Event::Request { conn: 0, .. }), "second request on the same connection");
    }

    #[test]
    fn tool_calls_get_ids_and_the_tool_calls_finish() {
        let lines = [
            r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}},{"function":{"name":"g","arguments":{}}}]},"done":false}"#,
            r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":3}"#,
        ];
        let server = TestServer::start(vec![Reply::keep(ndjson(&lines, false))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        let call = |index: u32, name: &str, arguments: &str| {
            ExecEvent::Delta(Delta {
                choice: 0,
                part: Part::ToolCall(Box::new(ToolCallDelta {
                    index,
                    id: format!("call_run-1_{index}"),
                    kind: "function".into(),
                    name: name.into(),
                    arguments: arguments.into(),
                })),
                logprobs: None,
            })
        };
        assert_eq!(
            evs,
            vec![
                ExecEvent::Start { model: "m".into() },
                call(0, "f", r#"{"x":1}"#),
                call(1, "g", "{}"),
                ExecEvent::Complete {
                    finish_reason: "tool_calls".into(),
                    usage: Some(Usage { input_tokens: 0, output_tokens: 3, ..Default::default() }),
                },
            ]
        );
    }

    #[test]
    fn refused_parameters_never_reach_the_provider() {
        let server = TestServer::start(vec![]);
        let a = adapter(&server, Duration::from_secs(10));
        for body in [
            json!({"n": 2, "messages": [{"role": "user", "content": "x"}]}),
            json!({"logprobs": true, "messages": [{"role": "user", "content": "x"}]}),
        ] {
            let evs = run(&a, chat_spec(body));
            assert_eq!(evs.len(), 1, "{evs:?}");
            let f = failure(&evs);
            assert_eq!((f.code, f.status, f.source), (codes::INVALID_REQUEST, 400, FailureSource::Client));
        }
        let evs = run(&a, embed_spec(json!({"input": [[1, 2]]})));
        assert_eq!(failure(&evs).status, 400);
        assert!(server.drain().is_empty(), "nothing was sent");
    }

    #[test]
    fn status_errors_pass_with_their_message_and_retry_after() {
        let server = TestServer::start(vec![
            Reply::keep(with_body(
                404,
                "application/json; charset=utf-8",
                r#"{"error":"model \"nope\" not found, try pulling it first"}"#,
            )),
            Reply::keep({
                let body = r#"{"error":"overloaded"}"#;
                format!(
                    "HTTP/1.1 503 X\r\ncontent-type: application/json\r\nretry-after: 3\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            }),
            Reply::close(with_body(500, "text/plain", "")),
        ]);
        let a = adapter(&server, Duration::from_secs(10));
        let runs = iop_core::rt::block_on_current(async {
            let mut runs = Vec::new();
            for _ in 0..3 {
                let mut sink = VecSink::default();
                a.execute(chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})), &mut sink).await;
                runs.push(sink.events);
            }
            runs
        })
        .unwrap();
        assert_eq!(runs[0].len(), 1, "no Start before a status error");
        let f = failure(&runs[0]);
        assert_eq!(
            (f.code, f.status, f.retryable, f.message.as_str()),
            (codes::UPSTREAM_STATUS, 404, false, "model \"nope\" not found, try pulling it first")
        );
        let f = failure(&runs[1]);
        assert_eq!(
            (f.status, f.retryable, f.retry_after_ms, f.message.as_str()),
            (503, true, Some(3000), "overloaded")
        );
        let f = failure(&runs[2]);
        assert_eq!((f.status, f.retryable, f.message.as_str()), (500, false, "upstream answered HTTP 500"));
    }

    #[test]
    fn broken_streams() {
        // Ends without the done line.
        let server = TestServer::start(vec![Reply::keep(ndjson(&LINES[..2], false))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        assert_eq!(evs[..3], expected()[..3]);
        assert_eq!(failure(&evs).code, codes::UPSTREAM_PROTOCOL);
        // An error line mid-stream.
        let lines = [LINES[1], r#"{"error":"out of memory"}"#];
        let server = TestServer::start(vec![Reply::keep(ndjson(&lines, true))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        let f = failure(&evs);
        assert_eq!((f.code, f.status, f.message.as_str()), (codes::UPSTREAM_STATUS, 502, "out of memory"));
        // A line over the limit.
        let huge = format!(r#"{{"message":{{"content":"{}"}}}}"#, "x".repeat(MAX_LINE_BYTES));
        let server = TestServer::start(vec![Reply::close(ndjson(&[&huge], false))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        let f = failure(&evs);
        assert_eq!(evs.len(), 1);
        assert!(f.code == codes::UPSTREAM_PROTOCOL && f.message.contains("exceeds"), "{f:?}");
    }

    #[test]
    fn a_client_without_a_stream_gets_ollamas_whole_answer() {
        let body = r#"{"model":"llama3.2","message":{"role":"assistant","content":"tok0 ","thinking":"hm"},"done":true,"done_reason":"stop","prompt_eval_count":5,"eval_count":2}"#;
        let server = TestServer::start(vec![Reply::keep(with_body(200, "application/json; charset=utf-8", body))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        assert_eq!(evs, expected());
        let (head, sent) = request_of(&server);
        assert!(head.to_ascii_lowercase().contains("\r\naccept: application/json\r\n"), "{head}");
        assert_eq!(sent["stream"], false);
    }

    #[test]
    fn a_stream_answered_without_being_asked_is_still_read() {
        let server = TestServer::start(vec![Reply::keep(ndjson(LINES, false))]);
        let spec = chat_spec(json!({"stream": false, "messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(run(&adapter(&server, Duration::from_secs(10)), spec), expected());
    }

    #[test]
    fn embeddings_post_to_api_embed() {
        let answer = r#"{"model":"nomic","embeddings":[[0.5,0.25],[1.0,0.0]],"prompt_eval_count":4}"#;
        let server = TestServer::start(vec![Reply::keep(with_body(200, "application/json; charset=utf-8", answer))]);
        let evs = run(
            &adapter(&server, Duration::from_secs(10)),
            embed_spec(json!({"model": "p", "input": ["a", "b"], "dimensions": 2, "encoding_format": "base64"})),
        );
        assert_eq!(
            evs,
            vec![
                ExecEvent::Start { model: "nomic".into() },
                ExecEvent::Embeddings(vec![vec![0.5, 0.25], vec![1.0, 0.0]]),
                ExecEvent::Complete {
                    finish_reason: "stop".into(),
                    usage: Some(Usage { input_tokens: 4, ..Default::default() })
                },
            ]
        );
        assert_eq!(server.next_event(), Event::Accepted(0));
        let (head, sent) = request_of(&server);
        assert!(head.starts_with("POST /ollama/api/embed HTTP/1.1\r\n"), "{head}");
        assert_eq!(sent, json!({"model": "llama3.2", "input": ["a", "b"], "dimensions": 2}));
    }

    #[test]
    fn connect_failure_is_retryable_and_hides_the_address() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = UpstreamUrl { tls: false, host: "127.0.0.1".into(), port, path_prefix: String::new() };
        let a = OllamaAdapter::new("ol".into(), url, None, 1, Duration::from_secs(5), UpstreamClient::default());
        let evs = run(&a, chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})));
        assert_eq!(evs.len(), 1);
        let f = failure(&evs);
        assert_eq!((f.code, f.status, f.retryable), (codes::UPSTREAM_CONNECT, 502, true));
        assert!(!f.message.contains("127.0.0.1") && !f.message.contains(&port.to_string()), "{}", f.message);
        let e = iop_core::rt::block_on_current(a.native_api("GET", "/api/tags", None)).unwrap().unwrap_err();
        assert_eq!((e.code, e.status), (codes::UPSTREAM_CONNECT, 502));
    }

    #[test]
    fn request_timeout_and_a_dropped_run_close_the_connection() {
        let server = TestServer::start(vec![Reply::keep(ndjson(&LINES[..2], true))]);
        let evs = run(
            &adapter(&server, Duration::from_millis(300)),
            chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})),
        );
        assert_eq!(evs[..3], expected()[..3]);
        assert_eq!((failure(&evs).code, failure(&evs).status), (codes::UPSTREAM_TIMEOUT, 504));
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { .. }));
        assert_eq!(server.next_event(), Event::Eof(0));

        let server = TestServer::start(vec![Reply::keep(ndjson(&LINES[..2], true))]);
        let a = adapter(&server, Duration::from_secs(30));
        let evs = iop_core::rt::block_on_current(async {
            let mut sink = VecSink { close_after: Some(1), ..Default::default() };
            a.execute(chat_spec(json!({"messages": [{"role": "user", "content": "x"}]})), &mut sink).await;
            sink.events
        })
        .unwrap();
        assert_eq!(evs, expected()[..1]);
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { .. }));
        assert_eq!(server.next_event(), Event::Eof(0), "a closed sink closes the upstream request");
    }

    #[test]
    fn native_api_allows_only_the_read_calls() {
        let tags = r#"{"models":[{"name":"llama3.2:latest"}]}"#;
        let server = TestServer::start(vec![
            Reply::keep(with_body(200, "application/json; charset=utf-8", tags)),
            Reply::keep(with_body(404, "application/json; charset=utf-8", r#"{"error":"model 'x' not found"}"#)),
        ]);
        let a = adapter(&server, Duration::from_secs(10));
        let (ok, missing, refused) = iop_core::rt::block_on_current(async {
            let ok = a.native_api("GET", "/api/tags", None).await;
            let missing = a.native_api("POST", "/api/show", Some(Bytes::from_static(br#"{"model":"x"}"#))).await;
            let mut refused = Vec::new();
            for (m, p) in [
                ("POST", "/api/pull"),
                ("DELETE", "/api/delete"),
                ("GET", "/api/show"),
                ("POST", "/api/tags"),
                ("GET", "/api/tags/../pull"),
            ] {
                refused.push(a.native_api(m, p, None).await);
            }
            (ok, missing, refused)
        })
        .unwrap();
        assert_eq!(ok.unwrap(), (200, Bytes::from(tags)));
        assert_eq!(missing.unwrap(), (404, Bytes::from_static(br#"{"error":"model 'x' not found"}"#)));
        for r in refused {
            let f = r.unwrap_err();
            assert_eq!((f.code, f.status, f.source), (codes::INVALID_REQUEST, 400, FailureSource::Client));
            assert!(f.message.contains("GET /api/tags, GET /api/ps, POST /api/show"), "{}", f.message);
        }
        assert_eq!(server.next_event(), Event::Accepted(0));
        let Event::Request { head, body, .. } = server.next_event() else { panic!() };
        assert!(head.starts_with("GET /ollama/api/tags HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("\r\nauthorization: bearer sk-test"));
        assert!(body.is_empty());
        let Event::Request { head, body, .. } = server.next_event() else { panic!() };
        assert!(head.starts_with("POST /ollama/api/show HTTP/1.1\r\n"), "{head}");
        assert_eq!(body, br#"{"model":"x"}"#);
        assert!(server.drain().iter().all(|e| !matches!(e, Event::Request { .. })), "refused calls were never sent");
        assert_eq!(clip(&"é".repeat(100)).len(), 128);
    }
}
