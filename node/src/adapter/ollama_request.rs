//! Sans-IO translation of OpenAI request bodies into Ollama's native API:
//! a chat completion into a `POST /api/chat` body, an embeddings request
//! into a `POST /api/embed` body.
//!
//! Nothing is lost silently. Each top-level field of the client's body is
//! either translated (table below), refused with a 400 `invalid_request`
//! naming it (a parameter Ollama cannot honour), dropped because it does not
//! change the answer (`stream_options`, `user`, `metadata`, `store`,
//! `service_tier`, `parallel_tool_calls`, `prediction`, `prompt_cache_key`,
//! `safety_identifier`), or passed to Ollama unchanged (any other key:
//! Ollama's own `keep_alive`, `format`, `think`, `options`, and whatever a
//! test upstream reads). `null` counts as absent, as OpenAI treats it.
//!
//! | OpenAI | Ollama |
//! |---|---|
//! | `model` | `model` (the target) |
//! | `messages` | `messages` (below) |
//! | `stream` | `stream`: `true` only when the client streams (a whole answer is one object, not one line per token) |
//! | `tools` (function tools) | `tools`, as sent |
//! | `tool_choice` | `"auto"`: nothing; `"none"`: `tools` not sent; others refused |
//! | `response_format` | `json_object`: `format: "json"`; `json_schema`: `format: <schema>`; `text`: nothing |
//! | `stop` | `options.stop` (a string becomes a one-item list) |
//! | `seed`, `temperature`, `top_p`, `top_k`, `frequency_penalty`, `presence_penalty` | `options.<same name>` |
//! | `max_tokens`, `max_completion_tokens` (wins) | `options.num_predict` |
//! | `reasoning_effort` | `think`: `none` → false, `minimal`/`low` → "low", `medium`, `high`/`xhigh` → "high" |
//!
//! An OpenAI parameter wins over its Ollama counterpart sent beside it
//! (`options.temperature`, `format`, `think`).
//!
//! Messages: `content` strings as they are, `null` as "", content parts
//! joined with "\n" (text and refusal parts), `image_url` data URLs into
//! `images` (base64, other URLs refused); role `developer` becomes
//! `system`; assistant `tool_calls` become Ollama's calls with the
//! arguments as an object (OpenAI sends their JSON text), assistant
//! `reasoning_content` its `thinking`; a `tool` message keeps its content
//! and `tool_call_id`, and gets `tool_name` from the earlier call with that
//! id (else from its `name`). `name` on other messages is dropped.
//!
//! Speed: a message that needs no translation (a `role` and a string
//! `content`, nothing else) is copied as the client wrote it; only the rest
//! is read as a JSON tree. The other top-level fields stay raw until the
//! translation takes them (most of the two dozen it asks for are absent),
//! and the Ollama body is written member by member, not built as a tree
//! first. A body the raw
//! reading refuses is read again as a tree, so errors are the tree's (the
//! `ollama_request` fuzz target holds both readings to the same answer).

use std::collections::HashMap;

use bytes::Bytes;
use iop_core::exec::{codes, FailureSource, ProviderError, RunFailure};
use serde_json::{value::RawValue, Map, Value};

/// Fields that do not change the answer: read and dropped.
const DROPPED: &[&str] = &[
    "stream_options",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prediction",
    "prompt_cache_key",
    "safety_identifier",
];

/// Fields of an embeddings request that do not change the vectors (the
/// edge renders `encoding_format`).
const EMBED_DROPPED: &[&str] = &["user"];

/// A 400 for the client's request.
fn invalid(message: impl Into<String>) -> RunFailure {
    RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, message)
}

/// A 400 for a parameter Ollama cannot honour; the client's error names it
/// in `param`, as OpenAI's do.
fn unsupported(param: &str, what: &str) -> RunFailure {
    let p = ProviderError { param: Some(param.to_owned()), ..Default::default() };
    invalid(format!("`{param}`: {what} is not supported by this provider (Ollama)")).with_provider(Some(p), None)
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, RunFailure> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid("invalid request body: expected a JSON object")),
        Err(e) => Err(invalid(format!("invalid request body: {e}"))),
    }
}

/// Removes `key`; `null` counts as absent.
fn take(m: &mut Map<String, Value>, key: &str) -> Option<Value> {
    m.remove(key).filter(|v| !v.is_null())
}

/// The client's top-level fields not read yet: raw, each read as a tree
/// only when taken (most are absent; those present are few and small), or
/// the whole body's tree.
enum Req<'a> {
    Raw(Vec<(&'a str, &'a RawValue)>),
    Tree(Map<String, Value>),
}

impl Req<'_> {
    /// Removes `key`; `null` counts as absent.
    fn take(&mut self, key: &str) -> Result<Option<Value>, RunFailure> {
        match self {
            Self::Tree(m) => Ok(take(m, key)),
            Self::Raw(m) => match m.iter().position(|(k, _)| *k == key).map(|at| m.swap_remove(at)) {
                Some((_, raw)) if raw.get() != "null" => tree_of(raw).map(Some),
                _ => Ok(None),
            },
        }
    }

    /// The value of `key` when it is a number.
    fn number(&mut self, key: &str) -> Result<Option<Value>, RunFailure> {
        match self.take(key)? {
            None => Ok(None),
            Some(v @ Value::Number(_)) => Ok(Some(v)),
            Some(_) => Err(invalid(format!("`{key}` must be a number"))),
        }
    }

    /// The value of `key` when it is a non-negative integer.
    fn count(&mut self, key: &str) -> Result<Option<u64>, RunFailure> {
        match self.take(key)? {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| invalid(format!("`{key}` must be a non-negative integer"))),
        }
    }

    /// The fields left that go to Ollama as sent, into `out` (a key `out`
    /// has already is not replaced). Every raw value left is read, dropped
    /// ones too: one a tree cannot hold (a number out of range) must fail
    /// as the tree's reading fails (see `chat_body`).
    fn pass_rest(self, out: &mut Out) -> Result<(), RunFailure> {
        let passed = |out: &Out, key: &str| !DROPPED.contains(&key) && !out.written.contains(&key);
        match self {
            Self::Tree(m) => {
                for (key, value) in m {
                    if passed(out, &key) {
                        out.pass(&key, &value);
                    }
                }
            }
            Self::Raw(m) => {
                for (key, raw) in m {
                    let value = tree_of(raw)?;
                    if passed(out, key) {
                        // Written as the tree's reading writes it (a long
                        // float's text read and written again can differ
                        // from the text sent in its last digit).
                        out.pass(key, &value);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The `/api/chat` body, written member by member after its messages.
struct Out {
    json: Vec<u8>,
    /// The members written so far (a field passed as sent does not repeat one).
    written: Vec<&'static str>,
}

impl Out {
    fn member(&mut self, key: &'static str, value: &impl serde::Serialize) {
        self.json.extend_from_slice(b",\"");
        self.json.extend_from_slice(key.as_bytes());
        self.json.extend_from_slice(b"\":");
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.json, value);
        self.written.push(key);
    }

    /// A client's field passed to Ollama as sent (its key escaped as needed).
    fn pass(&mut self, key: &str, value: &Value) {
        self.json.push(b',');
        let _ = serde_json::to_writer(&mut self.json, key);
        self.json.push(b':');
        let _ = serde_json::to_writer(&mut self.json, value);
    }
}

/// A raw value as a tree; one a tree cannot hold sends the body to the
/// tree's reading (see `chat_body`), never a silent null.
fn tree_of(raw: &RawValue) -> Result<Value, RunFailure> {
    serde_json::from_str(raw.get()).map_err(|_| needs_tree())
}

/// A `POST /api/chat` body and whether it asks for a stream.
pub(crate) struct ChatBody {
    pub body: Bytes,
    pub stream: bool,
}

/// `POST /api/chat` body for an OpenAI chat completion request, with
/// `model` = `target` and `stream` as the client asked (OpenAI's default:
/// no stream). A client that waits for the whole answer gets it from one
/// object Ollama writes once, not from a line per token.
pub(crate) fn chat_body(body: &[u8], target: &str) -> Result<ChatBody, RunFailure> {
    // A refused body is read again as a tree: its error is then the one a
    // tree finds first, wherever the raw reading stopped.
    chat_body_with(body, target, true).or_else(|_| chat_body_with(body, target, false))
}

/// [`chat_body`]; `raw: false` reads the whole body as a tree (the fuzz
/// target checks both ways give the same answer).
pub(crate) fn chat_body_with(body: &[u8], target: &str, raw: bool) -> Result<ChatBody, RunFailure> {
    // The top level's values stay raw: the messages (most of a body) are
    // then mostly copied as they are, not parsed into a tree and written
    // again. A body this cannot read (an escaped key, bad JSON) takes the
    // tree, which also names what is wrong with it.
    let top = if raw { serde_json::from_slice::<RawTop<'_>>(body).ok() } else { None };
    let (mut req, raw_messages) = match top {
        // A `null` list counts as absent, as the tree's `take` has it.
        Some(RawTop { fields, messages }) => (Req::Raw(fields), messages.flatten()),
        None => (Req::Tree(object(body)?), None),
    };
    refuse_unsupported(&mut req)?;
    let mut out = Out { json: Vec::with_capacity(body.len() + 128), written: Vec::with_capacity(8) };
    out.json.extend_from_slice(b"{\"messages\":");
    let messages = &mut out.json;
    match raw_messages {
        Some(raw) => {
            write_messages(raw, messages)?;
        }
        None => {
            let m = req.take("messages")?.ok_or_else(|| invalid("`messages` is required"))?;
            let _ = serde_json::to_writer(&mut *messages, &messages_of(m)?);
        }
    }
    let stream = match req.take("stream")? {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(invalid("`stream` must be a boolean")),
    };
    out.member("model", &target);
    out.member("stream", &stream);

    let tool_choice = req.take("tool_choice")?;
    let send_tools = match tool_choice.as_ref() {
        None => true,
        Some(Value::String(s)) if s == "auto" => true,
        Some(Value::String(s)) if s == "none" => false,
        Some(Value::String(s)) if s == "required" => {
            return Err(unsupported("tool_choice", "\"required\" (forcing a tool call)"))
        }
        Some(Value::Object(_)) => return Err(unsupported("tool_choice", "naming the function to call")),
        Some(_) => return Err(invalid("`tool_choice` must be \"none\", \"auto\", \"required\" or an object")),
    };
    if let Some(tools) = req.take("tools")? {
        let tools = tools_of(tools)?;
        if send_tools && !tools.is_empty() {
            out.member("tools", &tools);
        }
    }

    let native_format = req.take("format")?;
    match req.take("response_format")? {
        Some(rf) => {
            if let Some(format) = format_of(rf)? {
                out.member("format", &format);
            }
        }
        None => {
            if let Some(f) = native_format {
                out.member("format", &f);
            }
        }
    }

    let mut options = match req.take("options")? {
        None => Map::new(),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(invalid("`options` must be an object")),
    };
    if let Some(stop) = req.take("stop")? {
        let list = match stop {
            Value::String(s) => vec![Value::String(s)],
            Value::Array(items) if items.iter().all(Value::is_string) => items,
            _ => return Err(invalid("`stop` must be a string or an array of strings")),
        };
        if !list.is_empty() {
            options.insert("stop".into(), Value::Array(list));
        }
    }
    match req.take("seed")? {
        None => {}
        Some(v @ Value::Number(_)) if v.is_i64() || v.is_u64() => {
            options.insert("seed".into(), v);
        }
        Some(_) => return Err(invalid("`seed` must be an integer")),
    }
    // `top_k`: an extension vLLM, llama.cpp and Ollama's /v1 take at the
    // top level; Ollama's own API reads it among the options.
    for key in ["temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty"] {
        if let Some(v) = req.number(key)? {
            options.insert(key.into(), v);
        }
    }
    let max_tokens = req.count("max_tokens")?;
    let max_completion_tokens = req.count("max_completion_tokens")?;
    if let Some(n) = max_completion_tokens.or(max_tokens) {
        options.insert("num_predict".into(), Value::from(n));
    }
    if !options.is_empty() {
        out.member("options", &options);
    }

    let native_think = req.take("think")?;
    let think = match req.take("reasoning_effort")? {
        Some(effort) => Some(think_of(&effort)?),
        None => native_think,
    };
    if let Some(t) = think {
        out.member("think", &t);
    }

    req.pass_rest(&mut out)?;
    out.json.push(b'}');
    Ok(ChatBody { body: Bytes::from(out.json), stream })
}

/// A body's top level, each value raw but the messages, whose fields are
/// read in the same pass (a prompt, most of a body, is scanned once). A
/// key given twice refuses it, at either level: the tree keeps the last
/// value, and the value left out would go unread (a number out of range in
/// it is the tree's error; found by the fuzz target). So does an object of
/// more than [`RAW_KEYS`] keys (found by a scan: a body of many keys must
/// not cost their square; the tree reads it), and a `messages` that is not
/// a list of objects (the tree names what is wrong with it).
struct RawTop<'a> {
    fields: Vec<(&'a str, &'a RawValue)>,
    /// `messages`: absent, `null`, or each message's fields.
    messages: Option<Option<Vec<RawFields<'a>>>>,
}

/// An object's members, each value raw.
struct RawFields<'a>(Vec<(&'a str, &'a RawValue)>);

/// The most keys an object read raw may have (a chat request has about ten).
const RAW_KEYS: usize = 32;

/// Adds `key`'s `value` to `fields`, refusing a key given twice or one too many.
fn add_field<'a, E: serde::de::Error>(
    fields: &mut Vec<(&'a str, &'a RawValue)>,
    key: &'a str,
    value: &'a RawValue,
) -> Result<(), E> {
    if fields.len() == RAW_KEYS {
        return Err(E::custom("many keys"));
    }
    if fields.iter().any(|(k, _)| *k == key) {
        return Err(E::custom("a key given twice"));
    }
    fields.push((key, value));
    Ok(())
}

impl<'de> serde::Deserialize<'de> for RawTop<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Top;
        impl<'de> serde::de::Visitor<'de> for Top {
            type Value = RawTop<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut top = RawTop { fields: Vec::with_capacity(8), messages: None };
                while let Some(key) = map.next_key::<&str>()? {
                    if key != "messages" {
                        add_field(&mut top.fields, key, map.next_value()?)?;
                    } else if top.messages.is_some() {
                        return Err(serde::de::Error::custom("a key given twice"));
                    } else {
                        top.messages = Some(map.next_value()?);
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(Top)
    }
}

impl<'de> serde::Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = RawFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::with_capacity(2);
                while let Some((key, value)) = map.next_entry::<&str, &RawValue>()? {
                    add_field(&mut fields, key, value)?;
                }
                Ok(RawFields(fields))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// Writes the messages in Ollama's shape: a message of only a `role`
/// (`user`, `system`, `developer`, `assistant`) and a string `content` is
/// copied as the client wrote it (its role renamed for `developer`); any
/// other is translated by [`message_of`].
fn write_messages(list: Vec<RawFields<'_>>, out: &mut Vec<u8>) -> Result<(), RunFailure> {
    if list.is_empty() {
        return Err(invalid("`messages` must not be empty"));
    }
    let mut call_names: HashMap<String, String> = HashMap::new();
    out.push(b'[');
    for (i, RawFields(m)) in list.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if !copy_plain_message(&m, out) {
            let mut tree = Map::new();
            for (key, raw) in m {
                tree.insert(key.to_owned(), tree_of(raw)?);
            }
            let _ = serde_json::to_writer(&mut *out, &message_of(Value::Object(tree), i, &mut call_names)?);
        }
    }
    out.push(b']');
    Ok(())
}

/// What the raw reading cannot tell; never a client's answer: `chat_body`
/// reads a refused body again as a tree, whose error it gives.
fn needs_tree() -> RunFailure {
    invalid("invalid request body")
}

/// Copies a message that needs no translation; false when it needs one.
fn copy_plain_message(m: &[(&str, &RawValue)], out: &mut Vec<u8>) -> bool {
    let (role, content) = match m {
        [("role", role), ("content", content)] | [("content", content), ("role", role)] => (role.get(), content.get()),
        _ => return false,
    };
    let role = match role {
        r#""user""# | r#""system""# | r#""assistant""# => role,
        r#""developer""# => r#""system""#,
        _ => return false,
    };
    // A JSON tree refuses a lone surrogate escape: so does the copy (the
    // tree then names it).
    if !content.starts_with('"') || !surrogates_paired(content.as_bytes()) {
        return false;
    }
    out.extend_from_slice(b"{\"role\":");
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(b",\"content\":");
    out.extend_from_slice(content.as_bytes());
    out.push(b'}');
    true
}

/// Refuses the parameters Ollama cannot honour (removing the harmless
/// values of them: `n: 1`, `logprobs: false`, ...).
fn refuse_unsupported(req: &mut Req<'_>) -> Result<(), RunFailure> {
    match req.take("n")? {
        None => {}
        Some(v) => match v.as_u64() {
            Some(1) => {}
            Some(n) if n > 1 => return Err(unsupported("n", "more than one choice")),
            _ => return Err(invalid("`n` must be a positive integer")),
        },
    }
    match req.take("logprobs")? {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => return Err(unsupported("logprobs", "returning log probabilities")),
        Some(_) => return Err(invalid("`logprobs` must be a boolean")),
    }
    match req.take("top_logprobs")? {
        None => {}
        Some(v) => match v.as_u64() {
            Some(0) => {}
            Some(_) => return Err(unsupported("top_logprobs", "returning log probabilities")),
            None => return Err(invalid("`top_logprobs` must be a non-negative integer")),
        },
    }
    match req.take("logit_bias")? {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(_) => return Err(unsupported("logit_bias", "biasing tokens")),
    }
    for key in ["functions", "function_call"] {
        if req.take(key)?.is_some() {
            return Err(unsupported(key, "the deprecated function-calling API (use `tools`)"));
        }
    }
    if req.take("audio")?.is_some() {
        return Err(unsupported("audio", "audio output"));
    }
    match req.take("modalities")? {
        None => {}
        Some(Value::Array(items)) if items.iter().all(|m| m == "text") => {}
        Some(_) => return Err(unsupported("modalities", "output other than text")),
    }
    Ok(())
}

/// Whether every `\\u` escape of the JSON string `raw` that is a UTF-16
/// surrogate is a high one followed by a low one.
fn surrogates_paired(raw: &[u8]) -> bool {
    let hex4 = |at: usize| {
        let digits = std::str::from_utf8(raw.get(at..at + 4)?).ok()?;
        u16::from_str_radix(digits, 16).ok()
    };
    let low = |cp: u16| (0xDC00..0xE000).contains(&cp);
    let mut i = 0;
    while let Some(off) = memchr::memchr(b'\\', raw.get(i..).unwrap_or_default()) {
        let at = i + off;
        match raw.get(at + 1) {
            Some(b'u') => {
                let Some(cp) = hex4(at + 2) else { return false };
                if low(cp) {
                    return false;
                }
                if (0xD800..0xDC00).contains(&cp) {
                    let follows = raw.get(at + 6..at + 8) == Some(&b"\\u"[..]);
                    if !follows || !hex4(at + 8).is_some_and(low) {
                        return false;
                    }
                    i = at + 12;
                } else {
                    i = at + 6;
                }
            }
            Some(_) => i = at + 2,
            None => return false,
        }
    }
    true
}

/// `reasoning_effort` as Ollama's `think`.
fn think_of(effort: &Value) -> Result<Value, RunFailure> {
    Ok(match effort.as_str() {
        Some("none") => Value::Bool(false),
        Some("minimal" | "low") => Value::from("low"),
        Some("medium") => Value::from("medium"),
        Some("high" | "xhigh") => Value::from("high"),
        Some(_) | None => {
            return Err(invalid("`reasoning_effort` must be one of none, minimal, low, medium, high, xhigh"))
        }
    })
}

/// `response_format` as Ollama's `format` (`None`: plain text).
fn format_of(rf: Value) -> Result<Option<Value>, RunFailure> {
    let Value::Object(mut rf) = rf else { return Err(invalid("`response_format` must be an object")) };
    let kind = rf.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Value::from("json"))),
        "json_schema" => match rf.remove("json_schema").and_then(|mut s| s.get_mut("schema").map(Value::take)) {
            Some(schema @ Value::Object(_)) => Ok(Some(schema)),
            _ => Err(invalid("`response_format.json_schema.schema` must be an object")),
        },
        "" => Err(invalid("`response_format.type` is required")),
        _ => Err(unsupported("response_format.type", "this format")),
    }
}

/// `tools`: function tools, each passed as sent.
fn tools_of(tools: Value) -> Result<Vec<Value>, RunFailure> {
    let Value::Array(tools) = tools else { return Err(invalid("`tools` must be an array")) };
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str);
        if kind != Some("function") {
            return Err(unsupported(&format!("tools[{i}].type"), "a tool that is not a function"));
        }
        if tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_none() {
            return Err(invalid(format!("`tools[{i}].function.name` must be a string")));
        }
    }
    Ok(tools)
}

/// The messages in Ollama's shape.
fn messages_of(messages: Value) -> Result<Vec<Value>, RunFailure> {
    let Value::Array(messages) = messages else { return Err(invalid("`messages` must be an array")) };
    if messages.is_empty() {
        return Err(invalid("`messages` must not be empty"));
    }
    // Function name of each tool call id seen so far (for `tool_name`).
    let mut call_names: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        out.push(message_of(m, i, &mut call_names)?);
    }
    Ok(out)
}

/// Message `i` in Ollama's shape; `call_names` has the function name of
/// each tool call id of the messages before it.
fn message_of(m: Value, i: usize, call_names: &mut HashMap<String, String>) -> Result<Value, RunFailure> {
    let Value::Object(mut m) = m else { return Err(invalid(format!("`messages[{i}]` must be an object"))) };
    let role = match m.get("role").and_then(Value::as_str) {
        Some("developer") => "system".to_owned(),
        Some("function") => {
            return Err(unsupported(&format!("messages[{i}].role"), "role \"function\" (use \"tool\")"))
        }
        Some(r) if !r.is_empty() => r.to_owned(),
        _ => return Err(invalid(format!("`messages[{i}].role` must be a non-empty string"))),
    };
    let (mut text, images) = content_of(take(&mut m, "content"), i)?;
    let mut msg = Map::new();
    if role == "assistant" {
        if text.is_empty() {
            if let Some(Value::String(r)) = take(&mut m, "refusal") {
                text = r;
            }
        }
        let thinking = take(&mut m, "reasoning_content").or_else(|| take(&mut m, "reasoning"));
        if let Some(Value::String(t)) = thinking.filter(|t| t.as_str().is_some_and(|s| !s.is_empty())) {
            msg.insert("thinking".into(), Value::String(t));
        }
        if let Some(calls) = take(&mut m, "tool_calls") {
            let calls = assistant_calls(calls, i, call_names)?;
            if !calls.is_empty() {
                msg.insert("tool_calls".into(), Value::Array(calls));
            }
        }
    }
    if role == "tool" {
        let id = match take(&mut m, "tool_call_id") {
            None => None,
            Some(Value::String(id)) => Some(id),
            Some(_) => return Err(invalid(format!("`messages[{i}].tool_call_id` must be a string"))),
        };
        let name = id
            .as_ref()
            .and_then(|id| call_names.get(id).cloned())
            .or_else(|| take(&mut m, "name").and_then(|n| n.as_str().map(str::to_owned)).filter(|n| !n.is_empty()));
        if let Some(name) = name {
            msg.insert("tool_name".into(), Value::String(name));
        }
        if let Some(id) = id {
            msg.insert("tool_call_id".into(), Value::String(id));
        }
    }
    msg.insert("role".into(), Value::String(role));
    msg.insert("content".into(), Value::String(text));
    if !images.is_empty() {
        msg.insert("images".into(), Value::Array(images.into_iter().map(Value::String).collect()));
    }
    Ok(Value::Object(msg))
}

/// A message's content: its text and its images (base64).
fn content_of(content: Option<Value>, i: usize) -> Result<(String, Vec<String>), RunFailure> {
    let parts = match content {
        None => return Ok((String::new(), Vec::new())),
        Some(Value::String(s)) => return Ok((s, Vec::new())),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(invalid(format!("`messages[{i}].content` must be a string, an array or null"))),
    };
    let mut texts = Vec::new();
    let mut images = Vec::new();
    for (j, part) in parts.into_iter().enumerate() {
        let key = format!("messages[{i}].content[{j}]");
        let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "text" | "refusal" => match part.get(kind).and_then(Value::as_str) {
                Some(t) => texts.push(t.to_owned()),
                None => return Err(invalid(format!("`{key}.{kind}` must be a string"))),
            },
            "image_url" => {
                let url = part.get("image_url").and_then(|u| u.get("url").or(Some(u))).and_then(Value::as_str);
                let Some(url) = url else { return Err(invalid(format!("`{key}.image_url.url` must be a string"))) };
                images.push(data_url_base64(url).ok_or_else(|| {
                    unsupported(&format!("{key}.image_url.url"), "an image that is not a base64 data: URL")
                })?);
            }
            "" => return Err(invalid(format!("`{key}.type` is required"))),
            _ => return Err(unsupported(&format!("{key}.type"), "this content part type")),
        }
    }
    Ok((texts.join("\n"), images))
}

/// The base64 payload of a `data:<type>;base64,<payload>` URL.
fn data_url_base64(url: &str) -> Option<String> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    (meta.ends_with(";base64") && !payload.is_empty()).then(|| payload.to_owned())
}

/// An assistant message's OpenAI tool calls as Ollama's; records each id's
/// function name.
fn assistant_calls(calls: Value, i: usize, names: &mut HashMap<String, String>) -> Result<Vec<Value>, RunFailure> {
    let Value::Array(calls) = calls else {
        return Err(invalid(format!("`messages[{i}].tool_calls` must be an array")));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.into_iter().enumerate() {
        let key = format!("messages[{i}].tool_calls[{j}]");
        let Value::Object(mut call) = call else { return Err(invalid(format!("`{key}` must be an object"))) };
        if let Some(kind) = take(&mut call, "type") {
            if kind != "function" {
                return Err(unsupported(&format!("{key}.type"), "a tool call that is not a function call"));
            }
        }
        let Some(Value::Object(mut function)) = take(&mut call, "function") else {
            return Err(invalid(format!("`{key}.function` must be an object")));
        };
        let Some(Value::String(name)) = take(&mut function, "name") else {
            return Err(invalid(format!("`{key}.function.name` must be a string")));
        };
        let arguments = match take(&mut function, "arguments") {
            None => Value::Object(Map::new()),
            Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
                Ok(v @ Value::Object(_)) => v,
                _ => return Err(invalid(format!("`{key}.function.arguments` must be the JSON text of an object"))),
            },
            Some(v @ Value::Object(_)) => v,
            Some(_) => return Err(invalid(format!("`{key}.function.arguments` must be a string"))),
        };
        let mut f = Map::new();
        f.insert("name".into(), Value::String(name.clone()));
        f.insert("arguments".into(), arguments);
        let mut c = Map::new();
        if let Some(Value::String(id)) = take(&mut call, "id") {
            names.insert(id.clone(), name);
            c.insert("id".into(), Value::String(id));
        }
        c.insert("function".into(), Value::Object(f));
        out.push(Value::Object(c));
    }
    Ok(out)
}

/// `POST /api/embed` body for an OpenAI embeddings request, with `model` =
/// `target`; also the number of inputs (vectors expected).
pub(crate) fn embed_body(body: &[u8], target: &str) -> Result<(Bytes, usize), RunFailure> {
    let mut req = object(body)?;
    let mut out = Map::new();
    out.insert("model".into(), Value::String(target.to_owned()));
    let input = take(&mut req, "input").ok_or_else(|| invalid("`input` is required"))?;
    let token_arrays = || unsupported("input", "token arrays (send text)");
    let inputs = match &input {
        Value::String(s) if !s.is_empty() => 1,
        Value::String(_) => return Err(invalid("`input` must not be empty")),
        Value::Array(items) if items.is_empty() => return Err(invalid("`input` must not be empty")),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.is_empty() => {}
                    Value::String(_) => return Err(invalid(format!("`input[{i}]` must not be empty"))),
                    Value::Number(_) | Value::Array(_) => return Err(token_arrays()),
                    _ => return Err(invalid(format!("`input[{i}]` must be a string"))),
                }
            }
            items.len()
        }
        _ => return Err(invalid("`input` must be a string or an array of strings")),
    };
    out.insert("input".into(), input);
    if let Some(d) = take(&mut req, "dimensions") {
        match d.as_u64() {
            Some(n) if n > 0 => out.insert("dimensions".into(), Value::from(n)),
            _ => return Err(invalid("`dimensions` must be a positive integer")),
        };
    }
    match take(&mut req, "truncate") {
        None => {}
        Some(v @ Value::Bool(_)) => {
            out.insert("truncate".into(), v);
        }
        Some(_) => return Err(invalid("`truncate` must be a boolean")),
    }
    match take(&mut req, "encoding_format") {
        None => {}
        Some(Value::String(f)) if f == "float" || f == "base64" => {}
        Some(_) => return Err(invalid("`encoding_format` must be \"float\" or \"base64\"")),
    }
    for (key, value) in req {
        if !EMBED_DROPPED.contains(&key.as_str()) {
            out.entry(key).or_insert(value);
        }
    }
    Ok((Bytes::from(serde_json::to_vec(&Value::Object(out)).unwrap_or_default()), inputs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(body: Value) -> Value {
        let out = chat_body(body.to_string().as_bytes(), "llama3.2").unwrap();
        let value: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(value["stream"], out.stream);
        value
    }

    fn chat_err(body: Value) -> RunFailure {
        chat_body(body.to_string().as_bytes(), "llama3.2").err().unwrap()
    }

    fn user(content: &str) -> Value {
        json!([{"role": "user", "content": content}])
    }

    #[test]
    fn fields_read_raw_give_the_body_the_tree_gives() {
        // Passed as sent: a long float (its text read and written again
        // differs in the last digit), an escaped string, a nested object;
        // `model` given by the client is not repeated.
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[2239522223011222222e12],
            "keep_alive":"5\u006d","format":{"type":"object"},"max_tokens":7,"user":"u","stream":false}"#;
        let raw = chat_body_with(body, "t", true).unwrap();
        let tree = chat_body_with(body, "t", false).unwrap();
        let v: Value = serde_json::from_slice(&raw.body).unwrap();
        assert_eq!(v, serde_json::from_slice::<Value>(&tree.body).unwrap());
        assert_eq!(
            (&v["model"], &v["keep_alive"], &v["options"]),
            (&json!("t"), &json!("5m"), &json!({"num_predict": 7}))
        );
        assert!(v.get("user").is_none(), "{v}");
        // More keys than are read raw: the tree reads the body, same answer.
        let mut many = String::from(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#);
        for k in 0..40 {
            many.push_str(&format!(r#","k{k}":{k}"#));
        }
        many.push('}');
        let out = chat_body(many.as_bytes(), "t").unwrap();
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!((&v["k0"], &v["k39"]), (&json!(0), &json!(39)));
    }

    #[test]
    fn messages_read_in_the_top_levels_pass_answer_as_the_tree_does() {
        let same = |body: &str| {
            let raw = chat_body(body.as_bytes(), "t").map(|b| serde_json::from_slice::<Value>(&b.body).unwrap());
            let tree =
                chat_body_with(body.as_bytes(), "t", false).map(|b| serde_json::from_slice::<Value>(&b.body).unwrap());
            match (raw, tree) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "{body}");
                    a
                }
                (a, b) => {
                    assert_eq!(a.err().map(|e| e.message), b.err().map(|e| e.message), "{body}");
                    Value::Null
                }
            }
        };
        // Content first, a role given twice (the tree keeps the last), a
        // message that is not an object, `messages` twice, null, empty.
        let v = same(r#"{"messages":[{"content":"a\nb","role":"developer"}]}"#);
        assert_eq!(v["messages"], json!([{"role": "system", "content": "a\nb"}]));
        let v = same(r#"{"messages":[{"role":"user","role":"assistant","content":"x"}]}"#);
        assert_eq!(v["messages"][0]["role"], json!("assistant"));
        same(r#"{"messages":["hi"]}"#);
        same(r#"{"messages":[{"role":"user","content":"x"}],"messages":[{"role":"user","content":"y"}]}"#);
        same(r#"{"messages":null}"#);
        same(r#"{"messages":[]}"#);
        same(r#"{"messages":{"role":"user"}}"#);
        // A message with a third field is translated, the others copied.
        let v = same(r#"{"messages":[{"role":"user","content":"x","name":"n"},{"role":"user","content":"y"}]}"#);
        assert_eq!(v["messages"][1], json!({"role": "user", "content": "y"}));
    }

    #[test]
    fn plain_messages_are_copied_and_the_others_translated() {
        let body = r#"{"model":"m","messages":[
            {"role":"developer","content":"be \"brief\" \u00e9"},
            {"role":"user","content":"hi","name":"ann"},
            {"content":"x","role":"assistant"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"42","tool_call_id":"c1"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}
        ],"messages":[{"role":"user","content":"last wins"}],"keep_alive":"5m"}"#;
        let out = chat_body(body.as_bytes(), "t").unwrap();
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        // Duplicate keys: the last one counts, as in a JSON tree.
        assert_eq!(
            v,
            json!({"model": "t", "stream": false, "keep_alive": "5m", "messages": [{"role": "user", "content": "last wins"}]})
        );

        let body = body.replace(r#","messages":[{"role":"user","content":"last wins"}]"#, "");
        let out = chat_body(body.as_bytes(), "t").unwrap();
        // Copied as written: the escapes are the client's.
        let text = std::str::from_utf8(&out.body).unwrap();
        assert!(text.starts_with(r#"{"messages":[{"role":"system","content":"be \"brief\" \u00e9"},"#), "{text}");
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(
            v["messages"],
            json!([
                {"role": "system", "content": "be \"brief\" é"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}]},
                {"role": "tool", "content": "42", "tool_name": "f", "tool_call_id": "c1"},
                {"role": "user", "content": "a\nb"},
            ])
        );
        // An escaped key is read through the tree, with the same answer.
        let escaped = body.replace(r#""messages""#, r#""m\u0065ssages""#);
        let again: Value = serde_json::from_slice(&chat_body(escaped.as_bytes(), "t").unwrap().body).unwrap();
        assert_eq!(again, v);
        // Surrogate escapes: pairs are copied, a lone one is refused as a tree refuses it.
        let pair = r#"{"messages":[{"role":"user","content":"\ud83d\ude00 \\ud800"}]}"#;
        let v: Value = serde_json::from_slice(&chat_body(pair.as_bytes(), "t").unwrap().body).unwrap();
        assert_eq!(v["messages"][0]["content"], "\u{1f600} \\ud800");
        for lone in [r#""\ud800""#, r#""\udc00""#, r#""\ud800\u0041""#, r#""a\ud83d""#] {
            let bad = format!(r#"{{"messages":[{{"role":"user","content":{lone}}}]}}"#);
            assert_eq!(chat_body(bad.as_bytes(), "t").err().unwrap().status, 400, "{lone}");
        }
        // What is wrong is still named (the first: found by the fuzz target).
        for (bad, msg) in [
            (r#"{"messages":[{"role":"user","content":"a"}],"x":[2e+22222212]}"#, "number out of range"),
            (r#"{"messages":[{"role":"user","content":"a"}],"x":[1e999],"x":1}"#, "number out of range"),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a","n":1e999}]}]}"#,
                "number out of range",
            ),
            (r#"{"messages":[]}"#, "must not be empty"),
            (r#"{"messages":{}}"#, "must be an array"),
            (r#"{"messages":null}"#, "is required"),
            (r#"{"messages":[1]}"#, "`messages[0]` must be an object"),
            (r#"{"messages":[{"role":"user","content":"a"},{"role":"","content":"b"}]}"#, "`messages[1].role`"),
        ] {
            let e = chat_body(bad.as_bytes(), "t").err().unwrap();
            assert!(e.message.contains(msg), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn minimal_request() {
        let out = chat(json!({"model": "public", "messages": user("hi")}));
        assert_eq!(out, json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]}));
        // The client's stream is Ollama's; its stream_options are the edge's.
        for stream in [true, false] {
            let out = chat(
                json!({"model": "m", "stream": stream, "stream_options": {"include_usage": true}, "messages": user("hi")}),
            );
            assert_eq!(out["stream"], stream);
            assert!(out.get("stream_options").is_none());
        }
        assert_eq!(chat(json!({"model": "m", "stream": null, "messages": user("hi")}))["stream"], false);
        assert!(chat_err(json!({"model": "m", "stream": "yes", "messages": user("hi")})).message.contains("`stream`"));
    }

    #[test]
    fn every_sampling_field_lands_in_options() {
        let out = chat(json!({
            "model": "m", "messages": user("x"),
            "temperature": 0.25, "top_p": 0.5, "top_k": 40, "frequency_penalty": 1.5, "presence_penalty": -0.5,
            "seed": 42, "stop": "END", "max_tokens": 7,
        }));
        assert_eq!(
            out["options"],
            json!({"temperature": 0.25, "top_p": 0.5, "top_k": 40, "frequency_penalty": 1.5, "presence_penalty": -0.5,
                   "seed": 42, "stop": ["END"], "num_predict": 7})
        );
        for key in ["temperature", "top_p", "seed", "stop", "max_tokens"] {
            assert!(out.get(key).is_none(), "{key} stays out of the top level");
        }
        // max_completion_tokens wins; a stop list stays a list.
        let out = chat(json!({"model": "m", "messages": user("x"), "max_tokens": 7, "max_completion_tokens": 9,
                              "stop": ["a", "b"]}));
        assert_eq!(out["options"], json!({"num_predict": 9, "stop": ["a", "b"]}));
        // Nulls are absent; the client's own options are kept, the OpenAI field wins.
        let out = chat(json!({"model": "m", "messages": user("x"), "temperature": null, "max_tokens": null,
                              "top_p": 0.1, "options": {"num_ctx": 8192, "top_p": 0.9}}));
        assert_eq!(out["options"], json!({"num_ctx": 8192, "top_p": 0.1}));
        assert!(chat(json!({"model": "m", "messages": user("x"), "stop": []})).get("options").is_none());
    }

    #[test]
    fn bad_parameter_types_are_refused() {
        for (key, value) in [
            ("temperature", json!("hot")),
            ("seed", json!(1.5)),
            ("stop", json!([1])),
            ("max_tokens", json!(-1)),
            ("max_completion_tokens", json!("9")),
            ("options", json!([])),
            ("reasoning_effort", json!("extreme")),
            ("tool_choice", json!(3)),
        ] {
            let mut body = json!({"model": "m", "messages": user("x")});
            body[key] = value;
            let f = chat_err(body);
            assert_eq!((f.code, f.status, f.source), (codes::INVALID_REQUEST, 400, FailureSource::Client));
            assert!(f.message.contains(&format!("`{key}`")), "{key}: {}", f.message);
        }
        for body in [json!([1]), json!({"model": "m"}), json!({"model": "m", "messages": []})] {
            assert_eq!(chat_err(body).status, 400);
        }
        assert_eq!(chat_body(b"{nope", "m").err().unwrap().status, 400);
    }

    #[test]
    fn refused_parameters_are_named() {
        for (key, value, param) in [
            ("n", json!(2), "`n`"),
            ("logprobs", json!(true), "`logprobs`"),
            ("top_logprobs", json!(3), "`top_logprobs`"),
            ("logit_bias", json!({"42": 10}), "`logit_bias`"),
            ("tool_choice", json!("required"), "`tool_choice`"),
            ("tool_choice", json!({"type": "function", "function": {"name": "f"}}), "`tool_choice`"),
            ("functions", json!([{"name": "f"}]), "`functions`"),
            ("function_call", json!("auto"), "`function_call`"),
            ("audio", json!({"voice": "alloy"}), "`audio`"),
            ("modalities", json!(["text", "audio"]), "`modalities`"),
            ("response_format", json!({"type": "grammar"}), "`response_format.type`"),
        ] {
            let mut body = json!({"model": "m", "messages": user("x")});
            body[key] = value;
            let f = chat_err(body);
            assert_eq!(
                (f.code, f.status, f.source, f.retryable),
                (codes::INVALID_REQUEST, 400, FailureSource::Client, false),
                "{key}"
            );
            assert!(f.message.contains(param) && f.message.contains("not supported"), "{key}: {}", f.message);
            assert_eq!(f.provider.unwrap().param.map(|p| format!("`{p}`")).as_deref(), Some(param));
        }
        assert_eq!(chat_err(json!({"model": "m", "messages": user("x"), "n": 0})).status, 400);
        // The harmless values pass and are not sent.
        let out = chat(json!({"model": "m", "messages": user("x"), "n": 1, "logprobs": false, "top_logprobs": 0,
                              "logit_bias": {}, "modalities": ["text"], "functions": null}));
        for key in ["n", "logprobs", "top_logprobs", "logit_bias", "modalities", "functions"] {
            assert!(out.get(key).is_none(), "{key}");
        }
    }

    #[test]
    fn response_format_and_think() {
        let rf = |v: Value| chat(json!({"model": "m", "messages": user("x"), "response_format": v}));
        assert_eq!(rf(json!({"type": "json_object"}))["format"], "json");
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let out = rf(json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}}));
        assert_eq!(out["format"], schema);
        assert!(rf(json!({"type": "text"})).get("format").is_none());
        let f = chat_err(json!({"model": "m", "messages": user("x"), "response_format": {"type": "json_schema"}}));
        assert!(f.message.contains("json_schema.schema"), "{}", f.message);
        // Ollama's own format passes; response_format wins over it.
        let out = chat(json!({"model": "m", "messages": user("x"), "format": "json"}));
        assert_eq!(out["format"], "json");
        let out =
            chat(json!({"model": "m", "messages": user("x"), "format": "json", "response_format": {"type": "text"}}));
        assert!(out.get("format").is_none());

        let think = |effort: &str| {
            chat(json!({"model": "m", "messages": user("x"), "reasoning_effort": effort}))["think"].clone()
        };
        assert_eq!(think("none"), false);
        assert_eq!(think("minimal"), "low");
        assert_eq!(think("low"), "low");
        assert_eq!(think("medium"), "medium");
        assert_eq!(think("high"), "high");
        assert_eq!(think("xhigh"), "high");
        assert_eq!(chat(json!({"model": "m", "messages": user("x"), "think": true}))["think"], true);
        assert_eq!(
            chat(json!({"model": "m", "messages": user("x"), "think": true, "reasoning_effort": "none"}))["think"],
            false
        );
        assert!(chat(json!({"model": "m", "messages": user("x")})).get("think").is_none());
    }

    #[test]
    fn unknown_fields_pass_and_metadata_is_dropped() {
        let out = chat(json!({
            "model": "m", "messages": user("x"), "keep_alive": "10m", "mock": {"tool_calls": 2},
            "user": "u1", "metadata": {"a": "b"}, "store": true, "service_tier": "auto",
            "parallel_tool_calls": false, "prediction": {"type": "content", "content": "x"},
            "prompt_cache_key": "k", "safety_identifier": "s",
        }));
        assert_eq!(out["keep_alive"], "10m");
        assert_eq!(out["mock"], json!({"tool_calls": 2}));
        for key in DROPPED {
            assert!(out.get(*key).is_none(), "{key}");
        }
    }

    const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","description":"Weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}]"#;

    #[test]
    fn tools_and_tool_choice() {
        let tools: Value = serde_json::from_str(TOOLS).unwrap();
        let out = chat(json!({"model": "m", "messages": user("x"), "tools": tools}));
        assert_eq!(out["tools"], tools);
        let out = chat(json!({"model": "m", "messages": user("x"), "tools": tools, "tool_choice": "auto"}));
        assert_eq!(out["tools"], tools);
        let out = chat(json!({"model": "m", "messages": user("x"), "tools": tools, "tool_choice": "none"}));
        assert!(out.get("tools").is_none() && out.get("tool_choice").is_none());
        let f = chat_err(json!({"model": "m", "messages": user("x"), "tools": [{"type": "custom", "custom": {}}]}));
        assert!(f.message.contains("`tools[0].type`"), "{}", f.message);
        let f = chat_err(json!({"model": "m", "messages": user("x"), "tools": [{"type": "function", "function": {}}]}));
        assert!(f.message.contains("`tools[0].function.name`"), "{}", f.message);
    }

    #[test]
    fn a_tool_round_trip_conversation() {
        let out = chat(json!({"model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "weather?", "name": "alice"},
            {"role": "assistant", "content": null, "reasoning_content": "let me look", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}},
            ]},
            {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "11 degrees"}]},
            {"role": "tool", "tool_call_id": "unknown", "name": "legacy_name", "content": "?"},
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "thinking": "let me look", "tool_calls": [
                    {"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "call_2", "function": {"name": "get_time", "arguments": {}}},
                ]},
                {"role": "tool", "content": "noon", "tool_call_id": "call_2", "tool_name": "get_time"},
                {"role": "tool", "content": "11 degrees", "tool_call_id": "call_1", "tool_name": "get_weather"},
                {"role": "tool", "content": "?", "tool_call_id": "unknown", "tool_name": "legacy_name"},
            ])
        );
        let bad_args = json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]});
        let f = chat_err(bad_args);
        assert!(f.message.contains("`messages[0].tool_calls[0].function.arguments`"), "{}", f.message);
        let f = chat_err(json!({"model": "m", "messages": [{"role": "function", "content": "x"}]}));
        assert!(f.message.contains("`messages[0].role`"), "{}", f.message);
        assert_eq!(chat_err(json!({"model": "m", "messages": [{"content": "x"}]})).status, 400);
    }

    #[test]
    fn content_parts_and_images() {
        let out = chat(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            {"type": "text", "text": "in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
        ]}]}));
        assert_eq!(
            out["messages"][0],
            json!({"role": "user", "content": "what is\nin this picture?", "images": ["iVBORw0KGgo=", "/9j/4AAQ"]})
        );
        let part = |p: Value| chat_err(json!({"model": "m", "messages": [{"role": "user", "content": [p]}]}));
        let f = part(json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}));
        assert!(f.message.contains("`messages[0].content[0].image_url.url`") && f.message.contains("not supported"));
        let f = part(json!({"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}));
        assert!(f.message.contains("`messages[0].content[0].type`"), "{}", f.message);
        assert_eq!(part(json!({"type": "text"})).status, 400);
        assert_eq!(part(json!({"text": "no type"})).status, 400);
        // Refusal parts and a refusal field are text for Ollama.
        let out = chat(json!({"model": "m", "messages": [
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": null, "refusal": "not that"},
        ]}));
        assert_eq!(out["messages"][0]["content"], "no");
        assert_eq!(out["messages"][1]["content"], "not that");
    }

    fn embed(body: Value) -> (Value, usize) {
        let (out, n) = embed_body(body.to_string().as_bytes(), "nomic").unwrap();
        (serde_json::from_slice(&out).unwrap(), n)
    }

    #[test]
    fn embeddings_requests() {
        let (out, n) = embed(json!({"model": "public", "input": "hello", "encoding_format": "base64", "user": "u"}));
        assert_eq!((out, n), (json!({"model": "nomic", "input": "hello"}), 1));
        let (out, n) = embed(json!({"model": "p", "input": ["a", "b"], "dimensions": 4, "truncate": false,
                                    "keep_alive": 0, "encoding_format": "float"}));
        assert_eq!(
            (out, n),
            (json!({"model": "nomic", "input": ["a", "b"], "dimensions": 4, "truncate": false, "keep_alive": 0}), 2)
        );
        for (input, needle) in [
            (json!([1, 2, 3]), "token arrays"),
            (json!([[1, 2], [3]]), "token arrays"),
            (json!(""), "must not be empty"),
            (json!([]), "must not be empty"),
            (json!(["a", ""]), "`input[1]`"),
            (json!([{"a": 1}]), "`input[0]`"),
            (json!(7), "`input`"),
        ] {
            let f = embed_body(json!({"model": "p", "input": input}).to_string().as_bytes(), "t").unwrap_err();
            assert_eq!((f.code, f.status, f.source), (codes::INVALID_REQUEST, 400, FailureSource::Client));
            assert!(f.message.contains(needle), "{input}: {}", f.message);
        }
        for body in [
            json!({"model": "p"}),
            json!({"model": "p", "input": "a", "dimensions": 0}),
            json!({"model": "p", "input": "a", "truncate": "yes"}),
            json!({"model": "p", "input": "a", "encoding_format": "int8"}),
        ] {
            assert_eq!(embed_body(body.to_string().as_bytes(), "t").unwrap_err().status, 400, "{body}");
        }
    }
}
