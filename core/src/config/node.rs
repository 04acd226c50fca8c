//! Validated node configuration.

use std::time::Duration;

use super::{
    edge::{max_frame_bytes, split_host_port, MAX_WORKERS},
    raw::{self, check, RawNodeConfig},
    ConfigError, Secret, TestingSettings,
};

/// The whole validated node configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// The edges' node-listener addresses, `host:port` (`edge`, then
    /// `edges`): the node links to each and serves each independently.
    pub edges: Vec<String>,
    /// Registration token.
    pub token: Secret,
    /// Reactor threads, each with its own link to the edge.
    pub workers: usize,
    /// Pin each reactor thread to a core (`pin_workers`); see DESIGN.md.
    pub pin_workers: bool,
    /// Connect/reconnect policy.
    pub reconnect: ReconnectPolicy,
    /// Largest edge↔node frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// How long SIGINT/SIGTERM waits for in-flight runs.
    pub shutdown_grace: Duration,
    /// Test-only timers (`[testing]`); defaults outside tests.
    pub testing: TestingSettings,
    /// Where the node serves `GET /metrics` (none: no listener).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// TLS to the edge (`[edge_tls]`); none: plain TCP.
    pub edge_tls: Option<super::EdgeTls>,
    /// A provider's stream that arrives faster than this is read once per
    /// this window (`stream_coalesce_ms`; zero: every piece as it lands).
    pub stream_coalesce: Duration,
    /// The run store (`store`, `[store]`); none: `store = false`.
    pub store: Option<super::StoreSettings>,
}

/// The default of `stream_coalesce_ms`: far below what a reader notices
/// between tokens, and below the edge's idle gap (5 ms), so a coalesced
/// stream still counts as busy there and keeps its buffers.
pub const DEFAULT_STREAM_COALESCE: Duration = Duration::from_millis(DEFAULT_STREAM_COALESCE_MS);
const DEFAULT_STREAM_COALESCE_MS: u64 = 2;

/// Largest `stream_coalesce_ms`.
const MAX_STREAM_COALESCE_MS: u64 = 100;

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
        Self::try_from(raw::parse::<RawNodeConfig>(text, env)?)
    }
}

impl Default for ReconnectPolicy {
    /// 10 attempts, 10 s apart.
    fn default() -> Self {
        Self { max_attempts: Some(10), interval: Duration::from_secs(10) }
    }
}

impl TryFrom<RawNodeConfig> for NodeConfig {
    type Error = ConfigError;

    fn try_from(raw: RawNodeConfig) -> Result<Self, ConfigError> {
        let edges = edges(raw.edge, raw.edges)?;
        let token = Secret::new(check::non_empty("token", raw.token)?);
        let default_workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS);
        let workers = check::range_usize("workers", raw.workers, default_workers, 1, MAX_WORKERS)?;
        let max_frame_bytes = max_frame_bytes(raw.max_frame_bytes)?;
        let shutdown_grace = check::secs("shutdown_grace_sec", raw.shutdown_grace_sec, 30, 0)?;
        let defaults = ReconnectPolicy::default();
        let reconnect = match raw.reconnect {
            None => defaults,
            Some(r) => ReconnectPolicy {
                max_attempts: match r.max_attempts {
                    None => defaults.max_attempts,
                    // 0 means "never give up".
                    Some(0) => None,
                    Some(n) => Some(check::range_u32("reconnect.max_attempts", Some(n), 10, 1, u32::MAX)?),
                },
                interval: match r.interval_sec {
                    None => defaults.interval,
                    Some(s) => check::secs("reconnect.interval_sec", Some(s), 10, 1)?,
                },
            },
        };
        let testing = TestingSettings::try_from(raw.testing)?;
        let metrics_listen = match raw.metrics_listen {
            None => None,
            Some(a) => Some(check::socket_addr("metrics_listen", Some(a))?),
        };
        let edge_tls = super::tls::edge(raw.edge_tls)?;
        let stream_coalesce = check::millis(
            "stream_coalesce_ms",
            raw.stream_coalesce_ms,
            DEFAULT_STREAM_COALESCE_MS,
            0,
            MAX_STREAM_COALESCE_MS,
        )?;
        let store = super::store::settings(raw.store)?;
        Ok(Self {
            edges,
            token,
            workers,
            pin_workers: raw.pin_workers.unwrap_or(false),
            reconnect,
            max_frame_bytes,
            shutdown_grace,
            testing,
            metrics_listen,
            edge_tls,
            stream_coalesce,
            store,
        })
    }
}

/// Most edges one node links to (each costs a link per worker).
pub const MAX_EDGES: usize = 16;

/// `edge` and `edges` as one list: at least one address, each valid, none
/// twice (the same edge twice would register the node twice).
fn edges(edge: Option<String>, edges: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    if edge.is_none() && edges.as_ref().is_none_or(Vec::is_empty) {
        return Err(ConfigError::key("edge", "is required (or `edges = [\"host:port\", …]`)"));
    }
    let mut all = Vec::new();
    if let Some(e) = edge {
        validate_edge_addr(&e).map_err(|why| ConfigError::invalid("edge", &e, why))?;
        all.push(e);
    }
    for (i, e) in edges.into_iter().flatten().enumerate() {
        let key = format!("edges[{i}]");
        validate_edge_addr(&e).map_err(|why| ConfigError::invalid(&key, &e, why))?;
        if all.contains(&e) {
            return Err(ConfigError::invalid(&key, &e, "is listed twice (in `edge` or `edges`)"));
        }
        all.push(e);
    }
    if all.len() > MAX_EDGES {
        return Err(ConfigError::invalid("edges", all.len(), format!("at most {MAX_EDGES} edges")));
    }
    Ok(all)
}

/// `host:port` with a port in 1..=65535; the host may be a name.
fn validate_edge_addr(addr: &str) -> Result<(), String> {
    let (_, port) = split_host_port(addr)?;
    let port = port.ok_or("expected host:port, e.g. 127.0.0.1:7070")?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("invalid port `{port}`, expected 1..=65535")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const BASE: &str = "edge = \"127.0.0.1:7070\"\ntoken = \"tok\"\n";

    fn ok(text: &str) -> NodeConfig {
        NodeConfig::from_toml(text, &no_env).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
    }

    fn rejects(text: &str, key: &str, needle: &str) -> ConfigError {
        let e = match NodeConfig::from_toml(text, &no_env) {
            Ok(c) => panic!("accepted: {c:?}\n---\n{text}"),
            Err(e) => e,
        };
        assert_eq!(e.key_path(), Some(key), "{e}");
        assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`");
        e
    }

    #[test]
    fn metrics_listen_is_an_address() {
        assert_eq!(ok(BASE).metrics_listen, None);
        let c = ok(&format!("{BASE}metrics_listen = \"127.0.0.1:9101\"\n"));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9101".parse().unwrap()));
        rejects(&format!("{BASE}metrics_listen = \"nowhere\"\n"), "metrics_listen", "nowhere");
    }

    #[test]
    fn defaults() {
        let c = ok(BASE);
        assert_eq!(c.edges, ["127.0.0.1:7070"]);
        assert_eq!(c.token, Secret::new("tok"));
        assert_eq!(c.max_frame_bytes, crate::wire::DEFAULT_MAX_FRAME_BYTES);
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.reconnect, ReconnectPolicy { max_attempts: Some(10), interval: Duration::from_secs(10) });
        assert_eq!(c.testing, TestingSettings::default());
        assert!(c.workers >= 1 && c.workers <= MAX_WORKERS);
        assert_eq!(c.stream_coalesce, DEFAULT_STREAM_COALESCE);
        assert!(!c.pin_workers);
        assert!(ok(&format!("{BASE}pin_workers = true\n")).pin_workers);
        rejects(&format!("{BASE}pin_workers = 1\n"), "pin_workers", "invalid type");
        assert_eq!(ok(&format!("{BASE}workers = 3\n")).workers, 3);
        rejects(&format!("{BASE}workers = 0\n"), "workers", "0");
        // An empty [reconnect] table is the same as none.
        assert_eq!(ok(&format!("{BASE}[reconnect]\n")).reconnect, ReconnectPolicy::default());
    }

    #[test]
    fn explicit_values() {
        let text = format!(
            "{BASE}max_frame_bytes = 1073741824\nshutdown_grace_sec = 0\n[reconnect]\nmax_attempts = 3\ninterval_sec = 1\n"
        );
        let c = ok(&text);
        assert_eq!(c.max_frame_bytes, 1 << 30);
        assert_eq!(c.shutdown_grace, Duration::ZERO);
        assert_eq!(c.reconnect, ReconnectPolicy { max_attempts: Some(3), interval: Duration::from_secs(1) });
        let c = ok(&format!("{BASE}[testing]\nheartbeat_interval_ms = 20\nheartbeat_wait_ms = 50\n"));
        assert_eq!(
            c.testing,
            TestingSettings {
                heartbeat_interval: Duration::from_millis(20),
                heartbeat_wait: Duration::from_millis(50),
                ..Default::default()
            }
        );
        assert_eq!(ok(&format!("{BASE}stream_coalesce_ms = 0\n")).stream_coalesce, Duration::ZERO);
        assert_eq!(ok(&format!("{BASE}stream_coalesce_ms = 5\n")).stream_coalesce, Duration::from_millis(5));
        rejects(&format!("{BASE}stream_coalesce_ms = 101\n"), "stream_coalesce_ms", "at most 100");
        let c = ok(&format!("{BASE}[reconnect]\nmax_attempts = 0\n"));
        assert_eq!(c.reconnect.max_attempts, None, "0 = unlimited");
        assert_eq!(c.reconnect.interval, Duration::from_secs(10));
    }

    #[test]
    fn the_run_store_is_on_by_default_off_with_false_and_a_table_sets_it() {
        let default = super::super::StoreSettings::default();
        assert_eq!(ok(BASE).store.as_ref(), Some(&default));
        assert_eq!(default.path, "file:iop.db?cache=shared&mode=rwc");
        assert_eq!(ok(&format!("{BASE}store = true\n")).store.as_ref(), Some(&default));
        assert_eq!(ok(&format!("{BASE}store = false\n")).store, None);
        assert_eq!(ok(&format!("{BASE}[store]\n")).store.as_ref(), Some(&default));
        let c = ok(&format!("{BASE}[store]\npath = \"/var/lib/iop/runs.db\"\nmax_age_days = 7\nmax_rows = 5000\n"));
        let s = c.store.unwrap();
        assert_eq!(s.path, "/var/lib/iop/runs.db");
        assert_eq!((s.max_age, s.max_rows), (Duration::from_secs(7 * 86_400), 5000));
        rejects(&format!("{BASE}store = 1\n"), "store", "expected `false`, `true` or a [store] table");
        rejects(&format!("{BASE}store = \"no\"\n"), "store", "invalid type");
        rejects(
            &format!("{BASE}[store]\nmax_rows = 999\n"),
            "store.max_rows",
            "invalid value `999`: must be at least 1000",
        );
        rejects(&format!("{BASE}[store]\nmax_age_days = 0\n"), "store.max_age_days", "invalid value `0`");
        rejects(&format!("{BASE}[store]\nmax_age_days = 3651\n"), "store.max_age_days", "at most 3650");
        rejects(&format!("{BASE}[store]\npath = \"\"\n"), "store.path", "must not be empty");
        rejects(&format!("{BASE}[store]\npath = 3\n"), "store.path", "invalid type");
        rejects(&format!("{BASE}[store]\nmax_row = 1\n"), "store.max_row", "unknown key");
    }

    #[test]
    fn several_edges() {
        let c = ok("edge = \"a:1\"\nedges = [\"b:2\", \"c:3\"]\ntoken = \"t\"\n");
        assert_eq!(c.edges, ["a:1", "b:2", "c:3"]);
        assert_eq!(ok("edges = [\"b:2\"]\ntoken = \"t\"\n").edges, ["b:2"]);
        rejects("edges = []\ntoken = \"t\"\n", "edge", "is required");
        let e = rejects("edge = \"a:1\"\nedges = [\"b:2\", \"a:1\"]\ntoken = \"t\"\n", "edges[1]", "twice");
        assert!(e.to_string().contains("`a:1`"), "{e}");
        rejects("edges = [\"b:2\", \"b\"]\ntoken = \"t\"\n", "edges[1]", "expected host:port");
        let many: Vec<String> = (1..=17).map(|i| format!("\"h:{i}\"")).collect();
        rejects(&format!("edges = [{}]\ntoken = \"t\"\n", many.join(", ")), "edges", "at most 16");
    }

    #[test]
    fn edge_address_forms() {
        for edge in ["edge.example.com:7070", "localhost:1", "[::1]:7070", "10.0.0.1:65535", "my_edge:7070"] {
            assert_eq!(ok(&BASE.replace("127.0.0.1:7070", edge)).edges, [edge]);
        }
    }

    #[test]
    fn env_expansion() {
        let text = "edge = \"${EDGE:-127.0.0.1:7070}\"\ntoken = \"${TOK}\"\n";
        let env = |name: &str| (name == "TOK").then(|| "t".to_owned());
        let c = NodeConfig::from_toml(text, &env).unwrap();
        assert_eq!((c.edges[0].as_str(), c.token.expose()), ("127.0.0.1:7070", "t"));
        let e = NodeConfig::from_toml(text, &no_env).unwrap_err();
        assert_eq!(e.key_path(), Some("token"), "{e}");
        assert!(e.to_string().contains("environment variable `TOK` is not set"), "{e}");
        let c = NodeConfig::from_toml("edge = \"h:1\"\ntoken = \"a$${b}\"\n", &no_env).unwrap();
        assert_eq!(c.token.expose(), "a${b}");
    }

    #[test]
    fn rejections() {
        rejects("token = \"t\"\n", "edge", "is required");
        for (edge, why) in [
            ("127.0.0.1", "expected host:port"),
            ("h:0", "invalid port"),
            ("h:65536", "invalid port"),
            ("h:x", "invalid port"),
            (":7070", "missing host"),
            ("", "missing host"),
            ("::1:7070", "brackets"),
            ("http://h:1", "invalid"),
            ("h h:1", "invalid host"),
        ] {
            let e = rejects(&BASE.replace("127.0.0.1:7070", edge), "edge", why);
            assert!(e.to_string().contains(&format!("invalid value `{edge}`")), "{e}");
        }
        rejects("edge = \"h:1\"\n", "token", "is required");
        rejects("edge = \"h:1\"\ntoken = \"\"\n", "token", "invalid value `***`: must not be empty");
        rejects(&format!("{BASE}max_frame_bytes = 4095\n"), "max_frame_bytes", "must be at least 4096");
        rejects(&format!("{BASE}max_frame_bytes = 1073741825\n"), "max_frame_bytes", "must be at most");
        rejects(&format!("{BASE}shutdown_grace_sec = -1\n"), "shutdown_grace_sec", "-1");
        rejects(&format!("{BASE}shutdown_grace_sec = 31536001\n"), "shutdown_grace_sec", "must be at most 31536000");
        rejects(&format!("{BASE}[reconnect]\ninterval_sec = 0\n"), "reconnect.interval_sec", "must be at least 1");
        rejects(&format!("{BASE}[reconnect]\ninterval_sec = 31536001\n"), "reconnect.interval_sec", "at most");
        rejects(&format!("{BASE}[reconnect]\nmax_attempts = 4294967296\n"), "reconnect.max_attempts", "at most");
        rejects(&format!("{BASE}[reconnect]\nmax_attempts = -1\n"), "reconnect.max_attempts", "invalid value");
        rejects(&format!("{BASE}[reconnect]\nmax_attempt = 1\n"), "reconnect.max_attempt", "unknown key");
        rejects(&format!("{BASE}providers = []\n"), "providers", "unknown key");
        rejects(&format!("{BASE}reconnect = 5\n"), "reconnect", "invalid type");
        rejects(&format!("{BASE}[testing]\nheartbeat_wait_ms = 0\n"), "testing.heartbeat_wait_ms", "at least 1");
        rejects("edge = 7070\ntoken = \"t\"\n", "edge", "invalid type");
        for key in ["max_handshakes_per_address", "handshakes_per_sec_per_address"] {
            let text = format!("{BASE}[edge_tls]\n{key} = 4\n");
            rejects(&text, &format!("edge_tls.{key}"), "is a key of the edge's listeners");
        }
    }

    #[test]
    fn token_never_shown() {
        let c = ok(&BASE.replace("\"tok\"", "\"node-secret-value\""));
        assert!(!format!("{c:?}").contains("node-secret-value"));
        let e = rejects("edge = \"h:1\"\ntoken = [\"node-secret-value\"]\n", "token", "invalid type");
        assert!(!e.to_string().contains("node-secret-value") && !format!("{e:?}").contains("node-secret-value"));
    }
}
