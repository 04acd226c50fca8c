//! `[cluster]`: the API keys' limits shared by every edge through a
//! Redis-protocol server (Redis or Valkey). Without it each edge enforces
//! its keys' limits alone.

use std::time::Duration;

use super::{raw::RawCluster, ConfigError, Secret};

/// The default `cluster.prefix` of every key the edges keep in the engine.
pub const DEFAULT_PREFIX: &str = "iop:";
/// The default `cluster.deadline_ms`: how long a request waits for the
/// engine's verdict before the key's fail mode decides.
pub const DEFAULT_DEADLINE_MS: u64 = 20;
/// Largest `cluster.deadline_ms`: a request never waits longer on it.
pub const MAX_DEADLINE_MS: u64 = 1_000;
/// The default `cluster.queue`: checks waiting for the engine's thread.
pub const DEFAULT_QUEUE: usize = 4096;
/// Largest `cluster.queue`.
pub const MAX_QUEUE: usize = 1 << 20;
/// The longest `cluster.prefix`.
pub const MAX_PREFIX_BYTES: usize = 64;

/// URL schemes the client speaks (no TLS build: `rediss://` is refused).
const SCHEMES: [&str; 5] = ["redis", "valkey", "unix", "redis+unix", "valkey+unix"];

/// Validated `[cluster]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// The engine's URL (`redis`): `redis://host:port/db` or
    /// `unix:///path/to.sock`; a secret (it may hold a password).
    pub redis: Secret,
    /// Prefix of every key in the engine (`prefix`).
    pub prefix: String,
    /// How long a request waits for a verdict (`deadline_ms`).
    pub deadline: Duration,
    /// Checks that may wait for the engine's thread (`queue`): past it,
    /// the fail mode decides.
    pub queue: usize,
}

impl TryFrom<Option<RawCluster>> for ClusterSettings {
    type Error = ConfigError;

    /// `Err` for a `[cluster]` without `redis`; `None` is handled by the
    /// caller (no section, no cluster).
    fn try_from(raw: Option<RawCluster>) -> Result<Self, ConfigError> {
        let raw = raw.ok_or_else(|| ConfigError::missing("cluster"))?;
        let url = raw.redis.ok_or_else(|| ConfigError::missing("cluster.redis"))?;
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if !scheme.as_deref().is_some_and(|s| SCHEMES.contains(&s)) {
            // Only the scheme: the rest may hold a password.
            let shown = scheme.unwrap_or_else(|| "(no scheme)".to_owned());
            return Err(ConfigError::invalid(
                "cluster.redis",
                format!("{}://…", shown.escape_debug()),
                "must be a redis://, valkey:// or unix:// URL (TLS is not supported)",
            ));
        }
        let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
        if prefix.is_empty() || prefix.len() > MAX_PREFIX_BYTES || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::invalid(
                "cluster.prefix",
                prefix.escape_debug(),
                format!("must be 1-{MAX_PREFIX_BYTES} visible ASCII characters"),
            ));
        }
        let deadline =
            super::raw::check::millis("cluster.deadline_ms", raw.deadline_ms, DEFAULT_DEADLINE_MS, 1, MAX_DEADLINE_MS)?;
        let queue = super::raw::check::range_usize("cluster.queue", raw.queue, DEFAULT_QUEUE, 1, MAX_QUEUE)?;
        Ok(Self { redis: Secret::new(url), prefix, deadline, queue })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterSettings, ConfigError> {
        let raw: RawCluster = toml::from_str(text).unwrap();
        ClusterSettings::try_from(Some(raw))
    }

    #[test]
    fn defaults_and_values() {
        let s = parse("redis = \"redis://127.0.0.1:6379\"").unwrap();
        assert_eq!((s.prefix.as_str(), s.deadline, s.queue), ("iop:", Duration::from_millis(20), 4096));
        let s = parse("redis = \"unix:///tmp/r.sock\"\nprefix = \"t1:\"\ndeadline_ms = 5\nqueue = 8").unwrap();
        assert_eq!((s.prefix.as_str(), s.deadline, s.queue), ("t1:", Duration::from_millis(5), 8));
        assert_eq!(s.redis.expose(), "unix:///tmp/r.sock");
    }

    #[test]
    fn refusals_name_the_key_and_never_the_password() {
        for (text, key, needle) in [
            ("prefix = \"x\"", "cluster.redis", "is required"),
            ("redis = \"rediss://:pw@h:1\"", "cluster.redis", "`rediss://…`"),
            ("redis = \"h:6379\"", "cluster.redis", "(no scheme)"),
            ("redis = \"redis://h\"\nprefix = \"a b\"", "cluster.prefix", "`a b`"),
            ("redis = \"redis://h\"\nprefix = \"\"", "cluster.prefix", "visible ASCII"),
            ("redis = \"redis://h\"\ndeadline_ms = 0", "cluster.deadline_ms", "`0`"),
            ("redis = \"redis://h\"\ndeadline_ms = 5000", "cluster.deadline_ms", "at most 1000"),
            ("redis = \"redis://h\"\nqueue = 0", "cluster.queue", "at least 1"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.key_path(), Some(key), "{text}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(needle) && !msg.contains("pw"), "{text}: {msg}");
        }
    }
}
