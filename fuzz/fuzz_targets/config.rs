//! `EdgeConfig::from_toml` and `NodeConfig::from_toml` on arbitrary UTF-8,
//! with an empty environment and with one that resolves some variables.
//!
//! Invariants: never panics; every error renders with Display and Debug;
//! syntax errors point inside the text; key errors name a key, and a secret
//! key's value is never carried (only `***`).
#![no_main]

use iop_core::config::{ConfigError, EdgeConfig, NodeConfig};
use libfuzzer_sys::fuzz_target;

const SECRET_KEYS: [&str; 3] = ["token", "api_key", "admin_token"];

fn no_env(_: &str) -> Option<String> {
    None
}

/// Deterministic stand-in environment: some names set, some empty, some unset.
fn some_env(name: &str) -> Option<String> {
    match name.len() % 3 {
        0 => None,
        1 => Some(String::new()),
        _ => Some(format!("v-{}", name.to_ascii_lowercase())),
    }
}

fn check(text: &str, e: &ConfigError) {
    let shown = e.to_string();
    assert!(shown.starts_with("config "), "{shown}");
    let _ = format!("{e:?}");
    match e {
        ConfigError::Syntax { line, column, .. } => {
            assert!(e.key_path().is_none());
            if let Some(line) = *line {
                assert!(line >= 1 && line <= text.matches('\n').count() + 1, "line {line} outside the text");
            }
            if let Some(column) = *column {
                assert!(column >= 1 && column <= text.chars().count() + 1, "column {column} outside the text");
            }
        }
        ConfigError::Key { key, value, .. } => {
            assert_eq!(e.key_path(), Some(key.as_str()));
            let last = key.rsplit('.').next().unwrap_or(key);
            let last = last.split('[').next().unwrap_or(last);
            if SECRET_KEYS.contains(&last) {
                assert!(value.is_none() || value.as_deref() == Some("***"), "secret value in {e:?}");
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else { return };
    for env in [no_env as fn(&str) -> Option<String>, some_env] {
        match EdgeConfig::from_toml(text, &env) {
            Ok(c) => {
                let _ = format!("{c:?}");
            }
            Err(e) => check(text, &e),
        }
        match NodeConfig::from_toml(text, &env) {
            Ok(c) => {
                let _ = format!("{c:?}");
            }
            Err(e) => check(text, &e),
        }
    }
});
