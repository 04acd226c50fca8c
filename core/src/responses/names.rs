//! Flat function names for the functions of a `namespace` tool: OpenAI
//! chat has no namespaces, so `ns` + `name` goes as one function name and
//! the answer restores the pair from [`Names::namespaced`].
//!
//! The flat name is `<ns>__<name>`, characters outside `[A-Za-z0-9_-]` (the
//! set OpenAI allows in a function name) written as `_`, and the underscores
//! `ns` already ends with counted into the `__` (Codex's MCP namespaces end
//! with `__`: `mcp__github__` + `create_issue` is `mcp__github__create_issue`,
//! the name Codex used before namespaces). When that is over 64 bytes or
//! taken (by a plain function, or another namespace's flat name), the flat
//! name is its first 55 bytes, `_`, and 8 hex digits of a hash of the pair
//! (and of an attempt number, raised until the name is free): the same
//! request always gets the same names.

use std::collections::{HashMap, HashSet};

/// The most OpenAI allows in a function name.
const MAX_NAME: usize = 64;

/// The function names a request's tools and calls use.
#[derive(Default)]
pub(super) struct Names {
    /// Every name given out (plain and flat).
    used: HashSet<String>,
    flat: HashMap<(String, String), String>,
    /// (flat name, namespace, name), in the order given out.
    pub(super) namespaced: Vec<(String, String, String)>,
}

impl Names {
    /// Reserves a plain function's name; `false` when it is taken.
    pub(super) fn plain(&mut self, name: &str) -> bool {
        self.used.insert(name.to_owned())
    }

    /// The flat name of `name` in `ns`, given out on first use.
    pub(super) fn flatten(&mut self, ns: &str, name: &str) -> String {
        let key = (ns.to_owned(), name.to_owned());
        if let Some(flat) = self.flat.get(&key) {
            return flat.clone();
        }
        let mut flat = joined(ns, name);
        let mut attempt = 0u32;
        while flat.len() > MAX_NAME || self.used.contains(&flat) {
            flat = hashed(&joined(ns, name), ns, name, attempt);
            attempt += 1;
        }
        self.used.insert(flat.clone());
        self.flat.insert(key, flat.clone());
        self.namespaced.push((flat.clone(), ns.to_owned(), name.to_owned()));
        flat
    }

    /// The flat name already given to `name` in `ns`.
    pub(super) fn flat_of(&self, ns: &str, name: &str) -> Option<&str> {
        self.flat.get(&(ns.to_owned(), name.to_owned())).map(String::as_str)
    }
}

/// `<ns>__<name>` in OpenAI's function-name alphabet.
fn joined(ns: &str, name: &str) -> String {
    let mut out = String::with_capacity(ns.len() + name.len() + 2);
    out.extend(ns.chars().map(allowed));
    let trailing = out.bytes().rev().take_while(|&b| b == b'_').count();
    for _ in trailing..2 {
        out.push('_');
    }
    out.extend(name.chars().map(allowed));
    out
}

fn allowed(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
        c
    } else {
        '_'
    }
}

/// `joined` cut to 55 bytes (all ASCII), `_`, and 8 hex digits of a
/// FNV-1a hash of the pair and `attempt`: 64 bytes at most.
fn hashed(joined: &str, ns: &str, name: &str, attempt: u32) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in ns.bytes().chain([0]).chain(name.bytes()).chain([0]).chain(attempt.to_le_bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let keep = joined.len().min(MAX_NAME - 9);
    format!("{}_{h:08x}", &joined[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_names() {
        let mut n = Names::default();
        assert!(n.plain("shell"));
        assert_eq!(n.flatten("fs", "read"), "fs__read");
        assert_eq!(n.flatten("mcp__github__", "create_issue"), "mcp__github__create_issue");
        assert_eq!(n.flatten("ns_", "x"), "ns__x");
        assert_eq!(n.flatten("my.ns", "a b"), "my_ns__a_b");
        // The same pair, the same name; a pair whose flat name is taken
        // gets a hashed one, as does one over 64 bytes.
        assert_eq!(n.flatten("fs", "read"), "fs__read");
        assert!(n.plain("a__b"));
        let taken = n.flatten("a", "b");
        assert!(taken.starts_with("a__b_") && taken.len() == 13, "{taken}");
        let long = n.flatten(&"n".repeat(40), &"f".repeat(40));
        assert_eq!(long.len(), 64);
        assert!(long.starts_with(&format!("{}__{}", "n".repeat(40), "f".repeat(13))), "{long}");
        let mut again = Names::default();
        again.plain("a__b");
        assert_eq!(again.flatten("a", "b"), taken);
        assert_eq!(n.flat_of("fs", "read"), Some("fs__read"));
        assert_eq!(n.namespaced[0], ("fs__read".into(), "fs".into(), "read".into()));
        assert!(!n.plain("fs__read"));
    }
}
