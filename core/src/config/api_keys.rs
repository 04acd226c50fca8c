//! `[[api_keys]]`: client keys, by the SHA-256 of the key (the plain key is
//! never in the file), each with the public models it may use and optional
//! request and token rates.

use super::{raw::RawApiKey, ConfigError, ModelGroup};

/// Largest `requests_per_minute` / `tokens_per_minute`.
pub const MAX_RATE: u64 = 1_000_000_000;

/// One client key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyEntry {
    /// Its name (logs, metrics): never the key.
    pub name: String,
    /// SHA-256 of the key.
    pub sha256: [u8; 32],
    /// Public model names it may use.
    pub models: Vec<String>,
    /// Requests it may start per minute (a minute's worth may come at once).
    pub requests_per_minute: Option<u64>,
    /// Tokens (input + output, as providers report them) per minute.
    pub tokens_per_minute: Option<u64>,
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
        let rate = |field: &str, v: Option<u64>| match v {
            Some(n) if !(1..=MAX_RATE).contains(&n) => {
                Err(ConfigError::invalid(format!("{key}.{field}"), n, format!("must be 1-{MAX_RATE}")))
            }
            other => Ok(other),
        };
        let requests_per_minute = rate("requests_per_minute", k.requests_per_minute)?;
        let tokens_per_minute = rate("tokens_per_minute", k.tokens_per_minute)?;
        out.push(ApiKeyEntry { name, sha256, models: k.models, requests_per_minute, tokens_per_minute });
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
        assert_eq!((ok.api_keys[0].name.as_str(), ok.api_keys[0].requests_per_minute), ("a", Some(60)));
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
    fn hashes_parse_and_fingerprints_are_short() {
        let h = "A1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00";
        let parsed = parse_sha256(h).unwrap();
        assert_eq!(parsed[0], 0xa1);
        let e = ApiKeyEntry {
            name: "k".into(),
            sha256: parsed,
            models: vec![],
            requests_per_minute: None,
            tokens_per_minute: None,
        };
        assert_eq!(e.fingerprint(), "a1b2c3d4");
        assert!(parse_sha256(&h[1..]).is_none());
        assert!(parse_sha256(&h.replace('A', "g")).is_none());
    }
}
