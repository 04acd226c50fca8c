//! Raw serde layer: the TOML shape, nothing more. Every table rejects unknown
//! keys; required keys are `Option`s here so that validation reports them as
//! missing with their full path. Numbers are wide here and range-checked in
//! validation, so a rejection can show the value.

use serde::Deserialize;

use super::{env::expand_value, error::is_secret_key, ConfigError};

/// Parses `text`, expands `${VAR}` in every string value, then deserializes
/// into `T`, naming the key path of any shape error.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<T, ConfigError> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| ConfigError::syntax(text, e.span().map(|s| s.start), e.message()))?;
    let mut value = toml::Value::Table(table);
    expand_value(&mut value, &mut String::new(), env)?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().message().to_owned();
        shape_error(path, message)
    })
}

/// Turns a serde error at `path` into a ConfigError naming the offending key.
fn shape_error(path: String, message: String) -> ConfigError {
    let path = if path == "." { String::new() } else { path };
    // serde_path_to_error already ends the path with an unknown key's name.
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let expected = rest.split_once('`').map_or("", |(_, expected)| expected.trim_start_matches(", "));
        return ConfigError::key(path, format!("unknown key ({expected})"));
    }
    let key = if path.is_empty() { "<root>".to_owned() } else { path };
    if is_secret_key(&key) {
        // serde's messages quote the value; a secret must not show.
        return ConfigError::key(key, "invalid type, expected a string");
    }
    ConfigError::key(key, message)
}

/// Edge config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEdge {
    pub workers: Option<u64>,
    pub pin_workers: Option<bool>,
    pub admin_token: Option<String>,
    pub max_frame_bytes: Option<u64>,
    pub shutdown_grace_sec: Option<u64>,
    pub http: Option<RawHttp>,
    pub node_listener: Option<RawNodeListener>,
    pub embedded_node: Option<RawEmbeddedNode>,
    #[serde(default)]
    pub nodes: Vec<RawNode>,
    #[serde(default)]
    pub models: Vec<RawModel>,
    #[serde(default)]
    pub api_keys: Vec<RawApiKey>,
    #[serde(default)]
    pub agents: Vec<RawAgent>,
    pub affinity: Option<RawAffinity>,
    pub cluster: Option<RawCluster>,
    pub testing: Option<RawTesting>,
}

/// `[affinity]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAffinity {
    pub enabled: Option<bool>,
    pub header: Option<String>,
    pub prefix_bytes: Option<u64>,
    pub max_imbalance: Option<f64>,
}

/// `[[api_keys]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApiKey {
    pub name: Option<String>,
    pub sha256: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub on_engine_down: Option<String>,
}

/// `[cluster]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub redis: Option<String>,
    pub prefix: Option<String>,
    pub deadline_ms: Option<u64>,
    pub queue: Option<u64>,
}

/// `[http]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    pub listen: Option<String>,
    pub max_header_bytes: Option<u64>,
    pub max_body_bytes: Option<u64>,
    pub idle_timeout_sec: Option<u64>,
    pub header_timeout_sec: Option<u64>,
    pub body_timeout_sec: Option<u64>,
    pub read_timeout_sec: Option<u64>,
    pub access_log: Option<bool>,
    pub session_header: Option<String>,
    pub max_connections: Option<u64>,
    pub max_inflight_body_bytes: Option<u64>,
    pub max_websockets: Option<u64>,
    pub tls: Option<RawTls>,
}

/// `[http.tls]`, `[node_listener.tls]`, the node's `[edge_tls]` (each
/// takes its own keys; the others are refused by name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
    pub ca: Option<String>,
    pub server_name: Option<String>,
    pub max_handshakes_per_address: Option<u64>,
    pub handshakes_per_sec_per_address: Option<u64>,
}

/// `[node_listener]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNodeListener {
    pub listen: Option<String>,
    pub handshake_timeout_sec: Option<u64>,
    pub max_handshakes: Option<u64>,
    pub max_handshakes_per_address: Option<u64>,
    pub handshake_reserve: Option<u64>,
    pub first_bytes_timeout_ms: Option<u64>,
    pub suspect_after_ms: Option<u64>,
    pub probe_timeout_ms: Option<u64>,
    pub tls: Option<RawTls>,
}

/// `[embedded_node]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEmbeddedNode {
    pub node: Option<String>,
}

/// `[[nodes]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub id: Option<String>,
    pub token: Option<String>,
    #[serde(default)]
    pub providers: Vec<RawProvider>,
    #[serde(default)]
    pub workspaces: Vec<RawWorkspace>,
}

/// `[[nodes.workspaces]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkspace {
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    pub host: Option<String>,
    pub root: Option<String>,
    #[serde(default)]
    pub operations: Vec<String>,
    #[serde(default)]
    pub commands: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub env: Vec<String>,
    pub max_read_bytes: Option<u64>,
    pub max_write_bytes: Option<u64>,
    pub max_list_entries: Option<u64>,
    pub command_timeout_sec: Option<u64>,
    pub max_output_bytes: Option<u64>,
}

/// `[[agents]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    pub name: Option<String>,
    pub plan: Option<String>,
    pub work: Option<String>,
    pub review: Option<String>,
    #[serde(default)]
    pub workspaces: Vec<String>,
    pub request_timeout_sec: Option<u64>,
    pub stage_iterations: Option<u64>,
    pub stage_timeout_sec: Option<u64>,
    pub tool_output_bytes: Option<u64>,
    pub repair_rounds: Option<u64>,
}

/// `[[nodes.providers]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProvider {
    pub id: Option<String>,
    pub kind: Option<RawProviderKind>,
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub capacity: Option<u64>,
    pub long_capacity: Option<u64>,
    pub request_timeout_sec: Option<u64>,
    pub response_stall_timeout_ms: Option<u64>,
    pub health_probe_interval_ms: Option<u64>,
    pub tls_ca: Option<String>,
    pub native_apis: Option<Vec<String>>,
    pub mock: Option<RawMock>,
}

/// `kind = "..."`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawProviderKind {
    Mock,
    OpenaiCompat,
    Vllm,
    Ollama,
}

/// `[nodes.providers.mock]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMock {
    pub tokens: Option<u64>,
    pub token_interval_ms: Option<u64>,
    pub first_token_delay_ms: Option<u64>,
    pub reasoning: Option<bool>,
}

/// `[[models]]`. `node`, `provider` and `upstream_model` are the one-target
/// shorthand for `[[models.targets]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub name: Option<String>,
    pub node: Option<String>,
    pub provider: Option<String>,
    pub upstream_model: Option<String>,
    pub long_context_threshold: Option<u64>,
    pub max_waiters: Option<u64>,
    pub queue_timeout_ms: Option<u64>,
    pub strict: Option<bool>,
    pub targets: Option<Vec<RawTarget>>,
}

/// `[[models.targets]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTarget {
    pub node: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
}

/// `[testing]` (both binaries): timers shortened by tests.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTesting {
    pub heartbeat_interval_ms: Option<u64>,
    pub heartbeat_wait_ms: Option<u64>,
    pub lease_ttl_ms: Option<u64>,
}

/// Node config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNodeConfig {
    pub edge: Option<String>,
    pub edges: Option<Vec<String>>,
    pub token: Option<String>,
    pub workers: Option<u64>,
    pub pin_workers: Option<bool>,
    pub max_frame_bytes: Option<u64>,
    pub shutdown_grace_sec: Option<u64>,
    pub reconnect: Option<RawReconnect>,
    pub metrics_listen: Option<String>,
    pub edge_tls: Option<RawTls>,
    pub testing: Option<RawTesting>,
    pub stream_coalesce_ms: Option<u64>,
    pub store: Option<super::store::RawStore>,
}

/// `[reconnect]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReconnect {
    pub max_attempts: Option<u64>,
    pub interval_sec: Option<u64>,
}

/// Shared validation helpers: each names the key and shows the value.
pub(crate) mod check {
    use super::ConfigError;

    /// Upper bound of every `*_sec` setting (one year): large enough for any
    /// real use, small enough that `Instant + Duration` can never overflow.
    pub(crate) const MAX_SECS: u64 = 365 * 24 * 3600;

    /// A `*_sec` value (or `default`) within `min..=MAX_SECS`, as a Duration.
    pub(crate) fn secs(
        key: &str,
        value: Option<u64>,
        default: u64,
        min: u64,
    ) -> Result<std::time::Duration, ConfigError> {
        let Some(value) = value else { return Ok(std::time::Duration::from_secs(default)) };
        Ok(std::time::Duration::from_secs(range(key, value, min, MAX_SECS)?))
    }

    /// A `*_ms` value (or `default`, in ms) within `min..=max` ms, as a Duration.
    pub(crate) fn millis(
        key: &str,
        value: Option<u64>,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<std::time::Duration, ConfigError> {
        let Some(value) = value else { return Ok(std::time::Duration::from_millis(default)) };
        Ok(std::time::Duration::from_millis(range(key, value, min, max)?))
    }

    /// `value` within `min..=max`.
    pub(crate) fn range(key: &str, value: u64, min: u64, max: u64) -> Result<u64, ConfigError> {
        if value < min {
            Err(ConfigError::invalid(key, value, format!("must be at least {min}")))
        } else if value > max {
            Err(ConfigError::invalid(key, value, format!("must be at most {max}")))
        } else {
            Ok(value)
        }
    }

    /// `value` (or `default`) within `min..=max`, as usize.
    pub(crate) fn range_usize(
        key: &str,
        value: Option<u64>,
        default: usize,
        min: usize,
        max: usize,
    ) -> Result<usize, ConfigError> {
        let Some(value) = value else { return Ok(default) };
        let checked = range(key, value, to_u64(min), to_u64(max))?;
        // Within `max`, which is a usize.
        Ok(usize::try_from(checked).unwrap_or(max))
    }

    /// `value` (or `default`) within `min..=max`, as u32.
    pub(crate) fn range_u32(
        key: &str,
        value: Option<u64>,
        default: u32,
        min: u32,
        max: u32,
    ) -> Result<u32, ConfigError> {
        let Some(value) = value else { return Ok(default) };
        let checked = range(key, value, u64::from(min), u64::from(max))?;
        Ok(u32::try_from(checked).unwrap_or(max))
    }

    fn to_u64(n: usize) -> u64 {
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// A required key.
    pub(crate) fn required<T>(key: &str, value: Option<T>) -> Result<T, ConfigError> {
        value.ok_or_else(|| ConfigError::missing(key))
    }

    /// A required, non-empty string.
    pub(crate) fn non_empty(key: &str, value: Option<String>) -> Result<String, ConfigError> {
        let value = required(key, value)?;
        if value.is_empty() {
            return Err(ConfigError::invalid(key, "", "must not be empty"));
        }
        Ok(value)
    }

    /// An id: non-empty, at most 64 chars of `[A-Za-z0-9_.-]`.
    pub(crate) fn id(key: &str, value: Option<String>) -> Result<String, ConfigError> {
        let value = non_empty(key, value)?;
        if value.len() > 64 {
            return Err(ConfigError::invalid(key, &value, "must be at most 64 characters"));
        }
        if !value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
            return Err(ConfigError::invalid(key, &value, "may only contain A-Z, a-z, 0-9, `_`, `.` and `-`"));
        }
        Ok(value)
    }

    /// A socket address with an IP literal, e.g. `127.0.0.1:8080`.
    pub(crate) fn socket_addr(key: &str, value: Option<String>) -> Result<std::net::SocketAddr, ConfigError> {
        let value = required(key, value)?;
        value.parse().map_err(|_| {
            ConfigError::invalid(key, &value, "expected an IP address and port, e.g. 127.0.0.1:8080 or [::1]:8080")
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn unknown_key_names_the_key() {
        let e = parse::<RawEdge>("bogus = 1\n", &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("bogus"), "{e}");
        let e = parse::<RawEdge>("[http]\nlisten = \"x\"\nlistne = 1\n", &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("http.listne"), "{e}");
        assert!(e.to_string().contains("unknown key"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_path() {
        let text = "[[nodes]]\nid = \"a\"\n[[nodes.providers]]\nid = \"p\"\n[[nodes.providers]]\ncapacity = \"x\"\n";
        let e = parse::<RawEdge>(text, &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("nodes[0].providers[1].capacity"), "{e}");
        assert!(e.to_string().contains("invalid type"), "{e}");
        let text = "[[models]]\nname = \"m\"\n[[models.targets]]\nnode = \"n\"\n[[models.targets]]\nmodel = 1\n";
        let e = parse::<RawEdge>(text, &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("models[0].targets[1].model"), "{e}");
    }

    #[test]
    fn secret_type_errors_hide_the_value() {
        let e = parse::<RawNodeConfig>("token = 123456789\n", &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("token"));
        assert!(!e.to_string().contains("123456789"), "{e}");
    }

    #[test]
    fn syntax_error_has_location_and_no_source_line() {
        let e = parse::<RawNodeConfig>("edge = \"a\"\ntoken = \"sekrit\n", &no_env).unwrap_err();
        let ConfigError::Syntax { line, column, .. } = &e else { panic!("{e:?}") };
        assert_eq!(*line, Some(2), "{e}");
        assert!(column.is_some());
        assert!(!e.to_string().contains("sekrit"), "{e}");
    }
}
