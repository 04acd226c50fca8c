//! [`to_chat`]: the top level of a Responses request, read as a JSON tree
//! (duplicate keys refused), the fields that tune the answer, and what the
//! response echoes.

use serde_json::{json, Map, Value};

use super::{items, names::Names, tools, tune};
use crate::translate::{
    read::{array, boolean, count, invalid, number, object, required_top, shown, string, take, Dropped, Path},
    top::{self, read_top},
    Invalid,
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
    /// As sent; default `"auto"`.
    pub tool_choice: Value,
    /// As sent; default `[]`.
    pub tools: Value,
    /// As sent, `format` defaulting to `{"type":"text"}`.
    pub text: Value,
    /// `{"effort": .., "summary": ..}`, `null` where not given.
    pub reasoning: Value,
    /// As sent; default `{}`.
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
    let mut top = read_top(body)?;
    let mut out = Map::new();

    string(required_top(&mut top, "model")?, Path::top("model"))?;
    out.insert("model".into(), target_model.into());

    // Refused before anything else: answering without the state they name
    // would answer another question.
    let store = take(&mut top, "store").map(|v| boolean(v, Path::top("store"))).transpose()?.unwrap_or(false);
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
        if take(&mut top, key).is_some() {
            return Err(invalid(
                Path::top(key),
                "this gateway keeps no conversations or prompts; send their items in `input` and `instructions`",
            ));
        }
    }

    let stream = take(&mut top, "stream").map(|v| boolean(v, Path::top("stream"))).transpose()?.unwrap_or(false);
    if stream {
        out.insert("stream".into(), true.into());
        // The edge accounts usage, which a stream only reports when asked.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }

    let mut ctx = items::Ctx { opts, dropped: Dropped::default(), names: Names::default() };

    // Tools before the input: the input's namespaced calls take the flat
    // names the tools were given.
    let tools_sent = take(&mut top, "tools");
    let choice = take(&mut top, "tool_choice");
    let echo_tools = tools_sent.clone().unwrap_or_else(|| json!([]));
    let echo_choice = choice.clone().unwrap_or_else(|| json!("auto"));
    let parallel =
        take(&mut top, "parallel_tool_calls").map(|v| boolean(v, Path::top("parallel_tool_calls"))).transpose()?;
    tools::tools(tools_sent, choice, parallel, &mut ctx.names, &mut ctx.dropped, &mut out)?;

    let instructions = opt_string(&mut top, "instructions")?;
    let mut messages = Vec::with_capacity(opts.history.len() + 2);
    if let Some(text) = instructions.as_ref().filter(|t| !t.is_empty()) {
        messages.push(json!({"role": "system", "content": text}));
    }
    let lead = messages.len();
    messages.extend(opts.history.iter().cloned());
    let input_from = messages.len();
    let input = take(&mut top, "input");
    let had_input = input.is_some();
    if let Some(input) = input {
        items::input(input, input_from, &mut ctx, &mut messages)?;
    }
    if messages.len() == lead {
        let what = if had_input { "has no item the provider can read" } else { "field required" };
        return Err(invalid(Path::top("input"), what));
    }
    out.insert("messages".into(), Value::Array(messages));

    let text = take(&mut top, "text").map(|v| tune::text_format(v, &mut ctx.dropped, &mut out)).transpose()?;
    let echo_text = text.unwrap_or_else(|| json!({"format": {"type": "text"}}));

    let max_output_tokens = take(&mut top, "max_output_tokens")
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
        if let Some(v) = take(&mut top, key) {
            let v = number(v, Path::top(key))?;
            *slot = v.as_f64();
            out.insert(key.into(), v);
        }
    }
    let [temperature, top_p] = sampling;

    let reasoning = tune::reasoning(take(&mut top, "reasoning"), &mut ctx.dropped, &mut out)?;
    if let Some(v) = take(&mut top, "include") {
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
    let metadata = match take(&mut top, "metadata") {
        Some(v) => Value::Object(object(v, Path::top("metadata"))?),
        None => json!({}),
    };
    if let Some(v) = take(&mut top, "client_metadata") {
        object(v, Path::top("client_metadata"))?;
    }

    for key in SERVICE_ONLY {
        match take(&mut top, key) {
            // The defaults ask nothing.
            Some(Value::Bool(false)) if *key == "background" => {}
            Some(Value::String(s)) if *key == "truncation" && s == "disabled" => {}
            Some(_) => ctx.dropped.add(key),
            None => {}
        }
    }
    // Unknown fields are left out, never refused: a newer client's extras
    // must not fail its request.
    for (key, v) in top {
        if !v.is_null() {
            ctx.dropped.add(shown(&key));
        }
    }

    let body = top::write(out)?;
    Ok(Translated {
        body,
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
fn opt_string(top: &mut Map<String, Value>, key: &str) -> Result<Option<String>, Invalid> {
    take(top, key).map(|v| string(v, Path::top(key))).transpose()
}
