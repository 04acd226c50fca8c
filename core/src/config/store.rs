//! The node's run store (`store = false`, or a `[store]` table): where its
//! SQLite file lives and how long rows are kept.

use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

use super::{raw::check, ConfigError};

/// The spec's default location: `iop.db` in the node's working directory,
/// opened as a URI (shared cache, created when missing).
pub const DEFAULT_STORE_PATH: &str = "file:iop.db?cache=shared&mode=rwc";
/// Default `max_age_days`.
const DEFAULT_MAX_AGE_DAYS: u64 = 30;
/// Largest `max_age_days` (ten years).
const MAX_AGE_DAYS: u64 = 3650;
/// Default `max_rows`.
const DEFAULT_MAX_ROWS: u64 = 1_000_000;
/// `max_rows` bounds: below the lower one a busy node would keep minutes.
const MIN_ROWS: u64 = 1000;
const MAX_ROWS: u64 = 1_000_000_000;

/// The run store's settings; a node with `store = false` has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// A file path, or an SQLite URI (`file:...`).
    pub path: String,
    /// Rows that ended longer ago than this are deleted.
    pub max_age: Duration,
    /// At most this many rows are kept (the oldest go first).
    pub max_rows: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            path: DEFAULT_STORE_PATH.to_owned(),
            max_age: Duration::from_secs(DEFAULT_MAX_AGE_DAYS * 86_400),
            max_rows: DEFAULT_MAX_ROWS,
        }
    }
}

/// `store`: `true`/`false`, or a `[store]` table.
#[derive(Debug)]
pub(crate) enum RawStore {
    Switch(bool),
    Table(RawStoreTable),
}

/// `[store]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStoreTable {
    pub path: Option<String>,
    pub max_age_days: Option<u64>,
    pub max_rows: Option<u64>,
}

impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = RawStore;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`false`, `true` or a [store] table")
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawStore, E> {
                Ok(RawStore::Switch(v))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawStore, A::Error> {
                RawStoreTable::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawStore::Table)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The validated settings (`None`: the store is off).
pub(crate) fn settings(raw: Option<RawStore>) -> Result<Option<StoreSettings>, ConfigError> {
    let table = match raw {
        None | Some(RawStore::Switch(true)) => return Ok(Some(StoreSettings::default())),
        Some(RawStore::Switch(false)) => return Ok(None),
        Some(RawStore::Table(t)) => t,
    };
    let path = match table.path {
        None => DEFAULT_STORE_PATH.to_owned(),
        Some(p) if p.is_empty() => return Err(ConfigError::invalid("store.path", "", "must not be empty")),
        Some(p) if p.contains('\0') => {
            return Err(ConfigError::invalid("store.path", p.escape_debug(), "must not contain a NUL character"));
        }
        Some(p) => p,
    };
    let days = check::range("store.max_age_days", table.max_age_days.unwrap_or(DEFAULT_MAX_AGE_DAYS), 1, MAX_AGE_DAYS)?;
    let max_rows = check::range("store.max_rows", table.max_rows.unwrap_or(DEFAULT_MAX_ROWS), MIN_ROWS, MAX_ROWS)?;
    Ok(Some(StoreSettings { path, max_age: Duration::from_secs(days * 86_400), max_rows }))
}
