//! Server-sent events: an incremental parser (for upstream streams) and writer.
//!
//! Parsing follows the WHATWG event-stream rules that matter for LLM
//! upstreams: any of `\n`, `\r\n`, `\r` ends a line (also when `\r\n` is
//! split across reads), `:` lines are comments, `data:` loses one leading
//! space, several `data:` lines join with `\n`, a blank line dispatches, and an
//! event without data is dropped.

use bytes::{Buf, BytesMut};

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

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Bytes a line may hold beyond the event limit (a field name and its `: `).
const LINE_OVERHEAD: usize = 16;

/// The event being assembled.
#[derive(Debug, Default)]
struct Pending {
    data: Vec<u8>,
    has_data: bool,
    event: Option<String>,
    /// Bytes held for this event (data and event name).
    size: usize,
}

impl Pending {
    fn reset(&mut self) {
        self.data.clear();
        self.has_data = false;
        self.event = None;
        self.size = 0;
    }

    /// Applies one line (without its terminator); returns a dispatched event.
    fn line(&mut self, line: &[u8], max: usize) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            if !self.has_data {
                self.reset();
                return Ok(None);
            }
            let data = std::mem::take(&mut self.data);
            let event = self.event.take();
            self.reset();
            let data = String::from_utf8(data).map_err(|_| SseError::InvalidUtf8)?;
            return Ok(Some(SseEvent { event, data }));
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                let size = self.size + value.len() + usize::from(self.has_data);
                if size > max {
                    return Err(SseError::EventTooLarge(max));
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
                self.size = size;
            }
            b"event" => {
                let size = self.size + value.len();
                if size > max {
                    return Err(SseError::EventTooLarge(max));
                }
                let name = std::str::from_utf8(value).map_err(|_| SseError::InvalidUtf8)?;
                self.event = Some(name.to_owned());
                self.size = size;
            }
            // `id`, `retry` and unknown fields carry nothing an LLM relay uses.
            _ => {}
        }
        Ok(None)
    }
}

/// Incremental SSE parser; handles \n, \r\n and \r line ends, comments,
/// `id:`/`retry:` fields (ignored), and events split across any byte boundary.
///
/// After an error the event in progress and any buffered input are dropped;
/// the stream should be treated as broken.
#[derive(Debug)]
pub struct SseParser {
    buf: BytesMut,
    max_event_bytes: usize,
    pending: Pending,
    /// The previous line ended with `\r` at the end of the input: a `\n`
    /// arriving next belongs to that line end.
    skip_lf: bool,
    /// A byte-order mark may still be stripped.
    at_start: bool,
    /// `buf[..scanned]` holds no line end: a long line arriving in many
    /// reads is scanned once, not once per read.
    scanned: usize,
}

impl SseParser {
    /// A parser rejecting events above `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max_event_bytes,
            pending: Pending::default(),
            skip_lf: false,
            at_start: true,
            scanned: 0,
        }
    }

    /// Appends input bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Gives the memory of `data`, an event's data read and done with,
    /// for the next event's (when the parser holds none): a stream's
    /// events then take no allocation each.
    pub fn reuse(&mut self, data: String) {
        if self.pending.data.capacity() == 0 {
            let mut data = data.into_bytes();
            data.clear();
            self.pending.data = data;
        }
    }

    /// The memory held for the next event's data, when no event is in
    /// progress (for a stream about to wait long: it then holds none).
    pub fn idle_buffer(&mut self) -> Option<String> {
        if self.pending.has_data || self.pending.data.capacity() == 0 {
            return None;
        }
        String::from_utf8(std::mem::take(&mut self.pending.data)).ok()
    }

    /// Bytes pushed but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Next complete event, `Ok(None)` when more input is needed.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        let result = self.next_inner();
        if result.is_err() {
            self.pending.reset();
            self.buf.clear();
            self.skip_lf = false;
            self.scanned = 0;
        }
        result
    }

    fn next_inner(&mut self) -> Result<Option<SseEvent>, SseError> {
        if self.at_start {
            if self.buf.starts_with(BOM) {
                self.buf.advance(BOM.len());
            } else if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                // Possibly a split BOM (or no input yet): wait for more.
                return Ok(None);
            }
            self.at_start = false;
        }
        loop {
            if self.skip_lf {
                match self.buf.first() {
                    None => return Ok(None),
                    Some(b'\n') => {
                        self.buf.advance(1);
                        self.scanned = self.scanned.saturating_sub(1);
                    }
                    Some(_) => {}
                }
                self.skip_lf = false;
            }
            // Any one line, finished or not, is bounded by the event limit plus
            // room for a field name, so a peer cannot grow `buf` forever; the
            // same bound for both keeps the outcome independent of how the
            // input was split.
            let max_line = self.max_event_bytes.saturating_add(LINE_OVERHEAD);
            let from = self.scanned.min(self.buf.len());
            let Some(end) = memchr::memchr2(b'\n', b'\r', &self.buf[from..]).map(|i| from + i) else {
                self.scanned = self.buf.len();
                if self.buf.len() > max_line {
                    return Err(SseError::EventTooLarge(self.max_event_bytes));
                }
                return Ok(None);
            };
            self.scanned = 0;
            if end > max_line {
                return Err(SseError::EventTooLarge(self.max_event_bytes));
            }
            let event = self.pending.line(&self.buf[..end], self.max_event_bytes)?;
            let cr = self.buf[end] == b'\r';
            self.buf.advance(end + 1);
            if cr {
                match self.buf.first() {
                    Some(b'\n') => self.buf.advance(1),
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            if event.is_some() {
                return Ok(event);
            }
        }
    }
}

/// Appends `data: <line>\n` for each line of `data`, then a blank line.
/// `\r\n` and `\r` also end lines, as they would for a reader.
pub fn write_event(out: &mut BytesMut, data: &[u8]) {
    out.reserve(data.len() + 8);
    let mut rest = data;
    loop {
        out.extend_from_slice(b"data: ");
        match memchr::memchr2(b'\n', b'\r', rest) {
            Some(end) => {
                out.extend_from_slice(&rest[..end]);
                out.extend_from_slice(b"\n");
                let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') { 2 } else { 1 };
                rest = &rest[end + skip..];
            }
            None => {
                out.extend_from_slice(rest);
                out.extend_from_slice(b"\n\n");
                return;
            }
        }
    }
}

/// Appends `data: [DONE]\n\n`.
pub fn write_done(out: &mut BytesMut) {
    write_event(out, b"[DONE]");
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(data: &str) -> SseEvent {
        SseEvent { event: None, data: data.to_owned() }
    }

    /// Parses `input` pushed in pieces split at `splits`.
    fn parse_split(input: &[u8], splits: &[usize], max: usize) -> Result<Vec<SseEvent>, SseError> {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        let mut last = 0;
        for &s in splits.iter().chain(std::iter::once(&input.len())) {
            let s = s.clamp(last, input.len());
            p.push(&input[last..s]);
            last = s;
            while let Some(e) = p.next_event()? {
                out.push(e);
            }
        }
        Ok(out)
    }

    const OPENAI: &[u8] = b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\nevent: message\r\ndata: line1\r\ndata:line2\r\nid: 7\r\nretry: 10\r\n\r\ndata: x\rdata:  y\r\rdata: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            ev("{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}"),
            SseEvent { event: Some("message".into()), data: "line1\nline2".into() },
            ev("x\n y"),
            ev("[DONE]"),
        ]
    }

    #[test]
    fn an_events_memory_holds_the_next_and_goes_when_idle() {
        let mut p = SseParser::new(1024);
        p.push(b"data: one\n\ndata: two\n\n");
        let one = p.next_event().unwrap().unwrap();
        let at = one.data.as_ptr();
        p.reuse(one.data);
        let two = p.next_event().unwrap().unwrap();
        assert_eq!((two.data.as_str(), two.data.as_ptr()), ("two", at));
        p.reuse(two.data);
        // Mid-event the buffer stays; between events it may go.
        p.push(b"data: three\n");
        assert_eq!(p.next_event(), Ok(None));
        assert_eq!(p.idle_buffer(), None);
        p.push(b"\n");
        let three = p.next_event().unwrap().unwrap();
        assert_eq!(three.data, "three");
        p.reuse(three.data);
        let idle = p.idle_buffer().unwrap();
        assert!(idle.is_empty() && idle.capacity() > 0);
        assert_eq!(p.idle_buffer(), None, "none held now");
    }

    #[test]
    fn a_long_line_in_many_pieces_is_scanned_once() {
        let mut p = SseParser::new(1 << 20);
        p.push(b"data: ");
        for _ in 0..1000 {
            p.push(&[b'x'; 100]);
            assert_eq!(p.next_event(), Ok(None));
            // Everything buffered is known to hold no line end.
            assert_eq!(p.scanned, p.buffered());
        }
        p.push(b"\n\n");
        let ev = p.next_event().unwrap().unwrap();
        assert_eq!(ev.data.len(), 100_000);
        assert_eq!((p.scanned, p.buffered()), (0, 0));
    }

    #[test]
    fn sse_parses_stream() {
        assert_eq!(parse_split(OPENAI, &[], 1024).unwrap(), expected());
    }

    #[test]
    fn sse_every_split_point() {
        for split in 0..=OPENAI.len() {
            assert_eq!(parse_split(OPENAI, &[split], 1024).unwrap(), expected(), "split {split}");
        }
        let bytewise: Vec<usize> = (0..OPENAI.len()).collect();
        assert_eq!(parse_split(OPENAI, &bytewise, 1024).unwrap(), expected());
    }

    #[test]
    fn sse_crlf_split_across_pushes() {
        let mut p = SseParser::new(100);
        p.push(b"data: a\r");
        assert_eq!(p.next_event().unwrap(), None);
        p.push(b"\n");
        assert_eq!(p.next_event().unwrap(), None);
        p.push(b"\r");
        assert_eq!(p.next_event().unwrap(), Some(ev("a")));
        p.push(b"\ndata: b\r\n\r\n");
        assert_eq!(p.next_event().unwrap(), Some(ev("b")));
        assert_eq!(p.next_event().unwrap(), None);
    }

    #[test]
    fn sse_skips_events_without_data_and_handles_bom() {
        let input = b"\xEF\xBB\xBFevent: ping\n\nid: 3\n\n:comment\n\ndata\n\ndata:\n\n";
        assert_eq!(parse_split(input, &[1, 2], 100).unwrap(), vec![ev(""), ev("")]);
        // An incomplete event at end of input is never dispatched.
        assert_eq!(parse_split(b"data: x\n", &[], 100).unwrap(), vec![]);
    }

    #[test]
    fn sse_event_size_limit() {
        assert_eq!(parse_split(b"data: 12345\n\n", &[], 5).unwrap(), vec![ev("12345")]);
        assert_eq!(parse_split(b"data: 123456\n\n", &[], 5), Err(SseError::EventTooLarge(5)));
        assert_eq!(parse_split(b"data: 123\ndata: 45\n\n", &[], 5), Err(SseError::EventTooLarge(5)));
        // A line that never ends is refused while incomplete, once it is
        // longer than the limit plus room for a field name.
        let mut p = SseParser::new(16);
        p.push(b"data: ");
        assert_eq!(p.next_event().unwrap(), None);
        p.push(&[b'a'; 26]);
        assert_eq!(p.next_event().unwrap(), None);
        p.push(b"a");
        assert_eq!(p.next_event(), Err(SseError::EventTooLarge(16)));
        assert_eq!(p.buffered(), 0);
        // The same bound holds for a finished line, so splitting never matters.
        let long_comment = [b":".as_slice(), &[b'c'; 40], b"\ndata: ok\n\n"].concat();
        for splits in [&[][..], &[3, 20]] {
            assert_eq!(parse_split(&long_comment, splits, 16), Err(SseError::EventTooLarge(16)));
        }
        // The fuzzer's regressions: the outcome does not depend on the split.
        for (input, max) in [(&b":\n"[..], 0), (&b"data: 12345\n\n"[..], 5)] {
            let whole = parse_split(input, &[], max);
            let bytewise = parse_split(input, &(1..input.len()).collect::<Vec<_>>(), max);
            assert_eq!(whole, bytewise, "{:?}", String::from_utf8_lossy(input));
        }
        // Comments do not count towards an event.
        let mut input = Vec::new();
        for _ in 0..10 {
            input.extend_from_slice(b": 0123456789\n");
        }
        input.extend_from_slice(b"data: ok\n\n");
        assert_eq!(parse_split(&input, &[], 16).unwrap(), vec![ev("ok")]);
    }

    #[test]
    fn sse_invalid_utf8() {
        assert_eq!(parse_split(b"data: \xff\xfe\n\n", &[], 100), Err(SseError::InvalidUtf8));
        assert_eq!(parse_split(b"event: \xff\ndata: x\n\n", &[], 100), Err(SseError::InvalidUtf8));
        // The parser continues after an error with fresh input.
        let mut p = SseParser::new(100);
        p.push(b"data: \xff\n\n");
        assert!(p.next_event().is_err());
        p.push(b"data: ok\n\n");
        assert_eq!(p.next_event().unwrap(), Some(ev("ok")));
    }

    #[test]
    fn sse_write_event_splits_lines() {
        let mut out = BytesMut::new();
        write_event(&mut out, b"a\nb\r\nc\rd");
        write_event(&mut out, b"");
        write_done(&mut out);
        assert_eq!(&out[..], &b"data: a\ndata: b\ndata: c\ndata: d\n\ndata: \n\ndata: [DONE]\n\n"[..]);
        assert_eq!(parse_split(&out, &[], 100).unwrap(), vec![ev("a\nb\nc\nd"), ev(""), ev("[DONE]")]);
    }

    proptest! {
        #[test]
        fn sse_arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..512),
                                           splits in proptest::collection::vec(0usize..512, 0..6),
                                           max in 0usize..64) {
            let mut splits = splits;
            splits.sort_unstable();
            if let Ok(events) = parse_split(&input, &splits, max) {
                for e in events {
                    prop_assert!(e.data.len() <= max);
                }
            }
        }

        #[test]
        fn sse_random_splits_match_whole(events in proptest::collection::vec("[a-z\n\r {}:\"]{0,40}", 0..8),
                                         crlf: bool,
                                         splits in proptest::collection::vec(0usize..2048, 0..8)) {
            let mut wire = BytesMut::new();
            for e in &events {
                write_event(&mut wire, e.as_bytes());
            }
            let wire = if crlf {
                String::from_utf8(wire.to_vec()).unwrap().replace('\n', "\r\n").into_bytes()
            } else {
                wire.to_vec()
            };
            let mut splits = splits;
            splits.sort_unstable();
            let whole = parse_split(&wire, &[], 4096).unwrap();
            let parts = parse_split(&wire, &splits, 4096).unwrap();
            prop_assert_eq!(&whole, &parts);
            let normalized: Vec<String> =
                events.iter().map(|e| e.replace("\r\n", "\n").replace('\r', "\n")).collect();
            let got: Vec<String> = whole.into_iter().map(|e| e.data).collect();
            prop_assert_eq!(got, normalized);
        }
    }
}
