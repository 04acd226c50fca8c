//! Validated edge configuration.
// SKELETON — to be completed by the config helper.

use std::{net::SocketAddr, num::NonZeroU32, time::Duration};

use super::{ConfigError, Secret};

/// The whole validated edge configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeConfig {
    /// Reactor threads; default = available cores.
    pub workers: usize,
    /// Client-facing HTTP server.
    pub http: HttpSettings,
    /// Where nodes connect. None only when `embedded_node` is set (then an
    /// ephemeral loopback port is used).
    pub node_listen: Option<SocketAddr>,
    /// Largest edge↔node frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// Run this node inside the edge process.
    pub embedded_node: Option<EmbeddedNode>,
    /// Configured nodes, in file order.
    pub nodes: Vec<NodeEntry>,
    /// Public model names, in file order.
    pub models: Vec<ModelRoute>,
    /// Bearer token protecting `/admin`.
    pub admin_token: Option<Secret>,
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
}

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
}

/// One provider on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderEntry {
    /// Provider id, unique within its node.
    pub id: String,
    /// What kind of provider and its kind-specific settings.
    pub kind: ProviderKind,
    /// Bearer credential sent upstream.
    pub api_key: Option<Secret>,
    /// Concurrent runs the node admits for this provider.
    pub max_concurrency: NonZeroU32,
    /// Upper bound for one upstream request.
    pub request_timeout: Duration,
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

/// An `http://host:port/prefix` URL (https is not supported yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// Port (default 80).
    pub port: u16,
    /// Path prefix without trailing slash, e.g. "/v1" or "".
    pub path_prefix: String,
}

impl UpstreamUrl {
    /// Parses `http://host[:port][/prefix]`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let _ = s;
        unimplemented!()
    }

    /// `host:port` for the Host header and for connecting.
    pub fn authority(&self) -> String {
        unimplemented!()
    }
}

/// A public model name and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    /// Public name clients send as `model`.
    pub name: String,
    /// Node to run on; None = any ready node that has `provider`.
    pub node: Option<String>,
    /// Provider id on that node.
    pub provider: String,
    /// Model name sent upstream.
    pub upstream_model: String,
}

impl EdgeConfig {
    /// Parses and validates TOML text, expanding `${VAR}` through `env`.
    pub fn from_toml(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let _ = (text, env);
        unimplemented!()
    }

    /// The node entry holding `token`, compared in constant time.
    pub fn node_by_token(&self, token: &str) -> Option<&NodeEntry> {
        let _ = token;
        unimplemented!()
    }

    /// The node entry with this id.
    pub fn node(&self, id: &str) -> Option<&NodeEntry> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The route for a public model name.
    pub fn model(&self, name: &str) -> Option<&ModelRoute> {
        self.models.iter().find(|m| m.name == name)
    }
}
