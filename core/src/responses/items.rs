//! `input`: Responses items onto chat messages (the table is in the module
//! docs).

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::{names::Names, parts, Options};
use crate::translate::{
    read::{invalid, object, required, shown, string, take, Dropped, Path},
    Invalid,
};

/// Item types OpenAI knows that the translation cannot carry: hosted
/// tools' calls and results, free-form tool calls, references to stored
/// items, compacted context. Left out and named `item.<type>`.
const LEFT_OUT: &[&str] = &[
    "item_reference",
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "code_interpreter_call",
    "image_generation_call",
    "custom_tool_call",
    "custom_tool_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "tool_search_call",
    "tool_search_output",
    "compaction",
];

/// What the translation of the input shares.
pub(super) struct Ctx<'o> {
    pub(super) opts: &'o Options,
    pub(super) dropped: Dropped,
    pub(super) names: Names,
}

/// Calls made so far (in the history and the input) and those answered.
#[derive(Default)]
struct Calls {
    asked: HashSet<String>,
    answered: HashSet<String>,
}

impl Calls {
    /// The calls of chat messages already translated (the history).
    fn of(history: &[Value]) -> Self {
        let mut calls = Self::default();
        for m in history {
            if let Some(list) = m.get("tool_calls").and_then(Value::as_array) {
                calls.asked.extend(list.iter().filter_map(|c| c.get("id")?.as_str()).map(str::to_owned));
            }
            if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
                calls.answered.insert(id.to_owned());
            }
        }
        calls
    }
}

/// `input` appended to `out`, whose messages from `from` on are this
/// input's (those before: instructions and history).
pub(super) fn input(v: Value, from: usize, ctx: &mut Ctx<'_>, out: &mut Vec<Value>) -> Result<(), Invalid> {
    let at = Path::top("input");
    let list = match v {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(list) => list,
        _ => return Err(invalid(at, "must be a string or an array of items")),
    };
    out.reserve(list.len());
    let mut calls = Calls::of(out.get(..from).unwrap_or_default());
    for (i, item) in list.into_iter().enumerate() {
        let iat = at.index(i);
        let mut item = object(item, iat)?;
        let kind = take(&mut item, "type").map(|t| string(t, iat.key("type"))).transpose()?;
        // An item's `id` and `status` describe it as an earlier answer
        // returned it; chat has no place for them and they tune nothing.
        item.remove("id");
        item.remove("status");
        let kind = match kind {
            Some(kind) => kind,
            // An "easy" message: `role` and `content` without `type`.
            None if item.contains_key("role") => "message".to_owned(),
            None => return Err(invalid(iat.key("type"), "field required")),
        };
        match kind.as_str() {
            "message" => message(item, iat, ctx, out)?,
            "function_call" => function_call(item, iat, from, &mut calls, ctx, out)?,
            "function_call_output" => function_call_output(item, iat, &mut calls, ctx, out)?,
            // The model's own reasoning (summaries, encrypted content)
            // only OpenAI can read back.
            "reasoning" => ctx.dropped.add("reasoning_items"),
            other if LEFT_OUT.contains(&other) => ctx.dropped.add(&format!("item.{other}")),
            other => {
                return Err(invalid(iat.key("type"), format_args!("unknown input item type \"{}\"", shown(other))))
            }
        }
    }
    Ok(())
}

/// A message item; `developer` goes as `system` (chat servers other than
/// OpenAI's lack the role).
fn message(mut m: Map<String, Value>, at: Path<'_>, ctx: &mut Ctx<'_>, out: &mut Vec<Value>) -> Result<(), Invalid> {
    let role = string(required(&mut m, "role", at)?, at.key("role"))?;
    let content = required(&mut m, "content", at)?;
    let cat = at.key("content");
    let user = role == "user";
    let msg = match role.as_str() {
        "user" | "assistant" | "system" | "developer" => {
            let parts = parts::content(content, cat, user, ctx.opts.max_image_bytes, &mut ctx.dropped)?;
            let (role, content) = if user {
                ("user", parts::user(parts))
            } else {
                (if role == "assistant" { "assistant" } else { "system" }, Value::String(parts::text(parts)))
            };
            json!({"role": role, "content": content})
        }
        other => {
            return Err(invalid(
                at.key("role"),
                format_args!(
                    "must be one of \"user\", \"assistant\", \"system\", \"developer\", not \"{}\"",
                    shown(other)
                ),
            ))
        }
    };
    ctx.dropped.rest(m, "message");
    out.push(msg);
    Ok(())
}

/// A `function_call` item as a `tool_calls` entry: joined to the assistant
/// message just before (its text, or the calls before it) when that
/// message is this input's, else in a new assistant message.
fn function_call(
    mut c: Map<String, Value>,
    at: Path<'_>,
    from: usize,
    calls: &mut Calls,
    ctx: &mut Ctx<'_>,
    out: &mut Vec<Value>,
) -> Result<(), Invalid> {
    let id = string(required(&mut c, "call_id", at)?, at.key("call_id"))?;
    let name = string(required(&mut c, "name", at)?, at.key("name"))?;
    let arguments = string(required(&mut c, "arguments", at)?, at.key("arguments"))?;
    let ns = take(&mut c, "namespace").map(|n| string(n, at.key("namespace"))).transpose()?;
    ctx.dropped.rest(c, "function_call");
    if !calls.asked.insert(id.clone()) {
        return Err(invalid(at.key("call_id"), format_args!("a second function_call with call_id `{}`", shown(&id))));
    }
    let name = match ns {
        Some(ns) => ctx.names.flatten(&ns, &name),
        None => name,
    };
    let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    let last = out.len().checked_sub(1).filter(|&l| l >= from).and_then(|l| out.get_mut(l));
    if let Some(Value::Object(last)) = last.filter(|m| m["role"] == "assistant") {
        if let Some(Value::Array(list)) = last.get_mut("tool_calls") {
            list.push(call);
        } else {
            last.insert("tool_calls".into(), Value::Array(vec![call]));
        }
        return Ok(());
    }
    // OpenAI's convention: no text beside calls is `null`.
    out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    Ok(())
}

/// A `function_call_output` item as a `tool` message; its call must come
/// before it (in the input or the history), answered once.
fn function_call_output(
    mut o: Map<String, Value>,
    at: Path<'_>,
    calls: &mut Calls,
    ctx: &mut Ctx<'_>,
    out: &mut Vec<Value>,
) -> Result<(), Invalid> {
    let id = string(required(&mut o, "call_id", at)?, at.key("call_id"))?;
    let text = parts::output(required(&mut o, "output", at)?, at.key("output"), &mut ctx.dropped)?;
    ctx.dropped.rest(o, "function_call_output");
    if !calls.asked.contains(&id) {
        return Err(invalid(
            at.key("call_id"),
            format_args!("no function_call with call_id `{}` before it", shown(&id)),
        ));
    }
    if !calls.answered.insert(id.clone()) {
        return Err(invalid(
            at.key("call_id"),
            format_args!("a second function_call_output for call_id `{}`", shown(&id)),
        ));
    }
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    Ok(())
}
