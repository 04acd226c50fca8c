//! The OpenAI-compatible surface: chat completions (streamed and not), the
//! model list, and OpenAI-shaped errors.

pub mod chat;
mod chunk;
pub mod error;
pub mod models;
mod request;
