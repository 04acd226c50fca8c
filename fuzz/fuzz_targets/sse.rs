//! `sse::SseParser` over arbitrary bytes pushed in arbitrary chunks.
//!
//! Input: `[max selector, split seed, bytes...]`.
//! Invariants: never panics; no event (data plus event name) exceeds the
//! configured maximum; while waiting for input the parser never buffers more
//! than the maximum plus room for a field name (a peer cannot grow it
//! forever); an error drops all
//! buffered input; every event's data survives `write_event` and a re-parse;
//! pushing in chunks gives the same events and error as pushing all at once.
#![no_main]

use bytes::BytesMut;
use iop_core::sse::{write_event, SseError, SseEvent, SseParser};
use iop_fuzz::{chunks, params};
use libfuzzer_sys::fuzz_target;

fn run(pieces: &[&[u8]], max: usize) -> (Vec<SseEvent>, Option<SseError>) {
    let mut p = SseParser::new(max);
    let mut events = Vec::new();
    for piece in pieces {
        p.push(piece);
        loop {
            match p.next_event() {
                Ok(Some(e)) => {
                    let size = e.data.len() + e.event.as_ref().map_or(0, String::len);
                    assert!(size <= max, "event of {size} bytes with max {max}");
                    events.push(e);
                }
                Ok(None) => {
                    // One unfinished line: the maximum plus 16 bytes for a field name
                    // (or up to 2 bytes of a possibly split BOM).
                    assert!(p.buffered() <= (max + 16).max(2), "{} bytes buffered with max {max}", p.buffered());
                    break;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    assert_eq!(p.buffered(), 0, "error kept buffered input");
                    return (events, Some(e));
                }
            }
        }
    }
    (events, None)
}

fn rewrite(e: &SseEvent) {
    let mut wire = BytesMut::new();
    write_event(&mut wire, e.data.as_bytes());
    let mut p = SseParser::new(wire.len());
    p.push(&wire);
    let back = p.next_event().expect("re-parse").expect("one event");
    assert_eq!(back.data, e.data, "write_event + parse changed the data");
    assert_eq!(p.next_event(), Ok(None));
    assert_eq!(p.buffered(), 0);
}

fuzz_target!(|input: &[u8]| {
    let Some(([max_sel, split], data)) = params::<2>(input) else { return };
    let max = if max_sel & 0x80 != 0 { usize::from(max_sel & 0x7f) * 64 } else { usize::from(max_sel) };
    let whole = run(&[data], max);
    for e in &whole.0 {
        rewrite(e);
    }
    let split = run(&chunks(split, data), max);
    // fuzz/regressions/sse/ holds the inputs that once broke this (the bound
    // on an unfinished line differed from the one on a finished line).
    assert_eq!(split, whole, "chunked pushing changed the result");
});
