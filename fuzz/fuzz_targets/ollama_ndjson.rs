//! The node's Ollama `/api/chat` NDJSON mapping (line splitter, then each
//! line to run events) over arbitrary bytes in arbitrary chunks.
//!
//! Input: `[line limit selector, split seed, bytes...]`.
//! Invariants: never panics; while waiting for a line's end the splitter
//! holds at most the line limit; pushing in chunks gives the same events
//! (and the same too-long verdict) as pushing all at once.
#![no_main]

use iop_fuzz::{chunks, params};
use iop_node::adapter::fuzzing::ollama_ndjson;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some(([limit, seed], data)) = params::<2>(input) else { return };
    let max = 16 + usize::from(limit) * 16;
    let whole = ollama_ndjson(&[data], max);
    let pieces = chunks(seed, data);
    assert_eq!(ollama_ndjson(&pieces, max), whole, "chunked differs from whole");
});
