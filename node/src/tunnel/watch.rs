//! Watches a provider's answer while the tunnel relays it: finds the usage
//! the provider reported (in an SSE stream or a JSON body), notices the
//! stream's terminal event (after which the answer is over, whether or not
//! the provider closes) and, when the edge asked, leaves OpenAI's
//! usage-only SSE event out of the relayed bytes.
//!
//! Usage may be spread over several events: an Anthropic Messages stream
//! reports the input tokens in `message_start` and the output tokens in
//! `message_delta`, so each event's counts replace only the counts it
//! carries ([`Counts`]).
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
    /// Lines of the current event so far.
    lines: usize,
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
    /// The counts of the SSE events so far.
    counts: Counts,
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
            lines: 0,
            after_cr: false,
            carry: BytesMut::new(),
            carry_overflow: false,
            cr_ended: None,
            json: Vec::new(),
            json_len: 0,
            counts: Counts::default(),
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

    /// The body is an event stream (relayed as it arrives).
    pub fn is_stream(&self) -> bool {
        self.mode == Mode::Sse
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
            Mode::Other => None,
            Mode::Json => {
                let usage = match &self.json[..] {
                    _ if self.json_len > MAX_WATCHED_JSON => None,
                    [one] => usage_of_body(one),
                    pieces => usage_of_body(&pieces.concat()),
                };
                self.json.clear();
                usage
            }
            Mode::Sse => {
                // An unterminated last event is relayed as it came.
                if self.hide_usage_chunk && !self.carry.is_empty() {
                    out.push(std::mem::take(&mut self.carry).freeze());
                }
                std::mem::take(&mut self.counts).usage()
            }
        }
    }

    fn push_sse(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) {
        let ends = self.event_ends(&chunk);
        // The chunk's complete events are searched once for usage keys, not
        // event by event (a read of a fast stream holds dozens).
        let complete = &chunk[..ends.last().map_or(0, |e| e.0)];
        let mut keys = usage_key_offsets(complete).peekable();
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
        for (end, one_line) in ends {
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
            // Keys before this event belong to events looked at whole above.
            while keys.next_if(|&at| at < start).is_some() {}
            let mut mentions = false;
            while keys.next_if(|&at| at < end).is_some() {
                mentions = true;
            }
            let event = &chunk[start..end];
            // An event of one line (most are) is judged by that line alone,
            // without a search for its end.
            let terminal =
                if one_line { line_is_terminal(without_line_ends(event), &mut false) } else { is_terminal(event) };
            kept = self.inspect_with(event, mentions, terminal);
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

    /// Offsets in `chunk` just past each event-ending blank line, and
    /// whether that event was one line, carrying the line state across
    /// chunks. Lines end with LF, CRLF or CR.
    fn event_ends(&mut self, chunk: &[u8]) -> Vec<(usize, bool)> {
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
                if let Some((last, _)) = ends.last_mut() {
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
                ends.push((at + 1, self.lines == 1));
                self.lines = 0;
            } else {
                self.lines += 1;
            }
        }
        ends
    }

    /// Looks at one complete event; false when it is the usage-only event
    /// to leave out.
    fn inspect(&mut self, event: &[u8]) -> bool {
        self.inspect_with(event, mentions_usage(event), is_terminal(event))
    }

    /// [`Self::inspect`] told whether the event mentions usage (see
    /// [`mentions_usage`]) and whether it is terminal.
    fn inspect_with(&mut self, event: &[u8], mentions: bool, terminal: bool) -> bool {
        if terminal {
            self.ended = true;
        }
        if !mentions {
            return true;
        }
        let data = event_data(event);
        match usage_of_json(&data) {
            Some((counts, usage_only)) => {
                self.counts.merge(counts);
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
        if line_is_terminal(line, &mut named) {
            return true;
        }
    }
    false
}

/// `event` without the line ends at its end.
fn without_line_ends(event: &[u8]) -> &[u8] {
    let keep = event.iter().rposition(|&b| b != b'\r' && b != b'\n').map_or(0, |i| i + 1);
    &event[..keep]
}

/// One line of an event (without its line end) for [`is_terminal`];
/// `named`: an `event:` line came before (set by one).
fn line_is_terminal(line: &[u8], named: &mut bool) -> bool {
    if let Some(name) = line.strip_prefix(b"event:") {
        *named = true;
        let name = name.strip_prefix(b" ").unwrap_or(name);
        return TERMINAL_EVENTS.contains(&name);
    }
    let Some(data) = line.strip_prefix(b"data:") else { return false };
    let data = data.strip_prefix(b" ").unwrap_or(data);
    if data == b"[DONE]" {
        return true;
    }
    if *named {
        return false;
    }
    let Some(after) = data.trim_ascii_start().strip_prefix(br#"{"type":""#) else { return false };
    let name = after.split(|&b| b == b'"').next().unwrap_or_default();
    after.len() > name.len() && TERMINAL_EVENTS.contains(&name)
}

/// Whether `event` may carry usage: it has a `"usage"` key whose value is
/// not `null`. OpenAI-style streams put `"usage":null` in every chunk when
/// usage was asked for; those need no parse.
fn mentions_usage(event: &[u8]) -> bool {
    usage_key_offsets(event).next().is_some()
}

/// Where in `bytes` a `"usage"` key whose value is not `null` starts.
fn usage_key_offsets(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    // Built once: building a finder costs more than searching a chunk.
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));
    KEY.find_iter(bytes).filter(|&at| {
        let rest = &bytes[at + 7..];
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
/// end (where answers put it: a few members to skip, not the choices or
/// the content blocks), else what [`usage_of_json`] finds (a Responses API
/// event's `response.usage`, or a usage the end scan could not read).
fn usage_of_body(json: &[u8]) -> Option<Usage> {
    json_top::last_member(json, b"usage")
        .filter(|u| !json_top::is_null(u))
        .and_then(usage_object)
        .and_then(Counts::usage)
        .or_else(|| usage_of_json(json).and_then(|(c, _)| c.usage()))
}

/// The usage counts in a JSON document, and whether the document is a
/// usage-only chunk (`"choices": []`): the top level of a chat/completions/
/// embeddings body or chunk, of an Anthropic message or `message_delta`, of
/// a Responses API event (whose usage sits in `response`) or of Anthropic's
/// `message_start` (in `message`). Only the usage object is parsed; the
/// rest is scanned.
fn usage_of_json(json: &[u8]) -> Option<(Counts, bool)> {
    fn present(v: Option<&[u8]>) -> Option<&[u8]> {
        v.filter(|v| !json_top::is_null(v))
    }
    let [usage, choices, response, message] = json_top::members(json, [b"usage", b"choices", b"response", b"message"])?;
    let usage_only = present(usage).is_some() && choices.is_some_and(json_top::is_empty_array);
    let usage = match present(usage) {
        Some(u) => u,
        None => {
            let [u] = json_top::members(present(response).or(present(message))?, [b"usage"])?;
            present(u)?
        }
    };
    Some((usage_object(usage)?, usage_only))
}

/// The counts of a usage object: OpenAI's (chat and completions name them
/// `prompt_`/`completion_tokens`, the Responses API `input_`/`output_`,
/// with details) or Anthropic's (`input_`/`output_tokens` and the cache
/// counts beside them). `None` when it has none of them.
fn usage_object(json: &[u8]) -> Option<Counts> {
    let [prompt, completion, input, output, prompt_details, input_details, completion_details, output_details, cache_read, cache_creation] =
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
                b"cache_read_input_tokens",
                b"cache_creation_input_tokens",
            ],
        )?;
    let detail = |details: Option<&[u8]>, key: &[u8]| {
        let [v] = json_top::members(details?, [key])?;
        count(v)
    };
    let counts = Counts {
        input: count(prompt).or(count(input)),
        output: count(completion).or(count(output)),
        reasoning: detail(completion_details, b"reasoning_tokens")
            .or_else(|| detail(output_details, b"reasoning_tokens")),
        cached: detail(prompt_details, b"cached_tokens").or_else(|| detail(input_details, b"cached_tokens")),
        cache_read: count(cache_read),
        cache_creation: count(cache_creation),
    };
    (counts != Counts::default()).then_some(counts)
}

/// The token counts read so far. An event's counts replace those it
/// carries and leave the others: Anthropic reports the input in
/// `message_start` and the (cumulative) output in `message_delta`, which
/// newer servers also give input and cache counts that then win. OpenAI's
/// usage events carry every count, so the last one still decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    /// `prompt_tokens` or `input_tokens`.
    input: Option<u64>,
    output: Option<u64>,
    reasoning: Option<u64>,
    /// OpenAI's cached prompt tokens (counted in `input`).
    cached: Option<u64>,
    /// Anthropic's cache reads and writes, which its `input_tokens` leaves out.
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
}

impl Counts {
    fn merge(&mut self, newer: Counts) {
        let take = |old: &mut Option<u64>, new: Option<u64>| *old = new.or(*old);
        take(&mut self.input, newer.input);
        take(&mut self.output, newer.output);
        take(&mut self.reasoning, newer.reasoning);
        take(&mut self.cached, newer.cached);
        take(&mut self.cache_read, newer.cache_read);
        take(&mut self.cache_creation, newer.cache_creation);
    }

    /// The usage, `None` without an input count. Anthropic's cache reads
    /// and writes are added to its input, so that `input_tokens` is the
    /// whole prompt and the cached tokens a part of it, as in OpenAI's usage.
    fn usage(self) -> Option<Usage> {
        let cache = self.cache_read.unwrap_or(0).saturating_add(self.cache_creation.unwrap_or(0));
        Some(Usage {
            input_tokens: self.input?.saturating_add(cache),
            output_tokens: self.output.unwrap_or(0),
            reasoning_tokens: self.reasoning,
            cached_input_tokens: self.cached.or(self.cache_read),
        })
    }
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
        let u = |json: &str| usage_object(json.as_bytes()).and_then(Counts::usage);
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
        // Partial counts are kept (to merge with another event's), but no
        // usage comes of them without an input count.
        assert_eq!(usage_object(br#"{"completion_tokens":2}"#), Some(Counts { output: Some(2), ..Default::default() }));
        assert_eq!(usage_object(br#"{"total_tokens":2,"prompt_tokens":null}"#), None);
        let anthropic = r#"{"input_tokens":3,"cache_creation_input_tokens":4,"cache_read_input_tokens":5,"output_tokens":6,
            "cache_creation":{"ephemeral_5m_input_tokens":4},"server_tool_use":{"web_search_requests":0},"service_tier":"standard"}"#;
        assert_eq!(
            u(anthropic),
            Some(Usage { input_tokens: 12, output_tokens: 6, reasoning_tokens: None, cached_input_tokens: Some(5) }),
            "cache reads and writes are part of the prompt"
        );
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
    fn the_chunk_search_finds_every_usage_key_not_null() {
        let events = b"data: {\"usage\":null}\n\ndata: {\"usage\": {\"x\":1}}\n\ndata: {\"usage\"}\n\n";
        let keys: Vec<usize> = usage_key_offsets(events).collect();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys.iter().all(|&at| &events[at..at + 7] == b"\"usage\""));
    }

    #[test]
    fn a_one_line_event_is_judged_as_a_whole_event_is() {
        let lines: [&[u8]; 9] = [
            b"data: [DONE]",
            b"data:[DONE]",
            b"data: [DONE] ",
            b"event: message_stop",
            b"event: response.completed",
            br#"data: {"type":"response.failed","response":{}}"#,
            br#"data: {"type":"message_delta"}"#,
            br#"data: {"choices":[{"delta":{"content":"[DONE]"}}]}"#,
            b": comment",
        ];
        for line in lines {
            for end in [&b"\n\n"[..], b"\r\n\r\n", b"\r\r"] {
                let event = [line, end].concat();
                assert_eq!(
                    line_is_terminal(without_line_ends(&event), &mut false),
                    is_terminal(&event),
                    "{}",
                    String::from_utf8_lossy(&event)
                );
            }
        }
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

    /// An Anthropic Messages stream: input in `message_start`'s
    /// `message.usage`, the output in `message_delta`.
    const MESSAGES: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\
        \"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\
        \"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\
        \"cache_read_input_tokens\":10,\"output_tokens\":1}}}\n\n\
        event: ping\ndata: {\"type\": \"ping\"}\n\n\
        event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage: 9\"}}\n\n\
        event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\
        \"usage\":{\"output_tokens\":15}}\n\n\
        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn reads_anthropic_usage_across_events_at_every_split_and_hides_nothing() {
        let want = Usage { input_tokens: 38, output_tokens: 15, reasoning_tokens: None, cached_input_tokens: Some(10) };
        for a in 0..MESSAGES.len() {
            for (b, hide) in [(a, false), (a + 7, true), (a + 40, false), (a + 90, true)] {
                let mut w = BodyWatch::new(Some(b"text/event-stream"), hide);
                let mut out = Vec::new();
                let (a2, b2) = (a.min(MESSAGES.len()), b.min(MESSAGES.len()));
                for piece in [&MESSAGES[..a2], &MESSAGES[a2..b2], &MESSAGES[b2..]] {
                    w.push(Bytes::copy_from_slice(piece.as_bytes()), &mut out);
                }
                assert!(w.ended(), "split {a},{b}");
                let usage = w.finish(&mut out);
                let body: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
                assert_eq!(body, MESSAGES.as_bytes(), "split {a},{b}: never hidden");
                assert_eq!(usage, Some(want), "split {a},{b}");
            }
        }
        // One byte at a time.
        let splits: Vec<usize> = (0..MESSAGES.len()).collect();
        assert_eq!(run(MESSAGES, "text/event-stream", true, &splits), (MESSAGES.as_bytes().to_vec(), Some(want)));
    }

    #[test]
    fn a_later_anthropic_input_count_wins_and_output_alone_is_no_usage() {
        // Newer servers repeat the input and cache counts in `message_delta`.
        let newer = MESSAGES.replace(
            "\"usage\":{\"output_tokens\":15}",
            "\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":12,\"output_tokens\":15}",
        );
        assert_ne!(newer, MESSAGES);
        assert_eq!(
            run(&newer, "text/event-stream", false, &[100]).1,
            Some(Usage { input_tokens: 45, output_tokens: 15, reasoning_tokens: None, cached_input_tokens: Some(12) })
        );
        // Cumulative output: the last `message_delta` decides.
        let twice = MESSAGES.replace(
            "event: message_stop",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":20}}\n\nevent: message_stop",
        );
        assert_eq!(run(&twice, "text/event-stream", false, &[]).1.map(|u| u.output_tokens), Some(20));
        // Without `message_start` there is no input count: no usage.
        let start_end = MESSAGES.find("event: ping").unwrap();
        assert_eq!(run(&MESSAGES[start_end..], "text/event-stream", false, &[]).1, None);
    }

    #[test]
    fn reads_an_anthropic_message_body_at_every_split() {
        let body = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude",
            "content":[{"type":"text","text":"a "usage": {"input_tokens":99}"},{"type":"tool_use","id":"t","name":"f","input":{"usage":{"input_tokens":98}}}],
            "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,
            "cache_read_input_tokens":4,"cache_creation":{"ephemeral_5m_input_tokens":0},"output_tokens":6,"service_tier":"standard"}}"#;
        let want = Usage { input_tokens: 16, output_tokens: 6, reasoning_tokens: None, cached_input_tokens: Some(4) };
        for a in 0..body.len() {
            let (relayed, usage) = run(body, "application/json", false, &[a, a + 31]);
            assert_eq!(relayed, body.as_bytes(), "split {a}");
            assert_eq!(usage, Some(want), "split {a}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_still_relayed() {
        let s = "data: {\"a\":1}\n\ndata: {\"b\":2}";
        let (body, _) = run(s, "text/event-stream", true, &[5, 17]);
        assert_eq!(body, s.as_bytes());
    }
}
