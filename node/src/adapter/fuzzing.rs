//! Entry points for the fuzz targets (`fuzz/`): the node's parsers of
//! provider bytes, driven as the adapters drive them. Not an API.

use bytes::Bytes;
use iop_core::exec::{ExecEvent, Usage};

use super::{ollama_stream, openai_stream::Flow};

/// Translates a client's chat body for Ollama both ways (raw top level and
/// plain messages copied, or the whole body as a tree); panics when they
/// disagree: a different error, a different request, or output that is
/// not JSON.
pub fn ollama_chat_body(body: &[u8]) {
    use super::ollama_request::{chat_body, chat_body_with};
    let raw = chat_body(body, "target");
    let tree = chat_body_with(body, "target", false);
    match (raw, tree) {
        (Ok(a), Ok(b)) => {
            let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
            let (pa, pb) = (parse(&a.body), parse(&b.body));
            assert!(pa.is_some(), "the request is not JSON");
            assert_eq!(pa, pb, "the two translations differ");
            assert_eq!(a.stream, b.stream);
        }
        // Different errors, or only one way failed.
        (a, b) => assert_eq!(a.err().map(|e| e.message), b.err().map(|e| e.message), "raw and tree disagree"),
    }
}

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
                    fast_line_agrees(&line);
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
            fast_line_agrees(&line);
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

/// Panics when the hand scanner reads a line serde reads differently (or
/// refuses).
fn fast_line_agrees(line: &[u8]) {
    if let Some(fast) = super::ollama_line::parse(line) {
        let slow = serde_json::from_slice::<ollama_stream::ChatLine>(line);
        assert_eq!(Ok(format!("{fast:?}")), slow.map(|l| format!("{l:?}")).map_err(|e| e.to_string()), "fast path");
    }
}

/// Maps `data` as one SSE event's data of an OpenAI chat-completion
/// stream; panics when the hand scanner reads it differently from serde
/// (or takes what serde refuses). The events it maps to.
pub fn openai_chunk(data: &[u8]) -> Vec<ExecEvent> {
    let Ok(text) = std::str::from_utf8(data) else { return Vec::new() };
    if let Some(fast) = super::openai_line::parse(text) {
        let slow = serde_json::from_str::<super::openai_stream::CompletionJson>(text);
        assert_eq!(Ok(format!("{fast:?}")), slow.map(|l| format!("{l:?}")).map_err(|e| e.to_string()), "fast path");
    }
    let mut state = super::openai_stream::StreamState::new("target");
    let mut events = Vec::new();
    state.on_data(text, &mut events);
    events
}

/// Relays `pieces` of a tunnel's body of `content_type` through the usage
/// watch as the tunnel does (all of them: the watch must hold up past a
/// terminal event too); the relayed bytes, the usage found and whether the
/// terminal event was seen.
pub fn tunnel_watch(content_type: &[u8], hide_usage_chunk: bool, pieces: &[&[u8]]) -> (Vec<u8>, Option<Usage>, bool) {
    let mut watch = crate::tunnel::watch::BodyWatch::new(Some(content_type), hide_usage_chunk);
    let mut out: Vec<Bytes> = Vec::new();
    for piece in pieces {
        watch.push(Bytes::copy_from_slice(piece), &mut out);
    }
    let ended = watch.ended();
    let usage = watch.finish(&mut out);
    (out.iter().flat_map(|b| b.iter().copied()).collect(), usage, ended)
}
