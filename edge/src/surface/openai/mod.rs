//! The OpenAI dialect: chat completions and embeddings answered from a
//! normalized run ([`chat`], in OpenAI's exact chunk and aggregate shapes),
//! the Responses API answer of a normalized run ([`responses`]) and
//! OpenAI-shaped errors. The routes' admission, the
//! tunnel and replay are the dialect-neutral exchange's
//! ([`super::exchange`]).

mod aggregate;
pub mod chat;
pub mod chunk;
pub mod error;
pub mod responses;
