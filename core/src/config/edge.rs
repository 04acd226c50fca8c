//! Validated edge configuration.

use std::{
    collections::HashMap,
    net::{Ipv6Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use super::{
    provider::{provider_entry, ProviderEntry},
    raw::{self, check, RawEdge, RawModel, RawNode, RawTarget},
    ConfigError, Secret, TestingSettings,
};
use crate::wire::DEFAULT_MAX_FRAME_BYTES;

/// Smallest accepted `max_frame_bytes` (both binaries).
pub const MIN_FRAME_BYTES: usize = 4096;
/// Largest accepted `max_frame_bytes` (both binaries): 1 GiB.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// The `max_frame_bytes` key, shared by both configs.
pub(crate) fn max_frame_bytes(value: Option<u64>) -> Result<usize, ConfigError> {
    check::range_usize("max_frame_bytes", value, DEFAULT_MAX_FRAME_BYTES, MIN_FRAME_BYTES, MAX_FRAME_BYTES)
}
/// Largest accepted `workers`.
pub const MAX_WORKERS: usize = 1024;
/// Largest accepted `models[].queue_timeout_ms`: one day.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// Longest `request_timeout_sec` (one day).
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The whole validated edge configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeConfig {
    /// Reactor threads; default = available cores.
    pub workers: usize,
    /// Pin each reactor thread to a core (`pin_workers`); see DESIGN.md.
    pub pin_workers: bool,
    /// Client-facing HTTP server.
    pub http: HttpSettings,
    /// Where nodes connect. None only when `embedded_node` is set (then an
    /// ephemeral loopback port is used).
    pub node_listen: Option<SocketAddr>,
    /// Limits on node connections before they are registered and ready.
    pub node_handshake: HandshakeSettings,
    /// When a silent link that owes the edge something is probed, and how
    /// long the probe may take before the link is suspect.
    pub link_probe: LinkProbe,
    /// TLS on the node listener (`[node_listener.tls]`); with `client_ca`,
    /// managed mode: every node presents a certificate for its id.
    pub node_tls: Option<super::ListenerTls>,
    /// Largest edge↔node frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// Run this node inside the edge process.
    pub embedded_node: Option<EmbeddedNode>,
    /// Configured nodes, in file order.
    pub nodes: Vec<NodeEntry>,
    /// Public model groups, in file order; names unique. Shared: a request
    /// holds its group without copying it.
    pub models: Vec<Arc<ModelGroup>>,
    /// Bearer token protecting `/admin`.
    pub admin_token: Option<Secret>,
    /// Client keys (`[[api_keys]]`); with any, every `/v1` request needs one.
    pub api_keys: Vec<super::ApiKeyEntry>,
    /// The coordinator's agents (`[[agents]]`), in file order; names unique
    /// and distinct from the model groups'.
    pub agents: Vec<super::AgentEntry>,
    /// Cache affinity (`[affinity]`).
    pub affinity: super::AffinitySettings,
    /// The API keys' limits shared across edges (`[cluster]`); None: each
    /// edge enforces them alone.
    pub cluster: Option<super::ClusterSettings>,
    /// How long SIGINT/SIGTERM lets requests in flight finish.
    pub shutdown_grace: Duration,
    /// Test-only timers (`[testing]`); defaults outside tests.
    pub testing: TestingSettings,
}

/// Client-facing HTTP settings.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Largest request head (431 beyond).
    pub max_header_bytes: usize,
    /// Largest request body (413 beyond).
    pub max_body_bytes: usize,
    /// Idle keep-alive connections are closed after this.
    pub idle_timeout: Duration,
    /// A request head must arrive within this, however it trickles (408).
    pub header_timeout: Duration,
    /// A request body must make progress at least this often (408).
    pub body_timeout: Duration,
    /// The whole request (head and body) must arrive within this (408).
    pub read_timeout: Duration,
    /// One structured `iop::access` log line per request (on by default).
    pub access_log: bool,
    /// The client header whose value is the request's session id
    /// (`http.session_header`, lower-cased; None: off): an opaque
    /// correlation for the run store, events and the access log.
    pub session_header: Option<String>,
    /// Client connections open at once on the edge; None = derived from
    /// the open-file limit at start.
    pub max_connections: Option<usize>,
    /// Request body bytes being received and parsed at once per worker
    /// core; beyond it 503.
    pub max_inflight_body_bytes: usize,
    /// Responses API WebSockets open at once on the edge (0: the WebSocket
    /// mode is off).
    pub max_websockets: usize,
    /// TLS on the client listener (`[http.tls]`); it then speaks only TLS.
    pub tls: Option<super::ListenerTls>,
}

/// Limits on node connections that have not finished the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeSettings {
    /// Register and ready must both complete within this after accept.
    pub timeout: Duration,
    /// Node connections in the handshake at once on the edge.
    pub max_pending: usize,
    /// Handshakes from one address (IPv6: one /64) that have not presented
    /// a valid token yet, at once; a newcomer past it closes that
    /// address's oldest.
    pub per_address: usize,
    /// Of `max_pending`, the slots only an address with no handshake in
    /// progress may take: one address never gets them all.
    pub reserve: usize,
    /// A connection that sends nothing for this long after accept is
    /// closed (a node sends its first frame, or its TLS ClientHello, at once).
    pub first_bytes_timeout: Duration,
}

impl Default for HandshakeSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(DEFAULT_HANDSHAKE_TIMEOUT_SEC),
            max_pending: DEFAULT_MAX_HANDSHAKES,
            per_address: DEFAULT_HANDSHAKES_PER_ADDRESS,
            reserve: DEFAULT_MAX_HANDSHAKES / 4,
            first_bytes_timeout: Duration::from_millis(DEFAULT_FIRST_BYTES_TIMEOUT_MS),
        }
    }
}

/// A link that owes the edge something (runs in flight) and sent nothing
/// for `silence` is pinged; no frame within `answer_within` after that
/// makes it *suspect*: no new dispatch to it until any frame arrives.
/// Closing stays the heartbeat's (`testing.heartbeat_wait_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkProbe {
    /// `node_listener.suspect_after_ms`.
    pub silence: Duration,
    /// `node_listener.probe_timeout_ms`.
    pub answer_within: Duration,
}

impl Default for LinkProbe {
    fn default() -> Self {
        Self {
            silence: Duration::from_millis(DEFAULT_SUSPECT_AFTER_MS),
            answer_within: Duration::from_millis(DEFAULT_PROBE_TIMEOUT_MS),
        }
    }
}

/// Default `node_listener.suspect_after_ms`: well under the heartbeat's
/// 45 s wait, well over a live link's silence between frames of a busy
/// run (tokens, credit) yet short enough that a frozen node stops taking
/// new work within seconds.
pub const DEFAULT_SUSPECT_AFTER_MS: u64 = 3_000;
/// Default `node_listener.probe_timeout_ms`: a live node's reactor answers
/// a ping in well under a millisecond; this leaves room for a loaded host.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 1_000;

/// Default `node_listener.handshake_timeout_sec`.
pub const DEFAULT_HANDSHAKE_TIMEOUT_SEC: u64 = 10;
/// Default `node_listener.max_handshakes`.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default `node_listener.max_handshakes_per_address`.
pub const DEFAULT_HANDSHAKES_PER_ADDRESS: usize = 16;
/// Default `node_listener.first_bytes_timeout_ms`.
pub const DEFAULT_FIRST_BYTES_TIMEOUT_MS: u64 = 2000;
/// Smallest default `http.max_inflight_body_bytes` (16 MiB per core).
pub const DEFAULT_INFLIGHT_BODY_BYTES: usize = 16 << 20;

/// A node run inside the edge process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedNode {
    /// Must name one of `nodes`.
    pub node_id: String,
}

/// One configured node and the providers it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    /// Unique node id.
    pub id: String,
    /// Registration token (unique across nodes).
    pub token: Secret,
    /// Providers, in file order; ids unique within the node.
    pub providers: Vec<ProviderEntry>,
    /// Workspaces approved on this node for the coordinator (refs unique
    /// across the config).
    pub workspaces: Vec<super::WorkspaceEntry>,
}

impl NodeEntry {
    /// The provider with this id.
    pub fn provider(&self, id: &str) -> Option<&ProviderEntry> {
        self.providers.iter().find(|p| p.id == id)
    }
}

/// A public model name and the candidates that can serve it, possibly on
/// several nodes. Several groups may share one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelGroup {
    /// Public name clients send as `model`.
    pub name: String,
    /// Candidates in file order: non-empty, no (node, provider) pair twice,
    /// each naming a configured node and one of its providers.
    pub targets: Vec<ModelTarget>,
    /// Estimated prompt tokens above which a request is "long" (and takes a
    /// long-context lease). None = every request is normal. When set, at
    /// least one target's provider has `long_capacity > 0`.
    pub long_context_threshold: Option<u32>,
    /// Requests that may wait for a lease; 0 = never queue.
    pub max_waiters: u32,
    /// How long a request may wait for a lease.
    pub queue_timeout: Duration,
    /// Refuse (400) a request whose translation for a provider that does not
    /// speak its API would leave something out, instead of serving it with
    /// what was left out named.
    pub strict: bool,
}

/// One candidate of a [`ModelGroup`]. Shared strings: a request's
/// admission copies its target without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTarget {
    /// Node id (names one of `EdgeConfig::nodes`).
    pub node: Arc<str>,
    /// Provider id on that node.
    pub provider: Arc<str>,
    /// Model name sent upstream.
    pub upstream_model: Arc<str>,
}

impl EdgeConfig {
    /// Parses and validates TOML text, expanding `${VAR}` through `env`.
    pub fn from_toml(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::try_from(raw::parse::<RawEdge>(text, env)?)
    }

    /// The node entry holding `token`, compared in constant time.
    pub fn node_by_token(&self, token: &str) -> Option<&NodeEntry> {
        // Compare against every node (no early exit) so timing does not tell
        // how far down the list a guessed token got.
        self.nodes.iter().fold(None, |found, node| if node.token.ct_eq(token) { Some(node) } else { found })
    }

    /// The node entry with this id.
    pub fn node(&self, id: &str) -> Option<&NodeEntry> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The group for a public model name.
    pub fn model(&self, name: &str) -> Option<&Arc<ModelGroup>> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Provider `provider` of node `node` (e.g. of a [`ModelTarget`]).
    pub fn provider(&self, node: &str, provider: &str) -> Option<&ProviderEntry> {
        self.node(node).and_then(|n| n.provider(provider))
    }
}

/// Splits `host[:port]` (host may be a bracketed IPv6 literal, returned
/// without brackets). Rejects empty hosts and unbracketed IPv6.
pub(crate) fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed `[` in IPv6 address")?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(format!("invalid IPv6 address `{host}`"));
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| format!("unexpected `{after}` after IPv6 address"))?),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((_, p)) if p.contains(':') => return Err("IPv6 addresses must be in brackets, e.g. [::1]".into()),
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("missing host".into());
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')) {
        return Err(format!("invalid host `{host}`"));
    }
    Ok((host, port))
}

/// The default `http.session_header`: the header Claude Code sends on
/// every request (one id per session); other agents' are configured.
pub const DEFAULT_SESSION_HEADER: &str = "x-claude-code-session-id";

/// Headers that carry credentials: never a session id or an affinity key
/// (the one is logged, a hash of the other is).
const CREDENTIAL_HEADERS: [&str; 6] =
    ["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-goog-api-key"];

/// `http.session_header`.
fn session_header(value: Option<String>) -> Result<Option<String>, ConfigError> {
    header_name("http.session_header", value, DEFAULT_SESSION_HEADER, "the session id is logged")
}

/// Config key `key` naming a request header: an RFC 9110 token of at most
/// 64 characters, lower-cased; absent: `default`; empty: none. A header
/// that carries a credential is refused (`logged` says why it matters).
pub(crate) fn header_name(
    key: &str,
    value: Option<String>,
    default: &str,
    logged: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(name) = value else { return Ok(Some(default.to_owned())) };
    if name.is_empty() {
        return Ok(None);
    }
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.len() > 64 || !name.bytes().all(tchar) {
        let why = "must be a header name of at most 64 characters (letters, digits, `-`, `_` and the other \
                   token characters), or empty for none";
        return Err(ConfigError::invalid(key, name.escape_debug(), why));
    }
    let name = name.to_ascii_lowercase();
    if CREDENTIAL_HEADERS.contains(&name.as_str()) {
        return Err(ConfigError::invalid(key, &name, format!("carries a credential, and {logged}")));
    }
    Ok(Some(name))
}

/// Empty secrets mean "not set" (so `${VAR:-}` can switch them off).
pub(crate) fn optional_secret(value: Option<String>) -> Option<Secret> {
    value.filter(|v| !v.is_empty()).map(Secret::new)
}

impl TryFrom<RawEdge> for EdgeConfig {
    type Error = ConfigError;

    fn try_from(raw: RawEdge) -> Result<Self, ConfigError> {
        let default_workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS);
        let workers = check::range_usize("workers", raw.workers, default_workers, 1, MAX_WORKERS)?;
        let max_frame_bytes = max_frame_bytes(raw.max_frame_bytes)?;
        let admin_token = optional_secret(raw.admin_token);
        let shutdown_grace = check::secs("shutdown_grace_sec", raw.shutdown_grace_sec, 30, 0)?;

        let http = check::required("http", raw.http)?;
        let http_settings = HttpSettings {
            listen: check::socket_addr("http.listen", http.listen)?,
            max_header_bytes: check::range_usize("http.max_header_bytes", http.max_header_bytes, 16384, 1024, 1 << 20)?,
            max_body_bytes: check::range_usize("http.max_body_bytes", http.max_body_bytes, 4 << 20, 1024, 256 << 20)?,
            idle_timeout: check::secs("http.idle_timeout_sec", http.idle_timeout_sec, 60, 1)?,
            header_timeout: check::secs("http.header_timeout_sec", http.header_timeout_sec, 10, 1)?,
            body_timeout: check::secs("http.body_timeout_sec", http.body_timeout_sec, 10, 1)?,
            read_timeout: check::secs("http.read_timeout_sec", http.read_timeout_sec, 60, 1)?,
            access_log: http.access_log.unwrap_or(true),
            session_header: session_header(http.session_header)?,
            max_connections: match http.max_connections {
                None => None,
                Some(n) => Some(check::range_usize("http.max_connections", Some(n), 1, 1, 10_000_000)?),
            },
            max_inflight_body_bytes: 0,
            max_websockets: check::range_usize("http.max_websockets", http.max_websockets, 1024, 0, 10_000_000)?,
            tls: super::tls::listener("http.tls", http.tls, false, super::HTTP_TLS_HANDSHAKES)?,
        };
        // A body the limit allows must fit in the per-core budget.
        let max_inflight_body_bytes = check::range_usize(
            "http.max_inflight_body_bytes",
            http.max_inflight_body_bytes,
            DEFAULT_INFLIGHT_BODY_BYTES.max(http_settings.max_body_bytes),
            http_settings.max_body_bytes,
            1 << 40,
        )?;
        let http = HttpSettings { max_inflight_body_bytes, ..http_settings };

        if raw.nodes.is_empty() {
            return Err(ConfigError::key("nodes", "at least one [[nodes]] entry is required"));
        }
        let nodes = raw.nodes.into_iter().enumerate().map(|(i, n)| node_entry(i, n)).collect::<Result<Vec<_>, _>>()?;
        let mut ids = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            if let Some(first) = ids.insert(node.id.as_str(), i) {
                return Err(ConfigError::invalid(
                    format!("nodes[{i}].id"),
                    &node.id,
                    format!("duplicates nodes[{first}].id"),
                ));
            }
            if let Some(first) = nodes[..i].iter().position(|other| other.token == node.token) {
                return Err(ConfigError::invalid(
                    format!("nodes[{i}].token"),
                    &node.token,
                    format!("duplicates the token of nodes[{first}] (each node needs its own)"),
                ));
            }
        }

        let embedded_node = match raw.embedded_node {
            None => None,
            Some(e) => {
                let node_id = check::non_empty("embedded_node.node", e.node)?;
                if !ids.contains_key(node_id.as_str()) {
                    return Err(ConfigError::invalid("embedded_node.node", &node_id, "no [[nodes]] entry has this id"));
                }
                Some(EmbeddedNode { node_id })
            }
        };
        let (node_listen, node_handshake, node_tls, link_probe) = match raw.node_listener {
            Some(l) => {
                let link_probe = link_probe(&l)?;
                let handshake = handshake_settings(&l)?;
                let tls = super::tls::listener("node_listener.tls", l.tls, true, super::NODE_TLS_HANDSHAKES)?;
                let listen = check::socket_addr("node_listener.listen", l.listen)?;
                (Some(listen), handshake, tls, link_probe)
            }
            None if embedded_node.is_some() => (None, HandshakeSettings::default(), None, LinkProbe::default()),
            None => return Err(ConfigError::key("node_listener", "is required unless [embedded_node] is set")),
        };

        if embedded_node.is_some() && node_tls.is_some() {
            return Err(ConfigError::key(
                "embedded_node",
                "cannot be used with [node_listener.tls]: the embedded node links over loopback without TLS",
            ));
        }
        if raw.models.is_empty() {
            return Err(ConfigError::key("models", "at least one [[models]] entry is required"));
        }
        let mut models: Vec<Arc<ModelGroup>> = Vec::with_capacity(raw.models.len());
        for (i, m) in raw.models.into_iter().enumerate() {
            let group = model_group(i, m, &nodes)?;
            if let Some(first) = models.iter().position(|other| other.name == group.name) {
                return Err(ConfigError::invalid(
                    format!("models[{i}].name"),
                    &group.name,
                    format!("duplicates models[{first}].name"),
                ));
            }
            models.push(Arc::new(group));
        }
        let api_keys = super::api_keys::api_keys(raw.api_keys, &models)?;
        super::workspace::unique_refs(&nodes)?;
        let agents = super::workspace::agents(raw.agents, &models, &nodes)?;
        let testing = TestingSettings::try_from(raw.testing)?;
        let affinity = super::AffinitySettings::try_from(raw.affinity)?;
        let cluster = raw.cluster.map(|c| super::ClusterSettings::try_from(Some(c))).transpose()?;

        Ok(Self {
            workers,
            pin_workers: raw.pin_workers.unwrap_or(false),
            http,
            node_listen,
            node_handshake,
            link_probe,
            node_tls,
            max_frame_bytes,
            embedded_node,
            nodes,
            models,
            admin_token,
            api_keys,
            agents,
            affinity,
            cluster,
            shutdown_grace,
            testing,
        })
    }
}

/// `[node_listener]`'s probe of silent links.
fn link_probe(l: &raw::RawNodeListener) -> Result<LinkProbe, ConfigError> {
    let silence =
        check::millis("node_listener.suspect_after_ms", l.suspect_after_ms, DEFAULT_SUSPECT_AFTER_MS, 1, 3_600_000)?;
    let answer_within =
        check::millis("node_listener.probe_timeout_ms", l.probe_timeout_ms, DEFAULT_PROBE_TIMEOUT_MS, 1, 3_600_000)?;
    Ok(LinkProbe { silence, answer_within })
}

/// `[node_listener]`'s handshake limits.
fn handshake_settings(l: &raw::RawNodeListener) -> Result<HandshakeSettings, ConfigError> {
    let timeout =
        check::secs("node_listener.handshake_timeout_sec", l.handshake_timeout_sec, DEFAULT_HANDSHAKE_TIMEOUT_SEC, 1)?;
    let max_pending =
        check::range_usize("node_listener.max_handshakes", l.max_handshakes, DEFAULT_MAX_HANDSHAKES, 1, 1_000_000)?;
    let per_address = check::range_usize(
        "node_listener.max_handshakes_per_address",
        l.max_handshakes_per_address,
        DEFAULT_HANDSHAKES_PER_ADDRESS,
        1,
        1_000_000,
    )?;
    // Below max_handshakes, so an address holding none always finds room.
    let reserve = check::range_usize(
        "node_listener.handshake_reserve",
        l.handshake_reserve,
        max_pending / 4,
        0,
        max_pending - 1,
    )?;
    let key = "node_listener.first_bytes_timeout_ms";
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let first_bytes_timeout = match l.first_bytes_timeout_ms {
        // Within the handshake's own deadline (which is at least a second).
        None => Duration::from_millis(DEFAULT_FIRST_BYTES_TIMEOUT_MS.min(timeout_ms)),
        Some(ms) if ms > timeout_ms => {
            return Err(ConfigError::invalid(
                key,
                ms,
                format!("must be at most node_listener.handshake_timeout_sec ({timeout_ms} ms)"),
            ))
        }
        ms => check::millis(key, ms, DEFAULT_FIRST_BYTES_TIMEOUT_MS, 1, timeout_ms)?,
    };
    Ok(HandshakeSettings { timeout, max_pending, per_address, reserve, first_bytes_timeout })
}

fn node_entry(i: usize, raw: RawNode) -> Result<NodeEntry, ConfigError> {
    let id = check::id(&format!("nodes[{i}].id"), raw.id)?;
    let token = Secret::new(check::non_empty(&format!("nodes[{i}].token"), raw.token)?);
    if raw.providers.is_empty() {
        return Err(ConfigError::key(
            format!("nodes[{i}].providers"),
            "at least one [[nodes.providers]] entry is required",
        ));
    }
    let mut providers: Vec<ProviderEntry> = Vec::with_capacity(raw.providers.len());
    for (j, p) in raw.providers.into_iter().enumerate() {
        let key = format!("nodes[{i}].providers[{j}]");
        let provider = provider_entry(&key, p)?;
        if let Some(first) = providers.iter().position(|other| other.id == provider.id) {
            return Err(ConfigError::invalid(
                format!("{key}.id"),
                &provider.id,
                format!("duplicates nodes[{i}].providers[{first}].id"),
            ));
        }
        providers.push(provider);
    }
    let workspaces = raw
        .workspaces
        .into_iter()
        .enumerate()
        .map(|(j, w)| super::workspace::workspace_entry(&format!("nodes[{i}].workspaces[{j}]"), w))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeEntry { id, token, providers, workspaces })
}

fn model_group(i: usize, raw: RawModel, nodes: &[NodeEntry]) -> Result<ModelGroup, ConfigError> {
    let key = format!("models[{i}]");
    let name = check::non_empty(&format!("{key}.name"), raw.name)?;
    let targets = match raw.targets {
        Some(targets) => {
            for (shorthand, value) in
                [("node", &raw.node), ("provider", &raw.provider), ("upstream_model", &raw.upstream_model)]
            {
                if let Some(value) = value {
                    return Err(ConfigError::invalid(
                        format!("{key}.{shorthand}"),
                        value,
                        "not allowed together with [[models.targets]] (set it in each target)",
                    ));
                }
            }
            explicit_targets(&key, targets, &name, nodes)?
        }
        None => shorthand_targets(&key, raw.node, raw.provider, raw.upstream_model, &name, nodes)?,
    };

    let threshold_key = format!("{key}.long_context_threshold");
    let long_context_threshold = match raw.long_context_threshold {
        None => None,
        Some(t) => Some(check::range_u32(&threshold_key, Some(t), 1, 1, u32::MAX)?),
    };
    let max_waiters = check::range_u32(&format!("{key}.max_waiters"), raw.max_waiters, 256, 0, u32::MAX)?;
    let queue_timeout =
        check::millis(&format!("{key}.queue_timeout_ms"), raw.queue_timeout_ms, 30_000, 1, MAX_QUEUE_TIMEOUT_MS)?;

    if let Some(threshold) = long_context_threshold {
        let has_long_pool = targets.iter().any(|t| {
            let provider = nodes.iter().find(|n| *n.id == *t.node).and_then(|n| n.provider(&t.provider));
            provider.is_some_and(|p| p.long_capacity > 0)
        });
        if !has_long_pool {
            return Err(ConfigError::invalid(
                threshold_key,
                threshold,
                "no target's provider has long_capacity > 0, so long requests could never run",
            ));
        }
    }

    let strict = raw.strict.unwrap_or(false);
    Ok(ModelGroup { name, targets, long_context_threshold, max_waiters, queue_timeout, strict })
}

/// `[[models.targets]]`: each names an existing node and one of its
/// providers; no (node, provider) pair twice.
fn explicit_targets(
    model_key: &str,
    raw: Vec<RawTarget>,
    name: &str,
    nodes: &[NodeEntry],
) -> Result<Vec<ModelTarget>, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::key(
            format!("{model_key}.targets"),
            "at least one [[models.targets]] entry is required",
        ));
    }
    let mut targets: Vec<ModelTarget> = Vec::with_capacity(raw.len());
    for (j, t) in raw.into_iter().enumerate() {
        let key = format!("{model_key}.targets[{j}]");
        let node_id = check::non_empty(&format!("{key}.node"), t.node)?;
        let provider = check::non_empty(&format!("{key}.provider"), t.provider)?;
        let node = nodes
            .iter()
            .find(|n| n.id == node_id)
            .ok_or_else(|| ConfigError::invalid(format!("{key}.node"), &node_id, "no [[nodes]] entry has this id"))?;
        if node.provider(&provider).is_none() {
            return Err(ConfigError::invalid(
                format!("{key}.provider"),
                &provider,
                format!("node `{node_id}` has no provider with this id"),
            ));
        }
        let upstream_model = upstream_model(&format!("{key}.model"), t.model, name)?;
        if let Some(first) = targets.iter().position(|o| *o.node == *node_id && *o.provider == *provider) {
            return Err(ConfigError::invalid(
                format!("{key}.provider"),
                &provider,
                format!("node `{node_id}` with this provider duplicates {model_key}.targets[{first}]"),
            ));
        }
        targets.push(ModelTarget {
            node: node_id.into(),
            provider: provider.into(),
            upstream_model: upstream_model.into(),
        });
    }
    Ok(targets)
}

/// The shorthand `node` / `provider` / `upstream_model` on the model: one
/// target, or with `node` omitted one per node that has the provider.
fn shorthand_targets(
    key: &str,
    node: Option<String>,
    provider: Option<String>,
    upstream: Option<String>,
    name: &str,
    nodes: &[NodeEntry],
) -> Result<Vec<ModelTarget>, ConfigError> {
    let provider_key = format!("{key}.provider");
    let provider = check::required(&provider_key, provider)
        .map_err(|_| ConfigError::key(&provider_key, "is required (or list [[models.targets]])"))?;
    if provider.is_empty() {
        return Err(ConfigError::invalid(provider_key, "", "must not be empty"));
    }
    let upstream_model = upstream_model(&format!("{key}.upstream_model"), upstream, name)?;
    let (shared_provider, shared_model): (Arc<str>, Arc<str>) = (provider.as_str().into(), upstream_model.into());
    let target = |node: &NodeEntry| ModelTarget {
        node: node.id.as_str().into(),
        provider: shared_provider.clone(),
        upstream_model: shared_model.clone(),
    };
    match node {
        Some(node_id) => {
            let node = nodes.iter().find(|n| n.id == node_id).ok_or_else(|| {
                ConfigError::invalid(format!("{key}.node"), &node_id, "no [[nodes]] entry has this id")
            })?;
            if node.provider(&provider).is_none() {
                return Err(ConfigError::invalid(
                    provider_key,
                    &provider,
                    format!("node `{node_id}` has no provider with this id"),
                ));
            }
            Ok(vec![target(node)])
        }
        None => {
            let targets: Vec<ModelTarget> =
                nodes.iter().filter(|n| n.provider(&provider).is_some()).map(target).collect();
            if targets.is_empty() {
                return Err(ConfigError::invalid(provider_key, &provider, "no node has a provider with this id"));
            }
            Ok(targets)
        }
    }
}

/// The upstream model name at `key`: defaults to the group name, never empty.
fn upstream_model(key: &str, value: Option<String>, name: &str) -> Result<String, ConfigError> {
    match value {
        None => Ok(name.to_owned()),
        Some(m) if m.is_empty() => Err(ConfigError::invalid(key, "", "must not be empty (omit it to use `name`)")),
        Some(m) => Ok(m),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::provider::{MockSettings, ProviderKind, UpstreamUrl};
    use crate::config::ListenerTls;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Smallest valid config; tests patch it with `str::replace`.
    const BASE: &str = r#"
[http]
listen = "127.0.0.1:8080"

[node_listener]
listen = "127.0.0.1:7070"

[[nodes]]
id = "node-1"
token = "tok-1"

[[nodes.providers]]
id = "local"
kind = "openai_compat"
base_url = "http://127.0.0.1:9000/v1"

[[models]]
name = "m"
provider = "local"
"#;

    fn ok(text: &str) -> EdgeConfig {
        EdgeConfig::from_toml(text, &no_env).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
    }

    fn err(text: &str) -> ConfigError {
        match EdgeConfig::from_toml(text, &no_env) {
            Ok(c) => panic!("accepted: {c:?}\n---\n{text}"),
            Err(e) => e,
        }
    }

    /// Patches BASE (each `from` must occur) and expects a rejection naming `key`.
    fn rejects(patches: &[(&str, &str)], key: &str, needle: &str) -> ConfigError {
        let mut text = BASE.to_owned();
        for (from, to) in patches {
            assert!(text.contains(from), "patch target `{from}` not in BASE");
            text = text.replacen(from, to, 1);
        }
        let e = err(&text);
        assert_eq!(e.key_path(), Some(key), "{e}");
        assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`");
        assert!(e.to_string().starts_with(&format!("config key `{key}`: ")), "{e}");
        e
    }

    #[test]
    fn tls_sections() {
        let http = "listen = \"127.0.0.1:8080\"\n";
        let node = "listen = \"127.0.0.1:7070\"\n";
        let c =
            ok(&BASE.replacen(http, &format!("{http}[http.tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n"), 1).replacen(
                node,
                &format!("{node}[node_listener.tls]\ncert = \"/n.pem\"\nkey = \"/nk.pem\"\nclient_ca = \"/ca.pem\"\n"),
                1,
            ));
        let t = c.http.tls.unwrap();
        assert_eq!((t.cert.to_str(), t.key.to_str(), t.client_ca), (Some("/c.pem"), Some("/k.pem"), None));
        assert_eq!(c.node_tls.unwrap().client_ca.unwrap().to_str(), Some("/ca.pem"));
        rejects(&[(http, &format!("{http}[http.tls]\ncert = \"/c.pem\"\n"))], "http.tls.key", "is required");
        rejects(
            &[(http, &format!("{http}[http.tls]\ncert = \"/c\"\nkey = \"/k\"\nclient_ca = \"/ca\"\n"))],
            "http.tls.client_ca",
            "only on [node_listener.tls]",
        );
        rejects(&[(http, &format!("{http}[http.tls]\ncert = \"\"\nkey = \"/k\"\n"))], "http.tls.cert", "file path");
        let embedded = format!("[embedded_node]\nnode = \"node-1\"\n[node_listener]\n{node}[node_listener.tls]\ncert = \"/n\"\nkey = \"/k\"\n");
        rejects(&[(&format!("[node_listener]\n{node}"), &embedded)], "embedded_node", "[node_listener.tls]");
    }

    fn top(line: &str) -> (&'static str, String) {
        ("[http]", format!("{line}\n[http]"))
    }

    fn target(node: &str, provider: &str, model: &str) -> ModelTarget {
        ModelTarget { node: node.into(), provider: provider.into(), upstream_model: model.into() }
    }

    const PROVIDER_KIND: &str = "kind = \"openai_compat\"";
    const PROVIDER_URL: &str = "base_url = \"http://127.0.0.1:9000/v1\"";

    #[test]
    fn native_apis_default_by_kind_and_can_be_set() {
        let native = |patches: &[(&str, &str)]| {
            let mut text = BASE.to_owned();
            for (from, to) in patches {
                text = text.replacen(from, to, 1);
            }
            let c = ok(&text);
            let p = &c.nodes[0].providers[0];
            (p.native.responses, p.native.messages)
        };
        assert_eq!(native(&[]), (true, false), "openai_compat: the Responses API, as before the key");
        assert_eq!(native(&[(PROVIDER_KIND, "kind = \"vllm\"")]), (true, true));
        let set = "base_url = \"http://h:1/v1\"\nnative_apis = [\"messages\"]";
        assert_eq!(native(&[(PROVIDER_URL, set)]), (false, true));
    }

    #[test]
    fn base_and_defaults() {
        let c = ok(BASE);
        assert!(c.workers >= 1 && c.workers <= MAX_WORKERS);
        assert!(!c.pin_workers);
        assert_eq!(c.max_frame_bytes, DEFAULT_MAX_FRAME_BYTES);
        assert_eq!(c.admin_token, None);
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.http.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.http.max_header_bytes, 16384);
        assert_eq!(c.http.max_body_bytes, 4 * 1024 * 1024);
        assert_eq!(c.http.idle_timeout, Duration::from_secs(60));
        assert!(c.http.access_log);
        assert_eq!(c.http.session_header.as_deref(), Some(DEFAULT_SESSION_HEADER));
        assert_eq!(c.http.header_timeout, Duration::from_secs(10));
        assert_eq!(c.http.body_timeout, Duration::from_secs(10));
        assert_eq!(c.http.read_timeout, Duration::from_secs(60));
        assert_eq!(c.http.max_connections, None);
        assert_eq!(c.http.max_inflight_body_bytes, 16 << 20);
        assert_eq!(c.node_listen, Some("127.0.0.1:7070".parse().unwrap()));
        assert_eq!(
            c.node_handshake,
            HandshakeSettings {
                timeout: Duration::from_secs(10),
                max_pending: 64,
                per_address: 16,
                reserve: 16,
                first_bytes_timeout: Duration::from_secs(2),
            }
        );
        assert_eq!(c.node_handshake, HandshakeSettings::default());
        assert_eq!(c.embedded_node, None);
        let p = &c.nodes[0].providers[0];
        assert_eq!((p.capacity.get(), p.long_capacity, p.max_concurrency()), (64, 0, 64));
        assert_eq!(p.request_timeout, Duration::from_secs(600));
        assert_eq!(p.response_stall_timeout, Duration::from_millis(300_000));
        assert_eq!(p.health_probe_interval, Duration::from_millis(5_000));
        assert_eq!(p.api_key, None);
        assert_eq!(
            p.kind,
            ProviderKind::OpenAiCompat {
                base_url: UpstreamUrl { tls: false, host: "127.0.0.1".into(), port: 9000, path_prefix: "/v1".into() }
            }
        );
        assert_eq!(
            c.models,
            vec![Arc::new(ModelGroup {
                name: "m".into(),
                targets: vec![target("node-1", "local", "m")],
                long_context_threshold: None,
                max_waiters: 256,
                queue_timeout: Duration::from_secs(30),
                strict: false,
            })]
        );
        assert_eq!(c.testing, TestingSettings::default());
        assert!(c.model("m").is_some() && c.model("x").is_none());
        assert!(c.node("node-1").is_some() && c.node("x").is_none());
        assert_eq!(c.provider("node-1", "local").map(|p| p.id.as_str()), Some("local"));
        assert!(c.provider("node-1", "x").is_none() && c.provider("x", "local").is_none());
        assert!(c.nodes[0].provider("local").is_some() && c.nodes[0].provider("m").is_none());
    }

    #[test]
    fn session_header() {
        const LISTEN: &str = "listen = \"127.0.0.1:8080\"";
        let with = |v: &str| ok(&BASE.replacen(LISTEN, &format!("{LISTEN}\nsession_header = {v}"), 1));
        assert_eq!(with("\"X-Session-Id\"").http.session_header.as_deref(), Some("x-session-id"));
        assert_eq!(with("\"session_id\"").http.session_header.as_deref(), Some("session_id"));
        assert_eq!(with("\"\"").http.session_header, None, "empty: off");
        let key = "http.session_header";
        for bad in ["\"x session\"", "\"x:y\"", "\"x\\u00e9\"", &format!("\"{}\"", "a".repeat(65))] {
            rejects(&[(LISTEN, &format!("{LISTEN}\nsession_header = {bad}"))], key, "must be a header name");
        }
        let e = rejects(&[(LISTEN, &format!("{LISTEN}\nsession_header = \"Authorization\""))], key, "credential");
        assert!(e.to_string().contains("`authorization`"), "{e}");
    }

    #[test]
    fn explicit_values() {
        let text = r#"
workers = 3
pin_workers = true
admin_token = "adm"
max_frame_bytes = 4096
[http]
listen = "[::1]:8080"
max_header_bytes = 1024
max_body_bytes = 268435456
idle_timeout_sec = 5
header_timeout_sec = 2
body_timeout_sec = 3
read_timeout_sec = 4
max_connections = 10
[embedded_node]
node = "b"
[[nodes]]
id = "a"
token = "t-a"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "http://[::1]:9000/"
api_key = "k"
capacity = 1
long_capacity = 2
request_timeout_sec = 7
[[nodes]]
id = "b"
token = "t-b"
[[nodes.providers]]
id = "mock"
kind = "mock"
[nodes.providers.mock]
tokens = 1000000
token_interval_ms = 3
first_token_delay_ms = 4
reasoning = true
[[models]]
name = "x"
node = "b"
provider = "mock"
upstream_model = "y"
max_waiters = 0
queue_timeout_ms = 86400000
[[models]]
name = "z"
long_context_threshold = 8000
max_waiters = 4294967295
queue_timeout_ms = 1
[[models.targets]]
node = "a"
provider = "up"
[[models.targets]]
node = "b"
provider = "mock"
model = "zz"
[testing]
heartbeat_interval_ms = 10
heartbeat_wait_ms = 25
"#;
        let c = ok(text);
        assert_eq!(c.workers, 3);
        assert!(c.pin_workers);
        assert_eq!(c.admin_token, Some(Secret::new("adm")));
        assert_eq!(c.max_frame_bytes, 4096);
        assert_eq!(c.http.listen, "[::1]:8080".parse().unwrap());
        assert_eq!((c.http.max_header_bytes, c.http.max_body_bytes), (1024, 256 << 20));
        assert_eq!(c.http.idle_timeout, Duration::from_secs(5));
        let timeouts = (c.http.header_timeout, c.http.body_timeout, c.http.read_timeout);
        assert_eq!(timeouts, (Duration::from_secs(2), Duration::from_secs(3), Duration::from_secs(4)));
        assert_eq!(c.http.max_connections, Some(10));
        // The per-core body budget is at least one largest body.
        assert_eq!(c.http.max_inflight_body_bytes, 256 << 20);
        assert_eq!(c.node_listen, None);
        assert_eq!(c.node_handshake, HandshakeSettings::default());
        assert_eq!(c.embedded_node, Some(EmbeddedNode { node_id: "b".into() }));
        let up = &c.nodes[0].providers[0];
        assert_eq!(up.api_key, Some(Secret::new("k")));
        assert_eq!((up.capacity.get(), up.long_capacity, up.max_concurrency()), (1, 2, 3));
        assert_eq!(up.request_timeout, Duration::from_secs(7));
        let ProviderKind::OpenAiCompat { base_url } = &up.kind else { panic!() };
        assert_eq!(base_url.authority(), "[::1]:9000");
        assert_eq!(base_url.path_prefix, "");
        assert_eq!(
            c.nodes[1].providers[0].kind,
            ProviderKind::Mock(MockSettings {
                tokens: 1_000_000,
                token_interval: Duration::from_millis(3),
                first_token_delay: Duration::from_millis(4),
                reasoning: true,
            })
        );
        assert_eq!(
            *c.models[0],
            ModelGroup {
                name: "x".into(),
                targets: vec![target("b", "mock", "y")],
                long_context_threshold: None,
                max_waiters: 0,
                queue_timeout: Duration::from_secs(24 * 3600),
                strict: false,
            }
        );
        assert_eq!(
            *c.models[1],
            ModelGroup {
                name: "z".into(),
                targets: vec![target("a", "up", "z"), target("b", "mock", "zz")],
                long_context_threshold: Some(8000),
                max_waiters: u32::MAX,
                queue_timeout: Duration::from_millis(1),
                strict: false,
            }
        );
        assert_eq!(
            c.testing,
            TestingSettings {
                heartbeat_interval: Duration::from_millis(10),
                heartbeat_wait: Duration::from_millis(25),
                ..Default::default()
            }
        );
    }

    #[test]
    fn max_concurrency_is_capacity_plus_long_capacity() {
        let with = |capacity: u32, long_capacity: u32| {
            let text = BASE.replacen(
                PROVIDER_URL,
                &format!("{PROVIDER_URL}\ncapacity = {capacity}\nlong_capacity = {long_capacity}"),
                1,
            );
            let p = ok(&text).nodes[0].providers[0].clone();
            assert_eq!((p.capacity.get(), p.long_capacity), (capacity, long_capacity));
            p.max_concurrency()
        };
        assert_eq!(with(5, 0), 5);
        assert_eq!(with(5, 3), 8);
        assert_eq!(with(1, u32::MAX), u32::MAX, "saturates");
        assert_eq!(with(u32::MAX, u32::MAX), u32::MAX, "saturates");
    }

    #[test]
    fn model_shorthand_and_targets() {
        // Two nodes with provider `p`, one without; node-1 has `local` and `p`.
        let nodes = "[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\nlong_capacity = 1\n\
            [[nodes]]\nid = \"node-2\"\ntoken = \"tok-2\"\n[[nodes.providers]]\nid = \"q\"\nkind = \"mock\"\n\
            [[nodes]]\nid = \"node-3\"\ntoken = \"tok-3\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n\
            [[models]]";
        let with_models = |models: &str| {
            let text = BASE.replacen("[[models]]", nodes, 1);
            let text = text.replacen("name = \"m\"\nprovider = \"local\"\n", models, 1);
            ok(&text).models
        };
        // Shorthand without node: one target per node that has the provider, in node order.
        let m = with_models("name = \"m\"\nprovider = \"p\"\nupstream_model = \"u\"\n");
        assert_eq!(m[0].targets, vec![target("node-1", "p", "u"), target("node-3", "p", "u")]);
        // Shorthand with node: exactly that one.
        let m = with_models("name = \"m\"\nnode = \"node-3\"\nprovider = \"p\"\n");
        assert_eq!(m[0].targets, vec![target("node-3", "p", "m")]);
        // Explicit targets: file order; `model` defaults to the group name;
        // the same provider under another node is a different pair.
        let m = with_models(
            "name = \"m\"\n[[models.targets]]\nnode = \"node-3\"\nprovider = \"p\"\n\
             [[models.targets]]\nnode = \"node-1\"\nprovider = \"p\"\nmodel = \"big\"\n\
             [[models.targets]]\nnode = \"node-2\"\nprovider = \"q\"\n",
        );
        assert_eq!(
            m[0].targets,
            vec![target("node-3", "p", "m"), target("node-1", "p", "big"), target("node-2", "q", "m")]
        );
        // Several names may share one provider; the threshold is fine as
        // long as one target has a long pool (node-1/p here).
        let m = with_models(
            "name = \"a\"\nprovider = \"p\"\nlong_context_threshold = 1\n\
             [[models]]\nname = \"b\"\nnode = \"node-1\"\nprovider = \"p\"\nupstream_model = \"a\"\n\
             [[models]]\nname = \"c\"\n[[models.targets]]\nnode = \"node-1\"\nprovider = \"p\"\nmodel = \"a\"\n",
        );
        assert_eq!(m.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(m[0].long_context_threshold, Some(1));
        assert_eq!(m[1].targets, m[2].targets);
    }

    #[test]
    fn mock_defaults() {
        let text = BASE.replacen(PROVIDER_KIND, "kind = \"mock\"", 1).replacen(PROVIDER_URL, "", 1);
        assert_eq!(ok(&text).nodes[0].providers[0].kind, ProviderKind::Mock(MockSettings::default()));
        // An empty [nodes.providers.mock] table means all defaults too.
        let text =
            BASE.replacen(PROVIDER_KIND, "kind = \"mock\"", 1).replacen(PROVIDER_URL, "[nodes.providers.mock]", 1);
        assert_eq!(ok(&text).nodes[0].providers[0].kind, ProviderKind::Mock(MockSettings::default()));
        assert_eq!(MockSettings::default().tokens, 16);
    }

    #[test]
    fn env_expansion() {
        let text = BASE
            .replacen("tok-1", "${TOK}", 1)
            .replacen("http://127.0.0.1:9000/v1", "${URL:-http://h:1/v1/}", 1)
            .replacen("name = \"m\"", "name = \"$${m}\"", 1)
            .replacen("[http]", "admin_token = \"${ADMIN:-}\"\n[http]", 1);
        let env = |name: &str| (name == "TOK").then(|| "from-env".to_owned());
        let c = EdgeConfig::from_toml(&text, &env).unwrap();
        assert_eq!(c.nodes[0].token, Secret::new("from-env"));
        assert_eq!(c.admin_token, None, "empty default = no admin token");
        let ProviderKind::OpenAiCompat { base_url } = &c.nodes[0].providers[0].kind else { panic!() };
        assert_eq!(base_url.authority(), "h:1");
        assert_eq!(base_url.path_prefix, "/v1");
        assert_eq!(c.models[0].name, "${m}");

        // Set variables win over defaults.
        let env = |name: &str| match name {
            "TOK" => Some("t".to_owned()),
            "URL" => Some("http://other:2".to_owned()),
            "ADMIN" => Some("adm".to_owned()),
            _ => None,
        };
        let c = EdgeConfig::from_toml(&text, &env).unwrap();
        assert_eq!(c.admin_token, Some(Secret::new("adm")));
        let ProviderKind::OpenAiCompat { base_url } = &c.nodes[0].providers[0].kind else { panic!() };
        assert_eq!((base_url.authority().as_str(), base_url.path_prefix.as_str()), ("other:2", ""));

        // Unset without default: names the key and the variable.
        let e = EdgeConfig::from_toml(&text, &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("nodes[0].token"), "{e}");
        assert!(e.to_string().contains("`TOK`"), "{e}");
    }

    #[test]
    fn rejects_syntax_errors_with_location() {
        let e = err("[http]\nlisten = \n");
        let ConfigError::Syntax { line, .. } = e else { panic!("{e:?}") };
        assert_eq!(line, Some(2));
    }

    #[test]
    fn rejects_unknown_keys() {
        rejects(&[top("bogus = 1").as_ref_pair()], "bogus", "unknown key");
        rejects(&[("[http]", "[http]\nlisen = \"x\"")], "http.lisen", "unknown key");
        rejects(&[("[node_listener]", "[node_listener]\nport = 1")], "node_listener.port", "unknown key");
        rejects(&[("id = \"node-1\"", "id = \"node-1\"\nname = \"x\"")], "nodes[0].name", "unknown key");
        rejects(
            &[(PROVIDER_KIND, "kind = \"openai_compat\"\nmodel = \"x\"")],
            "nodes[0].providers[0].model",
            "unknown key",
        );
        rejects(&[("name = \"m\"", "name = \"m\"\nalias = \"x\"")], "models[0].alias", "unknown key");
        rejects(
            &[(PROVIDER_KIND, "kind = \"mock\""), (PROVIDER_URL, "[nodes.providers.mock]\ntoken = 3")],
            "nodes[0].providers[0].mock.token",
            "unknown key",
        );
        rejects(
            &[("[node_listener]", "[embedded_node]\nnode = \"node-1\"\nx = 1\n[node_listener]")],
            "embedded_node.x",
            "unknown key",
        );
    }

    #[test]
    fn rejects_wrong_types() {
        rejects(&[top("workers = \"two\"").as_ref_pair()], "workers", "invalid type");
        rejects(&[top("workers = -1").as_ref_pair()], "workers", "-1");
        rejects(&[("listen = \"127.0.0.1:8080\"", "listen = 8080")], "http.listen", "invalid type");
        rejects(
            &[(PROVIDER_KIND, "kind = \"openai_compat\"\ncapacity = \"x\"")],
            "nodes[0].providers[0].capacity",
            "invalid type",
        );
        rejects(
            &[(PROVIDER_KIND, "kind = \"openai_compat\"\nlong_capacity = 1.5")],
            "nodes[0].providers[0].long_capacity",
            "invalid type",
        );
        rejects(
            &[("provider = \"local\"", "provider = \"local\"\nmax_waiters = \"x\"")],
            "models[0].max_waiters",
            "invalid type",
        );
        rejects(&[("provider = \"local\"", "targets = \"x\"")], "models[0].targets", "invalid type");
        rejects(
            &[("[[models]]\nname = \"m\"\nprovider = \"local\"\n", ""), top("models = 1").as_ref_pair()],
            "models",
            "invalid type",
        );
    }

    #[test]
    fn rejects_top_level_ranges() {
        rejects(&[top("workers = 0").as_ref_pair()], "workers", "invalid value `0`: must be at least 1");
        rejects(&[top("workers = 1025").as_ref_pair()], "workers", "must be at most 1024");
        rejects(&[top("max_frame_bytes = 4095").as_ref_pair()], "max_frame_bytes", "must be at least 4096");
        rejects(&[top("max_frame_bytes = 1073741825").as_ref_pair()], "max_frame_bytes", "must be at most 1073741824");
        rejects(
            &[top("shutdown_grace_sec = 31536001").as_ref_pair()],
            "shutdown_grace_sec",
            "must be at most 31536000",
        );
    }

    #[test]
    fn rejects_http_settings() {
        rejects(&[("[http]\nlisten = \"127.0.0.1:8080\"\n", "")], "http", "is required");
        rejects(&[("listen = \"127.0.0.1:8080\"", "")], "http.listen", "is required");
        rejects(&[("127.0.0.1:8080", "localhost:8080")], "http.listen", "invalid value `localhost:8080`");
        rejects(&[("127.0.0.1:8080", "127.0.0.1")], "http.listen", "expected an IP address and port");
        let with = |line: &str| ("[http]", format!("[http]\n{line}"));
        rejects(&[with("max_header_bytes = 1023").as_ref_pair()], "http.max_header_bytes", "at least 1024");
        rejects(&[with("max_header_bytes = 1048577").as_ref_pair()], "http.max_header_bytes", "at most 1048576");
        rejects(&[with("max_body_bytes = 1023").as_ref_pair()], "http.max_body_bytes", "at least 1024");
        rejects(&[with("max_body_bytes = 268435457").as_ref_pair()], "http.max_body_bytes", "at most 268435456");
        rejects(&[with("idle_timeout_sec = 0").as_ref_pair()], "http.idle_timeout_sec", "at least 1");
        rejects(&[with("idle_timeout_sec = 31536001").as_ref_pair()], "http.idle_timeout_sec", "at most 31536000");
        for key in ["header_timeout_sec", "body_timeout_sec", "read_timeout_sec"] {
            rejects(&[with(&format!("{key} = 0")).as_ref_pair()], &format!("http.{key}"), "at least 1");
        }
        rejects(&[with("max_connections = 0").as_ref_pair()], "http.max_connections", "at least 1");
        rejects(&[with("max_connections = 10000001").as_ref_pair()], "http.max_connections", "at most 10000000");
        // Smaller than one largest body: such a body could never be taken.
        rejects(
            &[with("max_inflight_body_bytes = 4194303").as_ref_pair()],
            "http.max_inflight_body_bytes",
            "invalid value `4194303`: must be at least 4194304",
        );
        let c = ok(&BASE.replacen("[http]", "[http]\nmax_inflight_body_bytes = 5000000", 1));
        assert_eq!(c.http.max_inflight_body_bytes, 5_000_000);
    }

    #[test]
    fn node_handshake_settings() {
        let with = |line: &str| ("[node_listener]", format!("[node_listener]\n{line}"));
        let c =
            ok(&BASE.replacen("[node_listener]", "[node_listener]\nhandshake_timeout_sec = 3\nmax_handshakes = 5", 1));
        assert_eq!(
            c.node_handshake,
            HandshakeSettings {
                timeout: Duration::from_secs(3),
                max_pending: 5,
                per_address: 16,
                reserve: 1,
                first_bytes_timeout: Duration::from_secs(2),
            }
        );
        let c = ok(&BASE.replacen(
            "[node_listener]",
            "[node_listener]\nmax_handshakes = 100\nmax_handshakes_per_address = 3\nhandshake_reserve = 0\n\
             first_bytes_timeout_ms = 250",
            1,
        ));
        let h = c.node_handshake;
        assert_eq!((h.max_pending, h.per_address, h.reserve), (100, 3, 0));
        assert_eq!(h.first_bytes_timeout, Duration::from_millis(250));
        // The first bytes' default stays within a shorter handshake deadline.
        let c = ok(&BASE.replacen("[node_listener]", "[node_listener]\nhandshake_timeout_sec = 1", 1));
        assert_eq!(c.node_handshake.first_bytes_timeout, Duration::from_secs(1));

        rejects(
            &[with("handshake_timeout_sec = 0").as_ref_pair()],
            "node_listener.handshake_timeout_sec",
            "at least 1",
        );
        rejects(&[with("max_handshakes = 0").as_ref_pair()], "node_listener.max_handshakes", "at least 1");
        let per = "node_listener.max_handshakes_per_address";
        rejects(&[with("max_handshakes_per_address = 0").as_ref_pair()], per, "value `0`: must be at least 1");
        rejects(&[with("max_handshakes_per_address = 1000001").as_ref_pair()], per, "must be at most 1000000");
        let reserve = "node_listener.handshake_reserve";
        rejects(&[with("handshake_reserve = 64").as_ref_pair()], reserve, "value `64`: must be at most 63");
        rejects(&[with("max_handshakes = 4\nhandshake_reserve = 4").as_ref_pair()], reserve, "must be at most 3");
        rejects(&[with("handshake_reserve = -1").as_ref_pair()], reserve, "-1");
        let first = "node_listener.first_bytes_timeout_ms";
        rejects(&[with("first_bytes_timeout_ms = 0").as_ref_pair()], first, "value `0`: must be at least 1");
        rejects(
            &[with("first_bytes_timeout_ms = 10001").as_ref_pair()],
            first,
            "value `10001`: must be at most node_listener.handshake_timeout_sec (10000 ms)",
        );
        rejects(&[with("handshake_timeout_sec = 1\nfirst_bytes_timeout_ms = 1500").as_ref_pair()], first, "(1000 ms)");
    }

    #[test]
    fn tls_handshake_limits() {
        let http = "listen = \"127.0.0.1:8080\"\n";
        let node = "listen = \"127.0.0.1:7070\"\n";
        let files = "cert = \"/c\"\nkey = \"/k\"\n";
        let c = ok(&BASE.replacen(http, &format!("{http}[http.tls]\n{files}"), 1).replacen(
            node,
            &format!("{node}[node_listener.tls]\n{files}"),
            1,
        ));
        assert_eq!(c.http.tls.unwrap().handshakes, crate::config::HTTP_TLS_HANDSHAKES);
        assert_eq!(c.node_tls.unwrap().handshakes, crate::config::NODE_TLS_HANDSHAKES);
        let c = ok(&BASE.replacen(
            node,
            &format!("{node}[node_listener.tls]\n{files}max_handshakes_per_address = 2\nhandshakes_per_sec_per_address = 5\n"),
            1,
        ));
        let t = c.node_tls.unwrap();
        assert_eq!(t.handshakes, crate::config::TlsHandshakeLimits { concurrent: 2, per_sec: 5 });
        // Only the files decide whether a reload needs a restart.
        let other = ListenerTls { handshakes: crate::config::HTTP_TLS_HANDSHAKES, ..t.clone() };
        assert!(t.same_files(&other) && t != other);
        assert!(!t.same_files(&ListenerTls { client_ca: Some("/ca".into()), ..t.clone() }));

        for (section, anchor) in [("http.tls", http), ("node_listener.tls", node)] {
            let patch = |line: &str| (anchor, format!("{anchor}[{section}]\n{files}{line}\n"));
            for key in ["max_handshakes_per_address", "handshakes_per_sec_per_address"] {
                let full = format!("{section}.{key}");
                rejects(&[patch(&format!("{key} = 0")).as_ref_pair()], &full, "value `0`: must be at least 1");
                rejects(&[patch(&format!("{key} = 1000001")).as_ref_pair()], &full, "must be at most 1000000");
            }
        }
    }

    #[test]
    fn link_probe_settings() {
        let with = |line: &str| ("[node_listener]", format!("[node_listener]\n{line}"));
        assert_eq!(ok(BASE).link_probe, LinkProbe::default());
        let c =
            ok(&BASE.replacen("[node_listener]", "[node_listener]\nsuspect_after_ms = 250\nprobe_timeout_ms = 40", 1));
        assert_eq!(
            c.link_probe,
            LinkProbe { silence: Duration::from_millis(250), answer_within: Duration::from_millis(40) }
        );
        rejects(&[with("suspect_after_ms = 0").as_ref_pair()], "node_listener.suspect_after_ms", "at least 1");
        rejects(&[with("probe_timeout_ms = 0").as_ref_pair()], "node_listener.probe_timeout_ms", "at least 1");
        rejects(
            &[with("probe_timeout_ms = 3600001").as_ref_pair()],
            "node_listener.probe_timeout_ms",
            "invalid value `3600001`",
        );
    }

    #[test]
    fn rejects_listener_and_embedded_node() {
        rejects(&[("[node_listener]\nlisten = \"127.0.0.1:7070\"\n", "")], "node_listener", "unless [embedded_node]");
        rejects(&[("listen = \"127.0.0.1:7070\"", "")], "node_listener.listen", "is required");
        rejects(&[("127.0.0.1:7070", "nope")], "node_listener.listen", "invalid value `nope`");
        rejects(
            &[("[node_listener]", "[embedded_node]\nnode = \"ghost\"\n[node_listener]")],
            "embedded_node.node",
            "`ghost`",
        );
        rejects(&[("[node_listener]", "[embedded_node]\n[node_listener]")], "embedded_node.node", "is required");
        // Both together are fine.
        let text = BASE.replacen("[node_listener]", "[embedded_node]\nnode = \"node-1\"\n[node_listener]", 1);
        let c = ok(&text);
        assert!(c.embedded_node.is_some() && c.node_listen.is_some());
    }

    #[test]
    fn rejects_nodes() {
        let text = BASE.split("[[nodes]]").next().unwrap().to_owned() + "[[models]]\nname = \"m\"\nprovider = \"p\"\n";
        let e = err(&text);
        assert_eq!(e.key_path(), Some("nodes"), "{e}");
        rejects(&[("id = \"node-1\"", "")], "nodes[0].id", "is required");
        rejects(&[("id = \"node-1\"", "id = \"\"")], "nodes[0].id", "must not be empty");
        rejects(&[("id = \"node-1\"", "id = \"node 1\"")], "nodes[0].id", "may only contain");
        rejects(&[("id = \"node-1\"", "id = \"nodé\"")], "nodes[0].id", "may only contain");
        let long = format!("id = \"{}\"", "n".repeat(65));
        rejects(&[("id = \"node-1\"", long.as_str())], "nodes[0].id", "at most 64 characters");
        let max = format!("id = \"{}\"", "n".repeat(64));
        ok(&BASE.replacen("id = \"node-1\"", &max, 1));
        rejects(&[("token = \"tok-1\"", "")], "nodes[0].token", "is required");
        rejects(&[("token = \"tok-1\"", "token = \"\"")], "nodes[0].token", "invalid value `***`: must not be empty");
        rejects(&[("[[nodes.providers]]\nid = \"local\"\nkind = \"openai_compat\"\nbase_url = \"http://127.0.0.1:9000/v1\"\n", "")], "nodes[0].providers", "at least one");

        let second = |id: &str, token: &str| {
            format!("[[nodes]]\nid = \"{id}\"\ntoken = \"{token}\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n[[models]]")
        };
        rejects(&[("[[models]]", second("node-1", "tok-2").as_str())], "nodes[1].id", "duplicates nodes[0].id");
        let e =
            rejects(&[("[[models]]", second("node-2", "tok-1").as_str())], "nodes[1].token", "duplicates the token");
        assert!(!e.to_string().contains("tok-1") && !format!("{e:?}").contains("tok-1"), "{e}");
        ok(&BASE.replacen("[[models]]", &second("node-2", "tok-2"), 1));
    }

    #[test]
    fn rejects_providers() {
        let p = "nodes[0].providers[0]";
        rejects(&[("id = \"local\"", "")], &format!("{p}.id"), "is required");
        rejects(&[("id = \"local\"", "id = \"a/b\"")], &format!("{p}.id"), "may only contain");
        rejects(&[(PROVIDER_KIND, "")], &format!("{p}.kind"), "is required");
        rejects(&[(PROVIDER_KIND, "kind = \"sglang\"")], &format!("{p}.kind"), "unknown variant `sglang`");
        let vllm = ok(&BASE.replacen(PROVIDER_KIND, "kind = \"vllm\"", 1));
        let kind = &vllm.nodes[0].providers[0].kind;
        assert!(matches!(kind, ProviderKind::Vllm { .. }) && kind.is_openai_compatible());
        assert_eq!(vllm.nodes[0].providers[0].to_wire().kind, crate::wire::pb::ProviderKind::Vllm as i32);
        rejects(
            &[(PROVIDER_KIND, "kind = \"vllm\""), (PROVIDER_URL, "")],
            &format!("{p}.base_url"),
            "is required when kind = \"vllm\"",
        );
        let ollama = ok(&BASE.replacen(PROVIDER_KIND, "kind = \"ollama\"", 1).replacen(
            PROVIDER_URL,
            "base_url = \"http://127.0.0.1:11434\"",
            1,
        ));
        let entry = &ollama.nodes[0].providers[0];
        assert!(matches!(&entry.kind, ProviderKind::Ollama { base_url } if base_url.port == 11434));
        assert!(!entry.kind.is_openai_compatible(), "ollama runs on the normalized path");
        let wire = entry.to_wire();
        assert_eq!(
            (wire.kind, wire.base_url.as_str()),
            (crate::wire::pb::ProviderKind::Ollama as i32, "http://127.0.0.1:11434")
        );
        ok(&BASE.replacen(PROVIDER_KIND, "kind = \"ollama\"", 1).replacen(
            PROVIDER_URL,
            "base_url = \"http://10.0.0.2/ollama/\"",
            1,
        ));
        rejects(
            &[(PROVIDER_KIND, "kind = \"ollama\""), (PROVIDER_URL, "")],
            &format!("{p}.base_url"),
            "is required when kind = \"ollama\"",
        );
        rejects(
            &[(PROVIDER_KIND, "kind = \"ollama\"")],
            &format!("{p}.base_url"),
            "invalid value `http://127.0.0.1:9000/v1`: must be the Ollama server root",
        );
        rejects(
            &[
                (PROVIDER_KIND, "kind = \"ollama\""),
                (PROVIDER_URL, "base_url = \"http://h:1\"\n[nodes.providers.mock]"),
            ],
            &format!("{p}.mock"),
            "only allowed when kind = \"mock\"",
        );
        rejects(&[(PROVIDER_URL, "")], &format!("{p}.base_url"), "is required when kind = \"openai_compat\"");
        rejects(&[(PROVIDER_KIND, "kind = \"mock\"")], &format!("{p}.base_url"), "not allowed when kind = \"mock\"");
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://api.example.com/v1\"\ntls_ca = \"/etc/ca.pem\"")],
            &format!("{p}.tls_ca"),
            "invalid value `/etc/ca.pem`: only with an https:// base_url",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"https://api.example.com/v1\"\ntls_ca = \"/nonexistent/ca.pem\"")],
            &format!("{p}.tls_ca"),
            "invalid value `/nonexistent/ca.pem`: cannot read it",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1/v1\"\nnative_apis = [\"messages\", \"chat\"]")],
            &format!("{p}.native_apis"),
            "invalid value `chat`: unknown API; expected any of responses, messages",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1/v1\"\nnative_apis = [\"messages\", \"messages\"]")],
            &format!("{p}.native_apis"),
            "invalid value `messages`: listed twice",
        );
        rejects(
            &[(PROVIDER_KIND, "kind = \"ollama\""), (PROVIDER_URL, "base_url = \"http://h:1\"\nnative_apis = []")],
            &format!("{p}.native_apis"),
            "only for kind = \"openai_compat\" or \"vllm\"",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"127.0.0.1:9000\"")],
            &format!("{p}.base_url"),
            "expected an http:// or https:// URL",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\n[nodes.providers.mock]")],
            &format!("{p}.mock"),
            "only allowed when kind = \"mock\"",
        );
        let e = rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\ncapacity = 0")],
            &format!("{p}.capacity"),
            "must be at least 1",
        );
        assert_eq!(e.to_string(), "config key `nodes[0].providers[0].capacity`: invalid value `0`: must be at least 1");
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\ncapacity = 4294967296")],
            &format!("{p}.capacity"),
            "must be at most 4294967295",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\nlong_capacity = -1")],
            &format!("{p}.long_capacity"),
            "-1",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\nlong_capacity = 4294967296")],
            &format!("{p}.long_capacity"),
            "invalid value `4294967296`: must be at most 4294967295",
        );
        // The old key is gone; the error lists the new ones.
        let e = rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\nmax_concurrency = 4")],
            &format!("{p}.max_concurrency"),
            "unknown key",
        );
        assert!(e.to_string().contains("capacity") && e.to_string().contains("long_capacity"), "{e}");
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\nrequest_timeout_sec = 0")],
            &format!("{p}.request_timeout_sec"),
            "must be at least 1",
        );
        rejects(
            &[(PROVIDER_URL, "base_url = \"http://h:1\"\nrequest_timeout_sec = 86401")],
            &format!("{p}.request_timeout_sec"),
            "must be at most 86400",
        );
        for bad in ["9", "3600001"] {
            let line = format!("base_url = \"http://h:1\"\nhealth_probe_interval_ms = {bad}");
            rejects(
                &[(PROVIDER_URL, line.as_str())],
                &format!("{p}.health_probe_interval_ms"),
                "must be 10-3600000 (milliseconds)",
            );
        }
        for bad in ["0", "86400001"] {
            let line = format!("base_url = \"http://h:1\"\nresponse_stall_timeout_ms = {bad}");
            rejects(
                &[(PROVIDER_URL, line.as_str())],
                &format!("{p}.response_stall_timeout_ms"),
                "must be 1-86400000 (milliseconds)",
            );
        }
        let mock = |line: &str| {
            [(PROVIDER_KIND, "kind = \"mock\"".to_owned()), (PROVIDER_URL, format!("[nodes.providers.mock]\n{line}"))]
        };
        let pairs = mock("tokens = 0");
        rejects(&[pairs[0].as_ref_pair(), pairs[1].as_ref_pair()], &format!("{p}.mock.tokens"), "at least 1");
        let pairs = mock("tokens = 1000001");
        rejects(&[pairs[0].as_ref_pair(), pairs[1].as_ref_pair()], &format!("{p}.mock.tokens"), "at most 1000000");
        let pairs = mock("token_interval_ms = 4294967296");
        rejects(&[pairs[0].as_ref_pair(), pairs[1].as_ref_pair()], &format!("{p}.mock.token_interval_ms"), "at most");
        let pairs = mock("first_token_delay_ms = -1");
        rejects(&[pairs[0].as_ref_pair(), pairs[1].as_ref_pair()], &format!("{p}.mock.first_token_delay_ms"), "-1");
        let pairs = mock("reasoning = \"yes\"");
        rejects(&[pairs[0].as_ref_pair(), pairs[1].as_ref_pair()], &format!("{p}.mock.reasoning"), "invalid type");

        // A second provider on a node: duplicate id, and the path names index 1.
        let dup = "[[nodes.providers]]\nid = \"local\"\nkind = \"mock\"\n[[models]]";
        rejects(&[("[[models]]", dup)], "nodes[0].providers[1].id", "duplicates nodes[0].providers[0].id");
        let zero = "[[nodes.providers]]\nid = \"other\"\nkind = \"mock\"\ncapacity = 0\n[[models]]";
        let e = rejects(&[("[[models]]", zero)], "nodes[0].providers[1].capacity", "must be at least 1");
        assert_eq!(e.to_string(), "config key `nodes[0].providers[1].capacity`: invalid value `0`: must be at least 1");
    }

    #[test]
    fn rejects_models() {
        let text = BASE.split("[[models]]").next().unwrap();
        let e = err(text);
        assert_eq!(e.key_path(), Some("models"), "{e}");
        rejects(&[("name = \"m\"", "")], "models[0].name", "is required");
        rejects(&[("name = \"m\"", "name = \"\"")], "models[0].name", "must not be empty");
        rejects(&[("provider = \"local\"", "")], "models[0].provider", "is required (or list [[models.targets]])");
        rejects(
            &[("provider = \"local\"", "provider = \"\"")],
            "models[0].provider",
            "invalid value ``: must not be empty",
        );
        rejects(&[("provider = \"local\"", "provider = \"nope\"")], "models[0].provider", "no node has a provider");
        rejects(&[("provider = \"local\"", "provider = \"local\"\nnode = \"ghost\"")], "models[0].node", "`ghost`");
        rejects(
            &[("provider = \"local\"", "provider = \"nope\"\nnode = \"node-1\"")],
            "models[0].provider",
            "node `node-1` has no provider",
        );
        rejects(
            &[("provider = \"local\"", "provider = \"local\"\nupstream_model = \"\"")],
            "models[0].upstream_model",
            "must not be empty",
        );
        let dup = format!("{BASE}[[models]]\nname = \"m\"\nprovider = \"local\"\n");
        let e = err(&dup);
        assert_eq!(e.key_path(), Some("models[1].name"), "{e}");
        assert!(e.to_string().contains("duplicates models[0].name"), "{e}");
    }

    /// `provider = "local"` of BASE's model, for patching in model settings.
    const MODEL_PROVIDER: &str = "provider = \"local\"";

    /// Replaces BASE's shorthand model with `targets` (one or more
    /// `[[models.targets]]` bodies, each a `node`/`provider`/... snippet).
    fn targets(bodies: &[&str]) -> (&'static str, String) {
        let text: String = bodies.iter().map(|b| format!("[[models.targets]]\n{b}\n")).collect();
        (MODEL_PROVIDER, text)
    }

    #[test]
    fn rejects_model_settings() {
        let with = |line: &str| (MODEL_PROVIDER, format!("{MODEL_PROVIDER}\n{line}"));
        let t = "models[0].long_context_threshold";
        rejects(&[with("long_context_threshold = 0").as_ref_pair()], t, "invalid value `0`: must be at least 1");
        rejects(&[with("long_context_threshold = -1").as_ref_pair()], t, "-1");
        rejects(&[with("long_context_threshold = 4294967296").as_ref_pair()], t, "must be at most 4294967295");
        let e = rejects(&[with("long_context_threshold = 8000").as_ref_pair()], t, "invalid value `8000`");
        assert!(e.to_string().contains("long_capacity > 0"), "{e}");
        // A long pool on a provider that is not a target does not count.
        let other = "[[nodes.providers]]\nid = \"big\"\nkind = \"mock\"\nlong_capacity = 4\n[[models]]";
        rejects(&[("[[models]]", other), with("long_context_threshold = 8000").as_ref_pair()], t, "long_capacity > 0");
        ok(&BASE.replacen(PROVIDER_URL, &format!("{PROVIDER_URL}\nlong_capacity = 1"), 1).replacen(
            MODEL_PROVIDER,
            &format!("{MODEL_PROVIDER}\nlong_context_threshold = 8000"),
            1,
        ));

        let w = "models[0].max_waiters";
        rejects(&[with("max_waiters = -1").as_ref_pair()], w, "-1");
        rejects(&[with("max_waiters = 4294967296").as_ref_pair()], w, "must be at most 4294967295");
        let q = "models[0].queue_timeout_ms";
        rejects(&[with("queue_timeout_ms = 0").as_ref_pair()], q, "invalid value `0`: must be at least 1");
        rejects(&[with("queue_timeout_ms = 86400001").as_ref_pair()], q, "must be at most 86400000");
        rejects(&[with("queue_timeout_ms = -1").as_ref_pair()], q, "-1");
        rejects(&[with("queue_timeout = 5").as_ref_pair()], "models[0].queue_timeout", "unknown key");
    }

    #[test]
    fn rejects_model_targets() {
        let k = "models[0].targets";
        let one = "node = \"node-1\"\nprovider = \"local\"";
        ok(&BASE.replacen(MODEL_PROVIDER, &targets(&[one]).1, 1));

        // Shorthand keys together with targets, each named with its value.
        for (line, key, value) in [
            ("node = \"node-1\"", "models[0].node", "node-1"),
            ("provider = \"local\"", "models[0].provider", "local"),
            ("upstream_model = \"u\"", "models[0].upstream_model", "u"),
        ] {
            let (from, to) = targets(&[one]);
            let e = rejects(
                &[(from, format!("{line}\n{to}").as_str())],
                key,
                "not allowed together with [[models.targets]]",
            );
            assert!(e.to_string().contains(&format!("invalid value `{value}`")), "{e}");
        }
        rejects(&[(MODEL_PROVIDER, "targets = []")], k, "at least one [[models.targets]] entry is required");

        rejects(&[targets(&["provider = \"local\""]).as_ref_pair()], &format!("{k}[0].node"), "is required");
        rejects(
            &[targets(&["node = \"\"\nprovider = \"local\""]).as_ref_pair()],
            &format!("{k}[0].node"),
            "must not be empty",
        );
        rejects(
            &[targets(&[one, "node = \"ghost\"\nprovider = \"local\""]).as_ref_pair()],
            &format!("{k}[1].node"),
            "invalid value `ghost`: no [[nodes]] entry has this id",
        );
        rejects(&[targets(&["node = \"node-1\""]).as_ref_pair()], &format!("{k}[0].provider"), "is required");
        rejects(
            &[targets(&["node = \"node-1\"\nprovider = \"\""]).as_ref_pair()],
            &format!("{k}[0].provider"),
            "must not be empty",
        );
        rejects(
            &[targets(&["node = \"node-1\"\nprovider = \"nope\""]).as_ref_pair()],
            &format!("{k}[0].provider"),
            "invalid value `nope`: node `node-1` has no provider with this id",
        );
        rejects(
            &[targets(&[&format!("{one}\nmodel = \"\"")]).as_ref_pair()],
            &format!("{k}[0].model"),
            "must not be empty",
        );
        rejects(
            &[targets(&[one, &format!("{one}\nmodel = \"other\"")]).as_ref_pair()],
            &format!("{k}[1].provider"),
            "invalid value `local`: node `node-1` with this provider duplicates models[0].targets[0]",
        );
        rejects(
            &[targets(&[&format!("{one}\nupstream_model = \"x\"")]).as_ref_pair()],
            &format!("{k}[0].upstream_model"),
            "unknown key",
        );
        rejects(&[targets(&[&format!("{one}\nweight = 1")]).as_ref_pair()], &format!("{k}[0].weight"), "unknown key");
    }

    #[test]
    fn secrets_redacted_in_debug_and_errors() {
        let text = BASE
            .replacen("tok-1", "super-secret-token", 1)
            .replacen(PROVIDER_URL, "base_url = \"http://h:1\"\napi_key = \"sk-very-secret\"", 1)
            .replacen("[http]", "admin_token = \"admin-secret\"\n[http]", 1);
        let c = ok(&text);
        let debug = format!("{c:?}");
        for s in ["super-secret-token", "sk-very-secret", "admin-secret"] {
            assert!(!debug.contains(s), "{s} in {debug}");
        }
        assert_eq!(c.nodes[0].token.expose(), "super-secret-token");
        // Wrong-typed secrets do not show their value either.
        let e = err(&BASE.replacen("token = \"tok-1\"", "token = 987654321", 1));
        assert_eq!(e.key_path(), Some("nodes[0].token"));
        assert!(!e.to_string().contains("987654321"), "{e}");
        let e = err(&BASE.replacen("[http]", "admin_token = [\"admin-secret\"]\n[http]", 1));
        assert!(!e.to_string().contains("admin-secret") && !format!("{e:?}").contains("admin-secret"), "{e}");
    }

    #[test]
    fn node_by_token_matches_exactly() {
        let text = BASE.replacen(
            "[[models]]",
            "[[nodes]]\nid = \"node-2\"\ntoken = \"tok-2\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n[[models]]",
            1,
        );
        let c = ok(&text);
        assert_eq!(c.node_by_token("tok-1").map(|n| n.id.as_str()), Some("node-1"));
        assert_eq!(c.node_by_token("tok-2").map(|n| n.id.as_str()), Some("node-2"));
        for wrong in ["", "tok-", "tok-11", "TOK-1", "tok-3"] {
            assert!(c.node_by_token(wrong).is_none(), "{wrong}");
        }
    }

    #[test]
    fn upstream_url_parse() {
        let u = |s: &str| UpstreamUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let url = |host: &str, port: u16, path: &str| UpstreamUrl {
            tls: false,
            host: host.into(),
            port,
            path_prefix: path.into(),
        };
        let https = |host: &str, port: u16, path: &str| UpstreamUrl { tls: true, ..url(host, port, path) };
        assert_eq!(u("http://127.0.0.1:9000/v1"), url("127.0.0.1", 9000, "/v1"));
        assert_eq!(u("http://127.0.0.1:9000/v1/"), url("127.0.0.1", 9000, "/v1"));
        assert_eq!(u("http://example.com"), url("example.com", 80, ""));
        assert_eq!(u("http://example.com/"), url("example.com", 80, ""));
        assert_eq!(u("HTTP://example.com/a/b//"), url("example.com", 80, "/a/b"));
        assert_eq!(u("http://[::1]:8000/v1"), url("::1", 8000, "/v1"));
        assert_eq!(u("http://[fe80::1]"), url("fe80::1", 80, ""));
        assert_eq!(u("http://[::1]:8000").authority(), "[::1]:8000");
        assert_eq!(u("http://h").authority(), "h:80");
        assert_eq!(u("http://my_host.local:65535").authority(), "my_host.local:65535");

        let bad = |s: &str, why: &str| {
            let e = UpstreamUrl::parse(s).unwrap_err();
            assert!(e.contains(why), "{s}: `{e}` lacks `{why}`");
        };
        assert_eq!(u("https://api.openai.com/v1"), https("api.openai.com", 443, "/v1"));
        assert_eq!(u("HTTPS://x:8443"), https("x", 8443, ""));
        assert_eq!(u("https://api.openai.com/v1").to_url(), "https://api.openai.com:443/v1");
        bad("ftp://x", "unsupported scheme");
        bad("127.0.0.1:9000", "expected an http:// or https:// URL");
        bad("", "expected an http:// or https:// URL");
        bad("http://", "missing host");
        bad("http:///v1", "missing host");
        bad("http://:80", "missing host");
        bad("http://h:0", "invalid port");
        bad("http://h:65536", "invalid port");
        bad("http://h:", "invalid port");
        bad("http://h:x", "invalid port");
        bad("http://::1:80", "brackets");
        bad("http://[::1", "unclosed");
        bad("http://[nothex]:80", "invalid IPv6");
        bad("http://[::1]x", "unexpected");
        bad("http://u:p@h", "credentials");
        bad("http://h/v1?x=1", "query");
        bad("http://h h", "invalid host");
    }

    #[test]
    fn example_configs_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            // Node configs are named node*.toml; everything else is an edge config.
            if name.starts_with("node") {
                crate::config::NodeConfig::from_toml(&text, &no_env).unwrap_or_else(|e| panic!("{name}: {e}"));
            } else {
                EdgeConfig::from_toml(&text, &no_env).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            seen.push(name);
        }
        seen.sort();
        assert_eq!(seen, ["agent.toml", "edge.toml", "node.toml", "quickstart.toml"]);

        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let a = EdgeConfig::from_toml(&read("agent.toml"), &no_env).unwrap();
        assert_eq!(a.agents[0].name, "coder");
        assert_eq!(a.agents[0].workspaces, ["demo"]);
        assert_eq!(a.nodes[0].workspaces[0].root, "/tmp/iop-agent-demo");
        let q = EdgeConfig::from_toml(&read("quickstart.toml"), &no_env).unwrap();
        assert_eq!(q.http.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(q.node_listen, None);
        assert_eq!(q.embedded_node, Some(EmbeddedNode { node_id: "local".into() }));
        assert_eq!(q.node_by_token("quickstart-embedded-token").map(|n| n.id.as_str()), Some("local"));
        let mock = &q.nodes[0].providers[0];
        assert_eq!((mock.id.as_str(), mock.capacity.get(), mock.long_capacity), ("mock", 256, 0));
        assert_eq!(
            mock.kind,
            ProviderKind::Mock(MockSettings {
                tokens: 32,
                token_interval: Duration::from_millis(10),
                ..Default::default()
            })
        );
        assert_eq!(q.model("mock").map(|m| m.targets.clone()), Some(vec![target("local", "mock", "mock")]));
        assert_eq!(q.testing, TestingSettings::default());

        let e = EdgeConfig::from_toml(&read("edge.toml"), &no_env).unwrap();
        assert_eq!(e.node_listen, Some("127.0.0.1:7070".parse().unwrap()));
        assert_eq!(e.admin_token, None);
        assert_eq!(e.node_by_token("dev-node-token").map(|n| n.id.as_str()), Some("node-1"));
        let up = &e.nodes[0].providers[0];
        assert_eq!(up.api_key, None);
        let ProviderKind::OpenAiCompat { base_url } = &up.kind else { panic!("{up:?}") };
        assert_eq!((base_url.authority().as_str(), base_url.path_prefix.as_str()), ("127.0.0.1:9000", "/v1"));
        assert_eq!((up.capacity.get(), up.long_capacity), (64, 0));
        let m = e.model("mock").unwrap();
        assert_eq!(m.targets, vec![target("node-1", "upstream", "mock")]);
        assert_eq!((m.long_context_threshold, m.max_waiters), (None, 256));
        assert_eq!(e.testing, TestingSettings::default());
    }

    /// Lets `rejects` take owned patch pairs.
    trait AsRefPair {
        fn as_ref_pair(&self) -> (&str, &str);
    }

    impl AsRefPair for (&str, String) {
        fn as_ref_pair(&self) -> (&str, &str) {
            (self.0, self.1.as_str())
        }
    }
}
