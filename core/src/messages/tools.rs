//! `tools` and `tool_choice`: custom tools as OpenAI function tools; hosted
//! (server) tools left out by name.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::{
    read::{array, boolean, cache_control, invalid, object, required, shown, string, take, Dropped, Path},
    request::Invalid,
};

/// Writes `tools`, `tool_choice` and `parallel_tool_calls` into `out`.
pub(super) fn tools(
    tools: Option<Value>,
    choice: Option<Value>,
    dropped: &mut Dropped,
    out: &mut Map<String, Value>,
) -> Result<(), Invalid> {
    let at = Path::top("tools");
    let mut functions = Vec::new();
    let mut names = HashSet::new();
    let mut hosted = HashSet::new();
    for (k, tool) in tools.map(|t| array(t, at)).transpose()?.unwrap_or_default().into_iter().enumerate() {
        let tat = at.index(k);
        let mut tool = object(tool, tat)?;
        cache_control(dropped, &mut tool);
        let kind = take(&mut tool, "type").map(|t| string(t, tat.key("type"))).transpose()?;
        if let Some(kind) = kind.filter(|k| k != "custom") {
            // A server tool runs at Anthropic; no provider here has it.
            dropped.add(&format!("tools.{}", shown(&kind)));
            if let Some(Value::String(name)) = tool.remove("name") {
                hosted.insert(name);
            }
            continue;
        }
        let name = string(required(&mut tool, "name", tat)?, tat.key("name"))?;
        let schema = required(&mut tool, "input_schema", tat)?;
        if !schema.is_object() {
            return Err(invalid(tat.key("input_schema"), "must be an object"));
        }
        let mut function = Map::new();
        if let Some(d) = take(&mut tool, "description") {
            function.insert("description".into(), string(d, tat.key("description"))?.into());
        }
        if let Some(strict) = take(&mut tool, "strict") {
            function.insert("strict".into(), boolean(strict, tat.key("strict"))?.into());
        }
        function.insert("parameters".into(), schema);
        if !names.insert(name.clone()) {
            return Err(invalid(tat.key("name"), format_args!("a second tool named \"{}\"", shown(&name))));
        }
        function.insert("name".into(), name.into());
        dropped.rest(tool, "tool");
        functions.push(json!({"type": "function", "function": function}));
    }
    if let Some(choice) = choice {
        tool_choice(choice, &names, &hosted, dropped, out)?;
    }
    if !functions.is_empty() {
        out.insert("tools".into(), Value::Array(functions));
    }
    Ok(())
}

/// `tool_choice` over the function tools kept (`names`). A choice that
/// needs a tool no longer there (only server tools were given) is left
/// out; "auto" and "none" with no tools say nothing OpenAI needs.
fn tool_choice(
    choice: Value,
    names: &HashSet<String>,
    hosted: &HashSet<String>,
    dropped: &mut Dropped,
    out: &mut Map<String, Value>,
) -> Result<(), Invalid> {
    let at = Path::top("tool_choice");
    let mut choice = object(choice, at)?;
    let kind = string(required(&mut choice, "type", at)?, at.key("type"))?;
    let no_parallel = match take(&mut choice, "disable_parallel_tool_use") {
        Some(v) => boolean(v, at.key("disable_parallel_tool_use"))?,
        None => false,
    };
    let value = match kind.as_str() {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = string(required(&mut choice, "name", at)?, at.key("name"))?;
            if !names.contains(&name) && !hosted.contains(&name) {
                return Err(invalid(at.key("name"), format_args!("no tool named \"{}\" in `tools`", shown(&name))));
            }
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(invalid(
                at.key("type"),
                format_args!("must be one of \"auto\", \"any\", \"tool\", \"none\", not \"{}\"", shown(other)),
            ))
        }
    };
    dropped.rest(choice, "tool_choice");
    let forced = matches!(kind.as_str(), "any" | "tool");
    let tool_gone = value.pointer("/function/name").and_then(Value::as_str).is_some_and(|n| !names.contains(n));
    if names.is_empty() || tool_gone {
        if forced {
            dropped.add("tool_choice");
        }
        return Ok(());
    }
    out.insert("tool_choice".into(), value);
    if no_parallel && kind != "none" {
        out.insert("parallel_tool_calls".into(), false.into());
    }
    Ok(())
}
