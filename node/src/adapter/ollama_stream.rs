//! Sans-IO mapping of Ollama's answers to run events: the NDJSON lines of
//! `POST /api/chat` (or one JSON object, the same shape) and the body of
//! `POST /api/embed`.
//!
//! - [`LineSplitter`]: bytes in, whole lines out, each bounded by
//!   [`MAX_LINE_BYTES`] however the bytes were split.
//! - [`ChatStream`]: one line at a time. The first line starts the run;
//!   `message.thinking` is reasoning, `message.content` content, each of
//!   `message.tool_calls` (Ollama sends calls whole) one tool-call delta;
//!   the `done: true` line completes it with the finish reason and usage.
//! - [`embed_events`]: the vectors and the prompt token count.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use iop_core::exec::{Delta, ExecEvent, Part, RunFailure, ToolCallDelta, Usage};
use serde::Deserialize;
use serde_json::{value::RawValue, Value};

use super::openai_stream::{error_chunk_failure, protocol, Flow};

/// Longest NDJSON line accepted (one line carries one token, or all the
/// tool calls of a turn).
pub(crate) const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// A line longer than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("upstream NDJSON line exceeds {0} bytes")]
pub(crate) struct LineTooLong(pub(crate) usize);

/// Splits a byte stream at `\n`. A line of more than `max` bytes (without
/// its `\n` or a `\r` before it) is an error at whatever split it shows.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    buf: BytesMut,
    /// Bytes of `buf` known to hold no `\n`.
    scanned: usize,
    max: usize,
}

impl LineSplitter {
    pub(crate) fn new(max: usize) -> Self {
        Self { buf: BytesMut::new(), scanned: 0, max }
    }

    /// Appends received bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole line (without `\n` or `\r\n`); `None` until one is
    /// complete, leaving the partial one buffered.
    pub(crate) fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        match memchr::memchr(b'\n', &self.buf[self.scanned..]) {
            Some(at) => {
                let end = self.scanned + at;
                let mut line = self.buf.split_to(end + 1).freeze();
                self.scanned = 0;
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.len() > self.max {
                    return Err(LineTooLong(self.max));
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                // Even a `\r\n` next cannot bring this line under the limit.
                if self.buf.len() > self.max + 1 {
                    return Err(LineTooLong(self.max));
                }
                Ok(None)
            }
        }
    }

    /// At the end of the stream: the last line when it had no `\n`.
    pub(crate) fn finish(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        if let Some(line) = self.next_line()? {
            return Ok(Some(line));
        }
        self.scanned = 0;
        let mut rest = std::mem::take(&mut self.buf).freeze();
        if rest.last() == Some(&b'\r') {
            rest.truncate(rest.len() - 1);
        }
        if rest.len() > self.max {
            return Err(LineTooLong(self.max));
        }
        Ok((!rest.is_empty()).then_some(rest))
    }

    /// Bytes held.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// One line of `/api/chat` (or the whole non-streamed answer). Every field
/// is optional so that other Ollama versions still parse.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ChatLine<'a> {
    /// Borrowed from the line (every line names the model: no allocation
    /// for it per token).
    #[serde(borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) message: Option<MessageLine<'a>>,
    pub(super) done: Option<bool>,
    #[serde(borrow)]
    pub(super) done_reason: Option<Cow<'a, str>>,
    pub(super) prompt_eval_count: Option<u64>,
    pub(super) eval_count: Option<u64>,
    pub(super) error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct MessageLine<'a> {
    pub(super) content: Option<String>,
    pub(super) thinking: Option<String>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCallLine<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolCallLine<'a> {
    #[serde(borrow)]
    function: Option<FunctionLine<'a>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FunctionLine<'a> {
    name: Option<String>,
    /// An object (kept as its text, as Ollama wrote it).
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// State of one `/api/chat` answer being mapped.
#[derive(Debug)]
pub(crate) struct ChatStream {
    run_id: String,
    target: String,
    started: bool,
    /// Tool calls so far (the next call's index).
    calls: u32,
    done: bool,
}

impl ChatStream {
    /// `run_id` names the tool calls; `target` is the model of `Start` when
    /// the provider names none.
    pub(crate) fn new(run_id: &str, target: &str) -> Self {
        Self { run_id: run_id.to_owned(), target: target.to_owned(), started: false, calls: 0, done: false }
    }

    /// Maps one NDJSON line.
    pub(crate) fn on_line(&mut self, line: &[u8], out: &mut Vec<ExecEvent>) -> Flow {
        if self.done {
            return Flow::Done;
        }
        match line.iter().find(|b| !b.is_ascii_whitespace()) {
            None => return Flow::Continue,
            // serde would also read the struct from an array, by position.
            Some(b'{') => {}
            Some(_) => return self.fail(protocol("malformed upstream NDJSON line: not a JSON object"), out),
        }
        // The common line by hand; anything else (and every error) by serde.
        let parsed = match super::ollama_line::parse(line).map_or_else(|| serde_json::from_slice(line), Ok) {
            Ok(l) => l,
            Err(e) => return self.fail(protocol(format!("malformed upstream NDJSON line: {e}")), out),
        };
        if let Some(err) = parsed.error.as_ref().filter(|e| !e.is_null()) {
            return self.fail(error_chunk_failure(err), out);
        }
        if !self.started {
            self.started = true;
            let model = parsed.model.filter(|m| !m.is_empty()).map_or_else(|| self.target.clone(), Cow::into_owned);
            out.push(ExecEvent::Start { model });
        }
        if let Some(m) = parsed.message {
            self.message(m, out);
        }
        if parsed.done == Some(true) {
            self.done = true;
            let finish_reason = if self.calls > 0 {
                "tool_calls"
            } else {
                match parsed.done_reason.as_deref() {
                    Some("length") => "length",
                    // "stop", and "load"/"unload" (nothing was generated).
                    _ => "stop",
                }
            };
            // Ollama omits zero counts: one present means the other was 0.
            let usage = match (parsed.prompt_eval_count, parsed.eval_count) {
                (None, None) => None,
                (input, output) => Some(Usage {
                    input_tokens: input.unwrap_or(0),
                    output_tokens: output.unwrap_or(0),
                    ..Default::default()
                }),
            };
            out.push(ExecEvent::Complete { finish_reason: finish_reason.to_owned(), usage });
            return Flow::Done;
        }
        Flow::Continue
    }

    /// The stream ended: without its `done` line that is a broken stream.
    pub(crate) fn on_eof(&mut self, out: &mut Vec<ExecEvent>) {
        if !self.done {
            self.fail(protocol("upstream stream ended before its done line"), out);
        }
    }

    /// Maps a whole JSON answer (one object, as `"stream": false` sends).
    pub(crate) fn on_body(&mut self, body: &[u8], out: &mut Vec<ExecEvent>) {
        if self.on_line(body, out) == Flow::Continue {
            self.on_eof(out);
        }
    }

    fn fail(&mut self, failure: RunFailure, out: &mut Vec<ExecEvent>) -> Flow {
        self.done = true;
        out.push(ExecEvent::Error(failure));
        Flow::Done
    }

    /// Thinking, content, then the tool calls of one line.
    fn message(&mut self, m: MessageLine<'_>, out: &mut Vec<ExecEvent>) {
        let delta = |part| ExecEvent::Delta(Delta { choice: 0, part, logprobs: None });
        if let Some(t) = m.thinking.filter(|t| !t.is_empty()) {
            out.push(delta(Part::Reasoning(t)));
        }
        if let Some(c) = m.content.filter(|c| !c.is_empty()) {
            out.push(delta(Part::Content(c)));
        }
        for call in m.tool_calls.unwrap_or_default() {
            let function = call.function.unwrap_or_default();
            let arguments = match function.arguments.map(RawValue::get) {
                None | Some("null") => "{}".to_owned(),
                // A JSON string: some servers send the arguments' text.
                Some(raw) if raw.starts_with('"') => serde_json::from_str::<String>(raw).unwrap_or_default(),
                Some(raw) => raw.to_owned(),
            };
            let index = self.calls;
            self.calls = self.calls.saturating_add(1);
            out.push(delta(Part::ToolCall(Box::new(ToolCallDelta {
                index,
                id: format!("call_{}_{index}", self.run_id),
                kind: "function".into(),
                name: function.name.unwrap_or_default(),
                arguments,
            }))));
        }
    }
}

/// `POST /api/embed`'s answer.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EmbedBody {
    model: Option<String>,
    embeddings: Option<Vec<Vec<f32>>>,
    prompt_eval_count: Option<u64>,
    error: Option<Value>,
}

/// The events of an embeddings answer for `inputs` inputs: `Start`, the
/// vectors, `Complete` with the prompt tokens (or one error).
pub(crate) fn embed_events(body: &[u8], target: &str, inputs: usize) -> Vec<ExecEvent> {
    let parsed: EmbedBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return vec![ExecEvent::Error(protocol(format!("malformed embeddings answer: {e}")))],
    };
    if let Some(err) = parsed.error.as_ref().filter(|e| !e.is_null()) {
        return vec![ExecEvent::Error(error_chunk_failure(err))];
    }
    let Some(vectors) = parsed.embeddings else {
        return vec![ExecEvent::Error(protocol("embeddings answer without `embeddings`"))];
    };
    if vectors.len() != inputs {
        let msg = format!("upstream sent {} embeddings for {inputs} inputs", vectors.len());
        return vec![ExecEvent::Error(protocol(msg))];
    }
    let model = parsed.model.filter(|m| !m.is_empty()).unwrap_or_else(|| target.to_owned());
    let usage = parsed.prompt_eval_count.map(|n| Usage { input_tokens: n, ..Default::default() });
    vec![
        ExecEvent::Start { model },
        ExecEvent::Embeddings(vectors),
        ExecEvent::Complete { finish_reason: "stop".into(), usage },
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::{codes, FailureSource};

    use super::*;

    /// Feeds `bytes` split at `cuts`, then EOF; returns the events.
    fn feed(chunks: &[&[u8]]) -> Vec<ExecEvent> {
        let mut lines = LineSplitter::new(MAX_LINE_BYTES);
        let mut st = ChatStream::new("r1", "target-m");
        let mut out = Vec::new();
        for chunk in chunks {
            lines.push(chunk);
            loop {
                match lines.next_line() {
                    Ok(Some(line)) => {
                        if st.on_line(&line, &mut out) == Flow::Done {
                            return out;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        out.push(ExecEvent::Error(protocol(e.to_string())));
                        return out;
                    }
                }
            }
        }
        match lines.finish() {
            Ok(Some(line)) => {
                if st.on_line(&line, &mut out) == Flow::Done {
                    return out;
                }
            }
            Ok(None) => {}
            Err(e) => {
                out.push(ExecEvent::Error(protocol(e.to_string())));
                return out;
            }
        }
        st.on_eof(&mut out);
        out
    }

    /// The same events whatever two points the stream is cut at.
    fn every_split(stream: &str) -> Vec<ExecEvent> {
        let b = stream.as_bytes();
        let whole = feed(&[b]);
        for i in 0..=b.len() {
            assert_eq!(feed(&[&b[..i], &b[i..]]), whole, "split at {i}");
        }
        // Byte by byte, and a few three-way cuts.
        let bytes: Vec<&[u8]> = b.chunks(1).collect();
        assert_eq!(feed(&bytes), whole, "byte by byte");
        for i in (0..b.len()).step_by(7) {
            for j in (i..=b.len()).step_by(13) {
                assert_eq!(feed(&[&b[..i], &b[i..j], &b[j..]]), whole, "split at {i} and {j}");
            }
        }
        whole
    }

    fn start(m: &str) -> ExecEvent {
        ExecEvent::Start { model: m.into() }
    }

    fn complete(reason: &str, usage: Option<(u64, u64)>) -> ExecEvent {
        ExecEvent::Complete {
            finish_reason: reason.into(),
            usage: usage.map(|(i, o)| Usage { input_tokens: i, output_tokens: o, ..Default::default() }),
        }
    }

    fn tool(index: u32, name: &str, arguments: &str) -> ExecEvent {
        ExecEvent::Delta(Delta {
            choice: 0,
            part: Part::ToolCall(Box::new(ToolCallDelta {
                index,
                id: format!("call_r1_{index}"),
                kind: "function".into(),
                name: name.into(),
                arguments: arguments.into(),
            })),
            logprobs: None,
        })
    }

    const CONTENT: &str = concat!(
        r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"Hel"},"done":false}"#,
        "\n",
        r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"lo ☀"},"done":false}"#,
        "\n",
        r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:01Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":5,"prompt_eval_count":26,"eval_count":2}"#,
        "\n",
    );

    #[test]
    fn content_stream_at_every_split() {
        assert_eq!(
            every_split(CONTENT),
            vec![
                start("llama3.2"),
                ExecEvent::content("Hel"),
                ExecEvent::content("lo ☀"),
                complete("stop", Some((26, 2))),
            ]
        );
        // CRLF line ends and blank lines are tolerated.
        assert_eq!(every_split(&CONTENT.replace('\n', "\r\n\r\n")), every_split(CONTENT));
    }

    #[test]
    fn thinking_and_length() {
        let stream = concat!(
            r#"{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"hmm "},"done":false}"#,
            "\n",
            r#"{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"ok"},"done":false}"#,
            "\n",
            r#"{"model":"qwen3","message":{"role":"assistant","content":"Hi"},"done":false}"#,
            "\n",
            r#"{"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":3}"#,
            "\n",
        );
        assert_eq!(
            every_split(stream),
            vec![
                start("qwen3"),
                ExecEvent::reasoning("hmm "),
                ExecEvent::reasoning("ok"),
                ExecEvent::content("Hi"),
                complete("length", Some((3, 3))),
            ]
        );
    }

    #[test]
    fn tool_calls_are_counted_across_the_stream() {
        let stream = concat!(
            r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"id":"call_x","function":{"index":0,"name":"get_weather","arguments":{"city":"Paris","n":0}}},{"function":{"name":"get_time","arguments":{}}}]},"done":false}"#,
            "\n",
            r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"noargs"}},{"function":{"name":"text","arguments":"{\"a\":1}"}}]},"done":false}"#,
            "\n",
            r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":9,"eval_count":18}"#,
            "\n",
        );
        let evs = every_split(stream);
        assert_eq!(
            evs,
            vec![
                start("m"),
                tool(0, "get_weather", r#"{"city":"Paris","n":0}"#),
                tool(1, "get_time", "{}"),
                tool(2, "noargs", "{}"),
                tool(3, "text", r#"{"a":1}"#),
                complete("tool_calls", Some((9, 18))),
            ]
        );
        for ev in &evs {
            if let ExecEvent::Delta(Delta { part: Part::ToolCall(c), .. }) = ev {
                assert!(serde_json::from_str::<Value>(&c.arguments).unwrap().is_object());
            }
        }
    }

    #[test]
    fn usage_absent_or_partial() {
        let done = |fields: &str| {
            let line = format!(r#"{{"model":"m","message":{{"role":"assistant","content":""}},"done":true{fields}}}"#);
            feed(&[line.as_bytes()]).pop().unwrap()
        };
        assert_eq!(done(""), complete("stop", None));
        assert_eq!(done(r#","eval_count":4"#), complete("stop", Some((0, 4))));
        assert_eq!(done(r#","prompt_eval_count":4"#), complete("stop", Some((4, 0))));
        // done_reason other than stop/length: "stop".
        assert_eq!(done(r#","done_reason":"load""#), complete("stop", None));
        assert_eq!(done(r#","done_reason":"unload""#), complete("stop", None));
        // The done line without a trailing newline is still read at EOF.
        assert_eq!(feed(&[br#"{"done":true}"#]), vec![start("target-m"), complete("stop", None)]);
    }

    #[test]
    fn error_line_mid_stream() {
        let stream = concat!(
            r#"{"model":"m","message":{"role":"assistant","content":"a"},"done":false}"#,
            "\n",
            r#"{"error":"an error was encountered while running the model: unexpected EOF"}"#,
            "\n",
            r#"{"model":"m","message":{"role":"assistant","content":"b"},"done":false}"#,
            "\n",
        );
        let evs = every_split(stream);
        assert_eq!(evs[..2], [start("m"), ExecEvent::content("a")]);
        assert_eq!(evs.len(), 3);
        let ExecEvent::Error(f) = &evs[2] else { panic!("{evs:?}") };
        assert_eq!(
            (f.code, f.status, f.source, f.message.as_str()),
            (
                codes::UPSTREAM_STATUS,
                502,
                FailureSource::Provider,
                "an error was encountered while running the model: unexpected EOF"
            )
        );
        // An error first: no Start.
        let evs = feed(&[b"{\"error\":\"boom\"}\n"]);
        assert!(matches!(evs.as_slice(), [ExecEvent::Error(f)] if f.message == "boom"), "{evs:?}");
    }

    #[test]
    fn missing_done_and_garbage_are_protocol_errors() {
        let cut = &CONTENT[..CONTENT.find("\n").unwrap() + 1];
        let evs = every_split(cut);
        assert_eq!(evs[..2], [start("llama3.2"), ExecEvent::content("Hel")]);
        let ExecEvent::Error(f) = &evs[2] else { panic!("{evs:?}") };
        assert_eq!((f.code, f.status, f.retryable), (codes::UPSTREAM_PROTOCOL, 502, false));
        // Nothing at all.
        assert!(matches!(feed(&[]).as_slice(), [ExecEvent::Error(f)] if f.code == codes::UPSTREAM_PROTOCOL));
        // A cut line.
        let evs = feed(&[&CONTENT.as_bytes()[..40]]);
        assert!(matches!(evs.as_slice(), [ExecEvent::Error(f)] if f.code == codes::UPSTREAM_PROTOCOL), "{evs:?}");
        for garbage in ["data: {}\n", "[1,2]\n", "[]\n", "{\"done\":\"yes\"}\n"] {
            let evs = feed(&[garbage.as_bytes()]);
            assert!(matches!(evs.as_slice(), [ExecEvent::Error(f)] if f.code == codes::UPSTREAM_PROTOCOL), "{garbage}");
        }
        // Lines after done are ignored.
        let mut st = ChatStream::new("r", "t");
        let mut out = Vec::new();
        assert_eq!(st.on_line(br#"{"done":true}"#, &mut out), Flow::Done);
        assert_eq!(st.on_line(br#"{"message":{"content":"late"}}"#, &mut out), Flow::Done);
        st.on_eof(&mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn whole_json_body() {
        let body = br#"{
            "model": "llama3.2", "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "Hi!", "thinking": "short"},
            "done": true, "done_reason": "stop", "prompt_eval_count": 5, "eval_count": 2
        }"#;
        let mut st = ChatStream::new("r1", "t");
        let mut out = Vec::new();
        st.on_body(body, &mut out);
        assert_eq!(
            out,
            vec![
                start("llama3.2"),
                ExecEvent::reasoning("short"),
                ExecEvent::content("Hi!"),
                complete("stop", Some((5, 2)))
            ]
        );
        let mut out = Vec::new();
        ChatStream::new("r1", "t").on_body(br#"{"model":"m","message":{"content":"x"},"done":false}"#, &mut out);
        assert!(matches!(out.last(), Some(ExecEvent::Error(f)) if f.code == codes::UPSTREAM_PROTOCOL), "{out:?}");
    }

    #[test]
    fn line_limits_hold_at_every_split() {
        let max = 16;
        let run = |chunks: &[&[u8]]| {
            let mut s = LineSplitter::new(max);
            let mut lines = Vec::new();
            for c in chunks {
                s.push(c);
                loop {
                    match s.next_line() {
                        Ok(Some(l)) => lines.push(Ok(l)),
                        Ok(None) => break,
                        Err(e) => {
                            lines.push(Err(e));
                            return lines;
                        }
                    }
                }
                assert!(s.buffered() <= max + 1 + c.len(), "buffer bounded");
            }
            match s.finish() {
                Ok(Some(l)) => lines.push(Ok(l)),
                Ok(None) => {}
                Err(e) => lines.push(Err(e)),
            }
            lines
        };
        let at_limit = format!("{}\r\n{}\n", "a".repeat(max), "b".repeat(max));
        let over = format!("{}\n{}\n", "a".repeat(max), "b".repeat(max + 1));
        let over_crlf = format!("{}\r\n", "c".repeat(max + 1));
        let over_unterminated = "d".repeat(max + 1);
        for (input, want_err) in [(&at_limit, false), (&over, true), (&over_crlf, true), (&over_unterminated, true)] {
            let b = input.as_bytes();
            let whole = run(&[b]);
            assert_eq!(whole.last().unwrap().is_err(), want_err, "{input:?}: {whole:?}");
            for i in 0..=b.len() {
                assert_eq!(run(&[&b[..i], &b[i..]]), whole, "{input:?} split at {i}");
            }
            let bytes: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(run(&bytes), whole, "{input:?} byte by byte");
        }
        assert_eq!(run(&[at_limit.as_bytes()]).len(), 2);
        assert_eq!(LineTooLong(4).to_string(), "upstream NDJSON line exceeds 4 bytes");
    }

    #[test]
    fn embeddings_answer() {
        let body = br#"{"model":"nomic","embeddings":[[0.5,-1.25],[0.0,1e-3]],"total_duration":1,"load_duration":1,"prompt_eval_count":7}"#;
        assert_eq!(
            embed_events(body, "t", 2),
            vec![
                start("nomic"),
                ExecEvent::Embeddings(vec![vec![0.5, -1.25], vec![0.0, 1e-3]]),
                ExecEvent::Complete {
                    finish_reason: "stop".into(),
                    usage: Some(Usage { input_tokens: 7, ..Default::default() })
                },
            ]
        );
        let evs = embed_events(br#"{"embeddings":[[1.0]]}"#, "t", 1);
        assert_eq!(evs[0], start("t"));
        assert_eq!(evs[2], ExecEvent::Complete { finish_reason: "stop".into(), usage: None });
        for (bad, inputs) in [
            (&br#"{"embeddings":[[1.0]]}"#[..], 2),
            (br#"{"model":"m"}"#, 1),
            (b"nope", 1),
            (br#"{"embeddings":[["x"]]}"#, 1),
        ] {
            let evs = embed_events(bad, "t", inputs);
            assert!(
                matches!(evs.as_slice(), [ExecEvent::Error(f)] if f.code == codes::UPSTREAM_PROTOCOL),
                "{}: {evs:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let evs = embed_events(br#"{"error":"model 'x' not found"}"#, "t", 1);
        assert!(matches!(evs.as_slice(), [ExecEvent::Error(f)] if f.message == "model 'x' not found"));
    }
}
