//! `${NAME}` / `${NAME:-default}` expansion of config string values.
//!
//! - `${NAME}`: the variable's value; an error when it is unset.
//! - `${NAME:-default}`: the value, or `default` when unset or empty (as in
//!   POSIX shells). The default is taken literally and may be empty.
//! - `$${` is a literal `${`; any other `$` is kept as is.
//!
//! Lookups go through a callback so tests (and embedders) control the
//! environment; [`process_env`] reads the real one.

use super::ConfigError;

/// Why a string could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    /// `${NAME}` without a default and `NAME` is unset.
    #[error("environment variable `{0}` is not set (write `${{{0}:-default}}` to give a default)")]
    Unset(String),
    /// A `${` without its closing `}`.
    #[error("unterminated `${{` (write `$${{` for a literal `${{`)")]
    Unterminated,
    /// Not a valid variable name (`[A-Za-z_][A-Za-z0-9_]*`).
    #[error("invalid environment variable name `{0}`")]
    BadName(String),
}

/// Looks `name` up in the process environment (unset or non-UTF-8 = None).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Expands every `${...}` reference in `input`.
pub fn expand(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail.find('}').ok_or(ExpandError::Unterminated)?;
            out.push_str(&resolve(&tail[..end], env)?);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Resolves the inside of one `${...}`.
fn resolve(reference: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let (name, default) = match reference.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (reference, None),
    };
    if !is_var_name(name) {
        return Err(ExpandError::BadName(name.to_owned()));
    }
    match (env(name), default) {
        (Some(value), Some(default)) if value.is_empty() => Ok(default.to_owned()),
        (Some(value), _) => Ok(value),
        (None, Some(default)) => Ok(default.to_owned()),
        (None, None) => Err(ExpandError::Unset(name.to_owned())),
    }
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Expands every string value in `value` (recursively), naming the key path
/// in errors. Keys themselves are not expanded.
pub(crate) fn expand_value(
    value: &mut toml::Value,
    path: &mut String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) => {
            *s = expand(s, env).map_err(|e| ConfigError::key(path.clone(), e.to_string()))?;
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                expand_value(item, path, env)?;
                path.truncate(len);
            }
        }
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                expand_value(item, path, env)?;
                path.truncate(len);
            }
        }
        toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) | toml::Value::Datetime(_) => {}
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn x(s: &str) -> Result<String, ExpandError> {
        expand(s, &env)
    }

    #[test]
    fn plain_strings_untouched() {
        assert_eq!(x("").unwrap(), "");
        assert_eq!(x("no refs here").unwrap(), "no refs here");
        assert_eq!(x("cost $5 $ and $$ and $x}").unwrap(), "cost $5 $ and $$ and $x}");
        assert_eq!(x("ünïcode $").unwrap(), "ünïcode $");
    }

    #[test]
    fn set_variable() {
        assert_eq!(x("${SET}").unwrap(), "value");
        assert_eq!(x("a-${SET}-b-${SET}").unwrap(), "a-value-b-value");
        assert_eq!(x("${SET:-default}").unwrap(), "value");
    }

    #[test]
    fn unset_with_default() {
        assert_eq!(x("${NOPE:-default}").unwrap(), "default");
        assert_eq!(x("${NOPE:-}").unwrap(), "");
        assert_eq!(x("${NOPE:-http://h:1/v1}").unwrap(), "http://h:1/v1");
        assert_eq!(x("${NOPE:-a:-b}").unwrap(), "a:-b");
    }

    #[test]
    fn empty_uses_default_like_a_shell() {
        assert_eq!(x("${EMPTY:-d}").unwrap(), "d");
        assert_eq!(x("${EMPTY}").unwrap(), "");
    }

    #[test]
    fn unset_without_default_is_an_error() {
        let e = x("pre ${NOPE} post").unwrap_err();
        assert_eq!(e, ExpandError::Unset("NOPE".into()));
        assert!(e.to_string().contains("`NOPE`"));
    }

    #[test]
    fn literal_dollar_brace() {
        assert_eq!(x("$${SET}").unwrap(), "${SET}");
        assert_eq!(x("$${").unwrap(), "${");
        assert_eq!(x("$$${SET}").unwrap(), "$${SET}");
        assert_eq!(x("$${SET}${SET}").unwrap(), "${SET}value");
    }

    #[test]
    fn malformed_references() {
        assert_eq!(x("${SET").unwrap_err(), ExpandError::Unterminated);
        assert_eq!(x("${}").unwrap_err(), ExpandError::BadName(String::new()));
        assert_eq!(x("${1X}").unwrap_err(), ExpandError::BadName("1X".into()));
        assert_eq!(x("${A B:-x}").unwrap_err(), ExpandError::BadName("A B".into()));
        assert_eq!(x("${:-x}").unwrap_err(), ExpandError::BadName(String::new()));
    }

    #[test]
    fn expand_value_names_the_key() {
        let mut v: toml::Value = toml::from_str("[a]\nb = [\"ok\", \"${NOPE}\"]\n").unwrap();
        let e = expand_value(&mut v, &mut String::new(), &env).unwrap_err();
        assert_eq!(e.key_path(), Some("a.b[1]"));
        assert!(e.to_string().contains("`NOPE`"), "{e}");

        let mut v: toml::Value = toml::from_str("s = \"${SET}\"\nn = 1\n[t]\nu = \"$${X}\"\n").unwrap();
        expand_value(&mut v, &mut String::new(), &env).unwrap();
        assert_eq!(v["s"].as_str(), Some("value"));
        assert_eq!(v["t"]["u"].as_str(), Some("${X}"));
    }
}
