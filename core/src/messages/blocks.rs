//! `system` and `messages`: Anthropic's content blocks onto OpenAI chat
//! messages (the table is in the module docs).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::{
    read::{block, boolean, invalid, object, required, shown, string, take, Dropped, Path},
    request::{Invalid, Limits},
};
use crate::translate::{
    image,
    top::{self, Body},
};

/// Text blocks of one message (or of `system`) become one string joined
/// with this, as the node joins text parts for Ollama (and vLLM for its
/// templates): the model reads the same text whichever shape arrived.
const TEXT_JOIN: &str = "\n";

/// Block types Anthropic knows that the translation cannot carry (server
/// tools' calls and results, documents, citations' sources): left out and
/// named `block.<type>`.
const UNSUPPORTED_BLOCKS: &[&str] = &[
    "document",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
    "compaction",
];

/// Block types a `tool_result`'s content may hold beside text; an OpenAI
/// tool message carries text only.
const UNSUPPORTED_IN_RESULT: &[&str] = &["image", "document", "search_result", "tool_reference"];

/// Image media types Anthropic accepts.
const MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

/// What the translation of the blocks shares.
pub(super) struct Ctx<'l> {
    pub(super) limits: &'l Limits,
    pub(super) dropped: Dropped,
}

/// `system` as one leading system message, none when empty. A string is
/// carried as it was sent.
pub(super) fn system(raw: &str, ctx: &mut Ctx<'_>, out: &mut Body) -> Result<(), Invalid> {
    let at = Path::top("system");
    if top::is_string(raw) {
        if raw != "\"\"" {
            text_message(out, "system", raw)?;
        }
        return Ok(());
    }
    let Value::Array(blocks) = top::tree(raw)? else {
        return Err(invalid(at, "must be a string or an array of text blocks"));
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (k, b) in blocks.into_iter().enumerate() {
        let bat = at.index(k);
        let (kind, mut b) = block(b, bat, &mut ctx.dropped)?;
        if kind != "text" {
            return Err(invalid(bat.key("type"), "system blocks must be of type \"text\""));
        }
        texts.push(text(&mut b, bat)?);
        ctx.dropped.rest(b, "text");
    }
    let text = texts.join(TEXT_JOIN);
    if !text.is_empty() {
        out.element().value(&json!({"role": "system", "content": text}));
    }
    Ok(())
}

/// A message whose content is a string, carried as it was sent.
fn text_message(out: &mut Body, role: &str, content: &str) -> Result<(), Invalid> {
    out.element().bytes(b"{\"role\":\"");
    out.bytes(role.as_bytes());
    out.bytes(b"\",\"content\":");
    out.raw_string(content)?;
    out.bytes(b"}");
    Ok(())
}

/// A `tool_use` asked by the previous assistant message and not answered
/// yet: where it sits (message, block).
type Pending = HashMap<String, (usize, usize)>;

/// `messages` written into the open array of `out` as OpenAI chat messages.
pub(super) fn messages(raw: &str, ctx: &mut Ctx<'_>, out: &mut Body) -> Result<(), Invalid> {
    let at = Path::top("messages");
    if !top::is_array(raw) {
        return Err(invalid(at, "must be an array"));
    }
    // One pass reads the messages and their fields (a message's text is
    // read once more, when it is copied).
    let list = top::objects(raw)?;
    if list.is_empty() {
        return Err(invalid(at, "at least one message is required"));
    }
    let mut pending = Pending::new();
    // The chat messages of one message with blocks (a user message's tool
    // results become messages of their own).
    let mut built = Vec::new();
    for (i, m) in list.into_iter().enumerate() {
        let mat = at.index(i);
        let Some(mut m) = m else {
            return Err(invalid(mat, "must be an object"));
        };
        let role = m.take("role")?.ok_or_else(|| invalid(mat.key("role"), "field required"))?;
        let role = string(role, mat.key("role"))?;
        let content = m.take_raw("content").ok_or_else(|| invalid(mat.key("content"), "field required"))?;
        for key in m.rest() {
            ctx.dropped.add(&format!("message.{}", shown(&key)));
        }
        match role.as_str() {
            "user" => {
                if top::is_string(content) {
                    text_message(out, "user", content)?;
                } else {
                    user(i, content_blocks(content, mat)?, &mut pending, ctx, &mut built)?;
                }
                unanswered(&pending)?;
            }
            "assistant" => {
                unanswered(&pending)?;
                if top::is_string(content) {
                    text_message(out, "assistant", content)?;
                    pending.clear();
                } else {
                    pending = assistant(i, content_blocks(content, mat)?, ctx, &mut built)?;
                }
            }
            other => {
                return Err(invalid(
                    mat.key("role"),
                    format_args!("must be \"user\" or \"assistant\", not \"{}\"", shown(other)),
                ))
            }
        }
        for v in built.drain(..) {
            out.element().value(&v);
        }
    }
    // Anthropic (and OpenAI) refuse a tool call left without its result.
    unanswered(&pending)
}

/// A message's content that is not a string: its blocks.
fn content_blocks(content: &str, mat: Path<'_>) -> Result<Vec<Value>, Invalid> {
    match top::tree(content)? {
        Value::Array(blocks) => Ok(blocks),
        _ => Err(invalid(mat.key("content"), "must be a string or an array of content blocks")),
    }
}

/// Refuses the first `tool_use` (by position) still without a result.
fn unanswered(pending: &Pending) -> Result<(), Invalid> {
    let Some((id, &(i, j))) = pending.iter().min_by_key(|(_, at)| **at) else {
        return Ok(());
    };
    let msgs = Path::top("messages");
    let mi = msgs.index(i);
    let content = mi.key("content");
    let bj = content.index(j);
    Err(invalid(
        bj.key("id"),
        format_args!("tool_use `{}` has no tool_result in the next message (a user message)", shown(id)),
    ))
}

/// One piece of a user message's content, in order.
enum Part {
    Text(String),
    ImageUrl(String),
}

/// A user message: its tool results first, as tool messages (OpenAI wants
/// them right after the assistant's calls), then the rest as one user
/// message. Answered calls are taken out of `pending`.
fn user(
    i: usize,
    blocks: Vec<Value>,
    pending: &mut Pending,
    ctx: &mut Ctx<'_>,
    out: &mut Vec<Value>,
) -> Result<(), Invalid> {
    let msgs = Path::top("messages");
    let mi = msgs.index(i);
    let at = mi.key("content");
    let mut parts = Vec::new();
    let mut answered = HashSet::new();
    for (j, b) in blocks.into_iter().enumerate() {
        let bat = at.index(j);
        let (kind, mut b) = block(b, bat, &mut ctx.dropped)?;
        match kind.as_str() {
            "text" => parts.push(Part::Text(text(&mut b, bat)?)),
            "image" => {
                if let Some(url) = image(&mut b, bat, ctx)? {
                    parts.push(Part::ImageUrl(url));
                }
            }
            "tool_result" => {
                let (id, text) = tool_result(&mut b, bat, ctx)?;
                if pending.remove(&id).is_none() {
                    let what = if answered.contains(&id) {
                        format!("a second tool_result for tool_use `{}`", shown(&id))
                    } else {
                        format!("no tool_use with id `{}` in the previous message (an assistant message)", shown(&id))
                    };
                    return Err(invalid(bat.key("tool_use_id"), what));
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
                answered.insert(id);
            }
            "tool_use" => {
                return Err(invalid(bat.key("type"), "tool_use blocks are only allowed in assistant messages"))
            }
            _ => {
                other_block(&kind, bat, ctx)?;
                continue;
            }
        }
        ctx.dropped.rest(b, &kind);
    }
    // A message of tool results only adds no user turn; any other message
    // keeps its turn, even when nothing in it could be carried.
    if !parts.is_empty() || answered.is_empty() {
        out.push(json!({"role": "user", "content": user_content(parts)}));
    }
    Ok(())
}

/// A string when the parts are all text, else OpenAI content parts.
fn user_content(parts: Vec<Part>) -> Value {
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        let texts: Vec<String> =
            parts.into_iter().filter_map(|p| if let Part::Text(t) = p { Some(t) } else { None }).collect();
        return Value::String(texts.join(TEXT_JOIN));
    }
    Value::Array(
        parts
            .into_iter()
            .map(|p| match p {
                Part::Text(t) => json!({"type": "text", "text": t}),
                Part::ImageUrl(url) => json!({"type": "image_url", "image_url": {"url": url}}),
            })
            .collect(),
    )
}

/// An assistant message: text as its `content`, `tool_use` blocks as its
/// `tool_calls`. Returns the calls the next message must answer.
fn assistant(i: usize, blocks: Vec<Value>, ctx: &mut Ctx<'_>, out: &mut Vec<Value>) -> Result<Pending, Invalid> {
    let msgs = Path::top("messages");
    let mi = msgs.index(i);
    let at = mi.key("content");
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    let mut asked = Pending::new();
    for (j, b) in blocks.into_iter().enumerate() {
        let bat = at.index(j);
        let (kind, mut b) = block(b, bat, &mut ctx.dropped)?;
        match kind.as_str() {
            "text" => texts.push(text(&mut b, bat)?),
            "tool_use" => {
                let id = string(required(&mut b, "id", bat)?, bat.key("id"))?;
                let name = string(required(&mut b, "name", bat)?, bat.key("name"))?;
                let input = required(&mut b, "input", bat)?;
                if !input.is_object() {
                    return Err(invalid(bat.key("input"), "must be an object"));
                }
                if asked.insert(id.clone(), (i, j)).is_some() {
                    return Err(invalid(bat.key("id"), format_args!("a second tool_use with id `{}`", shown(&id))));
                }
                // OpenAI carries the arguments as JSON text.
                let arguments = input.to_string();
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            "image" | "tool_result" => {
                return Err(invalid(bat.key("type"), format_args!("{kind} blocks are only allowed in user messages")))
            }
            _ => {
                other_block(&kind, bat, ctx)?;
                continue;
            }
        }
        ctx.dropped.rest(b, &kind);
    }
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    // OpenAI's convention: no text beside calls is `null`.
    let content = match (texts.is_empty(), calls.is_empty()) {
        (false, _) => Value::String(texts.join(TEXT_JOIN)),
        (true, false) => Value::Null,
        (true, true) => Value::String(String::new()),
    };
    msg.insert("content".into(), content);
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    out.push(Value::Object(msg));
    Ok(asked)
}

/// A block neither role translates: thinking sent back (never forwarded),
/// a known block the translation cannot carry, or an unknown type (400).
fn other_block(kind: &str, at: Path<'_>, ctx: &mut Ctx<'_>) -> Result<(), Invalid> {
    if kind == "thinking" || kind == "redacted_thinking" {
        ctx.dropped.add("thinking_blocks");
    } else if UNSUPPORTED_BLOCKS.contains(&kind) {
        ctx.dropped.add(&format!("block.{kind}"));
    } else {
        return Err(invalid(at.key("type"), format_args!("unknown content block type \"{}\"", shown(kind))));
    }
    Ok(())
}

/// A text block's `text`.
fn text(b: &mut Map<String, Value>, at: Path<'_>) -> Result<String, Invalid> {
    string(required(b, "text", at)?, at.key("text"))
}

/// An image block as an `image_url` URL (a data URL for base64); `None`
/// for a Files API reference, which only Anthropic can resolve.
fn image(b: &mut Map<String, Value>, at: Path<'_>, ctx: &mut Ctx<'_>) -> Result<Option<String>, Invalid> {
    let sat = at.key("source");
    let mut src = object(required(b, "source", at)?, sat)?;
    let kind = string(required(&mut src, "type", sat)?, sat.key("type"))?;
    let url = match kind.as_str() {
        "base64" => {
            let media_type = string(required(&mut src, "media_type", sat)?, sat.key("media_type"))?;
            if !MEDIA_TYPES.contains(&media_type.as_str()) {
                return Err(invalid(sat.key("media_type"), format_args!("must be one of {}", MEDIA_TYPES.join(", "))));
            }
            let data = string(required(&mut src, "data", sat)?, sat.key("data"))?;
            image::within(image::decoded_len(&data), ctx.limits.max_image_bytes, sat.key("data"))?;
            Some(format!("data:{media_type};base64,{data}"))
        }
        "url" => Some(string(required(&mut src, "url", sat)?, sat.key("url"))?),
        "file" => {
            ctx.dropped.add("image.source.file");
            return Ok(None);
        }
        other => {
            return Err(invalid(
                sat.key("type"),
                format_args!("must be \"base64\", \"url\" or \"file\", not \"{}\"", shown(other)),
            ))
        }
    };
    ctx.dropped.rest(src, "image.source");
    Ok(url)
}

/// A `tool_result` block: the call's id and the tool message's text.
/// `is_error` results keep their text behind "Error: ", so the model sees
/// the call failed (a tool message has no error flag).
fn tool_result(b: &mut Map<String, Value>, at: Path<'_>, ctx: &mut Ctx<'_>) -> Result<(String, String), Invalid> {
    let id = string(required(b, "tool_use_id", at)?, at.key("tool_use_id"))?;
    let cat = at.key("content");
    let text = match take(b, "content") {
        None => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (k, inner) in blocks.into_iter().enumerate() {
                let kat = cat.index(k);
                let (kind, mut inner) = block(inner, kat, &mut ctx.dropped)?;
                if kind == "text" {
                    texts.push(text(&mut inner, kat)?);
                    ctx.dropped.rest(inner, "text");
                } else if UNSUPPORTED_IN_RESULT.contains(&kind.as_str()) {
                    ctx.dropped.add(&format!("tool_result.{kind}"));
                } else {
                    return Err(invalid(
                        kat.key("type"),
                        format_args!("unknown tool_result content block type \"{}\"", shown(&kind)),
                    ));
                }
            }
            texts.join(TEXT_JOIN)
        }
        Some(_) => return Err(invalid(cat, "must be a string or an array of content blocks")),
    };
    let is_error = match take(b, "is_error") {
        Some(v) => boolean(v, at.key("is_error"))?,
        None => false,
    };
    let text = match (is_error, text.is_empty()) {
        (false, _) => text,
        (true, true) => "Error".to_owned(),
        (true, false) => format!("Error: {text}"),
    };
    Ok((id, text))
}
