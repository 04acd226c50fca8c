//! The OpenAI Responses API (`POST /v1/responses`) for providers that do
//! not speak it: [`to_chat`] translates a request into an OpenAI
//! chat-completions body, which then runs on the node's normalized path.
//!
//! Nothing is lost silently: what the translation cannot honour is left
//! out and named in [`Translated::dropped`]; what it cannot read is refused
//! with an [`Invalid`] naming the field (`param`, a dotted path). `null`
//! counts as absent for optional fields. What the response object repeats
//! of the request is in [`Translated::echo`].
//!
//! | Responses | OpenAI chat |
//! |---|---|
//! | `model` (required string) | `model`: the target |
//! | `stream` | `stream`, with `stream_options.include_usage` (the edge accounts usage) |
//! | `instructions` (string) | one leading `system` message (none when empty) |
//! | [`Options::history`] | the messages after it, as given |
//! | `input` (a string: one user message; or items, below) | the messages after those |
//! | `tools`: `function` | function tools (`parameters`, `strict` kept) |
//! | `tools`: `namespace` | its functions, each named `<ns>__<name>` ([`Translated::namespaced`]; the rule is in `names.rs`); its description left out (`namespace.description`) |
//! | `tools`: hosted (`web_search`, `file_search`, `mcp`, `custom`...) | left out: `tools.<type>` |
//! | `tool_choice` `"auto"` / `"none"` / `"required"` | the same (`"required"` with no function left: `tool_choice`) |
//! | `tool_choice` `{"type":"function","name"[,"namespace"]}` | `{"type":"function","function":{"name"}}`, flat name |
//! | `tool_choice` of any other type (`allowed_tools`, hosted) | left out: `tool_choice.<type>` |
//! | `parallel_tool_calls` | the same, when function tools are sent (OpenAI refuses it without) |
//! | `text.format` `json_schema` / `json_object` / `text` | `response_format` `json_schema` (nested) / `json_object` / nothing |
//! | `text.verbosity` | left out: `text.verbosity` |
//! | `max_output_tokens` (> 0) | `max_tokens` |
//! | `temperature`, `top_p` | the same |
//! | `reasoning.effort` (`none`, `minimal`, `low`, `medium`, `high`, `xhigh`) | `reasoning_effort`, as given |
//! | `reasoning.summary` | left out: `reasoning.summary` |
//! | `include` entries | left out: `include.<entry>` (nothing more can be included) |
//! | `user` | `user` |
//! | `metadata`, `prompt_cache_key`, `safety_identifier`, `client_metadata` | not forwarded, not "dropped": they label the request without changing the answer (`metadata` is echoed, `prompt_cache_key` kept in [`Translated::prompt_cache_key`]) |
//! | `service_tier`, `truncation` (but `"disabled"`), `background` (but `false`), `top_logprobs`, `stream_options`, `max_tool_calls` | left out by name |
//! | `store: true` | 400: this gateway keeps no responses |
//! | `previous_response_id` | 400 unless [`Options::previous_found`] (the WebSocket mode's previous response, whose messages the caller puts in [`Options::history`]) |
//! | `conversation`, `prompt` | 400: their items live in OpenAI's store |
//! | any other field | left out by its name (never refused) |
//!
//! Input items (an item without `type` but with `role` is a message; every
//! item's `id` and `status` are not forwarded):
//! - `message` (roles `user`, `assistant`, `system`, `developer` →
//!   `system`; `content` a string or parts): text parts (`input_text`,
//!   `output_text`, `refusal`) joined with "\n" into a string `content`; a
//!   user message with images keeps its parts in order as chat parts;
//!   `input_image` (user messages only) with an http(s) or base64 data
//!   `image_url` (over [`Options::max_image_bytes`] decoded: 413) and its
//!   `detail`, one with a `file_id` only left out (`input_image.file_id`);
//!   `input_file` left out (`input_file`);
//! - `function_call`: a `tool_calls` entry (`id` = `call_id`, `arguments`
//!   as sent, a `namespace`'s call under its flat name), joined to the
//!   assistant message just before when there is one (text or calls of
//!   this input), else a new assistant message with `content: null`;
//! - `function_call_output`: a `tool` message; `output` a string or parts
//!   whose text is joined (images and files left out:
//!   `function_call_output.<type>`). Its `call_id` must name a
//!   `function_call` before it (in the input or the history), answered
//!   once: else a 400. A call left without output is sent as it is;
//! - `reasoning`: left out (`reasoning_items`), never forwarded;
//! - hosted tools' items, `custom_tool_call*`, `item_reference`,
//!   `compaction`...: left out (`item.<type>`); an unknown type is a 400;
//! - other keys of an item or a part: left out as `<type>.<key>`.
//!
//! Duplicate top-level keys are refused; inside nested objects the last
//! one is read (the body is rebuilt, so the provider sees only what was
//! read).

mod items;
mod names;
mod parts;
mod request;
mod tools;
mod tune;

#[cfg(test)]
mod tests;

use serde_json::Value;

pub use crate::translate::Invalid;
pub use request::{to_chat, to_chat_at, Echo, Options, Translated};

/// The chat messages `t`'s own `input` gave (instructions and
/// [`Options::history`] excluded): with the answer's messages after them,
/// what the WebSocket mode keeps as the next turn's history.
pub fn history_of(t: &Translated) -> Vec<Value> {
    let Ok(mut body) = serde_json::from_slice::<Value>(&t.body) else {
        return Vec::new();
    };
    match body.get_mut("messages").map(Value::take) {
        Some(Value::Array(mut messages)) if t.input_from <= messages.len() => messages.split_off(t.input_from),
        _ => Vec::new(),
    }
}
