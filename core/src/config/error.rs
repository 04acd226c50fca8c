//! Config errors that name the offending key and value.
// SKELETON — to be completed by the config helper.

/// A config rejection. Display: "config key `a.b[0].c`: <message>" and, for
/// non-secret keys, the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
