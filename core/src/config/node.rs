//! Validated node configuration.
// SKELETON — to be completed by the config helper.

use std::time::Duration;

use super::{ConfigError, Secret};

/// The whole validated node configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// Edge node-listener address, `host:port`.
    pub edge: String,
    /// Registration token.
    pub token: Secret,
    /// Connect/reconnect policy.
    pub reconnect: ReconnectPolicy,
    /// Largest edge↔node frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// How long SIGINT/SIGTERM waits for in-flight runs.
    pub shutdown_grace: Duration,
}

/// How the node (re)connects to the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Attempts before giving up; None = unlimited.
    pub max_attempts: Option<u32>,
    /// Base wait between attempts (jitter is added).
    pub interval: Duration,
}

impl NodeConfig {
    /// Parses and validates TOML text, expanding `${VAR}` through `env`.
    pub fn from_toml(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let _ = (text, env);
        unimplemented!()
    }
}
