//! `[affinity]`: cache affinity without coordination. A request that names
//! a session (a header, OpenAI's `prompt_cache_key` or `user`, Anthropic's
//! `metadata.user_id`) or, failing that, opens with a prompt prefix prefers
//! one target of its model, the same on every edge (rendezvous hashing);
//! load wins past `max_imbalance`.

use super::{raw::RawAffinity, ConfigError};

/// The default `affinity.header`: a client opts in per request without any
/// operator setup (it names no credential and nothing else uses it).
pub const DEFAULT_AFFINITY_HEADER: &str = "x-session-affinity";
/// The default `affinity.prefix_bytes`: about a thousand tokens of system
/// prompt and first message, enough to tell conversations and system
/// prompts apart, while hashing it stays well under a microsecond.
pub const DEFAULT_PREFIX_BYTES: usize = 4096;
/// Largest `affinity.prefix_bytes` (1 MiB): a bound on the work per request.
pub const MAX_PREFIX_BYTES: usize = 1 << 20;
/// The default `affinity.max_imbalance`: the preferred target keeps a
/// session while it is at most a quarter of its capacity busier than the
/// least busy target.
pub const DEFAULT_MAX_IMBALANCE: f64 = 0.25;

/// Validated `[affinity]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AffinitySettings {
    /// Requests with a key prefer their rendezvous target (`enabled`, on
    /// by default); off, every request goes to the least loaded target.
    pub enabled: bool,
    /// The client header whose value is the session key, lower-cased
    /// (`header`; None: no header is read).
    pub header: Option<String>,
    /// Bytes of system prompt and first messages hashed when the request
    /// names no session (`prefix_bytes`; 0: no prefix key).
    pub prefix_bytes: usize,
    /// How much busier (in use over capacity, 0-1) the preferred target
    /// may be than the least busy one before the request goes on to the
    /// next target in rendezvous order (`max_imbalance`).
    pub max_imbalance: f64,
}

impl Default for AffinitySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            header: Some(DEFAULT_AFFINITY_HEADER.to_owned()),
            prefix_bytes: DEFAULT_PREFIX_BYTES,
            max_imbalance: DEFAULT_MAX_IMBALANCE,
        }
    }
}

impl TryFrom<Option<RawAffinity>> for AffinitySettings {
    type Error = ConfigError;

    fn try_from(raw: Option<RawAffinity>) -> Result<Self, ConfigError> {
        let Some(raw) = raw else { return Ok(Self::default()) };
        let d = Self::default();
        let prefix_bytes = super::raw::check::range_usize(
            "affinity.prefix_bytes",
            raw.prefix_bytes,
            DEFAULT_PREFIX_BYTES,
            0,
            MAX_PREFIX_BYTES,
        )?;
        let max_imbalance = match raw.max_imbalance {
            None => d.max_imbalance,
            Some(v) if v.is_finite() && (0.0..=1.0).contains(&v) => v,
            Some(v) => {
                return Err(ConfigError::invalid(
                    "affinity.max_imbalance",
                    v,
                    "must be a fraction of capacity from 0 to 1",
                ))
            }
        };
        Ok(Self { enabled: raw.enabled.unwrap_or(d.enabled), header: header(raw.header)?, prefix_bytes, max_imbalance })
    }
}

/// `affinity.header`.
fn header(value: Option<String>) -> Result<Option<String>, ConfigError> {
    super::edge::header_name("affinity.header", value, DEFAULT_AFFINITY_HEADER, "a hash of the key is logged")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AffinitySettings, ConfigError> {
        let raw: RawAffinity = toml::from_str(text).unwrap();
        AffinitySettings::try_from(Some(raw))
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(AffinitySettings::try_from(None).unwrap(), AffinitySettings::default());
        assert_eq!(parse("").unwrap(), AffinitySettings::default());
        let s = parse("enabled = false\nheader = \"X-Conv\"\nprefix_bytes = 0\nmax_imbalance = 1").unwrap();
        assert_eq!(
            s,
            AffinitySettings { enabled: false, header: Some("x-conv".into()), prefix_bytes: 0, max_imbalance: 1.0 }
        );
        assert_eq!(parse("header = \"\"").unwrap().header, None, "empty: off");
        assert_eq!(parse("max_imbalance = 0.5").unwrap().max_imbalance, 0.5);
    }

    #[test]
    fn refusals_name_the_key() {
        for (text, key, needle) in [
            ("max_imbalance = 1.5", "affinity.max_imbalance", "from 0 to 1"),
            ("max_imbalance = -0.1", "affinity.max_imbalance", "from 0 to 1"),
            ("max_imbalance = nan", "affinity.max_imbalance", "from 0 to 1"),
            ("prefix_bytes = 1048577", "affinity.prefix_bytes", "at most"),
            ("header = \"a b\"", "affinity.header", "header name"),
            ("header = \"Authorization\"", "affinity.header", "credential"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(needle), "{text}: {e}");
        }
    }
}
