//! One client connection: HTTP/1.1 keep-alive loop, routing, and the pacing
//! primitives that notice a departed client between tokens. Model requests
//! are turned into a [`Reply`](super::reply::Reply) by their endpoint module
//! and played by [`super::play`].
//!
//! The socket is split so a read can stay in flight while chunks are written:
//! that read is how a client close is seen within one token interval. The
//! in-flight read is never dropped while the connection lives (monoio trap:
//! under io_uring a dropped read can lose bytes); it is parked in [`Reader`]
//! and picked up again by the next request.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iop_core::http::{parse_request_head, write_response_head, BodyDecoder, BodyKind, Framing, HttpError, RequestHead};
use iop_core::net::{ReadHalf, Stream, WriteHalf};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::clock::Timestamp;
use super::play::Live;
use super::record::{Exchange, RequestHeaders};
use super::reply::{Action, Env, Reply, OLLAMA_JSON};
use super::routes::{self, Endpoint, Meta, Route};
use super::{
    chat, completions, embeddings, errors, messages, models, ollama_chat, ollama_meta, responses, script,
    script_ollama, Ctx, Stats,
};

/// Bytes asked of one read.
const READ_CHUNK: usize = 16 * 1024;
/// While streaming, stop reading ahead once this much pipelined input waits.
const MAX_READ_AHEAD: usize = 64 * 1024;
/// With no token interval, yield to sibling tasks every this many chunks
/// (monoio has no fair `yield_now`).
const YIELD_EVERY: u64 = 32;
/// Lingering close after an error response: drain the client's unread input
/// so the kernel does not answer it with a reset that could destroy the response.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

type ReadDone = (ReadHalf, io::Result<usize>, Vec<u8>);
type ReadFut = Pin<Box<dyn Future<Output = ReadDone>>>;

enum ReadState {
    Idle(ReadHalf, Vec<u8>),
    Busy(ReadFut),
    /// Only between taking `Idle` apart and starting the read.
    Broken,
}

/// The read half with at most one read in flight, kept across awaits.
struct Reader {
    state: ReadState,
}

impl Reader {
    /// The in-flight read, starting one if none is.
    fn inflight(&mut self) -> Option<&mut ReadFut> {
        if let ReadState::Idle(..) = self.state {
            if let ReadState::Idle(mut half, mut buf) = std::mem::replace(&mut self.state, ReadState::Broken) {
                buf.clear();
                self.state = ReadState::Busy(Box::pin(async move {
                    let (res, buf) = half.read(buf).await;
                    (half, res, buf)
                }));
            }
        }
        match &mut self.state {
            ReadState::Busy(fut) => Some(fut),
            _ => None,
        }
    }

    /// Takes a finished read's bytes into `inbuf`; returns its length (0 = EOF).
    fn complete(&mut self, done: ReadDone, inbuf: &mut BytesMut) -> io::Result<usize> {
        let (half, res, buf) = done;
        if let Ok(n) = res {
            inbuf.extend_from_slice(&buf[..n.min(buf.len())]);
        }
        self.state = ReadState::Idle(half, buf);
        res
    }

    async fn read_more(&mut self, inbuf: &mut BytesMut) -> io::Result<usize> {
        let Some(fut) = self.inflight() else {
            return Err(io::Error::other("connection reader unavailable"));
        };
        let done = fut.await;
        self.complete(done, inbuf)
    }
}

pub(super) enum Waited {
    Slept,
    Read(io::Result<usize>),
}

/// What the connection does after a response.
pub(super) enum Next {
    KeepAlive,
    Close,
}

/// The client went away mid-answer.
pub(super) struct Gone;

/// Counts a stream as active for its lifetime.
pub(super) struct ActiveStream(Arc<Stats>);

impl ActiveStream {
    pub(super) fn new(stats: &Arc<Stats>) -> Self {
        let now = stats.active_streams.fetch_add(1, Ordering::Relaxed) + 1;
        stats.peak_streams.fetch_max(now, Ordering::Relaxed);
        Self(stats.clone())
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        self.0.active_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(super) struct Conn {
    reader: Reader,
    wr: WriteHalf,
    pub(super) inbuf: BytesMut,
    /// Our own write buffer (monoio's BufWriter is unsound in 0.2.4).
    pub(super) out: BytesMut,
    /// One frame (SSE event, NDJSON line) before chunk framing.
    pub(super) event: BytesMut,
    pub(super) ctx: Rc<Ctx>,
    /// The model exchange being answered, while it is recorded.
    pub(super) live: Option<Live>,
}

/// Serves one connection until it closes; errors are logged, never fatal.
pub(crate) async fn serve(stream: Stream, ctx: Rc<Ctx>) {
    let (rd, wr) = stream.into_split();
    let mut conn = Conn {
        reader: Reader { state: ReadState::Idle(rd, Vec::with_capacity(READ_CHUNK)) },
        wr,
        inbuf: BytesMut::with_capacity(READ_CHUNK),
        out: BytesMut::with_capacity(READ_CHUNK),
        event: BytesMut::with_capacity(1024),
        ctx,
        live: None,
    };
    if let Err(e) = conn.run().await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

impl Conn {
    async fn run(&mut self) -> io::Result<()> {
        loop {
            let (head, raw_head) = loop {
                // The head as received (header names in their own case) for
                // the exchange log; the parser below lower-cases names.
                let before = self.inbuf.len();
                let raw = if self.ctx.config.no_record {
                    None
                } else {
                    memchr::memmem::find(&self.inbuf, b"\r\n\r\n")
                        .map(|end| Bytes::copy_from_slice(&self.inbuf[..end + 4]))
                };
                match parse_request_head(&mut self.inbuf, &self.ctx.limits) {
                    Ok(Some(head)) => {
                        let consumed = before - self.inbuf.len();
                        break (head, raw.filter(|r| r.len() == consumed));
                    }
                    Ok(None) => {
                        let idle = self.inbuf.is_empty().then_some(self.ctx.config.keepalive_timeout_ms).flatten();
                        let read = match idle {
                            // Waiting for the next request: a server's keep-alive
                            // timeout closes an idle connection.
                            Some(ms) => match self.wait(Duration::from_millis(ms)).await {
                                Waited::Slept => return Ok(()),
                                Waited::Read(read) => read?,
                            },
                            None => self.reader.read_more(&mut self.inbuf).await?,
                        };
                        if read == 0 {
                            return Ok(());
                        }
                    }
                    Err(e) => return self.reject(&e).await,
                }
            };
            if head.expect_continue && head.body != BodyKind::Empty && self.inbuf.is_empty() {
                self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                self.flush().await?;
            }
            let body = match self.read_body(head.body).await? {
                Ok(body) => body.freeze(),
                Err(e) => return self.reject(&e).await,
            };
            let next = self.route(&head, raw_head, body).await;
            // Whatever happened, the exchange is over (a no-op once recorded).
            self.finish_record(false);
            if !head.keep_alive || matches!(next?, Next::Close) {
                return Ok(());
            }
        }
    }

    async fn read_body(&mut self, kind: BodyKind) -> io::Result<Result<BytesMut, HttpError>> {
        let mut decoder = BodyDecoder::new(kind, self.ctx.limits.max_body_bytes);
        let mut body = BytesMut::new();
        loop {
            match decoder.decode(&mut self.inbuf) {
                Ok(Some(data)) => body.extend_from_slice(&data),
                Ok(None) if decoder.is_done() => return Ok(Ok(body)),
                Ok(None) => {
                    if self.reader.read_more(&mut self.inbuf).await? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Ok(Err(e)),
            }
        }
    }

    async fn route(&mut self, head: &RequestHead, raw_head: Option<Bytes>, body: Bytes) -> io::Result<Next> {
        match routes::route(&head.method, head.path(), &self.ctx.config.without) {
            // Still "loading": model requests get its 503, as llama.cpp's do.
            Route::Model(_) if self.ctx.list_health.get() == super::list_health::ListHealth::Loading => {
                let answer = self.ctx.list_health.get().error_body().unwrap_or_default();
                self.respond(503, "application/json", answer.as_bytes(), head.keep_alive).await
            }
            Route::Model(endpoint) => self.model(endpoint, head, raw_head, body).await,
            other => {
                let (status, content_type, answer) = self.meta(other, &body);
                self.respond(status, content_type, answer.as_bytes(), head.keep_alive).await
            }
        }
    }

    /// Status, content type and body of a request that is not a model request.
    fn meta(&self, route: Route, body: &[u8]) -> (u16, &'static str, String) {
        let json = "application/json";
        let error = |status, message| (status, json, errors::error_body(message, "invalid_request_error", "null"));
        let config = &self.ctx.config;
        let Route::Meta(meta) = route else {
            return match route {
                Route::MethodNotAllowed => error(405, "method not allowed"),
                _ => error(404, "not found"),
            };
        };
        if let (Meta::Models | Meta::Tags, Some(down)) = (meta, self.ctx.list_health.get().error_body()) {
            return (503, json, down);
        }
        match meta {
            Meta::Models => (200, json, models::models_body(&config.model)),
            Meta::Tags => (200, OLLAMA_JSON, ollama_meta::tags_body(&config.model)),
            Meta::Ps => (200, OLLAMA_JSON, ollama_meta::ps_body(&config.model, Timestamp::now())),
            Meta::Version => (200, OLLAMA_JSON, ollama_meta::version_body()),
            Meta::Show => match ollama_meta::show_body(body) {
                Ok(answer) => (200, OLLAMA_JSON, answer),
                Err(e) => (400, OLLAMA_JSON, errors::ollama_error_body(&e.0)),
            },
            Meta::Healthz => (200, "text/plain", "ok".to_owned()),
            Meta::Stats => (200, json, self.ctx.stats.to_json()),
            Meta::Last => match self.ctx.log.borrow().last_json() {
                Some(last) => (200, json, last),
                None => error(404, "no model request recorded yet"),
            },
            Meta::Log => (200, json, self.ctx.log.borrow().log_json()),
            Meta::Closes => (200, json, self.ctx.closes.borrow().to_json()),
            Meta::Tokenize => match super::tokenize::tokenize_body(body) {
                Ok(answer) => (200, json, answer),
                Err(e) => error(400, &e.0),
            },
            Meta::SetHealth => {
                let (status, answer) = super::list_health::set(&self.ctx.list_health, body);
                (status, json, answer)
            }
        }
    }

    /// A model request: counted, numbered, recorded, answered.
    async fn model(
        &mut self,
        endpoint: Endpoint,
        head: &RequestHead,
        raw_head: Option<Bytes>,
        body: Bytes,
    ) -> io::Result<Next> {
        let started = Instant::now();
        let stats = &self.ctx.stats;
        let seq = Stats::bump(&stats.model_requests) + 1;
        Stats::bump(match endpoint {
            Endpoint::Chat => &stats.requests,
            Endpoint::Completions => &stats.completions_requests,
            Endpoint::Embeddings => &stats.embeddings_requests,
            Endpoint::Responses => &stats.responses_requests,
            Endpoint::Messages => &stats.messages_requests,
            Endpoint::CountTokens => &stats.count_tokens_requests,
            Endpoint::OllamaChat | Endpoint::OllamaEmbed => &stats.ollama_requests,
        });
        let env = Env { config: &self.ctx.config, seq, now: Timestamp::now() };
        let reply: Reply = match endpoint {
            Endpoint::Chat => match self.ctx.scripts.as_deref().and_then(|s| script::reply(s, &body, &env)) {
                Some(scripted) => scripted,
                None => chat::reply(&body, &env),
            },
            Endpoint::Completions => completions::reply(&body, &env),
            Endpoint::Embeddings => embeddings::openai_reply(&body, &env),
            Endpoint::Responses => responses::reply(&body, &env),
            Endpoint::Messages => messages::reply(&body, &env),
            Endpoint::CountTokens => messages::count_tokens_reply(&body, &env),
            Endpoint::OllamaChat => {
                match self.ctx.scripts.as_deref().and_then(|s| script_ollama::reply(s, &body, &env)) {
                    Some(scripted) => scripted,
                    None => ollama_chat::reply(&body, &env),
                }
            }
            Endpoint::OllamaEmbed => embeddings::ollama_reply(&body, &env),
        };
        let reply = self.prefix_delay(endpoint, reply, &body);
        if !self.ctx.config.no_record {
            let headers = match raw_head {
                Some(raw) => RequestHeaders::Raw(raw),
                None => RequestHeaders::Parsed(head.headers.clone()),
            };
            self.ctx.log.borrow_mut().push(Exchange::new(seq, &head.method, &head.target, headers, body));
            self.live = Some(Live::new(seq));
        }
        self.play(reply, seq, started, head.keep_alive).await
    }

    /// `reply` with the prefix cache model's delay added before its first
    /// token ([`super::prefix_cache`]), on the endpoints that generate.
    fn prefix_delay(&self, endpoint: Endpoint, mut reply: Reply, body: &[u8]) -> Reply {
        let Some(delays) = self.ctx.config.prefix_delays() else { return reply };
        if matches!(endpoint, Endpoint::Embeddings | Endpoint::CountTokens | Endpoint::OllamaEmbed) {
            return reply;
        }
        let Some(prefix) = super::prefix_cache::prefix_of(body) else { return reply };
        let hit = self.ctx.prefix_cache.borrow_mut().touch(prefix);
        Stats::bump(if hit { &self.ctx.stats.prefix_hits } else { &self.ctx.stats.prefix_misses });
        let extra = if hit { delays.hit } else { delays.miss };
        match &mut reply.action {
            Action::Whole(w) => w.delay = w.delay.saturating_add(extra),
            Action::Stream(s) => s.timing.ttft = s.timing.ttft.saturating_add(extra),
            Action::Hangup => {}
        }
        reply
    }

    /// Waits the token interval before every token but the first.
    pub(super) async fn pace(&mut self, sent: u64, interval: Duration) -> Result<(), Gone> {
        if sent == 0 {
            return Ok(());
        }
        if interval.is_zero() {
            if sent.is_multiple_of(YIELD_EVERY) {
                monoio::time::sleep(Duration::ZERO).await;
            }
            return Ok(());
        }
        self.pause(interval).await
    }

    /// Sleeps `d` while watching the socket: EOF or a read error means the
    /// client left. Bytes it pipelined meanwhile are kept for the next request.
    pub(super) async fn pause(&mut self, d: Duration) -> Result<(), Gone> {
        let deadline = Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            if self.inbuf.len() >= MAX_READ_AHEAD {
                monoio::time::sleep(left).await;
                return Ok(());
            }
            match self.wait(left).await {
                Waited::Slept => return Ok(()),
                Waited::Read(Ok(0) | Err(_)) => return Err(Gone),
                Waited::Read(Ok(_)) => {}
            }
        }
    }

    /// Waits for `d` to pass or the in-flight read to finish, whichever is first.
    pub(super) async fn wait(&mut self, d: Duration) -> Waited {
        let mut sleep = std::pin::pin!(monoio::time::sleep(d));
        let Some(fut) = self.reader.inflight() else {
            sleep.await;
            return Waited::Slept;
        };
        let done = poll_fn(|cx| {
            if let Poll::Ready(done) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(done));
            }
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        match done {
            Some(done) => Waited::Read(self.reader.complete(done, &mut self.inbuf)),
            None => Waited::Slept,
        }
    }

    async fn respond(&mut self, status: u16, content_type: &str, body: &[u8], ka: bool) -> io::Result<Next> {
        write_response_head(&mut self.out, status, &[("content-type", content_type)], Framing::Length(body.len()), ka);
        self.out.extend_from_slice(body);
        self.flush().await?;
        Ok(Next::KeepAlive)
    }

    /// Answers an unparsable request and closes the connection.
    async fn reject(&mut self, e: &HttpError) -> io::Result<()> {
        tracing::debug!(error = %e, "rejecting request");
        let body = errors::error_body(&e.to_string(), "invalid_request_error", "null");
        write_response_head(
            &mut self.out,
            e.status(),
            &[("content-type", "application/json")],
            Framing::Length(body.len()),
            false,
        );
        self.out.extend_from_slice(body.as_bytes());
        self.flush().await?;
        let _ = self.wr.shutdown().await;
        let deadline = Instant::now() + LINGER;
        let mut drained = 0usize;
        while drained < LINGER_BYTES {
            self.inbuf.clear();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.wait(left).await {
                Waited::Read(Ok(n)) if n > 0 => drained += n,
                _ => break,
            }
        }
        Ok(())
    }

    pub(super) async fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let buf = std::mem::take(&mut self.out);
        let (res, mut buf) = self.wr.write_all(buf).await;
        buf.clear();
        self.out = buf;
        res.map(|_| ())
    }
}
