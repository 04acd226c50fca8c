//! `tools`, `tool_choice` and `parallel_tool_calls`: function tools as
//! OpenAI chat function tools, a `namespace`'s functions flattened
//! ([`super::names`]), hosted tools left out by type.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::names::Names;
use crate::translate::{
    read::{array, boolean, invalid, object, required, shown, string, take, Dropped, Path},
    Invalid,
};

/// Writes `tools`, `tool_choice` and `parallel_tool_calls` into `out`.
/// Plain function names are reserved before any namespace is flattened, so
/// a flat name never takes a plain function's.
pub(super) fn tools(
    tools: Option<Value>,
    choice: Option<Value>,
    parallel: Option<bool>,
    names: &mut Names,
    dropped: &mut Dropped,
    out: &mut Map<String, Value>,
) -> Result<(), Invalid> {
    let at = Path::top("tools");
    let list = tools.map(|t| array(t, at)).transpose()?.unwrap_or_default();
    // One slot per tool, filled in two passes: plain functions, then
    // namespaces (whose flat names must avoid every plain name).
    let mut slots: Vec<Vec<Value>> = Vec::with_capacity(list.len());
    let mut namespaces = Vec::new();
    for (k, tool) in list.into_iter().enumerate() {
        let tat = at.index(k);
        let mut tool = object(tool, tat)?;
        let kind = string(required(&mut tool, "type", tat)?, tat.key("type"))?;
        match kind.as_str() {
            "function" => {
                let name = string(required(&mut tool, "name", tat)?, tat.key("name"))?;
                if !names.plain(&name) {
                    return Err(invalid(tat.key("name"), format_args!("a second tool named \"{}\"", shown(&name))));
                }
                slots.push(vec![function(name, tool, tat, dropped)?]);
            }
            "namespace" => {
                namespaces.push((k, tool));
                slots.push(Vec::new());
            }
            // Hosted tools run at OpenAI; no provider here has them.
            // `custom` (free-form input) has no chat counterpart.
            other => {
                dropped.add(&format!("tools.{}", shown(other)));
                slots.push(Vec::new());
            }
        }
    }
    for (k, tool) in namespaces {
        let tat = at.index(k);
        if let Some(slot) = slots.get_mut(k) {
            *slot = namespace(tool, tat, names, dropped)?;
        }
    }
    let functions: Vec<Value> = slots.into_iter().flatten().collect();
    let sent: HashSet<&str> =
        functions.iter().filter_map(|f| f.pointer("/function/name").and_then(Value::as_str)).collect();
    if let Some(choice) = choice {
        if let Some(choice) = tool_choice(choice, &sent, names, dropped)? {
            out.insert("tool_choice".into(), choice);
        }
    }
    if !functions.is_empty() {
        // OpenAI refuses `parallel_tool_calls` without tools.
        if let Some(parallel) = parallel {
            out.insert("parallel_tool_calls".into(), parallel.into());
        }
        out.insert("tools".into(), Value::Array(functions));
    }
    Ok(())
}

/// A function tool (its `type` and `name` read) as a chat function tool
/// named `name`.
fn function(name: String, mut tool: Map<String, Value>, at: Path<'_>, dropped: &mut Dropped) -> Result<Value, Invalid> {
    let mut f = Map::new();
    f.insert("name".into(), name.into());
    if let Some(d) = take(&mut tool, "description") {
        f.insert("description".into(), string(d, at.key("description"))?.into());
    }
    if let Some(p) = take(&mut tool, "parameters") {
        if !p.is_object() {
            return Err(invalid(at.key("parameters"), "must be an object"));
        }
        f.insert("parameters".into(), p);
    }
    if let Some(s) = take(&mut tool, "strict") {
        f.insert("strict".into(), boolean(s, at.key("strict"))?.into());
    }
    dropped.rest(tool, "tool");
    Ok(json!({"type": "function", "function": f}))
}

/// A `namespace` tool's functions, each under its flat name. The
/// namespace's own description has no place in chat: left out.
fn namespace(
    mut tool: Map<String, Value>,
    at: Path<'_>,
    names: &mut Names,
    dropped: &mut Dropped,
) -> Result<Vec<Value>, Invalid> {
    let ns = string(required(&mut tool, "name", at)?, at.key("name"))?;
    if let Some(d) = take(&mut tool, "description") {
        if !string(d, at.key("description"))?.is_empty() {
            dropped.add("namespace.description");
        }
    }
    let iat = at.key("tools");
    let inner = array(required(&mut tool, "tools", at)?, iat)?;
    dropped.rest(tool, "namespace");
    let mut out = Vec::with_capacity(inner.len());
    for (j, f) in inner.into_iter().enumerate() {
        let fat = iat.index(j);
        let mut f = object(f, fat)?;
        let kind = take(&mut f, "type").map(|t| string(t, fat.key("type"))).transpose()?;
        if let Some(kind) = kind.filter(|k| k != "function") {
            dropped.add(&format!("tools.{}", shown(&kind)));
            continue;
        }
        let name = string(required(&mut f, "name", fat)?, fat.key("name"))?;
        if names.flat_of(&ns, &name).is_some() {
            return Err(invalid(
                fat.key("name"),
                format_args!("a second function named \"{}\" in namespace \"{}\"", shown(&name), shown(&ns)),
            ));
        }
        let flat = names.flatten(&ns, &name);
        out.push(function(flat, f, fat, dropped)?);
    }
    Ok(out)
}

/// `tool_choice` over the functions sent (`sent`, by their chat names);
/// `None` when nothing is to be sent: a choice that forces a tool no
/// longer there, or one the translation cannot carry, is left out.
fn tool_choice(
    choice: Value,
    sent: &HashSet<&str>,
    names: &Names,
    dropped: &mut Dropped,
) -> Result<Option<Value>, Invalid> {
    let at = Path::top("tool_choice");
    let value = match choice {
        Value::String(s) => match s.as_str() {
            "auto" | "none" | "required" => Value::String(s),
            other => {
                return Err(invalid(
                    at,
                    format_args!("must be \"auto\", \"none\", \"required\" or an object, not \"{}\"", shown(other)),
                ))
            }
        },
        Value::Object(mut c) => {
            let kind = string(required(&mut c, "type", at)?, at.key("type"))?;
            if kind != "function" {
                // `allowed_tools`, `custom`, `mcp` and the hosted tools'
                // choices name tools that are not sent, or a restriction
                // chat cannot say.
                dropped.add(&format!("tool_choice.{}", shown(&kind)));
                return Ok(None);
            }
            let name = string(required(&mut c, "name", at)?, at.key("name"))?;
            let ns = take(&mut c, "namespace").map(|n| string(n, at.key("namespace"))).transpose()?;
            dropped.rest(c, "tool_choice");
            let flat = match &ns {
                Some(ns) => names.flat_of(ns, &name).map(str::to_owned),
                None => sent.contains(name.as_str()).then_some(name),
            };
            let Some(flat) = flat.filter(|f| sent.contains(f.as_str())) else {
                return Err(invalid(at.key("name"), "no function tool of that name in `tools`"));
            };
            json!({"type": "function", "function": {"name": flat}})
        }
        _ => return Err(invalid(at, "must be a string or an object")),
    };
    if sent.is_empty() {
        // "auto" and "none" say nothing without tools; "required" cannot
        // be honoured when only hosted tools were given.
        if value == "required" {
            dropped.add("tool_choice");
        }
        return Ok(None);
    }
    Ok(Some(value))
}
