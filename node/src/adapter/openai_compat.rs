//! Any OpenAI-compatible server (vLLM, llama.cpp server, Ollama's /v1,
//! SGLang, OpenAI itself): `POST {base_url}/chat/completions` with
//! `stream: true`, mapped to run events.

use std::time::Duration;

use bytes::Bytes;
use iop_core::request::Top;
use iop_core::{
    config::{Secret, UpstreamUrl},
    exec::{codes, ExecEvent, FailureSource, RunFailure},
};

use super::openai_stream::{protocol, retry_after_ms, status_failure, Flow, StreamState};
use crate::{
    run::{EventSink, RunSpec, SinkClosed},
    upstream::{Request, Response, UpstreamClient},
};

/// Most of a non-2xx body read for its error message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Most of a non-streaming JSON completion accepted.
const MAX_JSON_BODY: usize = 16 * 1024 * 1024;
/// Largest single SSE event accepted.
const MAX_SSE_EVENT: usize = 4 * 1024 * 1024;
/// How long to wait for the end of the body after `[DONE]`, so the
/// connection can be reused (normally it is already buffered).
const DRAIN_AFTER_DONE: Duration = Duration::from_millis(100);

/// An OpenAI-compatible provider.
#[derive(Debug)]
pub struct OpenAiCompatAdapter {
    pub(super) id: String,
    pub(super) url: UpstreamUrl,
    /// `{prefix}/chat/completions`.
    path: String,
    /// `Bearer <key>`, never logged (Secret's Debug prints ***).
    pub(super) authorization: Option<Secret>,
    max_concurrency: u32,
    pub(super) request_timeout: Duration,
    pub(super) client: UpstreamClient,
    /// The configured kind (`openai_compat` or `vllm`), for capabilities.
    kind: &'static str,
    /// TLS of an https provider.
    pub(super) tls: Option<iop_core::net::tls::ClientTls>,
}

impl OpenAiCompatAdapter {
    /// Its health probe: the OpenAI model list.
    pub(super) fn probe(&self) -> super::health::Probe<'_> {
        super::health::Probe {
            client: &self.client,
            url: &self.url,
            tls: self.tls.as_ref(),
            authorization: self.authorization.as_ref().map(|a| a.expose()),
            list: "/models",
            provider: &self.id,
        }
    }
}

/// Why the attempt stopped without its own terminal.
pub(super) enum Halt {
    /// The sink is gone: stop without a terminal.
    Sink,
    /// Emit this failure as the terminal.
    Fail(RunFailure),
}

impl Halt {
    /// The failure to end with after an attempt bounded by `limit`: none
    /// when it ended itself (its terminal sent, or its sink gone).
    pub(super) fn failure(
        attempt: Result<Result<(), Halt>, iop_core::rt::time::Elapsed>,
        limit: std::time::Duration,
    ) -> Option<RunFailure> {
        match attempt {
            Ok(Ok(())) | Ok(Err(Halt::Sink)) => None,
            Ok(Err(Halt::Fail(f))) => Some(f),
            // The attempt (and its connection) was dropped.
            Err(_) => Some(RunFailure::new(
                codes::UPSTREAM_TIMEOUT,
                504,
                FailureSource::Provider,
                format!("upstream did not finish within {} ms", limit.as_millis()),
            )),
        }
    }
}

impl From<SinkClosed> for Halt {
    fn from(_: SinkClosed) -> Self {
        Halt::Sink
    }
}

impl OpenAiCompatAdapter {
    /// A provider at `url`, sending requests through `client`.
    pub fn new(
        id: String,
        url: UpstreamUrl,
        api_key: Option<&str>,
        max_concurrency: u32,
        request_timeout: Duration,
        client: UpstreamClient,
    ) -> Self {
        let path = format!("{}/chat/completions", url.path_prefix.trim_end_matches('/'));
        let authorization = api_key.map(|k| Secret::new(format!("Bearer {k}")));
        Self {
            id,
            url,
            path,
            authorization,
            max_concurrency,
            request_timeout,
            client,
            kind: "openai_compat",
            tls: None,
        }
    }

    /// The same adapter, with TLS for its https URL.
    pub fn with_tls(mut self, tls: Option<iop_core::net::tls::ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    /// The same adapter, reporting `kind` (e.g. `vllm`) in capabilities.
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// The configured kind.
    pub fn kind(&self) -> &'static str {
        self.kind
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

    /// Streams one chat completion for `spec`.
    pub async fn execute<S: EventSink>(&self, spec: RunSpec, sink: &mut S) {
        let outcome = iop_core::rt::time::timeout(self.request_timeout, self.attempt(&spec, sink)).await;
        let Some(failure) = Halt::failure(outcome, self.request_timeout) else { return };
        tracing::debug!(run_id = %spec.run_id, provider = %self.id, code = failure.code, status = failure.status, "run failed");
        let _ = sink.emit(ExecEvent::Error(failure)).await;
    }

    /// Sends the request and emits everything, the terminal included, except
    /// for the failures it returns.
    async fn attempt<S: EventSink>(&self, spec: &RunSpec, sink: &mut S) -> Result<(), Halt> {
        // In a block: the request's body and headers are not kept while the
        // answer streams.
        let mut resp = {
            let body = request_body(spec).map_err(Halt::Fail)?;
            let mut headers: Vec<(&str, &[u8])> =
                vec![("content-type", b"application/json"), ("accept", b"text/event-stream")];
            // A leased credential (managed mode) before the configured one.
            if let Some(auth) = spec.credential.as_ref().or(self.authorization.as_ref()) {
                headers.push(("authorization", auth.expose().as_bytes()));
            }
            let req = Request {
                method: "POST",
                host: &self.url.host,
                port: self.url.port,
                target: &self.path,
                headers: &headers,
                body: &body,
                tls: self.tls.as_ref(),
            };
            super::send_upstream(&self.client, &req, &self.id, &spec.run_id).await.map_err(Halt::Fail)?
        };
        let status = resp.status();
        if !(200..=299).contains(&status) {
            // An unreadable error body still leaves the status to report.
            let retry = retry_after_ms(resp.header("retry-after-ms"), resp.header("retry-after"));
            let body = resp.read_to_end(MAX_ERROR_BODY).await.map(|(b, _)| b).unwrap_or_default();
            return Err(Halt::Fail(status_failure(status, &body, retry)));
        }
        let mut state = StreamState::new(&spec.target);
        let mut out = Vec::new();
        if is_json(&resp) {
            let (body, truncated) =
                resp.read_to_end(MAX_JSON_BODY).await.map_err(|e| Halt::Fail(protocol(e.to_string())))?;
            if truncated {
                return Err(Halt::Fail(protocol("completion body too large")));
            }
            state.on_completion_body(&body, &mut out);
            return emit_all(sink, &mut out).await;
        }
        let mut parser = iop_core::sse::SseParser::new(MAX_SSE_EVENT);
        loop {
            // Emitted: the events' room goes back while the provider thinks
            // (kept by this core for the next read of any stream).
            crate::spare::keep_events(std::mem::take(&mut out));
            if let Some(data) = parser.idle_buffer() {
                crate::spare::keep(data);
            }
            let chunk = resp.chunk().await;
            out = crate::spare::events();
            parser.reuse(crate::spare::text(""));
            match chunk {
                Ok(Some(bytes)) => parser.push(&bytes),
                Ok(None) => {
                    state.on_eof(&mut out);
                    return emit_all(sink, &mut out).await;
                }
                Err(e) => return Err(Halt::Fail(protocol(format!("upstream stream broke: {e}")))),
            }
            let flow = emit_read(sink, &mut out, |out| {
                parser.next_event().map(|ev| {
                    ev.map(|ev| {
                        let flow = state.on_data(&ev.data, out);
                        // Its memory holds the next event's data.
                        parser.reuse(ev.data);
                        flow
                    })
                })
            })
            .await?;
            if flow == Flow::Done {
                drain(&mut resp).await;
                return Ok(());
            }
        }
    }
}

/// Parses what one read held, one item at a time with `step` (`None`:
/// nothing left), until the stream is done, and sends it together (one
/// frame to the edge). On a parse error what was parsed before it goes
/// first.
pub(super) async fn emit_read<S: EventSink, E: std::fmt::Display>(
    sink: &mut S,
    out: &mut Vec<ExecEvent>,
    mut step: impl FnMut(&mut Vec<ExecEvent>) -> Result<Option<Flow>, E>,
) -> Result<Flow, Halt> {
    let mut flow = Flow::Continue;
    while flow == Flow::Continue {
        match step(out) {
            Ok(Some(f)) => flow = f,
            Ok(None) => break,
            Err(e) => {
                emit_all(sink, out).await?;
                return Err(Halt::Fail(protocol(e.to_string())));
            }
        }
    }
    emit_all(sink, out).await?;
    Ok(flow)
}

/// Sends and clears `out`.
pub(super) async fn emit_all<S: EventSink>(sink: &mut S, out: &mut Vec<ExecEvent>) -> Result<(), Halt> {
    if out.is_empty() {
        return Ok(());
    }
    Ok(sink.emit_many(out).await?)
}

/// Reads what is left of the body (normally just the last chunk marker) so
/// the connection returns to the pool; gives up quickly and closes it
/// otherwise.
pub(super) async fn drain(resp: &mut Response) {
    let rest = async {
        let mut left = MAX_ERROR_BODY;
        while let Ok(Some(chunk)) = resp.chunk().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
    };
    let _ = iop_core::rt::time::timeout(DRAIN_AFTER_DONE, rest).await;
}

pub(super) fn is_json(resp: &Response) -> bool {
    resp.header("content-type").is_some_and(|ct| {
        let ct = String::from_utf8_lossy(ct).to_ascii_lowercase();
        ct.trim_start().starts_with("application/json")
    })
}

/// The client's body as the provider gets it: `model` set to the target,
/// asked as a stream with usage (this adapter reads the answer as SSE);
/// every other byte as the client sent it.
fn request_body(spec: &RunSpec) -> Result<Bytes, RunFailure> {
    let top = Top::parse(&spec.body)
        .map_err(|msg| RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, msg))?;
    Ok(top.rewrite_as(&spec.body, &spec.target, true).0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::Usage;

    use super::*;
    use crate::{
        adapter::tests::{spec, VecSink},
        upstream::test_server::{sse_chunked, sse_chunked_open, with_body, Event, Reply, TestServer},
    };

    fn adapter(server: &TestServer, timeout: Duration) -> OpenAiCompatAdapter {
        let url =
            UpstreamUrl { tls: false, host: "127.0.0.1".into(), port: server.addr.port(), path_prefix: "/v1".into() };
        OpenAiCompatAdapter::new("up".into(), url, Some("sk-test"), 4, timeout, UpstreamClient::default())
    }

    fn run(a: &OpenAiCompatAdapter, spec: RunSpec) -> Vec<ExecEvent> {
        iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            a.execute(spec, &mut sink).await;
            sink.events
        })
        .unwrap()
    }

    fn failure(evs: &[ExecEvent]) -> &RunFailure {
        match evs.last() {
            Some(ExecEvent::Error(f)) => f,
            other => panic!("expected an error terminal, got {other:?} in {evs:?}"),
        }
    }

    const CHUNKS: &[&str] = &[
        r#"{"model":"served","choices":[{"delta":{"role":"assistant","content":""}}]}"#,
        r#"{"model":"served","choices":[{"delta":{"content":"tok0 "}}]}"#,
        r#"{"model":"served","choices":[{"delta":{"content":"tok1 "},"finish_reason":"stop"}]}"#,
        r#"{"model":"served","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
        "[DONE]",
    ];

    fn expected_stream() -> Vec<ExecEvent> {
        vec![
            ExecEvent::Start { model: "served".into() },
            ExecEvent::content("tok0 "),
            ExecEvent::content("tok1 "),
            ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None },
            ExecEvent::Complete {
                finish_reason: "stop".into(),
                usage: Some(Usage { input_tokens: 5, output_tokens: 2, ..Default::default() }),
            },
        ]
    }

    #[test]
    fn request_body_keeps_every_byte_but_model_and_stream() {
        let body = r#"{"stream":false, "model":"client-side","temperature":0,"n":123456789012345678901234567890,"messages":[{"role":"tool","content":"42","tool_call_id":"c1"}],"z":{"b":1,"a":2}}"#;
        let s = crate::adapter::tests::spec_body("m1", body);
        let out = request_body(&s).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"stream":true, "model":"m1","temperature":0,"n":123456789012345678901234567890,"messages":[{"role":"tool","content":"42","tool_call_id":"c1"}],"z":{"b":1,"a":2},"stream_options":{"include_usage":true}}"#
        );
        let f = request_body(&crate::adapter::tests::spec_body("m", "[1]")).unwrap_err();
        assert_eq!((f.code, f.status), (codes::INVALID_REQUEST, 400));
    }

    #[test]
    fn streams_and_reuses_the_connection() {
        let server = TestServer::start(vec![Reply::keep(sse_chunked(CHUNKS)), Reply::keep(sse_chunked(CHUNKS))]);
        let a = adapter(&server, Duration::from_secs(10));
        let (first, second, idle) = iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            a.execute(spec("m1", "hello", Some(16)), &mut sink).await;
            let first = sink.events;
            let mut sink = VecSink::default();
            a.execute(spec("m1", "again", None), &mut sink).await;
            (first, sink.events, a.client().idle_connections("127.0.0.1", server.addr.port()))
        })
        .unwrap();
        assert_eq!(first, expected_stream());
        assert_eq!(second, expected_stream());
        assert_eq!(idle, 1, "connection parked after the second run");

        assert_eq!(server.next_event(), Event::Accepted(0));
        let Event::Request { conn: 0, head, body } = server.next_event() else { panic!() };
        assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"), "{head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nauthorization: bearer sk-test"), "{head}");
        assert!(lower.contains("\r\naccept: text/event-stream"), "{head}");
        assert!(lower.contains("\r\ncontent-type: application/json"), "{head}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["stream"].as_bool(), v["max_tokens"].as_u64()),
            (Some("m1"), Some(true), Some(16))
        );
        assert!(matches!(server.next_event(), Event::Request { conn: 0, .. }), "second request on the same connection");
        assert!(!server.drain().iter().any(|e| matches!(e, Event::Accepted(_))));
    }

    #[test]
    fn non_2xx_maps_status_and_message() {
        let server = TestServer::start(vec![
            Reply::keep(with_body(429, "application/json", r#"{"error":{"message":"slow down","type":"rate"}}"#)),
            Reply::keep(with_body(400, "application/json", r#"{"object":"error","message":"bad request"}"#)),
            Reply::close(with_body(503, "text/plain", "overloaded")),
        ]);
        let a = adapter(&server, Duration::from_secs(10));
        // One runtime for all three: pooled connections belong to the
        // runtime that opened them.
        let runs = iop_core::rt::block_on_current(async {
            let mut runs = Vec::new();
            for _ in 0..3 {
                let mut sink = VecSink::default();
                a.execute(spec("m", "x", None), &mut sink).await;
                runs.push(sink.events);
            }
            runs
        })
        .unwrap();
        assert_eq!(runs[0].len(), 1, "no Start before a status error: {:?}", runs[0]);
        let f = failure(&runs[0]);
        assert_eq!(
            (f.code, f.status, f.retryable, f.message.as_str()),
            (codes::UPSTREAM_STATUS, 429, true, "slow down")
        );
        let f = failure(&runs[1]);
        assert_eq!((f.status, f.retryable, f.message.as_str()), (400, false, "bad request"));
        let f = failure(&runs[2]);
        assert_eq!((f.status, f.retryable, f.message.as_str()), (503, true, "overloaded"));
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(!server.drain().iter().any(|e| matches!(e, Event::Accepted(1))), "error bodies were read to the end");
    }

    #[test]
    fn json_completion_body_works() {
        let body = r#"{"object":"chat.completion","model":"served","choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
        let server = TestServer::start(vec![Reply::keep(with_body(200, "application/json; charset=utf-8", body))]);
        let evs = run(&adapter(&server, Duration::from_secs(10)), spec("m", "x", None));
        assert_eq!(
            evs,
            vec![
                ExecEvent::Start { model: "served".into() },
                ExecEvent::content("hi"),
                ExecEvent::ChoiceFinish { choice: 0, finish_reason: "stop".into(), stop_sequence: None },
                ExecEvent::Complete {
                    finish_reason: "stop".into(),
                    usage: Some(Usage { input_tokens: 1, output_tokens: 1, ..Default::default() }),
                },
            ]
        );
    }

    #[test]
    fn stream_cut_before_done_is_a_protocol_error() {
        // Until-close body that ends without [DONE] or a finish_reason.
        let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec();
        bytes.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        let server = TestServer::start(vec![Reply::close(bytes)]);
        let evs = run(&adapter(&server, Duration::from_secs(10)), spec("m", "x", None));
        assert_eq!(evs[..2], [ExecEvent::Start { model: "m".into() }, ExecEvent::content("a")]);
        let f = failure(&evs);
        assert_eq!((f.code, f.status), (codes::UPSTREAM_PROTOCOL, 502));
    }

    #[test]
    fn connect_failure_is_retryable() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = UpstreamUrl { tls: false, host: "127.0.0.1".into(), port, path_prefix: String::new() };
        let a = OpenAiCompatAdapter::new("up".into(), url, None, 1, Duration::from_secs(5), UpstreamClient::default());
        let evs = run(&a, spec("m", "x", None));
        assert_eq!(evs.len(), 1);
        let f = failure(&evs);
        assert_eq!((f.code, f.status, f.retryable), (codes::UPSTREAM_CONNECT, 502, true));
        // The provider's address is internal: never in what the client sees.
        assert!(!f.message.contains("127.0.0.1") && !f.message.contains(&port.to_string()), "{}", f.message);
    }

    #[test]
    fn request_timeout_closes_the_connection() {
        let server = TestServer::start(vec![Reply::keep(sse_chunked_open(&CHUNKS[..2]))]);
        let a = adapter(&server, Duration::from_millis(300));
        let evs = run(&a, spec("m", "x", None));
        assert_eq!(evs[..2], expected_stream()[..2]);
        let f = failure(&evs);
        assert_eq!((f.code, f.status), (codes::UPSTREAM_TIMEOUT, 504));
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { .. }));
        assert_eq!(server.next_event(), Event::Eof(0));
    }

    #[test]
    fn dropping_execute_mid_stream_closes_the_connection() {
        let server = TestServer::start(vec![Reply::keep(sse_chunked_open(&CHUNKS[..2]))]);
        let a = adapter(&server, Duration::from_secs(30));
        let (evs, idle) = iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            // The stream never ends: the timeout drops the execute future.
            let dropped =
                iop_core::rt::time::timeout(Duration::from_millis(300), a.execute(spec("m", "x", None), &mut sink))
                    .await;
            assert!(dropped.is_err(), "execute returned on an open stream");
            (sink.events, a.client().idle_connections("127.0.0.1", server.addr.port()))
        })
        .unwrap();
        assert_eq!(evs, expected_stream()[..2]);
        assert_eq!(idle, 0);
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { .. }));
        assert_eq!(server.next_event(), Event::Eof(0), "upstream saw the close");
    }

    #[test]
    fn closed_sink_stops_and_closes_the_connection() {
        let server = TestServer::start(vec![Reply::keep(sse_chunked_open(&CHUNKS[..2]))]);
        let a = adapter(&server, Duration::from_secs(30));
        let evs = iop_core::rt::block_on_current(async {
            let mut sink = VecSink { close_after: Some(1), ..Default::default() };
            a.execute(spec("m", "x", None), &mut sink).await;
            sink.events
        })
        .unwrap();
        assert_eq!(evs, expected_stream()[..1]);
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { .. }));
        assert_eq!(server.next_event(), Event::Eof(0));
    }
}
