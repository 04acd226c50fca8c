//! The node's translation of a client's chat body into Ollama's `/api/chat`
//! request, over arbitrary bytes.
//!
//! Invariants: never panics; reading the top level raw (plain messages
//! copied as written) gives the same request, or the same error, as
//! reading the whole body as a JSON tree.
#![no_main]

use iop_node::adapter::fuzzing::ollama_chat_body;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    ollama_chat_body(input);
});
