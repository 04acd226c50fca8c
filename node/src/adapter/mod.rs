//! Provider adapters: how the node talks to one provider.
//!
//! [`Adapter`] is an enum over the kinds (no boxing); it is built from the
//! edge-sent [`pb::ProviderConfig`] by [`Adapter::from_config`] and shared as
//! `Rc<Adapter>` on the node's reactor thread.
//!
//! Contract of [`Adapter::execute`]: it emits `Start` first (once the provider
//! accepted the request), then deltas, then exactly one terminal (`Complete`
//! with usage, or `Error` with a classified failure). If it returns without a
//! terminal the caller synthesises one. When `emit` reports
//! [`SinkClosed`](crate::run::SinkClosed) it stops at once. Cancellation is by
//! dropping the future, which closes the upstream connection.
//!
//! - [`mock`]: in-process deterministic mock.
//! - [`openai_compat`]: any OpenAI-compatible `/chat/completions` server
//!   (and its `/tokenize`, by `tokenize`).
//! - [`ollama`]: Ollama's native API (`/api/chat`, `/api/embed`), with the
//!   request translated by `ollama_request` and the answer mapped by
//!   `ollama_stream` (both sans-IO).

#[doc(hidden)]
pub mod fuzzing;
mod health;
mod json_scan;
pub mod mock;
pub mod ollama;
mod ollama_line;
mod ollama_request;
mod ollama_stream;
pub mod openai_compat;
mod openai_line;
mod openai_stream;
mod openai_tunnel;
mod tokenize;

use std::time::Duration;

use bytes::Bytes;
use iop_core::{
    config::UpstreamUrl,
    exec::{codes, FailureSource, RunFailure},
    wire::pb,
};

pub use mock::MockAdapter;
pub use ollama::OllamaAdapter;
pub use openai_compat::OpenAiCompatAdapter;

use crate::{
    run::{EventSink, RunSpec},
    upstream::UpstreamClient,
};

/// Sends `req` to provider `provider` for stream `stream`; a provider that
/// cannot be reached is `upstream_connect` (retryable; its address only
/// in the node's log), any other failure `upstream_protocol`.
pub(crate) async fn send_upstream(
    client: &UpstreamClient,
    req: &crate::upstream::Request<'_>,
    provider: &str,
    stream: &str,
) -> Result<crate::upstream::Response, RunFailure> {
    match client.send(req).await {
        Ok(r) => Ok(r),
        Err(e) if e.is_connect() => {
            tracing::warn!(provider, stream, error = %e, "provider unreachable");
            Err(RunFailure::new(codes::UPSTREAM_CONNECT, 502, FailureSource::Provider, e.public_message()).retryable())
        }
        Err(e) => Err(openai_stream::protocol(e.to_string())),
    }
}

/// Upper bound for one upstream request when the config says 0.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// A provider config the node cannot run. Messages name the provider and
/// the field, never the api_key value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterConfigError {
    /// `id` is empty.
    #[error("provider config: field `id` is empty")]
    EmptyId,
    /// `kind` is unspecified or unknown.
    #[error("provider {id:?}: field `kind` is unspecified or unknown ({value})")]
    Kind {
        /// Provider id.
        id: String,
        /// Raw enum value.
        value: i32,
    },
    /// `base_url` does not parse.
    #[error("provider {id:?}: field `base_url` is invalid: {reason}")]
    BaseUrl {
        /// Provider id.
        id: String,
        /// Why.
        reason: String,
    },
    /// An https provider's TLS cannot be set up (its CA bundle does not
    /// parse, or the node has no system roots and was given none).
    #[error("provider {id:?}: TLS: {reason}")]
    Tls {
        /// Provider id.
        id: String,
        /// Why.
        reason: String,
    },
    /// `max_concurrency` is 0.
    #[error("provider {id:?}: field `max_concurrency` must be at least 1")]
    MaxConcurrency {
        /// Provider id.
        id: String,
    },
}

/// One provider on this node.
#[derive(Debug)]
pub enum Adapter {
    /// In-process mock.
    Mock(MockAdapter),
    /// OpenAI-compatible HTTP server.
    OpenAiCompat(OpenAiCompatAdapter),
    /// Ollama's native API.
    Ollama(OllamaAdapter),
}

/// The TLS client of an https provider: its CA bundle from the edge, or
/// the system's roots (loaded when the node started); none for http.
fn upstream_tls(
    id: &str,
    url: &UpstreamUrl,
    ca_pem: &[u8],
) -> Result<Option<iop_core::net::tls::ClientTls>, AdapterConfigError> {
    use iop_core::net::tls::{self, ClientTls, Roots};
    if !url.tls {
        return Ok(None);
    }
    let fail = |e: tls::TlsError| AdapterConfigError::Tls { id: id.to_owned(), reason: e.to_string() };
    let roots = if ca_pem.is_empty() {
        Roots::System
    } else {
        Roots::Bundle(tls::parse_certs(ca_pem, "tls_ca").map_err(fail)?)
    };
    ClientTls::new(&roots, None, tls::ALPN_HTTP1).map(Some).map_err(fail)
}

impl Adapter {
    /// Builds an adapter with its own upstream connection pool.
    pub fn from_config(cfg: &pb::ProviderConfig) -> Result<Adapter, AdapterConfigError> {
        Self::from_config_with_client(cfg, &UpstreamClient::default())
    }

    /// Builds an adapter that shares `client`'s connection pool.
    pub fn from_config_with_client(
        cfg: &pb::ProviderConfig,
        client: &UpstreamClient,
    ) -> Result<Adapter, AdapterConfigError> {
        if cfg.id.is_empty() {
            return Err(AdapterConfigError::EmptyId);
        }
        let id = cfg.id.clone();
        if cfg.max_concurrency == 0 {
            return Err(AdapterConfigError::MaxConcurrency { id });
        }
        let timeout = match cfg.request_timeout_ms {
            0 => DEFAULT_REQUEST_TIMEOUT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        match pb::ProviderKind::try_from(cfg.kind) {
            Ok(pb::ProviderKind::Mock) => {
                let settings = cfg.mock.unwrap_or_default();
                Ok(Adapter::Mock(MockAdapter::new(id, cfg.max_concurrency, settings.into())))
            }
            Ok(pb::ProviderKind::OpenaiCompat | pb::ProviderKind::Vllm) => {
                let url = UpstreamUrl::parse(&cfg.base_url)
                    .map_err(|reason| AdapterConfigError::BaseUrl { id: id.clone(), reason })?;
                let api_key = (!cfg.api_key.is_empty()).then_some(cfg.api_key.as_str());
                let kind = if cfg.kind == pb::ProviderKind::Vllm as i32 { "vllm" } else { "openai_compat" };
                let tls = upstream_tls(&id, &url, &cfg.tls_ca_pem)?;
                Ok(Adapter::OpenAiCompat(
                    OpenAiCompatAdapter::new(id, url, api_key, cfg.max_concurrency, timeout, client.clone())
                        .with_kind(kind)
                        .with_tls(tls),
                ))
            }
            Ok(pb::ProviderKind::Ollama) => {
                let url = UpstreamUrl::parse(&cfg.base_url)
                    .map_err(|reason| AdapterConfigError::BaseUrl { id: id.clone(), reason })?;
                let api_key = (!cfg.api_key.is_empty()).then_some(cfg.api_key.as_str());
                let tls = upstream_tls(&id, &url, &cfg.tls_ca_pem)?;
                Ok(Adapter::Ollama(
                    OllamaAdapter::new(id, url, api_key, cfg.max_concurrency, timeout, client.clone()).with_tls(tls),
                ))
            }
            Ok(pb::ProviderKind::Unspecified) | Err(_) => Err(AdapterConfigError::Kind { id, value: cfg.kind }),
        }
    }

    /// Provider id.
    pub fn id(&self) -> &str {
        match self {
            Adapter::Mock(a) => a.id(),
            Adapter::OpenAiCompat(a) => a.id(),
            Adapter::Ollama(a) => a.id(),
        }
    }

    /// Concurrent runs the node admits for this provider (≥ 1).
    pub fn max_concurrency(&self) -> u32 {
        match self {
            Adapter::Mock(a) => a.max_concurrency(),
            Adapter::OpenAiCompat(a) => a.max_concurrency(),
            Adapter::Ollama(a) => a.max_concurrency(),
        }
    }

    /// The configured kind, as the config names it.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Adapter::Mock(_) => "mock",
            Adapter::OpenAiCompat(a) => a.kind(),
            Adapter::Ollama(_) => "ollama",
        }
    }

    /// The OpenAI routes this provider serves, and how: through the tunnel
    /// (the provider's own bytes) or the normalized run path.
    pub fn routes(&self) -> (&'static str, &'static [&'static str]) {
        match self {
            Adapter::OpenAiCompat(_) => {
                ("tunnel", &["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"])
            }
            Adapter::Mock(_) | Adapter::Ollama(_) => ("normalized", &["/v1/chat/completions", "/v1/embeddings"]),
        }
    }

    /// The provider's own API calls the node relays (`method path`).
    pub fn native_api_calls(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Adapter::Ollama(_) => ollama::NATIVE_API_ALLOWED,
            Adapter::Mock(_) | Adapter::OpenAiCompat(_) => &[],
        }
    }

    /// Whether the provider takes tunnels (it speaks the OpenAI HTTP API).
    pub fn tunnels(&self) -> bool {
        matches!(self, Adapter::OpenAiCompat(_))
    }

    /// Relays `spec` to the provider (see [`crate::tunnel`]); a provider that
    /// takes no tunnels answers with an error. The arm's own future (not an
    /// `async fn` over both): the tunnel's request is held once, by it.
    pub fn tunnel<'a, S: crate::tunnel::TunnelSink>(
        &'a self,
        spec: crate::tunnel::TunnelSpec,
        sink: &'a mut S,
    ) -> impl std::future::Future<Output = ()> + 'a {
        match self {
            Adapter::OpenAiCompat(a) => iop_core::rt::either::Either::Left { fut: a.tunnel(spec, sink) },
            Adapter::Mock(_) | Adapter::Ollama(_) => iop_core::rt::either::Either::Right {
                fut: async move {
                    let f = RunFailure::new(
                        codes::INVALID_REQUEST,
                        501,
                        FailureSource::Node,
                        format!("provider `{}` does not speak the OpenAI HTTP API", self.id()),
                    );
                    let _ = sink.send(iop_core::tunnel::TunnelItem::Error(f)).await;
                },
            },
        }
    }

    /// Whether the provider answers and serves `target` (bounded by
    /// [`health::PROBE_TIMEOUT`]): the evidence a stall terminal carries.
    pub async fn probe_health(&self, target: &str) -> iop_core::liveness::ProviderHealth {
        match self {
            Adapter::Mock(_) => iop_core::liveness::ProviderHealth::Available,
            Adapter::OpenAiCompat(a) => Box::pin(a.probe().run(target)).await,
            Adapter::Ollama(a) => Box::pin(a.probe().run(target)).await,
        }
    }

    /// Runs `spec`, sending its events to `sink` (see the module docs for
    /// the contract).
    pub async fn execute<S: EventSink>(&self, spec: RunSpec, sink: &mut S) {
        // Boxed per kind: a run's task holds its own adapter's state, not
        // the largest of all kinds.
        let tokenize = spec.operation == crate::run::Operation::Tokenize;
        match self {
            Adapter::OpenAiCompat(a) if tokenize => Box::pin(tokenize::execute(a, spec, sink)).await,
            Adapter::Mock(_) | Adapter::Ollama(_) if tokenize => {
                let _ = sink.emit(iop_core::exec::ExecEvent::Error(tokenize::unsupported(self.id()))).await;
            }
            Adapter::Mock(a) => Box::pin(a.execute(spec, sink)).await,
            Adapter::OpenAiCompat(a) => Box::pin(a.execute(spec, sink)).await,
            Adapter::Ollama(a) => Box::pin(a.execute(spec, sink)).await,
        }
    }

    /// One of the provider's own read-only API calls, for operators (see
    /// [`OllamaAdapter::native_api`]): the provider's status and body.
    /// Providers without such an API answer with a 400.
    pub async fn native_api(&self, method: &str, path: &str, body: Option<Bytes>) -> Result<(u16, Bytes), RunFailure> {
        match self {
            Adapter::Ollama(a) => a.native_api(method, path, body).await,
            Adapter::Mock(_) | Adapter::OpenAiCompat(_) => Err(RunFailure::new(
                codes::INVALID_REQUEST,
                400,
                FailureSource::Client,
                format!("provider `{}` has no native API (only kind = \"ollama\" has one)", self.id()),
            )),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests {
    use iop_core::exec::ExecEvent;

    use super::*;
    use crate::run::SinkClosed;

    /// Collects events; optionally closes after `close_after` events.
    #[derive(Debug, Default)]
    pub(crate) struct VecSink {
        pub(crate) events: Vec<ExecEvent>,
        pub(crate) close_after: Option<usize>,
    }

    impl EventSink for VecSink {
        async fn emit(&mut self, ev: ExecEvent) -> Result<(), SinkClosed> {
            if self.close_after.is_some_and(|n| self.events.len() >= n) {
                return Err(SinkClosed);
            }
            self.events.push(ev);
            Ok(())
        }
    }

    /// A chat run for `target` with one user message (and `max_tokens`).
    pub(crate) fn spec(target: &str, content: &str, max_tokens: Option<u32>) -> RunSpec {
        let mut body = serde_json::json!({"model": target, "messages": [{"role": "user", "content": content}]});
        if let Some(m) = max_tokens {
            body["max_tokens"] = m.into();
        }
        spec_body(target, &body.to_string())
    }

    /// A chat run for `target` with this request body.
    pub(crate) fn spec_body(target: &str, body: &str) -> RunSpec {
        RunSpec {
            run_id: "run-1".into(),
            target: target.into(),
            body: bytes::Bytes::copy_from_slice(body.as_bytes()),
            operation: crate::run::Operation::Chat,
            credential: None,
        }
    }

    fn cfg(kind: pb::ProviderKind, base_url: &str, max_concurrency: u32) -> pb::ProviderConfig {
        pb::ProviderConfig {
            id: "p1".into(),
            kind: kind as i32,
            base_url: base_url.into(),
            api_key: "sk-very-secret".into(),
            max_concurrency,
            mock: None,
            request_timeout_ms: 0,
            tls_ca_pem: Default::default(),
            ..Default::default()
        }
    }

    #[test]
    fn builds_each_kind() {
        let a = Adapter::from_config(&cfg(pb::ProviderKind::Mock, "", 3)).unwrap();
        assert!(matches!(a, Adapter::Mock(_)));
        assert_eq!((a.id(), a.max_concurrency()), ("p1", 3));
        let a = Adapter::from_config(&cfg(pb::ProviderKind::OpenaiCompat, "http://127.0.0.1:9000/v1", 2)).unwrap();
        assert!(matches!(a, Adapter::OpenAiCompat(_)));
        assert_eq!((a.id(), a.max_concurrency()), ("p1", 2));
        assert!(!format!("{a:?}").contains("very-secret"), "Debug leaks the api key: {a:?}");
        assert!(a.tunnels());
        let a = Adapter::from_config(&cfg(pb::ProviderKind::Ollama, "http://127.0.0.1:11434", 5)).unwrap();
        assert!(matches!(a, Adapter::Ollama(_)));
        assert_eq!((a.id(), a.max_concurrency(), a.tunnels()), ("p1", 5, false));
        assert!(!format!("{a:?}").contains("very-secret"), "Debug leaks the api key: {a:?}");
    }

    #[test]
    fn only_ollama_has_a_native_api() {
        let a = Adapter::from_config(&cfg(pb::ProviderKind::Mock, "", 1)).unwrap();
        let f = iop_core::rt::block_on_current(a.native_api("GET", "/api/tags", None)).unwrap().unwrap_err();
        assert_eq!((f.code, f.status, f.source), (codes::INVALID_REQUEST, 400, FailureSource::Client));
        assert!(f.message.contains("p1"), "{}", f.message);
        let a = Adapter::from_config(&cfg(pb::ProviderKind::OpenaiCompat, "http://127.0.0.1:1/v1", 1)).unwrap();
        let f = iop_core::rt::block_on_current(a.native_api("GET", "/api/tags", None)).unwrap().unwrap_err();
        assert_eq!(f.status, 400);
    }

    #[test]
    fn rejects_bad_configs() {
        let e = Adapter::from_config(&cfg(pb::ProviderKind::Unspecified, "", 1)).unwrap_err();
        assert_eq!(e, AdapterConfigError::Kind { id: "p1".into(), value: 0 });
        let mut c = cfg(pb::ProviderKind::Mock, "", 1);
        c.kind = 99;
        assert!(matches!(Adapter::from_config(&c), Err(AdapterConfigError::Kind { value: 99, .. })));
        let e = Adapter::from_config(&cfg(pb::ProviderKind::Mock, "", 0)).unwrap_err();
        assert_eq!(e, AdapterConfigError::MaxConcurrency { id: "p1".into() });
        let e = Adapter::from_config(&cfg(pb::ProviderKind::Ollama, "", 1)).unwrap_err();
        assert!(matches!(&e, AdapterConfigError::BaseUrl { id, .. } if id == "p1"), "{e:?}");
        let e = Adapter::from_config(&cfg(pb::ProviderKind::OpenaiCompat, "ftp://x", 1)).unwrap_err();
        assert!(matches!(&e, AdapterConfigError::BaseUrl { id, .. } if id == "p1"), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("p1") && msg.contains("base_url") && !msg.contains("very-secret"), "{msg}");
        let mut c = cfg(pb::ProviderKind::Mock, "", 1);
        c.id.clear();
        assert_eq!(Adapter::from_config(&c).unwrap_err(), AdapterConfigError::EmptyId);
    }
}
