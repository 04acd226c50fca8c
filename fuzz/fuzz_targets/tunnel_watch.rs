//! The node's tunnel body watch (usage read from an SSE stream or a JSON
//! body, the usage-only event left out when the edge asked) over arbitrary
//! bytes in arbitrary chunks.
//!
//! Input: `[flags, split seed, bytes...]`; flags bit 0: SSE (else JSON),
//! bit 1: hide the usage-only event.
//! Invariants: never panics; without hiding, the relayed bytes are the
//! input byte for byte; with hiding, they are a subsequence of whole events
//! (never more bytes than came); pushing in chunks gives the same bytes,
//! usage and end (the terminal event seen in both or neither) as pushing
//! all at once; only an SSE stream has a terminal event.
#![no_main]

use iop_fuzz::{chunks, params};
use iop_node::adapter::fuzzing::tunnel_watch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some(([flags, seed], data)) = params::<2>(input) else { return };
    let ct: &[u8] = if flags & 1 == 1 { b"text/event-stream; charset=utf-8" } else { b"application/json" };
    let hide = flags & 2 == 2;
    let (whole, usage, ended) = tunnel_watch(ct, hide, &[data]);
    if hide && flags & 1 == 1 {
        assert!(whole.len() <= data.len(), "relayed more than came");
    } else {
        assert_eq!(whole, data, "not byte for byte");
    }
    assert!(flags & 1 == 1 || !ended, "a JSON body has no terminal event");
    let pieces = chunks(seed, data);
    let (chunked, chunked_usage, chunked_ended) = tunnel_watch(ct, hide, &pieces);
    assert_eq!((chunked, chunked_usage), (whole, usage), "chunked differs from whole");
    assert_eq!(chunked_ended, ended, "the end seen in one feed and not the other");
});
