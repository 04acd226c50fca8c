//! Entry points for the fuzz targets (`fuzz/`): the node's parsers of
//! provider bytes, driven as the adapters drive them. Not an API.

use bytes::Bytes;
use iop_core::exec::{ExecEvent, Usage};

use super::{ollama_stream, openai_stream::Flow};

/// What an Ollama NDJSON answer fed in `pieces` produced.
#[derive(Debug, PartialEq)]
pub struct NdjsonOutcome {
    /// The run events, in order.
    pub events: Vec<ExecEvent>,
    /// A line outgrew the limit (the answer then fails).
    pub too_long: bool,
}

/// Splits `pieces` into lines (at most `max` bytes each) and maps each as
/// `/api/chat` answers are mapped, then the end of the body. Panics when
/// more than `max + 1` bytes stay buffered while waiting for a line's end.
pub fn ollama_ndjson(pieces: &[&[u8]], max: usize) -> NdjsonOutcome {
    let mut lines = ollama_stream::LineSplitter::new(max);
    let mut chat = ollama_stream::ChatStream::new("run", "target");
    let mut events = Vec::new();
    for piece in pieces {
        lines.push(piece);
        loop {
            match lines.next_line() {
                Ok(Some(line)) => {
                    if chat.on_line(&line, &mut events) == Flow::Done {
                        return NdjsonOutcome { events, too_long: false };
                    }
                }
                Ok(None) => break,
                Err(_) => return NdjsonOutcome { events, too_long: true },
            }
        }
        // The limit, plus a `\r` whose `\n` may come next.
        assert!(lines.buffered() <= max + 1, "{} bytes buffered, line limit {max}", lines.buffered());
    }
    match lines.finish() {
        Ok(Some(line)) => {
            if chat.on_line(&line, &mut events) == Flow::Done {
                return NdjsonOutcome { events, too_long: false };
            }
        }
        Ok(None) => {}
        Err(_) => return NdjsonOutcome { events, too_long: true },
    }
    chat.on_eof(&mut events);
    NdjsonOutcome { events, too_long: false }
}

/// Relays `pieces` of a tunnel's body of `content_type` through the usage
/// watch as the tunnel does; the relayed bytes and the usage found.
pub fn tunnel_watch(content_type: &[u8], hide_usage_chunk: bool, pieces: &[&[u8]]) -> (Vec<u8>, Option<Usage>) {
    let mut watch = crate::tunnel::watch::BodyWatch::new(Some(content_type), hide_usage_chunk);
    let mut out: Vec<Bytes> = Vec::new();
    for piece in pieces {
        watch.push(Bytes::copy_from_slice(piece), &mut out);
    }
    let usage = watch.finish(&mut out);
    (out.iter().flat_map(|b| b.iter().copied()).collect(), usage)
}
