//! [`to_chat`]: the top level of a Messages request, its fields read as sent
//! (duplicate keys refused), and the fields that tune the answer.

use serde_json::{json, Map, Value};

use super::{
    blocks::{self, Ctx},
    read::{array, boolean, count, invalid, number, object, required, shown, string, take, Dropped, Path},
    tools,
};
pub use crate::translate::Invalid;
use crate::{
    request::TopFields,
    translate::top::{Body, Fields},
};

/// A Messages request translated onto an OpenAI chat-completions body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    /// The OpenAI chat-completions body (JSON), `model` set to the target given.
    pub body: Vec<u8>,
    /// `"stream": true` was asked.
    pub stream: bool,
    /// What the request carried that the translation could not honour and
    /// left out, as short stable names (`cache_control`, `thinking_blocks`,
    /// `tools.web_search_20250305`, `block.document`, an unknown top-level
    /// field's own name...), sorted, deduplicated.
    pub dropped: Vec<String>,
    /// The client asked for thinking (`thinking.type` "enabled" or "adaptive").
    pub thinking: bool,
    /// The `stop_sequences` asked, to tell `stop_sequence` from `end_turn`
    /// when the provider says which matched.
    pub stop_sequences: Vec<String>,
}

/// Bounds on what a request may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Decoded bytes of one base64 image.
    pub max_image_bytes: usize,
}

impl Default for Limits {
    /// Anthropic's own limit: 5 MiB per image.
    fn default() -> Self {
        Self { max_image_bytes: 5 * 1024 * 1024 }
    }
}

/// Top-level fields Anthropic knows that need its own servers (or only
/// tune them): left out by name.
const SERVER_ONLY: &[&str] = &["context_management", "container", "mcp_servers", "service_tier", "inference_geo"];

/// The OpenAI chat-completions body for the Messages request `body`, with
/// `model` = `target_model`.
pub fn to_chat(body: &[u8], target_model: &str, limits: &Limits) -> Result<Translated, Invalid> {
    to_chat_at(body, None, target_model, limits)
}

/// [`to_chat`], with the places of the body's top-level fields when a
/// first read kept them ([`crate::request::Top::parse_keeping`]): the
/// body is then not walked again.
pub fn to_chat_at(
    body: &[u8],
    places: Option<&TopFields>,
    target_model: &str,
    limits: &Limits,
) -> Result<Translated, Invalid> {
    let mut top = Fields::of(body, places)?;
    let mut ctx = Ctx { limits, dropped: Dropped::default() };
    // The messages are most of the body and are written as they were sent.
    let mut out = Body::new(body.len() + 128);

    string(required_top(top.take("model")?, "model")?, Path::top("model"))?;
    out.key("model").str(target_model);
    let max_tokens = count(required_top(top.take("max_tokens")?, "max_tokens")?, Path::top("max_tokens"))
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| invalid(Path::top("max_tokens"), "must be a positive integer"))?;
    out.key("max_tokens").u64(max_tokens);

    let messages = top.take_raw("messages").ok_or_else(|| invalid(Path::top("messages"), "field required"))?;
    out.key("messages").open_array();
    if let Some(system) = top.take_raw("system") {
        blocks::system(system, &mut ctx, &mut out)?;
    }
    blocks::messages(messages, &mut ctx, &mut out)?;
    out.close_array();

    // The fields that tune the answer, few and small: a tree.
    let mut tune = Map::new();
    let stream = top.take("stream")?.map(|v| boolean(v, Path::top("stream"))).transpose()?.unwrap_or(false);
    if stream {
        tune.insert("stream".into(), true.into());
        // The edge accounts usage, which a stream only reports when asked.
        tune.insert("stream_options".into(), json!({"include_usage": true}));
    }

    tools::tools(top.take("tools")?, top.take("tool_choice")?, &mut ctx.dropped, &mut tune)?;

    let stop_sequences = match top.take("stop_sequences")? {
        None => Vec::new(),
        Some(v) => {
            let at = Path::top("stop_sequences");
            let list = array(v, at)?;
            let mut stops = Vec::with_capacity(list.len());
            for (k, s) in list.into_iter().enumerate() {
                stops.push(string(s, at.index(k))?);
            }
            stops
        }
    };
    if !stop_sequences.is_empty() {
        tune.insert("stop".into(), stop_sequences.clone().into());
    }

    for key in ["temperature", "top_p"] {
        if let Some(v) = top.take(key)? {
            tune.insert(key.into(), number(v, Path::top(key))?);
        }
    }
    if let Some(v) = top.take("top_k")? {
        tune.insert("top_k".into(), count(v, Path::top("top_k"))?.into());
    }

    if let Some(v) = top.take("metadata")? {
        metadata(v, &mut ctx.dropped, &mut tune)?;
    }

    let thinking = reasoning(top.take("thinking")?, top.take("output_config")?, &mut ctx.dropped, &mut tune)?;
    // The structured-outputs beta's name for `output_config.format`.
    if let Some(v) = top.take("output_format")? {
        if tune.contains_key("response_format") {
            ctx.dropped.add("output_format");
        } else {
            tune.insert("response_format".into(), response_format(v, Path::top("output_format"), &mut ctx.dropped)?);
        }
    }

    for key in SERVER_ONLY {
        if top.take_raw(key).is_some() {
            ctx.dropped.add(key);
        }
    }
    // Unknown fields are left out, never refused: a newer client's extras
    // must not fail its request.
    for key in top.rest() {
        ctx.dropped.add(shown(&key));
    }

    out.members(&tune);
    Ok(Translated { body: out.finish(), stream, dropped: ctx.dropped.into_vec(), thinking, stop_sequences })
}

/// A required top-level field's value.
fn required_top(v: Option<Value>, key: &str) -> Result<Value, Invalid> {
    v.ok_or_else(|| invalid(Path::top(key), "field required"))
}

/// `metadata.user_id` as `user`; other keys (Anthropic knows none) left
/// out by name.
fn metadata(v: Value, dropped: &mut Dropped, out: &mut Map<String, Value>) -> Result<(), Invalid> {
    let at = Path::top("metadata");
    let mut m = object(v, at)?;
    if let Some(user) = take(&mut m, "user_id") {
        out.insert("user".into(), string(user, at.key("user_id"))?.into());
    }
    dropped.rest(m, "metadata");
    Ok(())
}

/// `thinking` and `output_config` as `reasoning_effort` and
/// `response_format`; returns whether thinking was asked.
///
/// One rule for the effort: `thinking.type` "disabled" is `"none"` whatever
/// else is said; otherwise `output_config.effort` when given (an explicit
/// level beats one guessed from a budget); otherwise the budget of
/// "enabled" (< 4096 low, < 16384 medium, else high). "adaptive" alone
/// leaves the provider's default.
fn reasoning(
    thinking: Option<Value>,
    config: Option<Value>,
    dropped: &mut Dropped,
    out: &mut Map<String, Value>,
) -> Result<bool, Invalid> {
    let mut asked = false;
    let mut disabled = false;
    let mut from_budget = None;
    if let Some(v) = thinking {
        let at = Path::top("thinking");
        let mut t = object(v, at)?;
        let kind = string(required(&mut t, "type", at)?, at.key("type"))?;
        match kind.as_str() {
            "enabled" => {
                asked = true;
                let budget = count(required(&mut t, "budget_tokens", at)?, at.key("budget_tokens"))?;
                from_budget = Some(match budget {
                    0..4096 => "low",
                    4096..16384 => "medium",
                    _ => "high",
                });
            }
            "adaptive" => asked = true,
            "disabled" => disabled = true,
            other => {
                return Err(invalid(
                    at.key("type"),
                    format_args!("must be one of \"enabled\", \"adaptive\", \"disabled\", not \"{}\"", shown(other)),
                ))
            }
        }
        dropped.rest(t, "thinking");
    }
    let mut effort = None;
    if let Some(v) = config {
        let at = Path::top("output_config");
        let mut c = object(v, at)?;
        if let Some(e) = take(&mut c, "effort") {
            effort = Some(match string(e, at.key("effort"))?.as_str() {
                "low" => "low",
                "medium" => "medium",
                // OpenAI-compatible servers know up to "high".
                "high" | "xhigh" | "max" => "high",
                other => {
                    return Err(invalid(
                        at.key("effort"),
                        format_args!("must be one of low, medium, high, xhigh, max, not \"{}\"", shown(other)),
                    ))
                }
            });
        }
        if let Some(f) = take(&mut c, "format") {
            out.insert("response_format".into(), response_format(f, at.key("format"), dropped)?);
        }
        dropped.rest(c, "output_config");
    }
    let level = if disabled { Some("none") } else { effort.or(from_budget) };
    if let Some(level) = level {
        out.insert("reasoning_effort".into(), level.into());
    }
    Ok(asked)
}

/// A structured-output format (`{"type":"json_schema","schema":{..}}`) as
/// OpenAI's `response_format`. Not `strict`: OpenAI's strict mode refuses
/// schemas Anthropic accepts, and the servers that constrain decoding do so
/// without it.
fn response_format(v: Value, at: Path<'_>, dropped: &mut Dropped) -> Result<Value, Invalid> {
    let mut f = object(v, at)?;
    let kind = string(required(&mut f, "type", at)?, at.key("type"))?;
    if kind != "json_schema" {
        return Err(invalid(at.key("type"), format_args!("must be \"json_schema\", not \"{}\"", shown(&kind))));
    }
    let schema = required(&mut f, "schema", at)?;
    if !schema.is_object() {
        return Err(invalid(at.key("schema"), "must be an object"));
    }
    dropped.rest(f, &format!("{at}"));
    Ok(json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}))
}
