//! One provider: its kind and settings as validated from the config, and
//! its wire form sent to the node. A kind lives here and nowhere else on
//! the edge side.

use std::{num::NonZeroU32, time::Duration};

use super::{
    edge::{optional_secret, split_host_port, MAX_REQUEST_TIMEOUT},
    raw::{self, check, RawProvider, RawProviderKind},
    ConfigError, Secret,
};
use crate::wire::pb;

/// One provider on a node.
/// How often a provider whose runtime health is lowered is probed, unless set.
pub const DEFAULT_HEALTH_PROBE_INTERVAL_MS: u64 = 5_000;
/// Largest `health_probe_interval_ms` (an hour).
pub const MAX_HEALTH_PROBE_INTERVAL_MS: u64 = 3_600_000;

#[derive(Debug, Clone, PartialEq)]
pub struct ProviderEntry {
    /// Provider id, unique within its node.
    pub id: String,
    /// What kind of provider and its kind-specific settings.
    pub kind: ProviderKind,
    /// Bearer credential sent upstream.
    pub api_key: Option<Secret>,
    /// Normal-context leases the edge grants concurrently on this provider.
    pub capacity: NonZeroU32,
    /// Long-context leases, a separate pool (0 = no long-context requests).
    pub long_capacity: u32,
    /// Upper bound for one upstream request.
    pub request_timeout: Duration,
    /// How long the provider may send nothing before the node ends the
    /// request with `response_stalled` (the wire's default when unset).
    pub response_stall_timeout: Duration,
    /// How often the edge probes this provider while its runtime health is
    /// lowered (unavailable after a stall, or still loading).
    pub health_probe_interval: Duration,
    /// The CA bundle (PEM, read from `tls_ca` when the config is loaded) an
    /// `https` provider's certificate must chain to; None = the node's
    /// system roots. Sent to the node with the provider's config.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// The APIs besides chat completions that the provider's server speaks
    /// itself, so requests to them go through the tunnel as they are.
    pub native: NativeApis,
}

/// APIs an OpenAI-compatible server may serve natively (`native_apis`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NativeApis {
    /// `/responses` (the OpenAI Responses API).
    pub responses: bool,
    /// `/messages` and `/messages/count_tokens` (the Anthropic Messages API).
    pub messages: bool,
}

impl NativeApis {
    /// The names `native_apis` takes.
    pub const NAMES: [&'static str; 2] = ["responses", "messages"];

    /// What a provider of `kind` speaks unless its `native_apis` says:
    /// OpenAI-compatible servers the Responses API (as before the key
    /// existed), vLLM the Messages API too; the others nothing.
    pub fn default_for(kind: &ProviderKind) -> Self {
        match kind {
            ProviderKind::OpenAiCompat { .. } => NativeApis { responses: true, messages: false },
            ProviderKind::Vllm { .. } => NativeApis { responses: true, messages: true },
            ProviderKind::Mock(_) | ProviderKind::Ollama { .. } => NativeApis::default(),
        }
    }
}

impl ProviderEntry {
    /// Concurrent runs the node admits locally: `capacity + long_capacity`
    /// (saturating).
    pub fn max_concurrency(&self) -> u32 {
        self.capacity.get().saturating_add(self.long_capacity)
    }
}

/// Provider kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// In-process deterministic mock.
    Mock(MockSettings),
    /// Any OpenAI-compatible HTTP server.
    OpenAiCompat {
        /// Parsed `base_url`.
        base_url: UpstreamUrl,
    },
    /// vLLM's OpenAI-compatible server.
    Vllm {
        /// Parsed `base_url` (…/v1).
        base_url: UpstreamUrl,
    },
    /// Ollama's native API.
    Ollama {
        /// Parsed `base_url` (the server root, e.g. http://127.0.0.1:11434).
        base_url: UpstreamUrl,
    },
}

impl ProviderKind {
    /// The config name of the kind.
    pub fn name(&self) -> &'static str {
        match self {
            ProviderKind::Mock(_) => "mock",
            ProviderKind::OpenAiCompat { .. } => "openai_compat",
            ProviderKind::Vllm { .. } => "vllm",
            ProviderKind::Ollama { .. } => "ollama",
        }
    }

    /// The provider speaks the OpenAI HTTP API: requests to it go through
    /// the provider tunnel, byte for byte. Other kinds run normalized.
    pub fn is_openai_compatible(&self) -> bool {
        matches!(self, ProviderKind::OpenAiCompat { .. } | ProviderKind::Vllm { .. })
    }

    /// The HTTP provider's base URL.
    pub fn base_url(&self) -> Option<&UpstreamUrl> {
        match self {
            ProviderKind::Mock(_) => None,
            ProviderKind::OpenAiCompat { base_url }
            | ProviderKind::Vllm { base_url }
            | ProviderKind::Ollama { base_url } => Some(base_url),
        }
    }
}

impl ProviderEntry {
    /// The provider's config as sent to its node.
    pub fn to_wire(&self) -> pb::ProviderConfig {
        let kind = match &self.kind {
            ProviderKind::Mock(_) => pb::ProviderKind::Mock,
            ProviderKind::OpenAiCompat { .. } => pb::ProviderKind::OpenaiCompat,
            ProviderKind::Vllm { .. } => pb::ProviderKind::Vllm,
            ProviderKind::Ollama { .. } => pb::ProviderKind::Ollama,
        };
        let mock = match &self.kind {
            ProviderKind::Mock(m) => Some(pb::MockSettings {
                tokens: m.tokens,
                token_interval_ms: millis(m.token_interval),
                first_token_delay_ms: millis(m.first_token_delay),
                reasoning: m.reasoning,
            }),
            _ => None,
        };
        pb::ProviderConfig {
            id: self.id.clone(),
            kind: kind as i32,
            base_url: self.kind.base_url().map(UpstreamUrl::to_url).unwrap_or_default(),
            api_key: self.api_key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default(),
            max_concurrency: self.max_concurrency(),
            mock,
            request_timeout_ms: millis(self.request_timeout),
            tls_ca_pem: self.tls_ca_pem.clone().map(bytes::Bytes::from).unwrap_or_default(),
            // Set by the edge's payload in managed mode.
            leased: false,
            credential_epoch: 0,
            long_capacity: self.long_capacity,
        }
    }
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Mock provider behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MockSettings {
    /// Tokens per completion (capped by the request's max_tokens).
    pub tokens: u32,
    /// Delay between tokens.
    pub token_interval: Duration,
    /// Delay before the first token.
    pub first_token_delay: Duration,
    /// Emit reasoning deltas before the content.
    pub reasoning: bool,
}

/// An `http://` or `https://host:port/prefix` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `https`: TLS, verified against the system's roots or the provider's
    /// `tls_ca`, with the host as SNI.
    pub tls: bool,
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// Port (default 80, 443 for https).
    pub port: u16,
    /// Path prefix without trailing slash, e.g. "/v1" or "".
    pub path_prefix: String,
}

impl UpstreamUrl {
    /// Parses `http[s]://host[:port][/prefix]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let scheme_end = s.find("://").ok_or("expected an http:// or https:// URL, e.g. http://127.0.0.1:9000/v1")?;
        let scheme = &s[..scheme_end];
        let tls = if scheme.eq_ignore_ascii_case("https") {
            true
        } else if scheme.eq_ignore_ascii_case("http") {
            false
        } else {
            return Err(format!("unsupported scheme `{scheme}`, expected http:// or https://"));
        };
        let rest = &s[scheme_end + 3..];
        if rest.contains(['?', '#']) {
            return Err("must not contain a query or fragment".into());
        }
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.contains('@') {
            return Err("must not contain credentials (use api_key)".into());
        }
        let (host, port) = split_host_port(authority)?;
        let port = match port {
            None if tls => 443,
            None => 80,
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(format!("invalid port `{p}`")),
            },
        };
        Ok(Self { tls, host: host.to_owned(), port, path_prefix: path.trim_end_matches('/').to_owned() })
    }

    /// The URL again, `http[s]://host:port/prefix`.
    pub fn to_url(&self) -> String {
        format!("{}://{}{}", if self.tls { "https" } else { "http" }, self.authority(), self.path_prefix)
    }

    /// `host:port` for the Host header and for connecting.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

pub(crate) fn provider_entry(key: &str, raw: RawProvider) -> Result<ProviderEntry, ConfigError> {
    let id = check::id(&format!("{key}.id"), raw.id)?;
    let kind = match check::required(&format!("{key}.kind"), raw.kind)? {
        RawProviderKind::Mock => {
            if let Some(url) = raw.base_url {
                return Err(ConfigError::invalid(format!("{key}.base_url"), url, "not allowed when kind = \"mock\""));
            }
            ProviderKind::Mock(mock_settings(key, raw.mock)?)
        }
        http @ (RawProviderKind::OpenaiCompat | RawProviderKind::Vllm | RawProviderKind::Ollama) => {
            let name = match http {
                RawProviderKind::Vllm => "vllm",
                RawProviderKind::Ollama => "ollama",
                _ => "openai_compat",
            };
            if raw.mock.is_some() {
                return Err(ConfigError::key(format!("{key}.mock"), "only allowed when kind = \"mock\""));
            }
            let url_key = format!("{key}.base_url");
            let url = check::required(&url_key, raw.base_url)
                .map_err(|_| ConfigError::key(&url_key, format!("is required when kind = \"{name}\"")))?;
            let base_url = UpstreamUrl::parse(&url).map_err(|why| ConfigError::invalid(&url_key, &url, why))?;
            match http {
                RawProviderKind::Vllm => ProviderKind::Vllm { base_url },
                RawProviderKind::Ollama => {
                    // The node appends `/api/chat`; `…/v1` is Ollama's OpenAI
                    // endpoint, a likely mix-up with `openai_compat`.
                    if base_url.path_prefix.ends_with("/v1") {
                        return Err(ConfigError::invalid(
                            &url_key,
                            &url,
                            "must be the Ollama server root (e.g. http://127.0.0.1:11434): the node appends \
                             /api/chat; for Ollama's /v1 endpoint use kind = \"openai_compat\"",
                        ));
                    }
                    ProviderKind::Ollama { base_url }
                }
                _ => ProviderKind::OpenAiCompat { base_url },
            }
        }
    };
    let capacity = check::range_u32(&format!("{key}.capacity"), raw.capacity, 64, 1, u32::MAX)?;
    let long_capacity = check::range_u32(&format!("{key}.long_capacity"), raw.long_capacity, 0, 0, u32::MAX)?;
    // At most a day: the node receives it in milliseconds as a u32.
    let request_timeout = check::secs(&format!("{key}.request_timeout_sec"), raw.request_timeout_sec, 600, 1)?;
    if request_timeout > MAX_REQUEST_TIMEOUT {
        return Err(ConfigError::invalid(
            format!("{key}.request_timeout_sec"),
            request_timeout.as_secs(),
            format!("must be at most {}", MAX_REQUEST_TIMEOUT.as_secs()),
        ));
    }
    let stall_key = format!("{key}.response_stall_timeout_ms");
    let default_stall = crate::liveness::DEFAULT_STALL_TIMEOUT.as_millis() as u64;
    let stall_ms = raw.response_stall_timeout_ms.unwrap_or(default_stall);
    if !(1..=crate::liveness::MAX_STALL_TIMEOUT_MS).contains(&stall_ms) {
        return Err(ConfigError::invalid(
            stall_key,
            stall_ms,
            format!("must be 1-{} (milliseconds)", crate::liveness::MAX_STALL_TIMEOUT_MS),
        ));
    }
    let probe_ms = raw.health_probe_interval_ms.unwrap_or(DEFAULT_HEALTH_PROBE_INTERVAL_MS);
    if !(10..=MAX_HEALTH_PROBE_INTERVAL_MS).contains(&probe_ms) {
        return Err(ConfigError::invalid(
            format!("{key}.health_probe_interval_ms"),
            probe_ms,
            format!("must be 10-{MAX_HEALTH_PROBE_INTERVAL_MS} (milliseconds)"),
        ));
    }
    let tls_ca_pem = tls_ca(key, raw.tls_ca, kind.base_url())?;
    let native = native_apis(key, raw.native_apis, &kind)?;
    Ok(ProviderEntry {
        tls_ca_pem,
        native,
        id,
        kind,
        response_stall_timeout: Duration::from_millis(stall_ms),
        health_probe_interval: Duration::from_millis(probe_ms),
        api_key: optional_secret(raw.api_key),
        // Checked to be at least 1 just above.
        capacity: NonZeroU32::new(capacity).unwrap_or(NonZeroU32::MIN),
        long_capacity,
        request_timeout,
    })
}

/// `native_apis`: only for the kinds the tunnel serves (their server is
/// reached as it is); each name once, from [`NativeApis::NAMES`].
fn native_apis(key: &str, names: Option<Vec<String>>, kind: &ProviderKind) -> Result<NativeApis, ConfigError> {
    let Some(names) = names else { return Ok(NativeApis::default_for(kind)) };
    let nkey = format!("{key}.native_apis");
    if !kind.is_openai_compatible() {
        return Err(ConfigError::key(
            nkey,
            format!(
                "only for kind = \"openai_compat\" or \"vllm\" (a server reached through the tunnel); for \
                 Ollama's own /v1/messages or /v1/responses use kind = \"openai_compat\" with base_url …/v1, not \
                 kind = \"{}\"",
                kind.name()
            ),
        ));
    }
    let mut native = NativeApis::default();
    for name in names {
        let slot = match name.as_str() {
            "responses" => &mut native.responses,
            "messages" => &mut native.messages,
            _ => {
                let why = format!("unknown API; expected any of {}", NativeApis::NAMES.join(", "));
                return Err(ConfigError::invalid(&nkey, &name, why));
            }
        };
        if std::mem::replace(slot, true) {
            return Err(ConfigError::invalid(&nkey, &name, "listed twice"));
        }
    }
    Ok(native)
}

/// `tls_ca`: a PEM CA bundle (read now, so a bad file fails the config
/// load), only for an https `base_url`.
fn tls_ca(key: &str, path: Option<String>, url: Option<&UpstreamUrl>) -> Result<Option<Vec<u8>>, ConfigError> {
    let Some(path) = path else { return Ok(None) };
    let ca_key = format!("{key}.tls_ca");
    if !url.is_some_and(|u| u.tls) {
        return Err(ConfigError::invalid(ca_key, &path, "only with an https:// base_url"));
    }
    let pem = std::fs::read(&path).map_err(|e| ConfigError::invalid(&ca_key, &path, format!("cannot read it: {e}")))?;
    crate::net::tls::parse_certs(&pem, &path).map_err(|e| ConfigError::invalid(&ca_key, &path, e.to_string()))?;
    Ok(Some(pem))
}

fn mock_settings(key: &str, raw: Option<raw::RawMock>) -> Result<MockSettings, ConfigError> {
    let Some(raw) = raw else { return Ok(MockSettings::default()) };
    let defaults = MockSettings::default();
    Ok(MockSettings {
        tokens: check::range_u32(&format!("{key}.mock.tokens"), raw.tokens, defaults.tokens, 1, 1_000_000)?,
        token_interval: Duration::from_millis(u64::from(check::range_u32(
            &format!("{key}.mock.token_interval_ms"),
            raw.token_interval_ms,
            0,
            0,
            u32::MAX,
        )?)),
        first_token_delay: Duration::from_millis(u64::from(check::range_u32(
            &format!("{key}.mock.first_token_delay_ms"),
            raw.first_token_delay_ms,
            0,
            0,
            u32::MAX,
        )?)),
        reasoning: raw.reasoning.unwrap_or(defaults.reasoning),
    })
}

impl Default for MockSettings {
    /// 16 tokens, no delays, no reasoning.
    fn default() -> Self {
        Self { tokens: 16, token_interval: Duration::ZERO, first_token_delay: Duration::ZERO, reasoning: false }
    }
}
