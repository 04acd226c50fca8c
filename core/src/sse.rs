//! Server-sent events: an incremental parser (for upstream streams) and writer.
// SKELETON — to be completed by the http helper.

use bytes::BytesMut;

/// One parsed event. `data` lines are joined with '\n'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` field, if any.
    pub event: Option<String>,
    /// Joined `data:` lines.
    pub data: String,
}

/// SSE parse failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event larger than the configured maximum.
    #[error("server-sent event larger than {0} bytes")]
    EventTooLarge(usize),
    /// Event data is not UTF-8.
    #[error("server-sent event is not valid UTF-8")]
    InvalidUtf8,
}

/// Incremental SSE parser; handles \n, \r\n and \r line ends, comments,
/// `id:`/`retry:` fields (ignored), and events split across any byte boundary.
#[derive(Debug)]
pub struct SseParser {
    _private: (),
}

impl SseParser {
    /// A parser rejecting events above `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        let _ = max_event_bytes;
        unimplemented!()
    }

    /// Appends input bytes.
    pub fn push(&mut self, data: &[u8]) {
        let _ = data;
        unimplemented!()
    }

    /// Next complete event, `Ok(None)` when more input is needed.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        unimplemented!()
    }
}

/// Appends `data: <line>\n` for each line of `data`, then a blank line.
pub fn write_event(out: &mut BytesMut, data: &[u8]) {
    let _ = (out, data);
    unimplemented!()
}

/// Appends `data: [DONE]\n\n`.
pub fn write_done(out: &mut BytesMut) {
    write_event(out, b"[DONE]");
}
