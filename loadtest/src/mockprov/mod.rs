//! `iop-mockprov`: an upstream model server for end-to-end and load tests,
//! shaped like OpenAI (and vLLM / llama.cpp server), like Anthropic's
//! Messages API and like Ollama's native API, on one listener.
//!
//! - [`MockConfig`]: CLI defaults; a request may override them with a
//!   `"mock": {...}` object in its JSON body ([`overrides::MockOverrides`]),
//!   on every model endpoint.
//! - [`MockProv`]: the server on one monoio runtime; [`run_blocking`] builds
//!   the runtime, [`spawn`] runs it on a background thread for in-process tests.
//! - [`Stats`]: counters served at `GET /stats`.
//! - [`record`]: the exchange log served at `GET /last` and `GET /log`.
//! - [`closes`]: the early closes of tagged requests, at `GET /closes`.
//! - [`script`]: scripted chat answers per coordinator stage (`--script`),
//!   on `/v1/chat/completions` and ([`script_ollama`]) on `/api/chat`.
//!
//! Endpoints. Model endpoints (numbered, recorded, `mock` overrides apply):
//! `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
//! `POST /v1/responses` (streamed as SSE or whole JSON), `POST /v1/messages`
//! (Anthropic, SSE or whole JSON), `POST /v1/messages/count_tokens`,
//! `POST /api/chat` (NDJSON or whole JSON), `POST /api/embed`
//! (`--without messages,responses,tokenize` turns the native dialect
//! routes and the tokenizer off).
//! Metadata: `GET /v1/models`, `GET /api/tags`, `GET /api/ps`,
//! `POST /api/show`, `GET /api/version`, `POST /tokenize` (vLLM's).
//! The mock's own: `GET /healthz`, `GET /stats`, `GET /last`, `GET /log`,
//! `GET /closes`.
//!
//! Layout: each endpoint module turns a body into a [`reply::Reply`] with no
//! I/O (`chat` + `chat_stream` + `chat_body`, `completions`, `embeddings`,
//! `responses`, `messages` + `messages_stream`, `ollama_chat`,
//! `ollama_meta`, and `script` + `script_ollama` for scripted chat answers); `routes` picks
//! the endpoint, `conn` reads requests, `play` paces, writes and records a
//! reply.

pub mod chat;
pub mod chat_body;
pub mod chat_stream;
pub mod clock;
pub mod closes;
pub mod completions;
mod conn;
pub mod embeddings;
pub mod errors;
pub mod json;
pub mod list_health;
pub mod logprobs;
pub mod messages;
pub mod messages_stream;
pub mod models;
pub mod ollama_chat;
pub mod ollama_meta;
pub mod overrides;
mod play;
pub mod prefix_cache;
pub mod record;
pub mod reply;
pub mod responses;
pub mod routes;
pub mod script;
pub mod script_ollama;
pub mod tokenize;
pub mod tool_calls;

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iop_core::http::Limits;

/// `--help` epilogue: what the flags do not say.
const AFTER_HELP: &str = "\
Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses,
/v1/messages, /v1/messages/count_tokens (Anthropic), /api/chat, /api/embed; GET /v1/models,
/api/tags, /api/ps, /api/version; POST /api/show;
GET /healthz, /stats, /last (the most recent model exchange), /log (the last 64),
/closes (tagged requests whose client left early, with the instant); POST /mock/health
{\"state\": \"ok\" | \"down\" | \"loading\"} makes the model lists answer 503 (down, or
llama.cpp's \"Loading model\") until set back to ok.

Per request, a \"mock\" object in the JSON body overrides the flags: tokens,
token_interval_ms, ttft_ms, burst, error_status, abort_after, stall_after (a stream
goes silent after that many content chunks, its connection open, until the
client leaves), hold_open (a stream sends everything, its terminal event
included, but never ends its body: the connection stays open until the
client leaves, counted as an early close), reasoning, token_bytes, tool_calls, tool_name, refusal,
logprobs, hangup (read the request, close without answering) and tag (a
label for /closes). Unknown keys are refused
with a 400.

--script PATH: a chat request whose messages hold [script:NAME] gets the next
answer of that script's stage (response_format.json_schema.name iop_plan: plan,
iop_review: review, else work) instead of a generated one; on /api/chat the
stage is plan when format.properties has plan, review when it has verdict; see
loadtest/README.md.";

/// Defaults for every request (each can be overridden per request).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "iop-mockprov",
    about = "Mock OpenAI-compatible, Anthropic and Ollama model server for iop tests",
    after_help = AFTER_HELP
)]
pub struct MockConfig {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Content tokens per answer (every endpoint).
    #[arg(long, default_value_t = 16)]
    pub tokens: u64,
    /// Delay between tokens, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub token_interval_ms: u64,
    /// Delay before the first token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub ttft_ms: u64,
    /// Token steps of a stream written together: one write of this many
    /// events after this many intervals (a fast engine's several tokens a
    /// step, a congested link). 1: one write per token.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub burst: u64,
    /// Answer model requests with this HTTP status and an error in the
    /// endpoint's shape (OpenAI's, with `retry-after` on 429/503, or Ollama's).
    #[arg(long, value_parser = clap::value_parser!(u16).range(400..=599))]
    pub error_status: Option<u16>,
    /// Close the connection after this many content chunks (no finish, no
    /// `[DONE]`); a whole answer that would be cut closes without answering.
    #[arg(long)]
    pub abort_after: Option<u64>,
    /// Reasoning chunks before the content (chat `reasoning_content`, Ollama
    /// `thinking`).
    #[arg(long, default_value_t = 0)]
    pub reasoning: u64,
    /// Pad every content token to at least this many bytes (large deltas).
    #[arg(long, default_value_t = 0)]
    pub token_bytes: u64,
    /// Model name reported when a request names none, and in /v1/models.
    #[arg(long, default_value = "mock")]
    pub model: String,
    /// Answer chat requests with this many parallel tool calls instead of
    /// content (Ollama: only when the request has `tools`). A request whose
    /// last message is a tool result gets text: `tool said: <result>`.
    #[arg(long, default_value_t = 0)]
    pub tool_calls: u64,
    /// Function name of the tool calls (default `get_weather`).
    #[arg(long)]
    pub tool_name: Option<String>,
    /// Answer chat requests with this refusal instead of content.
    #[arg(long)]
    pub refusal: Option<String>,
    /// Attach logprobs to every chat content token, asked for or not.
    #[arg(long)]
    pub logprobs: bool,
    /// Close a connection that has waited this long for its next request
    /// (a server's keep-alive timeout; default: never).
    #[arg(long)]
    pub keepalive_timeout_ms: Option<u64>,
    /// Do not record exchanges for /last and /log (load tests).
    #[arg(long)]
    pub no_record: bool,
    /// Serve HTTPS with this PEM certificate chain (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Turn native dialect routes off (comma-separated): `messages`
    /// (`/v1/messages` and its `count_tokens`), `responses` (`/v1/responses`),
    /// `tokenize` (`/tokenize`).
    /// Their paths then answer 404, as on a server without them.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub without: Vec<routes::Native>,
    /// Scripted chat answers, a JSON file read at start
    /// (`{"scripts": {"NAME": {"plan": [..], "work": [..], "review": [..]}}}`):
    /// a chat request (`/v1/chat/completions` or Ollama's `/api/chat`)
    /// whose messages hold `[script:NAME]` gets the next answer of its stage.
    #[arg(long, value_name = "PATH")]
    pub script: Option<std::path::PathBuf>,
    /// Model a prompt-prefix cache: a request whose prompt prefix (system
    /// prompt, leading system messages and the first other message) this
    /// mock saw among its last `--prefix-cache-entries` gets its first
    /// token this many milliseconds later (added to the first-token delay).
    #[arg(long, value_name = "MS")]
    pub prefix_cache_ttft_ms: Option<u64>,
    /// With the prefix cache model: the first token of a request whose
    /// prefix is not cached comes this many milliseconds later.
    #[arg(long, value_name = "MS")]
    pub prefix_miss_ttft_ms: Option<u64>,
    /// Prefixes the prefix cache model remembers (least recently used
    /// evicted first).
    #[arg(long, default_value_t = 1024)]
    pub prefix_cache_entries: usize,
}

impl MockConfig {
    /// The CLI defaults.
    pub fn for_tests() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens: 16,
            token_interval_ms: 0,
            ttft_ms: 0,
            burst: 1,
            error_status: None,
            abort_after: None,
            reasoning: 0,
            token_bytes: 0,
            model: "mock".to_owned(),
            tool_calls: 0,
            tool_name: None,
            refusal: None,
            logprobs: false,
            keepalive_timeout_ms: None,
            no_record: false,
            tls_cert: None,
            tls_key: None,
            without: Vec::new(),
            script: None,
            prefix_cache_ttft_ms: None,
            prefix_miss_ttft_ms: None,
            prefix_cache_entries: 1024,
        }
    }

    /// The prefix cache model's delays, when either flag is given.
    pub fn prefix_delays(&self) -> Option<prefix_cache::PrefixDelays> {
        if self.prefix_cache_ttft_ms.is_none() && self.prefix_miss_ttft_ms.is_none() {
            return None;
        }
        let ms = |v: Option<u64>| Duration::from_millis(v.unwrap_or(0));
        Some(prefix_cache::PrefixDelays { hit: ms(self.prefix_cache_ttft_ms), miss: ms(self.prefix_miss_ttft_ms) })
    }
}

/// Server counters, readable from any thread.
#[derive(Debug, Default)]
pub struct Stats {
    /// Chat-completion requests received (other endpoints have their own counters).
    pub requests: AtomicU64,
    /// Requests to any model endpoint (the sequence behind ids and `x-request-id`).
    pub model_requests: AtomicU64,
    /// `POST /v1/completions` requests.
    pub completions_requests: AtomicU64,
    /// `POST /v1/embeddings` requests.
    pub embeddings_requests: AtomicU64,
    /// `POST /v1/responses` requests.
    pub responses_requests: AtomicU64,
    /// `POST /v1/messages` requests.
    pub messages_requests: AtomicU64,
    /// `POST /v1/messages/count_tokens` requests.
    pub count_tokens_requests: AtomicU64,
    /// Ollama model requests (`POST /api/chat`, `POST /api/embed`).
    pub ollama_requests: AtomicU64,
    /// Streamed answers begun (SSE and NDJSON, every endpoint).
    pub streams_started: AtomicU64,
    /// Streamed answers that reached `[DONE]`.
    pub streams_completed: AtomicU64,
    /// Model answers (streamed or not) whose client closed the connection
    /// before the answer was complete.
    pub early_closed: AtomicU64,
    /// Answers ended on purpose by `abort_after`.
    pub aborted: AtomicU64,
    /// Streamed answers in progress.
    pub active_streams: AtomicU64,
    /// The most streamed answers in progress at once (what a gateway's
    /// concurrency limit is checked against).
    pub peak_streams: AtomicU64,
    /// TCP connections accepted.
    pub connections_accepted: AtomicU64,
    /// Model requests whose prompt prefix was cached (prefix cache model).
    pub prefix_hits: AtomicU64,
    /// Model requests whose prompt prefix was not.
    pub prefix_misses: AtomicU64,
}

impl Stats {
    /// The `GET /stats` body.
    pub fn to_json(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{{\"requests\":{},\"model_requests\":{},\"completions_requests\":{},\"embeddings_requests\":{},\
             \"responses_requests\":{},\"messages_requests\":{},\"count_tokens_requests\":{},\"ollama_requests\":{},\
             \"streams_started\":{},\"streams_completed\":{},\
             \"early_closed\":{},\"aborted\":{},\"active_streams\":{},\"peak_streams\":{},\"connections_accepted\":{},\
             \"prefix_hits\":{},\"prefix_misses\":{}}}",
            g(&self.requests),
            g(&self.model_requests),
            g(&self.completions_requests),
            g(&self.embeddings_requests),
            g(&self.responses_requests),
            g(&self.messages_requests),
            g(&self.count_tokens_requests),
            g(&self.ollama_requests),
            g(&self.streams_started),
            g(&self.streams_completed),
            g(&self.early_closed),
            g(&self.aborted),
            g(&self.active_streams),
            g(&self.peak_streams),
            g(&self.connections_accepted),
            g(&self.prefix_hits),
            g(&self.prefix_misses)
        )
    }

    pub(crate) fn bump(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed)
    }
}

/// Shared by the connections of one server.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) config: MockConfig,
    pub(crate) stats: Arc<Stats>,
    pub(crate) limits: Limits,
    /// The exchanges behind `/last` and `/log` (one runtime thread, so a `RefCell`).
    pub(crate) log: RefCell<record::ExchangeLog>,
    /// The early closes behind `/closes`.
    pub(crate) closes: RefCell<closes::CloseLog>,
    /// What the model lists answer (`POST /mock/health`).
    pub(crate) list_health: std::cell::Cell<list_health::ListHealth>,
    /// `--script`, read at start.
    pub(crate) scripts: Option<Arc<script::Scripts>>,
    /// The prefix cache model's prefixes (`--prefix-cache-entries`).
    pub(crate) prefix_cache: RefCell<prefix_cache::PrefixCache>,
}

/// A bound mock provider. Create and run it inside a monoio runtime.
#[derive(Debug)]
pub struct MockProv {
    listener: monoio::net::TcpListener,
    ctx: Rc<Ctx>,
    tls: Option<iop_core::net::tls::ServerTls>,
}

impl MockProv {
    /// Binds `config.listen` (without `SO_REUSEPORT`, so a stale server can
    /// never silently share the port).
    pub fn bind(config: MockConfig) -> io::Result<Self> {
        // Before binding: a bad script file stops the mock before it is announced.
        let scripts = config.script.as_deref().map(script::Scripts::load).transpose().map_err(io::Error::other)?;
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(c), Some(k)) => Some(
                iop_core::net::tls::ServerTls::new(c, k, None, iop_core::net::tls::ALPN_HTTP1)
                    .map_err(io::Error::other)?,
            ),
            _ => None,
        };
        let opts = monoio::net::ListenerOpts::new().reuse_port(false);
        let listener = monoio::net::TcpListener::bind_with_config(config.listen, &opts)?;
        let ctx = Rc::new(Ctx {
            stats: Arc::new(Stats::default()),
            limits: Limits::default(),
            log: RefCell::new(record::ExchangeLog::default()),
            closes: RefCell::new(closes::CloseLog::default()),
            list_health: std::cell::Cell::new(list_health::ListHealth::Ok),
            scripts: scripts.map(Arc::new),
            prefix_cache: RefCell::new(prefix_cache::PrefixCache::new(config.prefix_cache_entries)),
            config,
        });
        Ok(Self { listener, ctx, tls })
    }

    /// The bound address (with the real port).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.ctx.stats.clone()
    }

    /// Accepts connections forever, one task per connection.
    pub async fn run(self) -> io::Result<()> {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    Stats::bump(&self.ctx.stats.connections_accepted);
                    // Token chunks are tiny; Nagle would batch them and distort timing.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "set_nodelay failed");
                    }
                    let ctx = self.ctx.clone();
                    match self.tls.clone() {
                        None => {
                            monoio::spawn(conn::serve(iop_core::net::Stream::Plain(stream), ctx));
                        }
                        Some(tls) => {
                            monoio::spawn(async move {
                                let shake = monoio::time::timeout(Duration::from_secs(10), tls.accept(stream));
                                match shake.await {
                                    Ok(Ok(s)) => conn::serve(s, ctx).await,
                                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                                }
                            });
                        }
                    }
                }
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    monoio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Builds a single-threaded monoio runtime (io_uring, epoll fallback), binds,
/// calls `on_ready` with the bound address and serves until an error.
pub fn run_blocking(config: MockConfig, on_ready: impl FnOnce(SocketAddr, Arc<Stats>)) -> io::Result<()> {
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().build()?;
    let driver = match rt {
        monoio::FusionRuntime::Uring(_) => "io_uring",
        monoio::FusionRuntime::Legacy(_) => "epoll",
    };
    tracing::info!(driver, "monoio runtime started");
    rt.block_on(async move {
        let server = MockProv::bind(config)?;
        on_ready(server.local_addr()?, server.stats());
        server.run().await
    })
}

/// A mock provider running on a background thread (for in-process tests).
/// The thread lives until the process exits.
#[derive(Debug, Clone)]
pub struct Background {
    /// Bound address.
    pub addr: SocketAddr,
    /// Live counters.
    pub stats: Arc<Stats>,
}

/// Starts a mock provider on its own thread and waits until it listens.
pub fn spawn(config: MockConfig) -> io::Result<Background> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let err_tx = tx.clone();
    std::thread::Builder::new().name("iop-mockprov".into()).spawn(move || {
        let result = run_blocking(config, |addr, stats| {
            let _ = tx.send(Ok(Background { addr, stats }));
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "mock provider stopped");
            let _ = err_tx.send(Err(e));
        }
    })?;
    rx.recv().map_err(|_| io::Error::other("mock provider thread exited"))?
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn spawn_serves_in_process() {
        let bg = spawn(MockConfig::for_tests()).unwrap();
        let mut s = std::net::TcpStream::connect(bg.addr).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
        assert!(raw.ends_with("\r\n\r\nok"), "{raw}");
        assert_eq!(bg.stats.connections_accepted.load(Ordering::Relaxed), 1);
    }
}
