//! Reading typed values out of a request's JSON tree, each refusal naming
//! its param as a dotted path (`messages.1.content.0.tool_use_id`), and the
//! record of what a translation left out.
//!
//! Values are moved out of the tree, not cloned: a prompt can be megabytes.

use std::{collections::BTreeSet, fmt};

use serde_json::{Map, Value};

use super::Invalid;

/// Where a value sits in the request. Built on the stack as the reader
/// descends and rendered only for a refusal, so a valid request pays no
/// string per field.
#[derive(Clone, Copy)]
pub(crate) struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    seg: Seg<'a>,
}

#[derive(Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

impl<'a> Path<'a> {
    /// A top-level field.
    pub(crate) fn top(key: &'a str) -> Self {
        Self { parent: None, seg: Seg::Key(key) }
    }

    pub(crate) fn key<'b>(&'b self, key: &'b str) -> Path<'b> {
        Path { parent: Some(self), seg: Seg::Key(key) }
    }

    pub(crate) fn index<'b>(&'b self, index: usize) -> Path<'b> {
        Path { parent: Some(self), seg: Seg::Index(index) }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            write!(f, "{parent}.")?;
        }
        match self.seg {
            Seg::Key(k) => f.write_str(k),
            Seg::Index(i) => write!(f, "{i}"),
        }
    }
}

/// A 400 naming `at`.
pub(crate) fn invalid(at: Path<'_>, what: impl fmt::Display) -> Invalid {
    let param = at.to_string();
    Invalid { status: 400, message: format!("{param}: {what}"), param }
}

/// A client-chosen string shown in a message or a dropped name, cut short
/// (a key or a type can be megabytes).
pub(crate) fn shown(s: &str) -> &str {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What was left out, by stable name; sorted and deduplicated.
#[derive(Default)]
pub(crate) struct Dropped(BTreeSet<String>);

impl Dropped {
    pub(crate) fn add(&mut self, name: &str) {
        if !self.0.contains(name) {
            self.0.insert(name.to_owned());
        }
    }

    /// Every non-null field left in `m` (the known ones were taken out), as
    /// `<prefix>.<key>`.
    pub(crate) fn rest(&mut self, m: Map<String, Value>, prefix: &str) {
        for (k, v) in m {
            if !v.is_null() {
                self.add(&format!("{prefix}.{}", shown(&k)));
            }
        }
    }

    pub(crate) fn into_vec(self) -> Vec<String> {
        self.0.into_iter().collect()
    }
}

/// Removes `key`; `null` counts as absent.
pub(crate) fn take(m: &mut Map<String, Value>, key: &str) -> Option<Value> {
    m.remove(key).filter(|v| !v.is_null())
}

/// Removes `key`, which must be there (`at` is the object holding it).
pub(crate) fn required(m: &mut Map<String, Value>, key: &str, at: Path<'_>) -> Result<Value, Invalid> {
    take(m, key).ok_or_else(|| invalid(at.key(key), "field required"))
}

pub(crate) fn string(v: Value, at: Path<'_>) -> Result<String, Invalid> {
    match v {
        Value::String(s) => Ok(s),
        _ => Err(invalid(at, "must be a string")),
    }
}

pub(crate) fn object(v: Value, at: Path<'_>) -> Result<Map<String, Value>, Invalid> {
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(invalid(at, "must be an object")),
    }
}

pub(crate) fn array(v: Value, at: Path<'_>) -> Result<Vec<Value>, Invalid> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(invalid(at, "must be an array")),
    }
}

pub(crate) fn boolean(v: Value, at: Path<'_>) -> Result<bool, Invalid> {
    v.as_bool().ok_or_else(|| invalid(at, "must be a boolean"))
}

/// A non-negative integer.
pub(crate) fn count(v: Value, at: Path<'_>) -> Result<u64, Invalid> {
    v.as_u64().ok_or_else(|| invalid(at, "must be a non-negative integer"))
}

/// A number, kept as written (integer or float).
pub(crate) fn number(v: Value, at: Path<'_>) -> Result<Value, Invalid> {
    match v {
        Value::Number(_) => Ok(v),
        _ => Err(invalid(at, "must be a number")),
    }
}
