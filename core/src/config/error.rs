//! Config errors that name the offending key and value.

/// Keys whose values are secrets: their values never appear in errors.
const SECRET_KEYS: [&str; 3] = ["token", "api_key", "admin_token"];

/// What a redacted value prints as.
const REDACTED: &str = "***";

/// A config rejection.
///
/// Display: ``config key `a.b[0].c`: invalid value `v`: <why>``, or
/// ``config key `a.b`: <why>`` when there is no single value to show. Values
/// of secret keys (`token`, `api_key`, `admin_token`) are replaced by `***`
/// when the error is built, so neither Display nor Debug can leak them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not valid TOML.
    #[error("config syntax error{}: {message}", location(*line, *column))]
    Syntax {
        /// 1-based line of the error, when known.
        line: Option<usize>,
        /// 1-based column (in characters) of the error, when known.
        column: Option<usize>,
        /// What the parser expected.
        message: String,
    },
    /// A key that is missing, unknown, of the wrong type or has a rejected value.
    #[error("config key `{key}`: {}{message}", value_part(value.as_deref()))]
    Key {
        /// Dotted key path, e.g. `nodes[0].providers[1].capacity`.
        key: String,
        /// The offending value (`***` for secret keys), when there is one.
        value: Option<String>,
        /// Why it was rejected.
        message: String,
    },
}

fn location(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l}, column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

fn value_part(value: Option<&str>) -> String {
    value.map(|v| format!("invalid value `{v}`: ")).unwrap_or_default()
}

/// Whether `key` (a full path) ends in a secret key name.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    let last = last.split('[').next().unwrap_or(last);
    SECRET_KEYS.contains(&last)
}

impl ConfigError {
    /// `value` of `key` is rejected because `message`.
    pub(crate) fn invalid(key: impl Into<String>, value: impl std::fmt::Display, message: impl Into<String>) -> Self {
        let key = key.into();
        let value = if is_secret_key(&key) { REDACTED.to_owned() } else { value.to_string() };
        Self::Key { key, value: Some(value), message: message.into() }
    }

    /// `key` is rejected for a reason that involves no single value.
    pub(crate) fn key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Key { key: key.into(), value: None, message: message.into() }
    }

    /// A required `key` is absent.
    pub(crate) fn missing(key: impl Into<String>) -> Self {
        Self::key(key, "is required")
    }

    /// A TOML syntax error at byte `offset` (when known) of `text`.
    pub(crate) fn syntax(text: &str, offset: Option<usize>, message: impl Into<String>) -> Self {
        let (line, column) = match offset {
            Some(offset) => {
                let (line, column) = line_column(text, offset);
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        Self::Syntax { line, column, message: message.into() }
    }

    /// The key path this error names, if it names one.
    pub fn key_path(&self) -> Option<&str> {
        match self {
            Self::Key { key, .. } => Some(key),
            Self::Syntax { .. } => None,
        }
    }
}

/// 1-based line and column (in chars) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn display_with_value() {
        let e = ConfigError::invalid("nodes[0].providers[1].capacity", 0, "must be at least 1");
        assert_eq!(e.to_string(), "config key `nodes[0].providers[1].capacity`: invalid value `0`: must be at least 1");
        assert_eq!(e.key_path(), Some("nodes[0].providers[1].capacity"));
    }

    #[test]
    fn display_without_value() {
        assert_eq!(ConfigError::missing("http.listen").to_string(), "config key `http.listen`: is required");
    }

    #[test]
    fn secret_values_redacted_in_display_and_debug() {
        for key in ["admin_token", "nodes[3].token", "nodes[0].providers[0].api_key"] {
            let e = ConfigError::invalid(key, "hunter2", "is bad");
            assert!(!e.to_string().contains("hunter2"), "{e}");
            assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
            assert!(e.to_string().contains("invalid value `***`"), "{e}");
        }
        // Only whole key names count.
        let e = ConfigError::invalid("tokens", 5, "x");
        assert!(e.to_string().contains("`5`"));
    }

    #[test]
    fn syntax_location() {
        let text = "a = 1\nbé = [\n";
        let e = ConfigError::syntax(text, Some(text.find('=').unwrap()), "boom");
        assert_eq!(e.to_string(), "config syntax error at line 1, column 3: boom");
        let e = ConfigError::syntax(text, Some(text.rfind('[').unwrap()), "boom");
        assert_eq!(e.to_string(), "config syntax error at line 2, column 6: boom");
        let e = ConfigError::syntax(text, Some(text.len() + 10), "boom");
        assert_eq!(e.to_string(), "config syntax error at line 3, column 1: boom");
        assert_eq!(ConfigError::syntax(text, None, "boom").to_string(), "config syntax error: boom");
    }
}
