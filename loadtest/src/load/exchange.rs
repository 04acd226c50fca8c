//! One request/response, sans-IO: the connection code feeds it the bytes it
//! reads with their arrival time; it parses the response head, decodes the
//! body (Content-Length, chunked or until close), parses SSE events, takes
//! the timings and validates the answer.
//!
//! Valid means: status 200; for a stream, every `data:` event is a JSON
//! event that is not an error until the API's last event (`data: [DONE]`
//! for chat), and nothing follows it; for JSON, the body is the API's whole
//! answer (see [`Api`]).

use std::time::{Duration, Instant};

use super::api::Api;
use super::stats::{Failure, Measure};
use bytes::BytesMut;
use iop_core::http::{parse_response_head, BodyDecoder, Limits};
use iop_core::sse::SseParser;

/// Largest response body accepted.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Largest single SSE event accepted.
const MAX_EVENT_BYTES: usize = 1 << 20;

/// What happens to the body.
#[derive(Debug)]
enum Body {
    /// SSE events; `done` once `[DONE]` was seen.
    Sse { parser: SseParser, done: bool },
    /// One JSON document, collected.
    Json(BytesMut),
    /// An error answer: read to keep the connection usable, then dropped.
    Discard,
}

#[derive(Debug)]
enum Phase {
    Head,
    Body { status: u16, keep_alive: bool, decoder: BodyDecoder, body: Body },
    Finished,
}

/// The end of one exchange.
#[derive(Debug, PartialEq, Eq)]
pub struct Done {
    /// The connection can carry the next request.
    pub keep_alive: bool,
    /// Measurements of a valid answer, or why it failed.
    pub result: Result<Measure, Failure>,
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct Exchange {
    api: Api,
    stream: bool,
    start: Instant,
    phase: Phase,
    measure: Measure,
    last_token: Option<Instant>,
    limits: Limits,
    /// Cut the stream once this many tokens have arrived.
    cut_after: Option<u64>,
}

impl Exchange {
    /// An exchange whose request was sent at `start`; `stream` is what was asked for.
    pub fn new(stream: bool, start: Instant) -> Self {
        Self {
            api: Api::Chat,
            stream,
            start,
            phase: Phase::Head,
            measure: Measure::default(),
            last_token: None,
            limits: Limits { max_body_bytes: MAX_BODY_BYTES, ..Limits::default() },
            cut_after: None,
        }
    }

    /// Reads the answer as `api` speaks it (chat completions by default).
    pub fn with_api(mut self, api: Api) -> Self {
        self.api = api;
        self
    }

    /// Ends a valid stream early, as done (`cut`, and the connection not to
    /// be reused), once `tokens` token deltas have arrived.
    pub fn cut_after(mut self, tokens: Option<u64>) -> Self {
        self.cut_after = tokens;
        self
    }

    /// Consumes what it can of `buf` (bytes that arrived at `now`). `None`
    /// while more input is needed; once `Some`, the exchange is over and
    /// anything left in `buf` was sent after the response.
    pub fn feed(&mut self, buf: &mut BytesMut, now: Instant) -> Option<Done> {
        if self.measure.ttfb.is_none() && !buf.is_empty() {
            self.measure.ttfb = Some(now.saturating_duration_since(self.start));
        }
        match self.step(buf, now) {
            Ok(None) => None,
            Ok(Some(done)) => Some(done),
            Err(failure) => Some(self.fail(failure)),
        }
    }

    /// The peer closed the connection (read returned 0).
    pub fn eof(&mut self, now: Instant) -> Done {
        let Phase::Body { status, mut decoder, body, .. } = std::mem::replace(&mut self.phase, Phase::Finished) else {
            return self.fail(Failure::Protocol("closed"));
        };
        if decoder.finish_on_eof().is_err() {
            return self.fail(Failure::Protocol("closed"));
        }
        match self.finish(status, body, now) {
            Ok(done) => Done { keep_alive: false, ..done },
            Err(failure) => self.fail(failure),
        }
    }

    fn fail(&mut self, failure: Failure) -> Done {
        self.phase = Phase::Finished;
        Done { keep_alive: false, result: Err(failure) }
    }

    fn step(&mut self, buf: &mut BytesMut, now: Instant) -> Result<Option<Done>, Failure> {
        loop {
            match &mut self.phase {
                Phase::Head => {
                    let Some(head) = parse_response_head(buf, &self.limits, false).map_err(|_| http_error())? else {
                        return Ok(None);
                    };
                    let body = if head.status != 200 {
                        Body::Discard
                    } else if self.stream {
                        let sse = head.header("content-type").is_some_and(|v| starts_with_ci(v, b"text/event-stream"));
                        if !sse {
                            return Err(Failure::Protocol("not_event_stream"));
                        }
                        Body::Sse { parser: SseParser::new(MAX_EVENT_BYTES), done: false }
                    } else {
                        Body::Json(BytesMut::new())
                    };
                    self.phase = Phase::Body {
                        status: head.status,
                        keep_alive: head.keep_alive,
                        decoder: BodyDecoder::new(head.body, MAX_BODY_BYTES),
                        body,
                    };
                }
                Phase::Body { decoder, body, .. } => {
                    while let Some(data) = decoder.decode(buf).map_err(|_| http_error())? {
                        self.measure.body_bytes += data.len() as u64;
                        match body {
                            Body::Sse { parser, done } => {
                                parser.push(&data);
                                sse_events(
                                    self.api,
                                    parser,
                                    done,
                                    &mut self.measure,
                                    &mut self.last_token,
                                    self.start,
                                    now,
                                )?;
                                if self.cut_after.is_some_and(|n| self.measure.tokens >= n) {
                                    self.phase = Phase::Finished;
                                    self.measure.total = now.saturating_duration_since(self.start);
                                    self.measure.cut = true;
                                    let measure = std::mem::take(&mut self.measure);
                                    return Ok(Some(Done { keep_alive: false, result: Ok(measure) }));
                                }
                            }
                            Body::Json(collected) => collected.extend_from_slice(&data),
                            Body::Discard => {}
                        }
                    }
                    if !decoder.is_done() {
                        return Ok(None);
                    }
                    let Phase::Body { status, keep_alive, body, .. } =
                        std::mem::replace(&mut self.phase, Phase::Finished)
                    else {
                        return Err(Failure::Protocol("internal"));
                    };
                    let done = self.finish(status, body, now)?;
                    return Ok(Some(Done { keep_alive: keep_alive && done.keep_alive, ..done }));
                }
                Phase::Finished => return Err(Failure::Protocol("internal")),
            }
        }
    }

    /// The body is complete: validate it.
    fn finish(&mut self, status: u16, body: Body, now: Instant) -> Result<Done, Failure> {
        self.phase = Phase::Finished;
        match body {
            Body::Discard => return Ok(Done { keep_alive: true, result: Err(Failure::Status(status)) }),
            Body::Sse { parser, done } => {
                if !done {
                    return Err(Failure::Protocol("missing_done"));
                }
                // The parser consumes whole lines; what stays is an unfinished one.
                if parser.buffered() > 0 {
                    return Err(Failure::Protocol("data_after_done"));
                }
            }
            Body::Json(collected) => {
                let tokens = self.api.whole(&collected)?;
                self.measure.usage_tokens = tokens;
                self.measure.tokens = tokens.unwrap_or(0);
            }
        }
        self.measure.total = now.saturating_duration_since(self.start);
        Ok(Done { keep_alive: true, result: Ok(std::mem::take(&mut self.measure)) })
    }
}

fn http_error() -> Failure {
    Failure::Protocol("http")
}

fn starts_with_ci(value: &[u8], prefix: &[u8]) -> bool {
    value.len() >= prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Handles every complete event in `parser`.
fn sse_events(
    api: Api,
    parser: &mut SseParser,
    done: &mut bool,
    m: &mut Measure,
    last_token: &mut Option<Instant>,
    start: Instant,
    now: Instant,
) -> Result<(), Failure> {
    while let Some(event) = parser.next_event().map_err(|_| Failure::Protocol("sse"))? {
        if *done {
            return Err(Failure::Protocol("data_after_done"));
        }
        m.events += 1;
        let ev = api.event(&event.data)?;
        *done = ev.last;
        if let Some(n) = ev.usage {
            m.usage_tokens = Some(n);
        }
        for _ in 0..ev.tokens {
            match *last_token {
                None => m.ttft = Some(now.saturating_duration_since(start)),
                Some(prev) => m.gaps_us.push(micros(now.saturating_duration_since(prev))),
            }
            *last_token = Some(now);
            m.tokens += 1;
        }
    }
    Ok(())
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn chunked(parts: &[&str]) -> String {
        let mut out =
            String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        for p in parts {
            out.push_str(&format!("{:x}\r\n{p}\r\n", p.len()));
        }
        out.push_str("0\r\n\r\n");
        out
    }

    fn ev(content: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n")
    }

    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn good_stream() -> String {
        chunked(&[ROLE, &ev("a"), &(ev("b") + &ev("c")), USAGE, DONE])
    }

    /// Feeds `input` split at `split`, the second part 1 ms later.
    fn run(stream: bool, input: &str, split: usize, eof: bool) -> Done {
        let t0 = Instant::now();
        let mut ex = Exchange::new(stream, t0);
        let mut buf = BytesMut::from(&input.as_bytes()[..split]);
        if let Some(done) = ex.feed(&mut buf, t0 + Duration::from_millis(1)) {
            return done;
        }
        buf.extend_from_slice(&input.as_bytes()[split..]);
        if let Some(done) = ex.feed(&mut buf, t0 + Duration::from_millis(2)) {
            return done;
        }
        assert!(eof, "incomplete without eof");
        ex.eof(t0 + Duration::from_millis(3))
    }

    #[test]
    fn valid_stream_at_every_split() {
        let input = good_stream();
        for split in 0..=input.len() {
            let done = run(true, &input, split, false);
            assert!(done.keep_alive, "split {split}");
            let m = done.result.unwrap_or_else(|e| panic!("split {split}: {e:?}"));
            assert_eq!((m.tokens, m.usage_tokens, m.gaps_us.len()), (3, Some(3), 2), "split {split}");
            assert_eq!((m.events, m.body_bytes, m.cut), (6, body_len(&input) as u64, false), "split {split}");
            assert!(m.ttfb.unwrap() <= m.ttft.unwrap() && m.ttft.unwrap() <= m.total);
        }
        // Both parts at once: two tokens in one read have a zero gap.
        let m = run(true, &input, input.len(), false).result.unwrap();
        assert_eq!(m.gaps_us, vec![0, 0]);
        assert_eq!(m.ttft, Some(Duration::from_millis(1)));
    }

    /// Bytes after the head of a chunked response, chunk framing removed.
    fn body_len(input: &str) -> usize {
        let (_, mut rest) = input.split_once("\r\n\r\n").unwrap();
        let mut n = 0;
        loop {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 {
                return n;
            }
            n += size;
            rest = &after[size + 2..];
        }
    }

    #[test]
    fn cuts_a_stream_after_n_tokens() {
        let input = good_stream();
        for split in 0..=input.len() {
            let t0 = Instant::now();
            let mut ex = Exchange::new(true, t0).cut_after(Some(2));
            let mut buf = BytesMut::from(&input.as_bytes()[..split]);
            let done = match ex.feed(&mut buf, t0) {
                Some(done) => done,
                None => {
                    buf.extend_from_slice(&input.as_bytes()[split..]);
                    ex.feed(&mut buf, t0).unwrap()
                }
            };
            assert!(!done.keep_alive, "split {split}");
            let m = done.result.unwrap();
            // "b" and "c" arrive in one event batch: the cut comes after both.
            assert!(m.cut && (2..=3).contains(&m.tokens), "split {split}: {m:?}");
        }
        // A stream that ends before the cut is a normal answer.
        let t0 = Instant::now();
        let m = Exchange::new(true, t0).cut_after(Some(9)).feed(&mut BytesMut::from(input.as_str()), t0).unwrap();
        assert_eq!((m.keep_alive, m.result.map(|m| (m.cut, m.tokens))), (true, Ok((false, 3))));
    }

    #[test]
    fn reasoning_counts_as_tokens() {
        let think = "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n";
        let m = run(true, &chunked(&[think, &ev("x"), DONE]), 0, false).result.unwrap();
        assert_eq!((m.tokens, m.usage_tokens), (2, None));
    }

    #[test]
    fn invalid_streams_are_errors() {
        let cases: Vec<(String, Failure)> = vec![
            (chunked(&[ROLE, &ev("a")]), Failure::Protocol("missing_done")),
            (chunked(&[&ev("a"), DONE, &ev("b")]), Failure::Protocol("data_after_done")),
            (chunked(&["data: {not json\n\n", DONE]), Failure::Protocol("invalid_chunk")),
            (
                chunked(&[&ev("a"), "data: {\"error\":{\"message\":\"slow_consumer\"}}\n\n"]),
                Failure::Protocol("error_event"),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".into(),
                Failure::Protocol("not_event_stream"),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".into(),
                Failure::Protocol("http"),
            ),
            ("garbage\r\n\r\n".into(), Failure::Protocol("http")),
        ];
        for (input, want) in cases {
            let done = run(true, &input, 0, false);
            assert_eq!(done.result, Err(want), "{input}");
            assert!(!done.keep_alive);
        }
    }

    #[test]
    fn cut_short_and_until_close() {
        let full = good_stream();
        let cut = &full[..full.len() - 30];
        let t0 = Instant::now();
        let mut ex = Exchange::new(true, t0);
        assert!(ex.feed(&mut BytesMut::from(cut.as_bytes()), t0).is_none());
        assert_eq!(ex.eof(t0).result, Err(Failure::Protocol("closed")));
        let mut ex = Exchange::new(true, t0);
        assert_eq!(ex.eof(t0).result, Err(Failure::Protocol("closed")));

        // A body delimited by close is complete at EOF, and the connection is done.
        let body = format!("{}{DONE}", ev("a"));
        let input = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{body}");
        let done = run(true, &input, 10, true);
        assert!(!done.keep_alive);
        assert_eq!(done.result.unwrap().tokens, 1);
    }

    #[test]
    fn status_errors_keep_the_connection() {
        let body = r#"{"error":{"message":"x","type":"server_error","code":500}}"#;
        let input = format!("HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        for split in 0..=input.len() {
            let done = run(true, &input, split, false);
            assert_eq!(done.result, Err(Failure::Status(500)));
            assert!(done.keep_alive);
        }
        let input = format!(
            "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let done = run(false, &input, 0, false);
        assert_eq!((done.result, done.keep_alive), (Err(Failure::Status(503)), false));
    }

    #[test]
    fn json_answers() {
        let body =
            r#"{"object":"chat.completion","choices":[{"message":{"content":"a b"}}],"usage":{"completion_tokens":2}}"#;
        let input = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        for split in 0..=input.len() {
            let m = run(false, &input, split, false).result.unwrap();
            assert_eq!((m.tokens, m.usage_tokens, m.ttft), (2, Some(2), None));
            assert_eq!((m.events, m.body_bytes), (0, body.len() as u64));
        }
        for (body, want) in
            [("{\"choices\":[]}", "no_choices"), ("{\"choices\":", "invalid_json"), ("[]", "invalid_json")]
        {
            let input = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            assert_eq!(run(false, &input, 0, false).result, Err(Failure::Protocol(want)), "{body}");
        }
    }
}
