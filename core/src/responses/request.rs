//! [`to_chat`]: the top level of a Responses request, its fields read as sent
//! (duplicate keys refused), the fields that tune the answer, and what the
//! response echoes.

use serde_json::{json, Map, Value};

use super::{items, names::Names, tools, tune};
use crate::{
    request::TopFields,
    translate::{
        read::{array, boolean, count, invalid, number, object, shown, string, Dropped, Path},
        top::{self, Body, Fields},
        Invalid,
    },
};

/// A Responses request translated onto an OpenAI chat-completions body.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// The OpenAI chat-completions body (JSON), `model` set to the target given.
    pub body: Vec<u8>,
    /// `"stream": true` was asked.
    pub stream: bool,
    /// What the request carried that the translation could not honour and
    /// left out, as short stable names (`reasoning_items`,
    /// `tools.web_search`, `item.web_search_call`, `text.verbosity`, an
    /// unknown top-level field's own name...), sorted, deduplicated.
    pub dropped: Vec<String>,
    /// Functions of `namespace` tools (and namespaced calls of the input)
    /// under their flat chat names: (flat name sent to the provider,
    /// namespace, original name), so the answer can restore them.
    pub namespaced: Vec<(String, String, String)>,
    /// Index into the body's `messages` of the first message `input`
    /// gave; those before it are the instructions and
    /// [`Options::history`] (see [`history_of`](super::history_of)).
    pub input_from: usize,
    /// `prompt_cache_key`: not forwarded, kept for routing (the same key to
    /// the same node finds its prompt cache warm).
    pub prompt_cache_key: Option<String>,
    /// What the response object echoes back.
    pub echo: Echo,
}

/// Request fields the Responses API repeats in its response object, as
/// the client gave them (defaults where it gave none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Default `true`.
    pub parallel_tool_calls: bool,
    /// As sent; `null` when not sent (the response says `"auto"`).
    pub tool_choice: Value,
    /// As sent; `null` when not sent (the response says `[]`).
    pub tools: Value,
    /// As sent, `format` defaulting to `{"type":"text"}`; `null` when not
    /// sent (the response says `{"format":{"type":"text"}}`).
    pub text: Value,
    /// `{"effort": .., "summary": ..}`, `null` where not given; `null`
    /// when not sent (the response says `{"effort":null,"summary":null}`).
    pub reasoning: Value,
    /// As sent; `null` when not sent (the response says `{}`).
    pub metadata: Value,
    /// Always `false`: `store: true` is refused.
    pub store: bool,
    pub user: Option<String>,
    pub previous_response_id: Option<String>,
}

/// What the caller knows beyond the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Decoded bytes of one base64 image (a 413 over it).
    pub max_image_bytes: usize,
    /// Chat messages of earlier turns to put before `input`, already
    /// translated (the WebSocket mode's own previous response). Read for
    /// the calls a `function_call_output` may answer; sent as they are.
    pub history: Vec<Value>,
    /// Whether `previous_response_id` can be served (the caller found it);
    /// when false, a request naming one is a 400.
    pub previous_found: bool,
}

impl Default for Options {
    /// 20 MiB per image, OpenAI's limit for one image input; no history.
    fn default() -> Self {
        Self { max_image_bytes: 20 * 1024 * 1024, history: Vec::new(), previous_found: false }
    }
}

/// Top-level fields that tune only OpenAI's own service (tiers, background
/// runs, context truncation) or ask what the node cannot give (log
/// probabilities of the output items): left out by name.
const SERVICE_ONLY: &[&str] =
    &["service_tier", "truncation", "background", "top_logprobs", "stream_options", "max_tool_calls"];

/// The OpenAI chat-completions body for the Responses request `body`, with
/// `model` = `target_model`.
pub fn to_chat(body: &[u8], target_model: &str, opts: &Options) -> Result<Translated, Invalid> {
    to_chat_at(body, None, target_model, opts)
}

/// [`to_chat`], with the places of the body's top-level fields when a
/// first read kept them ([`crate::request::Top::parse_keeping`]): the
/// body is then not walked again.
pub fn to_chat_at(
    body: &[u8],
    places: Option<&TopFields>,
    target_model: &str,
    opts: &Options,
) -> Result<Translated, Invalid> {
    let mut top = Fields::of(body, places)?;
    // The input is most of the body; a string is written as it was sent.
    let mut body_out = Body::new(body.len() + 128);
    // The fields that tune the answer, few and small: a tree.
    let mut out = Map::new();

    let model = top.take("model")?.ok_or_else(|| invalid(Path::top("model"), "field required"))?;
    string(model, Path::top("model"))?;
    body_out.key("model").str(target_model);

    // Refused before anything else: answering without the state they name
    // would answer another question.
    let store = top.take("store")?.map(|v| boolean(v, Path::top("store"))).transpose()?.unwrap_or(false);
    if store {
        return Err(invalid(
            Path::top("store"),
            "this gateway keeps no responses; send `\"store\": false` (the WebSocket mode chains the responses of \
             one connection without storing them)",
        ));
    }
    let previous_response_id = opt_string(&mut top, "previous_response_id")?;
    if previous_response_id.is_some() && !opts.previous_found {
        return Err(invalid(
            Path::top("previous_response_id"),
            "no such response: this gateway has no response store (only the WebSocket mode chains responses, \
             on one connection); send the whole conversation in `input`",
        ));
    }
    for key in ["conversation", "prompt"] {
        if top.take_raw(key).is_some() {
            return Err(invalid(
                Path::top(key),
                "this gateway keeps no conversations or prompts; send their items in `input` and `instructions`",
            ));
        }
    }

    let stream = top.take("stream")?.map(|v| boolean(v, Path::top("stream"))).transpose()?.unwrap_or(false);
    if stream {
        out.insert("stream".into(), true.into());
        // The edge accounts usage, which a stream only reports when asked.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }

    let mut ctx = items::Ctx { opts, dropped: Dropped::default(), names: Names::default() };

    // Tools before the input: the input's namespaced calls take the flat
    // names the tools were given.
    let tools_sent = top.take("tools")?;
    let choice = top.take("tool_choice")?;
    let echo_tools = tools_sent.clone().unwrap_or_default();
    let echo_choice = choice.clone().unwrap_or_default();
    let parallel =
        top.take("parallel_tool_calls")?.map(|v| boolean(v, Path::top("parallel_tool_calls"))).transpose()?;
    tools::tools(tools_sent, choice, parallel, &mut ctx.names, &mut ctx.dropped, &mut out)?;

    let instructions = opt_string(&mut top, "instructions")?;
    let mut messages = Vec::with_capacity(opts.history.len() + 2);
    if let Some(text) = instructions.as_ref().filter(|t| !t.is_empty()) {
        messages.push(json!({"role": "system", "content": text}));
    }
    let lead = messages.len();
    messages.extend(opts.history.iter().cloned());
    let input_from = messages.len();
    let input = top.take_raw("input");
    // A string is one user message, carried as it was sent.
    let text_input = input.filter(|raw| top::is_string(raw));
    if let Some(input) = input.filter(|_| text_input.is_none()) {
        items::input(top::tree(input)?, input_from, &mut ctx, &mut messages)?;
    }
    if messages.len() == lead && text_input.is_none() {
        let what = if input.is_some() { "has no item the provider can read" } else { "field required" };
        return Err(invalid(Path::top("input"), what));
    }
    write_messages(&mut body_out, &messages, text_input)?;

    let text = top.take("text")?.map(|v| tune::text_format(v, &mut ctx.dropped, &mut out)).transpose()?;
    let echo_text = text.unwrap_or_default();

    let max_output_tokens = top
        .take("max_output_tokens")?
        .map(|v| {
            count(v, Path::top("max_output_tokens"))
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid(Path::top("max_output_tokens"), "must be a positive integer"))
        })
        .transpose()?;
    if let Some(n) = max_output_tokens {
        out.insert("max_tokens".into(), n.into());
    }
    let mut sampling = [None, None];
    for (key, slot) in ["temperature", "top_p"].into_iter().zip(&mut sampling) {
        if let Some(v) = top.take(key)? {
            let v = number(v, Path::top(key))?;
            *slot = v.as_f64();
            out.insert(key.into(), v);
        }
    }
    let [temperature, top_p] = sampling;

    let reasoning = tune::reasoning(top.take("reasoning")?, &mut ctx.dropped, &mut out)?;
    if let Some(v) = top.take("include")? {
        let at = Path::top("include");
        // Each asks for more in the answer (encrypted reasoning, log
        // probabilities, hosted tools' results): none is there to give.
        for (k, entry) in array(v, at)?.into_iter().enumerate() {
            ctx.dropped.add(&format!("include.{}", shown(&string(entry, at.index(k))?)));
        }
    }

    let user = opt_string(&mut top, "user")?;
    if let Some(user) = &user {
        out.insert("user".into(), user.as_str().into());
    }
    // Not forwarded and not "dropped": they label the request (for
    // caching, abuse detection, the client's own bookkeeping) without
    // changing the answer.
    let prompt_cache_key = opt_string(&mut top, "prompt_cache_key")?;
    opt_string(&mut top, "safety_identifier")?;
    let metadata = match top.take("metadata")? {
        Some(v) => Value::Object(object(v, Path::top("metadata"))?),
        None => Value::Null,
    };
    if let Some(v) = top.take("client_metadata")? {
        object(v, Path::top("client_metadata"))?;
    }

    for key in SERVICE_ONLY {
        match top.take(key)? {
            // The defaults ask nothing.
            Some(Value::Bool(false)) if *key == "background" => {}
            Some(Value::String(s)) if *key == "truncation" && s == "disabled" => {}
            Some(_) => ctx.dropped.add(key),
            None => {}
        }
    }
    // Unknown fields are left out, never refused: a newer client's extras
    // must not fail its request.
    for key in top.rest() {
        ctx.dropped.add(shown(&key));
    }

    body_out.members(&out);
    Ok(Translated {
        body: body_out.finish(),
        stream,
        dropped: ctx.dropped.into_vec(),
        namespaced: ctx.names.namespaced,
        input_from,
        prompt_cache_key,
        echo: Echo {
            instructions,
            max_output_tokens,
            temperature,
            top_p,
            parallel_tool_calls: parallel.unwrap_or(true),
            tool_choice: echo_choice,
            tools: echo_tools,
            text: echo_text,
            reasoning,
            metadata,
            store: false,
            user,
            previous_response_id,
        },
    })
}

/// An optional top-level string.
fn opt_string(top: &mut Fields<'_>, key: &str) -> Result<Option<String>, Invalid> {
    top.take(key)?.map(|v| string(v, Path::top(key))).transpose()
}

/// `"messages":[..]`: those translated, then the input when it was a string.
fn write_messages(out: &mut Body, messages: &[Value], text_input: Option<&str>) -> Result<(), Invalid> {
    out.key("messages").open_array();
    for m in messages {
        out.element().value(m);
    }
    if let Some(text) = text_input {
        out.element().bytes(b"{\"role\":\"user\",\"content\":");
        out.raw_string(text)?;
        out.bytes(b"}");
    }
    out.close_array();
    Ok(())
}
