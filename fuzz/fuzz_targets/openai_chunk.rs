//! The node's OpenAI chat-completion chunk mapping (one SSE event's data
//! to run events) over arbitrary bytes.
//!
//! Invariants: never panics; what the hand scanner reads, serde reads the
//! same (and whatever it takes, serde takes).
#![no_main]

use iop_node::adapter::fuzzing::openai_chunk;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    openai_chunk(data);
});
