//! `[testing]`: settings that exist only so tests can shorten timers. Both
//! binaries accept the table; production configs leave it out.

use std::time::Duration;

use super::{
    raw::{check, RawTesting},
    ConfigError,
};

/// Default `heartbeat_interval_ms`.
const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 30_000;
/// Default `heartbeat_wait_ms`.
const DEFAULT_HEARTBEAT_WAIT_MS: u64 = 45_000;
/// Upper bound of both settings: one year, as for every `*_sec` setting.
const MAX_MS: u64 = check::MAX_SECS * 1000;

/// Test-only timer settings (`[testing]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestingSettings {
    /// How often each side sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long a side waits without hearing from the peer before closing
    /// the session; always greater than `heartbeat_interval`.
    pub heartbeat_wait: Duration,
    /// How long a credential lease is valid after issue (managed mode).
    pub lease_ttl: Duration,
}

impl Default for TestingSettings {
    /// 30 s interval, 45 s wait.
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(DEFAULT_HEARTBEAT_INTERVAL_MS),
            heartbeat_wait: Duration::from_millis(DEFAULT_HEARTBEAT_WAIT_MS),
            lease_ttl: crate::lease::DEFAULT_TTL,
        }
    }
}

impl TryFrom<Option<RawTesting>> for TestingSettings {
    type Error = ConfigError;

    fn try_from(raw: Option<RawTesting>) -> Result<Self, ConfigError> {
        let Some(raw) = raw else { return Ok(Self::default()) };
        let heartbeat_interval = check::millis(
            "testing.heartbeat_interval_ms",
            raw.heartbeat_interval_ms,
            DEFAULT_HEARTBEAT_INTERVAL_MS,
            1,
            MAX_MS,
        )?;
        let heartbeat_wait =
            check::millis("testing.heartbeat_wait_ms", raw.heartbeat_wait_ms, DEFAULT_HEARTBEAT_WAIT_MS, 1, MAX_MS)?;
        if heartbeat_wait <= heartbeat_interval {
            let defaulted = if raw.heartbeat_wait_ms.is_none() { " (the default)" } else { "" };
            return Err(ConfigError::invalid(
                "testing.heartbeat_wait_ms",
                format!("{}{defaulted}", heartbeat_wait.as_millis()),
                format!("must be greater than testing.heartbeat_interval_ms ({})", heartbeat_interval.as_millis()),
            ));
        }
        // 0: every lease is expired when it arrives (the expiry test).
        let lease_ttl = check::millis(
            "testing.lease_ttl_ms",
            raw.lease_ttl_ms,
            crate::lease::DEFAULT_TTL.as_millis() as u64,
            0,
            600_000,
        )?;
        Ok(Self { heartbeat_interval, heartbeat_wait, lease_ttl })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::{EdgeConfig, NodeConfig};

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const NODE: &str = "edge = \"127.0.0.1:7070\"\ntoken = \"tok\"\n";

    const EDGE: &str = "[http]\nlisten = \"127.0.0.1:8080\"\n[node_listener]\nlisten = \"127.0.0.1:7070\"\n\
        [[nodes]]\nid = \"n\"\ntoken = \"t\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n\
        [[models]]\nname = \"m\"\nprovider = \"p\"\n";

    /// The `[testing]` settings of `table` parsed in a node config and in an
    /// edge config; both must agree.
    fn parse(table: &str) -> Result<TestingSettings, ConfigError> {
        let node = NodeConfig::from_toml(&format!("{NODE}{table}"), &no_env).map(|c| c.testing);
        let edge = EdgeConfig::from_toml(&format!("{EDGE}{table}"), &no_env).map(|c| c.testing);
        assert_eq!(node, edge, "node and edge disagree on {table:?}");
        node
    }

    fn rejects(table: &str, key: &str, needle: &str) {
        let e = parse(table).unwrap_err();
        assert_eq!(e.key_path(), Some(key), "{e}");
        assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`");
    }

    #[test]
    fn defaults() {
        let d = TestingSettings::default();
        assert_eq!((d.heartbeat_interval, d.heartbeat_wait), (Duration::from_secs(30), Duration::from_secs(45)));
        assert_eq!(parse("").unwrap(), d, "no [testing] table");
        assert_eq!(parse("[testing]\n").unwrap(), d, "empty [testing] table");
        // Each key defaults on its own.
        let t = parse("[testing]\nheartbeat_wait_ms = 60000\n").unwrap();
        assert_eq!((t.heartbeat_interval, t.heartbeat_wait), (Duration::from_secs(30), Duration::from_secs(60)));
        let t = parse("[testing]\nheartbeat_interval_ms = 100\n").unwrap();
        assert_eq!((t.heartbeat_interval, t.heartbeat_wait), (Duration::from_millis(100), Duration::from_secs(45)));
    }

    #[test]
    fn explicit_values() {
        let t = parse("[testing]\nheartbeat_interval_ms = 1\nheartbeat_wait_ms = 2\n").unwrap();
        assert_eq!((t.heartbeat_interval, t.heartbeat_wait), (Duration::from_millis(1), Duration::from_millis(2)));
        let t = parse("[testing]\nheartbeat_interval_ms = 50\nheartbeat_wait_ms = 31536000000\n").unwrap();
        assert_eq!(t.heartbeat_wait, Duration::from_secs(365 * 24 * 3600));
    }

    #[test]
    fn rejections() {
        rejects("[testing]\nheartbeat_interval_ms = 0\n", "testing.heartbeat_interval_ms", "invalid value `0`");
        rejects("[testing]\nheartbeat_interval_ms = 0\n", "testing.heartbeat_interval_ms", "must be at least 1");
        rejects("[testing]\nheartbeat_wait_ms = 0\n", "testing.heartbeat_wait_ms", "must be at least 1");
        rejects("[testing]\nheartbeat_interval_ms = -5\n", "testing.heartbeat_interval_ms", "-5");
        rejects("[testing]\nheartbeat_wait_ms = 31536000001\n", "testing.heartbeat_wait_ms", "must be at most");
        rejects("[testing]\nheartbeat_interval_ms = \"1s\"\n", "testing.heartbeat_interval_ms", "invalid type");
        rejects(
            "[testing]\nheartbeat_interval_ms = 100\nheartbeat_wait_ms = 100\n",
            "testing.heartbeat_wait_ms",
            "invalid value `100`: must be greater than testing.heartbeat_interval_ms (100)",
        );
        rejects(
            "[testing]\nheartbeat_interval_ms = 100\nheartbeat_wait_ms = 99\n",
            "testing.heartbeat_wait_ms",
            "must be greater than",
        );
        // A larger interval against the default wait says the wait was defaulted.
        rejects(
            "[testing]\nheartbeat_interval_ms = 60000\n",
            "testing.heartbeat_wait_ms",
            "invalid value `45000 (the default)`: must be greater than testing.heartbeat_interval_ms (60000)",
        );
        rejects("[testing]\nheartbeat_ms = 1\n", "testing.heartbeat_ms", "unknown key");
        // A top-level key (not appended after the edge's last table).
        let e = NodeConfig::from_toml(&format!("testing = 1\n{NODE}"), &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("testing"), "{e}");
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
