//! The Anthropic Messages API (`POST /v1/messages`) for providers that do
//! not speak it: [`to_chat`] translates a request into an OpenAI
//! chat-completions body, which then runs on the node's normalized path.
//!
//! Nothing is lost silently: what the translation cannot honour is left
//! out and named in [`Translated::dropped`]; what it cannot read is refused
//! with an [`Invalid`] naming the field (`param`, a dotted path). `null`
//! counts as absent for optional fields.
//!
//! | Anthropic | OpenAI chat |
//! |---|---|
//! | `model` (required string) | `model`: the target |
//! | `max_tokens` (required, > 0) | `max_tokens` |
//! | `stream` | `stream`, with `stream_options.include_usage` (the edge accounts usage) |
//! | `system` (string or text blocks) | one leading `system` message, a string: blocks joined with "\n" |
//! | `messages` | below |
//! | `tools` (custom, with or without `"type":"custom"`) | function tools (`input_schema` → `parameters`, `strict` kept) |
//! | `tools` (hosted: `web_search_*`, `bash_*`, `text_editor_*`...) | left out: `tools.<type>` |
//! | `tool_choice` `auto` / `any` / `tool` / `none` | `"auto"` / `"required"` / `{"type":"function",..}` / `"none"` |
//! | `tool_choice.disable_parallel_tool_use: true` | `parallel_tool_calls: false` |
//! | `stop_sequences` | `stop` |
//! | `temperature`, `top_p`, `top_k` | same names (`top_k` is an extension vLLM, llama.cpp and Ollama's `/v1` read) |
//! | `metadata.user_id` | `user`; other metadata keys left out: `metadata.<key>` |
//! | `thinking`, `output_config.effort` | `reasoning_effort` (rule below) |
//! | `output_config.format`, `output_format` (beta) | `response_format` `json_schema` named "output" |
//! | `context_management`, `container`, `mcp_servers`, `service_tier`, `inference_geo` | left out by name |
//! | any other field | left out by its name (never refused) |
//!
//! Effort: `thinking.type` "disabled" gives `"none"`; otherwise
//! `output_config.effort` (low, medium; high, xhigh and max → high) when
//! given; otherwise the budget of "enabled" (< 4096 low, < 16384 medium,
//! else high); "adaptive" alone leaves the provider's default.
//! [`Translated::thinking`] says whether thinking was asked ("enabled" or
//! "adaptive").
//!
//! Messages (roles `user` and `assistant` only; `content` a string or
//! blocks):
//! - text blocks of a message are joined with "\n" into a string `content`;
//!   a user message with images keeps its parts in order as OpenAI content
//!   parts (`text`, `image_url`);
//! - `image` (user messages only): base64 as a data URL (jpeg, png, gif,
//!   webp; over [`Limits::max_image_bytes`] decoded is a 413), `url` as
//!   is, a Files API `file` left out (`image.source.file`);
//! - `tool_use` (assistant only): a `tool_calls` entry, `input` as compact
//!   JSON text; text beside calls stays `content` (`null` when none);
//! - `tool_result` (user only): a `tool` message, placed before the rest of
//!   its user message; its text blocks joined with "\n", images and other
//!   blocks left out (`tool_result.<type>`); `is_error` results read
//!   `"Error: <content>"`. Each must answer a `tool_use` of the message just
//!   before, and each `tool_use` must be answered in the message just
//!   after, as Anthropic requires: else a 400;
//! - `thinking`, `redacted_thinking`: left out (`thinking_blocks`), never
//!   forwarded;
//! - `document`, `search_result`, server tools' blocks: left out
//!   (`block.<type>`); an unknown type is a 400;
//! - `cache_control` anywhere: left out (`cache_control`); other unknown
//!   keys of a block: left out as `<type>.<key>`.
//!
//! A message left with nothing to carry still keeps its turn (empty
//! content), except a user message of tool results only. A trailing
//! assistant message (a prefill) goes as the last assistant message; a
//! provider may answer after it rather than continue it.
//!
//! Duplicate top-level keys are refused; inside nested objects the last
//! one is read (the body is rebuilt, so the provider sees only what was
//! read).

mod blocks;
mod read;
mod request;
mod tools;

#[cfg(test)]
mod tests;

pub use request::{to_chat, to_chat_at, Invalid, Limits, Translated};
