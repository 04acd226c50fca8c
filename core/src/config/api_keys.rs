//! `[[api_keys]]`: client keys, by the SHA-256 of the key (the plain key is
//! never in the file), each with the public models it may use, optional
//! request and token rates and daily and monthly token budgets, and what
//! its limits do while the shared engine (`[cluster]`) is unreachable.

use super::{raw::RawApiKey, ConfigError, ModelGroup};

/// Largest `requests_per_minute` / `tokens_per_minute`.
pub const MAX_RATE: u64 = 1_000_000_000;
/// Largest `tokens_per_day` / `tokens_per_month` (exact in the engine's
/// Lua numbers, which are doubles).
pub const MAX_BUDGET: u64 = 1_000_000_000_000_000;

/// What a key's limits do while the engine of `[cluster]` is unreachable
/// (`on_engine_down`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineDown {
    /// Each edge enforces its share: every limit divided by the edges
    /// last seen live (`open`, the default).
    #[default]
    Open,
    /// The key's limited requests are refused (503) until it returns
    /// (`closed`).
    Closed,
}

impl EngineDown {
    /// The config's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineDown::Open => "open",
            EngineDown::Closed => "closed",
        }
    }
}

/// A key's limits; `None`: unlimited. What the config sets, and what the
/// admin API may set in its place at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyLimits {
    /// Requests it may start per minute (a minute's worth may come at once).
    pub requests_per_minute: Option<u64>,
    /// Tokens (input + output, as providers report them) per minute.
    pub tokens_per_minute: Option<u64>,
    /// Tokens per UTC calendar day.
    pub tokens_per_day: Option<u64>,
    /// Tokens per UTC calendar month.
    pub tokens_per_month: Option<u64>,
}

impl KeyLimits {
    /// The field names, in the order of [`KeyLimits::values`].
    pub const FIELDS: [&'static str; 4] =
        ["requests_per_minute", "tokens_per_minute", "tokens_per_day", "tokens_per_month"];

    /// The values, in the order of [`KeyLimits::FIELDS`].
    pub fn values(&self) -> [Option<u64>; 4] {
        [self.requests_per_minute, self.tokens_per_minute, self.tokens_per_day, self.tokens_per_month]
    }

    /// Built from values in the order of [`KeyLimits::FIELDS`].
    pub fn from_values(v: [Option<u64>; 4]) -> Self {
        Self { requests_per_minute: v[0], tokens_per_minute: v[1], tokens_per_day: v[2], tokens_per_month: v[3] }
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.values().iter().any(Option::is_some)
    }

    /// `Err((field, why))` for the first value out of its range.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (i, (field, v)) in Self::FIELDS.iter().zip(self.values()).enumerate() {
            let max = if i < 2 { MAX_RATE } else { MAX_BUDGET };
            if let Some(n) = v {
                if !(1..=max).contains(&n) {
                    return Err((field, format!("must be 1-{max}")));
                }
            }
        }
        Ok(())
    }
}

/// One client key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyEntry {
    /// Its name (logs, metrics): never the key.
    pub name: String,
    /// SHA-256 of the key.
    pub sha256: [u8; 32],
    /// Public model names it may use.
    pub models: Vec<String>,
    /// Its configured limits.
    pub limits: KeyLimits,
    /// What its limits do while the shared engine is unreachable.
    pub on_engine_down: EngineDown,
}

impl ApiKeyEntry {
    /// A short fingerprint for logs: the first 8 hex digits of the hash.
    pub fn fingerprint(&self) -> String {
        self.sha256[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Validates `raw` against the configured `models`.
pub(crate) fn api_keys(
    raw: Vec<RawApiKey>,
    models: &[std::sync::Arc<ModelGroup>],
) -> Result<Vec<ApiKeyEntry>, ConfigError> {
    let mut out: Vec<ApiKeyEntry> = Vec::with_capacity(raw.len());
    for (i, k) in raw.into_iter().enumerate() {
        let key = format!("api_keys[{i}]");
        let name =
            k.name.filter(|n| !n.is_empty()).ok_or_else(|| ConfigError::key(format!("{key}.name"), "is required"))?;
        if let Some(first) = out.iter().position(|o| o.name == name) {
            return Err(ConfigError::invalid(
                format!("{key}.name"),
                &name,
                format!("duplicates api_keys[{first}].name"),
            ));
        }
        let hex = k.sha256.ok_or_else(|| ConfigError::key(format!("{key}.sha256"), "is required"))?;
        let sha256 = parse_sha256(&hex).ok_or_else(|| {
            ConfigError::invalid(format!("{key}.sha256"), &hex, "must be 64 hex digits (the SHA-256 of the key)")
        })?;
        if let Some(first) = out.iter().position(|o| o.sha256 == sha256) {
            return Err(ConfigError::invalid(
                format!("{key}.sha256"),
                &hex,
                format!("duplicates api_keys[{first}].sha256"),
            ));
        }
        if k.models.is_empty() {
            return Err(ConfigError::key(format!("{key}.models"), "must name at least one model"));
        }
        for (j, m) in k.models.iter().enumerate() {
            if !models.iter().any(|g| g.name == *m) {
                return Err(ConfigError::invalid(
                    format!("{key}.models[{j}]"),
                    m,
                    "is not a configured [[models]] name",
                ));
            }
        }
        let limits = KeyLimits {
            requests_per_minute: k.requests_per_minute,
            tokens_per_minute: k.tokens_per_minute,
            tokens_per_day: k.tokens_per_day,
            tokens_per_month: k.tokens_per_month,
        };
        if let Err((field, why)) = limits.validate() {
            let value = limits.values()[KeyLimits::FIELDS.iter().position(|f| *f == field).unwrap_or(0)];
            return Err(ConfigError::invalid(format!("{key}.{field}"), value.unwrap_or(0), why));
        }
        let on_engine_down = match k.on_engine_down.as_deref() {
            None | Some("open") => EngineDown::Open,
            Some("closed") => EngineDown::Closed,
            Some(other) => {
                return Err(ConfigError::invalid(
                    format!("{key}.on_engine_down"),
                    other.escape_debug(),
                    "must be \"open\" or \"closed\"",
                ))
            }
        };
        out.push(ApiKeyEntry { name, sha256, models: k.models, limits, on_engine_down });
    }
    Ok(out)
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::EdgeConfig;

    const BASE: &str = "[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n\
        [[nodes]]\nid = \"n\"\ntoken = \"t\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n\
        [[models]]\nname = \"m\"\nnode = \"n\"\nprovider = \"p\"\n";
    const HASH: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00";

    fn parse(keys: &str) -> Result<EdgeConfig, ConfigError> {
        EdgeConfig::from_toml(&format!("{BASE}{keys}"), &|_| None)
    }

    #[test]
    fn keys_are_checked_and_errors_name_the_key() {
        let ok = parse(&format!(
            "[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\nrequests_per_minute = 60\n"
        ))
        .unwrap();
        assert_eq!((ok.api_keys[0].name.as_str(), ok.api_keys[0].limits.requests_per_minute), ("a", Some(60)));
        assert_eq!(ok.api_keys[0].on_engine_down, EngineDown::Open);
        let ok = parse(&format!(
            "[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\ntokens_per_day = 1000\n\
             tokens_per_month = 20000\non_engine_down = \"closed\"\n"
        ))
        .unwrap();
        let k = &ok.api_keys[0];
        assert_eq!((k.limits.tokens_per_day, k.limits.tokens_per_month), (Some(1000), Some(20000)));
        assert_eq!(k.on_engine_down, EngineDown::Closed);
        assert!(parse("").unwrap().api_keys.is_empty());
        for (keys, path) in [
            (format!("[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"nope\"]\n"), "api_keys[0].models[0]"),
            ("[[api_keys]]\nname = \"a\"\nsha256 = \"xyz\"\nmodels = [\"m\"]\n".to_owned(), "api_keys[0].sha256"),
            (format!("[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\n"), "api_keys[0].models"),
            (format!("[[api_keys]]\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\n"), "api_keys[0].name"),
            (format!("[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\ntokens_per_minute = 0\n"), "api_keys[0].tokens_per_minute"),
            (
                format!("[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\n[[api_keys]]\nname = \"a\"\nsha256 = \"{}\"\nmodels = [\"m\"]\n", HASH.replace('a', "b")),
                "api_keys[1].name",
            ),
        ] {
            let e = parse(&keys).unwrap_err();
            assert_eq!(e.key_path(), Some(path), "{e}");
        }
    }

    #[test]
    fn budgets_and_fail_modes_name_key_and_value() {
        let key = |extra: &str| format!("[[api_keys]]\nname = \"a\"\nsha256 = \"{HASH}\"\nmodels = [\"m\"]\n{extra}\n");
        for (extra, path, value) in [
            ("tokens_per_day = 0", "api_keys[0].tokens_per_day", "`0`"),
            ("tokens_per_month = 1000000000000000001", "api_keys[0].tokens_per_month", "`1000000000000000001`"),
            ("requests_per_minute = 1000000001", "api_keys[0].requests_per_minute", "`1000000001`"),
            ("on_engine_down = \"maybe\"", "api_keys[0].on_engine_down", "`maybe`"),
        ] {
            let e = parse(&key(extra)).unwrap_err();
            assert_eq!(e.key_path(), Some(path), "{e}");
            assert!(e.to_string().contains(value), "{e}");
        }
        let l = KeyLimits { tokens_per_day: Some(5), ..Default::default() };
        assert!(l.any() && l.validate().is_ok());
        assert_eq!(KeyLimits::from_values(l.values()), l);
        assert_eq!(KeyLimits { requests_per_minute: Some(0), ..l }.validate().unwrap_err().0, "requests_per_minute");
    }

    #[test]
    fn hashes_parse_and_fingerprints_are_short() {
        let h = "A1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00";
        let parsed = parse_sha256(h).unwrap();
        assert_eq!(parsed[0], 0xa1);
        let e = ApiKeyEntry {
            name: "k".into(),
            sha256: parsed,
            models: vec![],
            limits: KeyLimits::default(),
            on_engine_down: EngineDown::Open,
        };
        assert_eq!(e.fingerprint(), "a1b2c3d4");
        assert!(parse_sha256(&h[1..]).is_none());
        assert!(parse_sha256(&h.replace('A', "g")).is_none());
    }
}
