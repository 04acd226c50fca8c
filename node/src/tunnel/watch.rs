//! Watches a provider's answer while the tunnel relays it: finds the usage
//! the provider reported (in an SSE stream or a JSON body), notices the
//! stream's terminal event (after which the answer is over, whether or not
//! the provider closes) and, when the edge asked, leaves the usage-only SSE
//! event out of the relayed bytes.
//! Sans-IO. Relayed bytes are slices of the chunks read from the provider;
//! only an event split across two reads is copied (once, to look at it).

use bytes::{Bytes, BytesMut};
use iop_core::exec::Usage;

use super::json_top;

/// Largest SSE event looked at for usage (usage events are small); a larger
/// one is relayed but not inspected.
const MAX_WATCHED_EVENT: usize = 1 << 20;
/// Largest JSON body whose usage is read (embeddings can be big).
const MAX_WATCHED_JSON: usize = 32 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Sse,
    Json,
    Other,
}

/// See the module docs.
#[derive(Debug)]
pub struct BodyWatch {
    mode: Mode,
    hide_usage_chunk: bool,
    /// Bytes of the current line so far, without its terminator.
    line_len: usize,
    /// The last byte seen was a CR: a LF next is the same line end.
    after_cr: bool,
    /// The start of the current event, from earlier chunks (SSE).
    carry: BytesMut,
    /// The current event outgrew `MAX_WATCHED_EVENT`: not inspected.
    carry_overflow: bool,
    /// The last chunk ended with the CR of an event's blank line, and
    /// whether that event was kept: a LF first in the next chunk completes
    /// its CRLF and goes with it.
    cr_ended: Option<bool>,
    /// JSON body chunks (shared, not copied) until the end.
    json: Vec<Bytes>,
    json_len: usize,
    usage: Option<Usage>,
    /// A terminal event was seen (SSE).
    ended: bool,
}

impl BodyWatch {
    /// A watch for a body of `content_type`. `hide_usage_chunk`: the edge
    /// asked the provider for usage the client did not ask for.
    pub fn new(content_type: Option<&[u8]>, hide_usage_chunk: bool) -> Self {
        // The media type: before any parameter, trimmed, any case.
        let ct = content_type.unwrap_or_default();
        let ct = ct.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let ends_with =
            |suffix: &[u8]| ct.len() >= suffix.len() && ct[ct.len() - suffix.len()..].eq_ignore_ascii_case(suffix);
        let mode = if ct.eq_ignore_ascii_case(b"text/event-stream") {
            Mode::Sse
        } else if ct.eq_ignore_ascii_case(b"application/json") || ends_with(b"+json") {
            Mode::Json
        } else {
            Mode::Other
        };
        Self {
            mode,
            hide_usage_chunk: hide_usage_chunk && mode == Mode::Sse,
            line_len: 0,
            after_cr: false,
            carry: BytesMut::new(),
            carry_overflow: false,
            cr_ended: None,
            json: Vec::new(),
            json_len: 0,
            usage: None,
            ended: false,
        }
    }

    /// Whether the stream's terminal event went by: `data: [DONE]` (chat
    /// and completions), `response.completed`/`.failed`/`.incomplete`
    /// (Responses), `message_stop` (Messages). Nothing the provider sends
    /// after it belongs to the answer.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes one chunk of the body; appends to `out` what to relay now.
    pub fn push(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) {
        match self.mode {
            Mode::Other => out.push(chunk),
            Mode::Json => {
                if self.json_len + chunk.len() <= MAX_WATCHED_JSON {
                    self.json_len += chunk.len();
                    self.json.push(chunk.clone());
                } else {
                    self.json.clear();
                    self.json_len = usize::MAX / 2;
                }
                out.push(chunk);
            }
            Mode::Sse => self.push_sse(chunk, out),
        }
    }

    /// The body ended: appends what is still held; returns the usage seen.
    pub fn finish(&mut self, out: &mut Vec<Bytes>) -> Option<Usage> {
        match self.mode {
            Mode::Other => {}
            Mode::Json => {
                if self.json_len <= MAX_WATCHED_JSON {
                    self.usage = match &self.json[..] {
                        [one] => usage_of_body(one),
                        pieces => usage_of_body(&pieces.concat()),
                    };
                }
                self.json.clear();
            }
            Mode::Sse => {
                // An unterminated last event is relayed as it came.
                if self.hide_usage_chunk && !self.carry.is_empty() {
                    out.push(std::mem::take(&mut self.carry).freeze());
                }
            }
        }
        self.usage.take()
    }

    fn push_sse(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) {
        let ends = self.event_ends(&chunk);
        if !self.hide_usage_chunk {
            // Relayed at once; events are only looked at for usage.
            out.push(chunk.clone());
        }
        // `start`: where the current event begins in `chunk`; `run_start`:
        // the first kept byte not yet relayed (hiding only).
        let (mut start, mut run_start) = (0, 0);
        if let (Some(kept), Some(b'\n')) = (self.cr_ended.take(), chunk.first()) {
            // The LF of the last event's CRLF: kept or hidden with that event.
            start = 1;
            if !kept {
                run_start = 1;
            }
        }
        let mut kept = true;
        for end in ends {
            if std::mem::take(&mut self.carry_overflow) {
                // The end of an event too big to be the usage chunk: kept.
                (start, kept) = (end, true);
                continue;
            }
            if !self.carry.is_empty() {
                // The event began in an earlier chunk: looked at whole (the
                // only copy), relayed whole when kept.
                let mut event = std::mem::take(&mut self.carry);
                event.extend_from_slice(&chunk[start..end]);
                kept = self.inspect(&event);
                if self.hide_usage_chunk && kept {
                    out.push(event.freeze());
                }
                (start, run_start) = (end, end);
                continue;
            }
            kept = self.inspect(&chunk[start..end]);
            if self.hide_usage_chunk && !kept {
                if run_start < start {
                    out.push(chunk.slice(run_start..start));
                }
                run_start = end;
            }
            start = end;
        }
        if self.hide_usage_chunk && run_start < start {
            out.push(chunk.slice(run_start..start));
        }
        // The unfinished event waits for its end, unless it is too big to be
        // the usage chunk: then it is relayed as it comes.
        if start == chunk.len() {
            if start > 0 && chunk[start - 1] == b'\r' {
                self.cr_ended = Some(kept);
            }
            return;
        }
        if self.carry_overflow || self.carry.len() + (chunk.len() - start) > MAX_WATCHED_EVENT {
            if self.hide_usage_chunk {
                if !self.carry.is_empty() {
                    out.push(std::mem::take(&mut self.carry).freeze());
                }
                out.push(chunk.slice(start..));
            }
            self.carry.clear();
            self.carry_overflow = true;
        } else {
            self.carry.extend_from_slice(&chunk[start..]);
        }
    }

    /// Offsets in `chunk` just past each event-ending blank line, carrying
    /// the line state across chunks. Lines end with LF, CRLF or CR.
    fn event_ends(&mut self, chunk: &[u8]) -> Vec<usize> {
        let mut ends = Vec::new();
        let mut i = 0;
        while i < chunk.len() {
            let Some(off) = memchr::memchr2(b'\r', b'\n', &chunk[i..]) else {
                self.line_len += chunk.len() - i;
                self.after_cr = false;
                break;
            };
            let at = i + off;
            if off > 0 {
                self.line_len += off;
                self.after_cr = false;
            }
            i = at + 1;
            if chunk[at] == b'\n' && self.after_cr && off == 0 {
                // The LF of a CRLF whose CR ended the line already.
                self.after_cr = false;
                if let Some(last) = ends.last_mut() {
                    if *last == at {
                        *last = at + 1;
                    }
                }
                continue;
            }
            let empty = self.line_len == 0;
            self.line_len = 0;
            self.after_cr = chunk[at] == b'\r';
            if empty {
                ends.push(at + 1);
            }
        }
        ends
    }

    /// Looks at one complete event; false when it is the usage-only event
    /// to leave out.
    fn inspect(&mut self, event: &[u8]) -> bool {
        if is_terminal(event) {
            self.ended = true;
        }
        if !mentions_usage(event) {
            return true;
        }
        let data = event_data(event);
        match usage_of_json(&data) {
            Some((usage, usage_only)) => {
                self.usage = Some(usage);
                !(self.hide_usage_chunk && usage_only)
            }
            None => true,
        }
    }
}

/// Event names that end a stream (Responses, Messages).
const TERMINAL_EVENTS: [&[u8]; 4] =
    [b"response.completed", b"response.failed", b"response.incomplete", b"message_stop"];

/// Whether `event` (one complete SSE event) ends its stream: a `data:
/// [DONE]` line, an `event:` name of [`TERMINAL_EVENTS`], or, in an event
/// without a name, data whose leading `type` member is one of them (how a
/// Responses or Messages event reads when the server leaves the name out).
fn is_terminal(event: &[u8]) -> bool {
    let mut named = false;
    let mut rest = event;
    while !rest.is_empty() {
        let end = memchr::memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or_default();
        if let Some(name) = line.strip_prefix(b"event:") {
            named = true;
            let name = name.strip_prefix(b" ").unwrap_or(name);
            if TERMINAL_EVENTS.contains(&name) {
                return true;
            }
        } else if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if data == b"[DONE]" {
                return true;
            }
            if !named {
                if let Some(after) = data.trim_ascii_start().strip_prefix(br#"{"type":""#) {
                    let name = after.split(|&b| b == b'"').next().unwrap_or_default();
                    if after.len() > name.len() && TERMINAL_EVENTS.contains(&name) {
                        return true;
                    }
                }
            }
        }
    }
    false
}

/// Whether `event` may carry usage: it has a `"usage"` key whose value is
/// not `null`. OpenAI-style streams put `"usage":null` in every chunk when
/// usage was asked for; those need no parse.
fn mentions_usage(event: &[u8]) -> bool {
    // Built once: building a finder costs more than searching a chunk.
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));
    KEY.find_iter(event).any(|at| {
        let rest = &event[at + 7..];
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else { return true };
        !rest.trim_ascii_start().starts_with(b"null")
    })
}

/// The `data:` lines of one event, joined with LF.
fn event_data(event: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        let Some(value) = line.strip_prefix(b"data:") else { continue };
        if !data.is_empty() {
            data.push(b'\n');
        }
        data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
    }
    data
}

/// The usage in a whole JSON answer: its top-level `usage` read from the
/// end (where answers put it: a few members to skip, not the choices),
/// else what [`usage_of_json`] finds (a Responses API event's
/// `response.usage`, or a usage the end scan could not read).
fn usage_of_body(json: &[u8]) -> Option<Usage> {
    json_top::last_member(json, b"usage")
        .filter(|u| !json_top::is_null(u))
        .and_then(usage_object)
        .or_else(|| usage_of_json(json).map(|(u, _)| u))
}

/// The usage in a JSON document, and whether the document is a usage-only
/// chunk (`"choices": []`): the top level of a chat/completions/embeddings
/// body or chunk, or of a Responses API event (whose usage sits in
/// `response`). Only the usage object is parsed; the rest is scanned.
fn usage_of_json(json: &[u8]) -> Option<(Usage, bool)> {
    fn present(v: Option<&[u8]>) -> Option<&[u8]> {
        v.filter(|v| !json_top::is_null(v))
    }
    let [usage, choices, response] = json_top::members(json, [b"usage", b"choices", b"response"])?;
    let usage_only = present(usage).is_some() && choices.is_some_and(json_top::is_empty_array);
    let usage = match present(usage) {
        Some(u) => u,
        None => {
            let [u] = json_top::members(present(response)?, [b"usage"])?;
            present(u)?
        }
    };
    Some((usage_object(usage)?, usage_only))
}

/// An OpenAI usage object (chat and completions name the counts
/// `prompt_`/`completion_tokens`, the Responses API `input_`/`output_`);
/// `None` without an input count.
fn usage_object(json: &[u8]) -> Option<Usage> {
    let [prompt, completion, input, output, prompt_details, input_details, completion_details, output_details] =
        json_top::members(
            json,
            [
                b"prompt_tokens",
                b"completion_tokens",
                b"input_tokens",
                b"output_tokens",
                b"prompt_tokens_details",
                b"input_tokens_details",
                b"completion_tokens_details",
                b"output_tokens_details",
            ],
        )?;
    let detail = |details: Option<&[u8]>, key: &[u8]| {
        let [v] = json_top::members(details?, [key])?;
        count(v)
    };
    Some(Usage {
        input_tokens: count(prompt).or(count(input))?,
        output_tokens: count(completion).or(count(output)).unwrap_or(0),
        reasoning_tokens: detail(completion_details, b"reasoning_tokens")
            .or_else(|| detail(output_details, b"reasoning_tokens")),
        cached_input_tokens: detail(prompt_details, b"cached_tokens")
            .or_else(|| detail(input_details, b"cached_tokens")),
    })
}

/// A token count: a non-negative integer (`null` or anything else: none).
fn count(value: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(value?).ok()?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn usage_null_needs_no_parse_but_a_usage_object_does() {
        assert!(!mentions_usage(br#"data: {"choices":[{"delta":{"content":"x"}}],"usage":null}"#));
        assert!(!mentions_usage(br#"data: {"usage" :  null,"choices":[]}"#));
        assert!(!mentions_usage(br#"data: {"choices":[{"delta":{"content":"no key here"}}]}"#));
        assert!(mentions_usage(br#"data: {"choices":[],"usage":{"prompt_tokens":1}}"#));
        assert!(mentions_usage(
            br#"data: {"choices":[{"delta":{"content":"\"usage\""}}],"usage":null,"x":{"usage":{}}}"#
        ));
        // An escaped mention alone is no key.
        assert!(!mentions_usage(br#"data: {"note":"the word \"usage\" alone","usage":null}"#));
        assert!(mentions_usage(br#"data: {"usage" "#));
    }

    #[test]
    fn usage_objects_of_each_api() {
        let u = |json: &str| usage_object(json.as_bytes());
        let chat = r#"{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,
            "prompt_tokens_details":{"cached_tokens":1,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":3}}"#;
        assert_eq!(
            u(chat),
            Some(Usage { input_tokens: 5, output_tokens: 2, reasoning_tokens: Some(3), cached_input_tokens: Some(1) })
        );
        let responses = r#"{"input_tokens":4,"output_tokens":6,"input_tokens_details":{"cached_tokens":2},
            "output_tokens_details":{"reasoning_tokens":null}}"#;
        assert_eq!(
            u(responses),
            Some(Usage { input_tokens: 4, output_tokens: 6, reasoning_tokens: None, cached_input_tokens: Some(2) })
        );
        assert_eq!(u(r#"{"prompt_tokens":9}"#), Some(Usage { input_tokens: 9, ..Default::default() }));
        for none in [
            r#"{"completion_tokens":2}"#,
            r#"{"prompt_tokens":null}"#,
            r#"{"prompt_tokens":"5"}"#,
            r#"{"prompt_tokens":-1}"#,
            "[]",
            "{",
        ] {
            assert_eq!(u(none), None, "{none}");
        }
    }

    const STREAM: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n\
        data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
        data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\
        \"prompt_tokens_details\":{\"cached_tokens\":1},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n\
        data: [DONE]\n\n";

    fn run(body: &str, ct: &str, hide: bool, split: &[usize]) -> (Vec<u8>, Option<Usage>) {
        let mut w = BodyWatch::new(Some(ct.as_bytes()), hide);
        let mut out = Vec::new();
        let mut at = 0;
        for &s in split.iter().chain(std::iter::once(&body.len())) {
            let s = s.min(body.len()).max(at);
            w.push(Bytes::copy_from_slice(&body.as_bytes()[at..s]), &mut out);
            at = s;
        }
        let usage = w.finish(&mut out);
        (out.iter().flat_map(|b| b.iter().copied()).collect(), usage)
    }

    #[test]
    fn the_media_type_is_read_in_any_case_and_with_parameters() {
        for (ct, mode) in [
            (Some(&b"text/event-stream"[..]), Mode::Sse),
            (Some(b" TEXT/Event-Stream ; charset=utf-8"), Mode::Sse),
            (Some(b"application/json"), Mode::Json),
            (Some(b"Application/Vnd.Api+JSON;charset=utf-8"), Mode::Json),
            (Some(b"text/plain"), Mode::Other),
            (Some(b"json"), Mode::Other),
            (Some(b"\xff\xfe"), Mode::Other),
            (None, Mode::Other),
        ] {
            assert_eq!(BodyWatch::new(ct, false).mode, mode, "{ct:?}");
        }
    }

    fn expected_usage() -> Usage {
        Usage { input_tokens: 5, output_tokens: 2, reasoning_tokens: Some(0), cached_input_tokens: Some(1) }
    }

    #[test]
    fn relays_every_byte_and_reads_usage_at_every_split() {
        for a in 0..STREAM.len() {
            for b in [a, a + 7, a + 40] {
                let (body, usage) = run(STREAM, "text/event-stream", false, &[a, b]);
                assert_eq!(body, STREAM.as_bytes(), "split {a},{b}");
                assert_eq!(usage, Some(expected_usage()), "split {a},{b}");
            }
        }
    }

    #[test]
    fn hides_only_the_usage_only_event_at_every_split() {
        let hidden = STREAM.replace(
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\
             \"prompt_tokens_details\":{\"cached_tokens\":1},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
            "",
        );
        assert_ne!(hidden, STREAM);
        for a in 0..STREAM.len() {
            let (body, usage) = run(STREAM, "text/event-stream; charset=utf-8", true, &[a, a + 13]);
            assert_eq!(String::from_utf8(body).unwrap(), hidden, "split {a}");
            assert_eq!(usage, Some(expected_usage()));
        }
        // One byte at a time.
        let splits: Vec<usize> = (0..STREAM.len()).collect();
        assert_eq!(String::from_utf8(run(STREAM, "text/event-stream", true, &splits).0).unwrap(), hidden);
    }

    #[test]
    fn crlf_and_cr_line_ends() {
        for sep in ["\r\n", "\r"] {
            let s = STREAM.replace('\n', sep);
            let (whole, _) = run(&s, "text/event-stream", true, &[]);
            for a in 0..s.len() {
                let (body, usage) = run(&s, "text/event-stream", true, &[a]);
                // Split between the CR and LF of a blank line, the LF still
                // goes with its event (kept or hidden).
                assert_eq!(body, whole, "{sep:?} split {a}");
                let body = String::from_utf8(body).unwrap();
                assert!(!body.contains("\"usage\""), "{sep:?} split {a}: {body:?}");
                assert!(body.contains("[DONE]") && body.contains("\"hi\""), "{sep:?} split {a}");
                assert_eq!(usage, Some(expected_usage()));
            }
        }
        // An event ending in CR CR LF before the usage-only one (found by
        // the `tunnel_watch` fuzz target).
        let s = "x\r\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2}}\n\nz";
        let (whole, _) = run(s, "text/event-stream", true, &[]);
        assert_eq!(whole, b"x\r\r\nz");
        for a in 0..s.len() {
            assert_eq!(run(s, "text/event-stream", true, &[a]).0, whole, "split {a}");
        }
    }

    #[test]
    fn usage_in_a_chunk_with_choices_is_read_but_kept() {
        // llama.cpp-style: usage rides on the finish chunk.
        let s = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
        let (body, usage) = run(s, "text/event-stream", true, &[20]);
        assert_eq!(body, s.as_bytes());
        assert_eq!(usage.map(|u| (u.input_tokens, u.output_tokens, u.reasoning_tokens)), Some((3, 1, None)));
    }

    #[test]
    fn json_bodies_and_responses_events() {
        let chat =
            r#"{"id":"x","choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#;
        let (body, usage) = run(chat, "application/json", false, &[10, 50]);
        assert_eq!(body, chat.as_bytes());
        assert_eq!(usage.map(|u| (u.input_tokens, u.output_tokens)), Some((9, 4)));
        let emb = r#"{"object":"list","data":[],"usage":{"prompt_tokens":6,"total_tokens":6}}"#;
        assert_eq!(run(emb, "application/json", false, &[]).1.map(|u| (u.input_tokens, u.output_tokens)), Some((6, 0)));
        let none = r#"{"id":"x","choices":[]}"#;
        assert_eq!(run(none, "application/json", false, &[]).1, None, "unknown usage stays absent");
        // Usage before other members (llama.cpp's `timings`), under `response`, or null there.
        let io = |body: &str| run(body, "application/json", false, &[7]).1.map(|u| (u.input_tokens, u.output_tokens));
        let later =
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"id":"x","timings":{"a":[1,"}"]}}"#;
        assert_eq!(io(later), Some((3, 2)));
        assert_eq!(io(r#"{"usage":null,"response":{"usage":{"input_tokens":5,"output_tokens":1}}}"#), Some((5, 1)));
        assert_eq!(io(r#"{"response":{"usage":{"input_tokens":5}},"usage":{"total_tokens":1}}"#), None);
        let twice = r#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#;
        assert_eq!(io(twice), Some((2, 0)), "a repeated key: the last, as JavaScript and Python read it");
        let resp = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":2},\"output_tokens_details\":{\"reasoning_tokens\":1}}}}\n\n";
        let (body, usage) = run(resp, "text/event-stream", true, &[33]);
        assert_eq!(body, resp.as_bytes(), "a Responses event is never hidden");
        assert_eq!(
            usage,
            Some(Usage { input_tokens: 7, output_tokens: 3, reasoning_tokens: Some(1), cached_input_tokens: Some(2) })
        );
        let (body, usage) = run("plain error", "text/plain", true, &[3]);
        assert_eq!((body, usage), (b"plain error".to_vec(), None));
    }

    #[test]
    fn terminal_events_of_each_dialect() {
        for terminal in [
            "data: [DONE]\n\n",
            "data:[DONE]\r\n\r\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n",
            "event: response.failed\ndata: {}\n\n",
            "event: response.incomplete\ndata: {}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            "id: 7\ndata: {\"type\":\"response.completed\",\"sequence_number\":9}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        ] {
            assert!(is_terminal(terminal.as_bytes()), "{terminal:?}");
        }
        for not in [
            "data: {\"choices\":[{\"delta\":{\"content\":\"[DONE]\"}}]}\n\n",
            "data: [DONE]x\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.completed\"}\n\n",
            "event: message_delta\ndata: {}\n\n",
            "data: {\"type\":\"message_stop_x\"}\n\n",
            "data: {\"type\":\"message_stop\n\n",
            ": data: [DONE]\n\n",
        ] {
            assert!(!is_terminal(not.as_bytes()), "{not:?}");
        }
    }

    #[test]
    fn the_end_is_seen_at_every_split_and_only_at_the_terminal_event() {
        let body = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n\
            event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n";
        for a in 0..body.len() {
            let mut w = BodyWatch::new(Some(b"text/event-stream"), false);
            let mut out = Vec::new();
            w.push(Bytes::copy_from_slice(&body.as_bytes()[..a]), &mut out);
            assert!(!w.ended(), "split {a}: ended early");
            w.push(Bytes::copy_from_slice(&body.as_bytes()[a..]), &mut out);
            assert!(w.ended(), "split {a}");
        }
        // The event's blank line completes it: not before.
        let mut w = BodyWatch::new(Some(b"text/event-stream"), true);
        w.push(Bytes::copy_from_slice(&STREAM.as_bytes()[..STREAM.len() - 1]), &mut Vec::new());
        assert!(!w.ended());
        w.push(Bytes::from_static(b"\n"), &mut Vec::new());
        assert!(w.ended());
        // A JSON body has no terminal event (its framing ends it).
        let mut w = BodyWatch::new(Some(b"application/json"), false);
        w.push(Bytes::from_static(b"data: [DONE]\n\n"), &mut Vec::new());
        assert!(!w.ended());
    }

    #[test]
    fn an_unterminated_last_event_is_still_relayed() {
        let s = "data: {\"a\":1}\n\ndata: {\"b\":2}";
        let (body, _) = run(s, "text/event-stream", true, &[5, 17]);
        assert_eq!(body, s.as_bytes());
    }
}
