//! The contract between the endpoint shapes and the connection code. An
//! endpoint turns a request body into a [`Reply`] without doing any I/O; the
//! connection only plays it: waits, writes, frames and records. A streamed
//! answer is a [`Script`] that yields one step ([`Frame`]s in a [`Phase`]) at
//! a time, so even a million-token stream is never held in memory.

use std::time::Duration;

use super::clock::Timestamp;
use super::errors;
use super::overrides::BadRequest;
use super::MockConfig;

/// Which server family the endpoint imitates; decides the extra headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `/v1/*`: `x-request-id`, `openai-processing-ms`, rate-limit headers.
    OpenAi,
    /// `/v1/messages*`: `request-id`.
    Anthropic,
    /// `/api/*`: no extra headers.
    Ollama,
}

/// What the connection does with one model request.
#[derive(Debug)]
pub enum Action {
    /// Close the connection without answering (a provider dying mid-request).
    Hangup,
    /// One body with a `content-length`.
    Whole(Whole),
    /// A chunked stream of frames.
    Stream(Stream),
}

/// A reply and the family it belongs to.
#[derive(Debug)]
pub struct Reply {
    /// Header family.
    pub flavor: Flavor,
    /// The answer.
    pub action: Action,
    /// The request's `mock.tag`: a client close before the end is logged under it.
    pub tag: Option<String>,
}

impl Reply {
    /// An untagged reply.
    pub fn new(flavor: Flavor, action: Action) -> Self {
        Self { flavor, action, tag: None }
    }

    /// The same reply, tagged.
    pub fn tagged(mut self, tag: Option<String>) -> Self {
        self.tag = tag;
        self
    }
}

/// A whole-body answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole {
    /// HTTP status.
    pub status: u16,
    /// `content-type`.
    pub content_type: &'static str,
    /// Extra headers (after `content-type`).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
    /// Wait this long before answering (as long as generating would take).
    pub delay: Duration,
    /// After the delay, close instead of answering (`abort_after`).
    pub abort: bool,
}

impl Whole {
    /// A JSON answer sent at once.
    pub fn json(status: u16, content_type: &'static str, body: String) -> Self {
        Self { status, content_type, headers: Vec::new(), body, delay: Duration::ZERO, abort: false }
    }
}

/// Pacing of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Before the first token step.
    pub ttft: Duration,
    /// Before every paced token step but the first.
    pub interval: Duration,
    /// Close after this many counted steps (no tail).
    pub abort_after: Option<u64>,
    /// Go silent after this many counted steps, until the client leaves.
    pub stall_after: Option<u64>,
    /// After the last frame, never end the body, until the client leaves.
    pub hold_open: bool,
    /// Token steps written together (one write of this many events, after
    /// `burst` × `interval`): a fast engine's several tokens per step, or a
    /// congested link. 1: one write per token.
    pub burst: u64,
}

/// A streamed answer.
pub struct Stream {
    /// `content-type` (`text/event-stream` or `application/x-ndjson`).
    pub content_type: &'static str,
    /// Extra headers (after `content-type`).
    pub headers: Vec<(&'static str, String)>,
    /// Write the head before the first-token delay even with no lead frames
    /// (OpenAI-style servers do; Ollama sends its head with the first line).
    pub eager_head: bool,
    /// Pacing.
    pub timing: Timing,
    /// The frames.
    pub script: Box<dyn Script>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("content_type", &self.content_type).field("timing", &self.timing).finish()
    }
}

/// One unit of the wire format; the connection frames it, writes it as one
/// HTTP chunk and hashes the framed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// SSE `data: <json>\n\n`.
    Data(String),
    /// SSE `event: <name>\ndata: <json>\n\n`.
    Event(&'static str, String),
    /// SSE `data: [DONE]\n\n`.
    Done,
    /// NDJSON `<json>\n`.
    Line(String),
}

/// When a step is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// With the response head, before the first-token delay.
    Lead,
    /// After the first-token delay. A `paced` step waits one token interval
    /// unless it is the first paced step; `counted` steps count toward
    /// `abort_after`.
    Token {
        /// Waits the token interval.
        paced: bool,
        /// Counts toward `abort_after`.
        counted: bool,
    },
    /// After the last token, without pauses; ends the stream.
    Tail,
}

impl Phase {
    /// A content token: paced and counted.
    pub const CONTENT: Self = Self::Token { paced: true, counted: true };
    /// A paced token that `abort_after` does not count (reasoning, tool-call heads).
    pub const SIDE: Self = Self::Token { paced: true, counted: false };
    /// Written right after the previous step.
    pub const FOLLOW: Self = Self::Token { paced: false, counted: false };
}

/// A streamed answer, one step at a time. The connection asks for the phase
/// first, waits as it says, and only then renders the step, so that every
/// frame is built (and time-stamped) when it is written.
pub trait Script {
    /// Phase of the next step; `None` once the stream is over.
    fn next_phase(&self) -> Option<Phase>;
    /// Pushes the frames of the next step onto `frames` and advances. `now`
    /// is the time the step is written (Ollama stamps every line).
    fn render_next(&mut self, now: Timestamp, frames: &mut Vec<Frame>);
}

/// What an endpoint needs besides the request body.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    /// CLI defaults.
    pub config: &'a MockConfig,
    /// Number of this model request (ids, `x-request-id`).
    pub seq: u64,
    /// When the request arrived.
    pub now: Timestamp,
}

/// The reply to a request that was refused or is configured to fail, if it
/// is one of those: `hangup`, then `error_status`.
pub fn early_reply(flavor: Flavor, hangup: bool, error_status: Option<u16>, model: &str) -> Option<Reply> {
    if hangup {
        return Some(Reply::new(flavor, Action::Hangup));
    }
    let status = error_status?;
    let whole = match flavor {
        Flavor::OpenAi => {
            let mut w = Whole::json(status, "application/json", errors::mock_error_body(status));
            w.headers = errors::retry_headers(status);
            w
        }
        Flavor::Anthropic => {
            let mut w = Whole::json(status, "application/json", errors::anthropic_mock_error_body(status));
            w.headers = errors::anthropic_retry_headers(status);
            w
        }
        Flavor::Ollama => Whole::json(
            status,
            OLLAMA_JSON,
            errors::ollama_error_body(&errors::ollama_mock_error_message(status, model)),
        ),
    };
    Some(Reply::new(flavor, Action::Whole(whole)))
}

/// The 400 for a refused request, in the flavor's error shape.
pub fn bad_request(flavor: Flavor, e: &BadRequest) -> Reply {
    let whole = match flavor {
        Flavor::OpenAi => {
            Whole::json(400, "application/json", errors::error_body(&e.0, "invalid_request_error", "null"))
        }
        Flavor::Anthropic => {
            Whole::json(400, "application/json", errors::anthropic_error_body("invalid_request_error", &e.0))
        }
        Flavor::Ollama => Whole::json(400, OLLAMA_JSON, errors::ollama_error_body(&e.0)),
    };
    Reply::new(flavor, Action::Whole(whole))
}

/// `system_fingerprint` of every OpenAI chunk and completion.
pub const SYSTEM_FINGERPRINT: &str = "fp_mock";
/// `service_tier` of every OpenAI chunk and completion.
pub const SERVICE_TIER: &str = "default";

/// The content type of Ollama's JSON answers (gin's).
pub const OLLAMA_JSON: &str = "application/json; charset=utf-8";

/// Headers OpenAI puts on every answer, except `openai-processing-ms`, which
/// the connection adds when it knows the time.
pub fn openai_headers(seq: u64) -> [(&'static str, String); 3] {
    [
        ("x-request-id", format!("req_mock_{seq}")),
        ("x-ratelimit-limit-requests", "1000".to_owned()),
        ("x-ratelimit-remaining-requests", "999".to_owned()),
    ]
}

/// The header Anthropic puts on every answer: `request-id: req_mock_<seq>`.
pub fn anthropic_request_id(seq: u64) -> (&'static str, String) {
    ("request-id", format!("req_mock_{seq}"))
}

/// Runs `script` to its end with a fixed clock (for tests).
pub fn collect(script: &mut dyn Script, now: Timestamp) -> Vec<(Phase, Vec<Frame>)> {
    let mut out = Vec::new();
    while let Some(phase) = script.next_phase() {
        let mut frames = Vec::new();
        script.render_next(now, &mut frames);
        out.push((phase, frames));
    }
    out
}

/// The exact bytes a frame puts on the wire (before chunked framing).
pub fn frame_bytes(frame: &Frame, out: &mut bytes::BytesMut) {
    match frame {
        Frame::Data(json) => iop_core::sse::write_event(out, json.as_bytes()),
        Frame::Event(name, json) => {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\n");
            iop_core::sse::write_event(out, json.as_bytes());
        }
        Frame::Done => iop_core::sse::write_done(out),
        Frame::Line(json) => {
            out.extend_from_slice(json.as_bytes());
            out.extend_from_slice(b"\n");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_early_replies() {
        let mut out = bytes::BytesMut::new();
        for f in [
            Frame::Data("{}".into()),
            Frame::Event("response.created", "{}".into()),
            Frame::Done,
            Frame::Line("{}".into()),
        ] {
            frame_bytes(&f, &mut out);
        }
        assert_eq!(&out[..], b"data: {}\n\nevent: response.created\ndata: {}\n\ndata: [DONE]\n\n{}\n");

        assert!(early_reply(Flavor::OpenAi, false, None, "m").is_none());
        let Some(Reply { action: Action::Whole(w), .. }) = early_reply(Flavor::OpenAi, false, Some(429), "m") else {
            panic!()
        };
        assert_eq!((w.status, w.headers.len()), (429, 2));
        let Some(Reply { action: Action::Whole(w), .. }) = early_reply(Flavor::Ollama, false, Some(429), "m") else {
            panic!()
        };
        assert_eq!(
            (w.status, w.content_type, w.body.as_str()),
            (429, OLLAMA_JSON, r#"{"error":"mock provider error"}"#)
        );
        assert!(matches!(
            early_reply(Flavor::Ollama, true, Some(429), "m"),
            Some(Reply { action: Action::Hangup, .. })
        ));
        assert_eq!(openai_headers(3)[0], ("x-request-id", "req_mock_3".to_owned()));
    }
}
