//! The provider tunnel of an OpenAI-compatible provider: the edge's request
//! goes out as is (plus this provider's credential) and the answer comes
//! back byte for byte, with the usage read on the way.

use bytes::Bytes;
use iop_core::tunnel::{self, TunnelItem, Whole};

// A tunnel stops like a run: its sink gone (no terminal) or with a failure.
use super::{
    openai_compat::{Halt, OpenAiCompatAdapter},
    openai_stream::protocol,
};
use crate::{
    tunnel::{watch::BodyWatch, TunnelSink, TunnelSpec},
    upstream::Request,
};

impl OpenAiCompatAdapter {
    /// Sends `spec` to the provider and relays its answer to `sink`:
    /// `Start`, body chunks, then `End` (with usage) or `Error`. A function
    /// returning its block: an `async fn` would hold `spec` twice for the
    /// whole answer.
    #[allow(clippy::manual_async_fn)]
    pub fn tunnel<'a, S: TunnelSink>(
        &'a self,
        mut spec: TunnelSpec,
        sink: &'a mut S,
    ) -> impl std::future::Future<Output = ()> + 'a {
        async move {
            let limit = spec.deadline.map_or(self.request_timeout, |d| d.min(self.request_timeout));
            let outcome = iop_core::rt::time::timeout(limit, self.relay(&mut spec, sink)).await;
            let Some(failure) = Halt::failure(outcome, limit) else { return };
            tracing::debug!(tunnel = %spec.id, provider = %self.id, code = failure.code, status = failure.status, "tunnel failed");
            let _ = sink.send(TunnelItem::Error(failure)).await;
        }
    }

    /// Sends `spec`'s request to the provider: its parts are this
    /// function's, not kept in the relay's state for the whole answer.
    async fn send(&self, spec: &TunnelSpec) -> Result<crate::upstream::Response, Halt> {
        let target = [self.url.path_prefix.as_str(), spec.path].concat();
        // Room for the credential: no second allocation.
        let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(spec.headers.len() + 1);
        headers.extend(spec.headers.iter().map(|(n, v)| (n.as_str(), &v[..])));
        // A leased credential (managed mode) before the configured one.
        if let Some(auth) = spec.credential.as_ref().or(self.authorization.as_ref()) {
            headers.push(("authorization", auth.expose().as_bytes()));
        }
        let req = Request {
            method: &spec.method,
            host: &self.url.host,
            port: self.url.port,
            target: &target,
            headers: &headers,
            body: &spec.body,
            tls: self.tls.as_ref(),
        };
        super::send_upstream(&self.client, &req, &self.id, &spec.id).await.map_err(Halt::Fail)
    }

    async fn relay<S: TunnelSink>(&self, spec: &mut TunnelSpec, sink: &mut S) -> Result<(), Halt> {
        // Boxed: connecting and sending are brief, and a stream's task then
        // holds only the relay loop's state for the rest of the answer.
        let mut resp = Box::pin(self.send(spec)).await?;
        // Sent: the request's bytes are slices of the link's read buffer, which
        // they must not keep alive for the whole (maybe long) answer.
        spec.body = Bytes::new();
        spec.headers = Vec::new();
        let mut watch = BodyWatch::new(resp.header("content-type"), spec.hide_usage_chunk);
        // Content-Length stays (the edge frames the body with it) unless
        // the body is about to change.
        let mut headers = resp.take_headers();
        headers.retain(|(n, _)| {
            let changed_length = spec.hide_usage_chunk && n == "content-length";
            !(tunnel::is_hop_by_hop(n.as_bytes()) || changed_length)
        });
        let status = resp.status();
        let mut out: Vec<Bytes> = Vec::with_capacity(4);
        let broke = |e: crate::upstream::UpstreamError| Halt::Fail(protocol(format!("upstream stream broke: {e}")));
        // What arrived with the head; when that is the whole body (a small
        // answer, the usual case without streaming), the answer goes as one
        // item: one frame instead of three, and a single client write.
        let mut arrived = 0;
        while out.len() < MAX_PARTS && arrived < MAX_WHOLE_BYTES && !watch.ended() {
            match resp.chunk_ready() {
                Ok(Some(chunk)) => {
                    arrived += chunk.len();
                    watch.push(chunk, &mut out);
                }
                Ok(None) => break,
                Err(e) => return Err(broke(e)),
            }
        }
        // A small body of known length that is not an event stream: the rest
        // is awaited, so it too goes as one whole item (one frame, one client
        // write) rather than a start, a piece per read and an end.
        let fits = |left: u64| left.saturating_add(arrived as u64) <= MAX_WHOLE_BYTES as u64;
        if !watch.is_stream() && resp.length_left().is_some_and(fits) {
            while out.len() < MAX_PARTS && !resp.is_done() {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        arrived += chunk.len();
                        watch.push(chunk, &mut out);
                    }
                    Ok(None) => break,
                    Err(e) => return Err(broke(e)),
                }
            }
        }
        if watch.ended() {
            end_after_terminal(&mut resp, &spec.id);
        }
        // Whole: the body ended, or its terminal event arrived.
        if (resp.is_done() || watch.ended()) && arrived <= MAX_WHOLE_BYTES {
            let usage = watch.finish(&mut out);
            out.retain(|p| !p.is_empty());
            coalesce(&mut out);
            sink.send(TunnelItem::Whole(Box::new(Whole { status, headers, body: out, usage }))).await?;
            return Ok(());
        }
        sink.send(TunnelItem::Start { status, headers }).await?;
        send_parts(sink, &mut out).await?;
        while !watch.ended() {
            match resp.chunk().await {
                Ok(Some(chunk)) => watch.push(chunk, &mut out),
                Ok(None) => break,
                Err(e) => return Err(broke(e)),
            }
            // What that read brought beyond the first chunk goes in the same
            // item: one frame, one client write (bounded).
            while out.len() < MAX_PARTS && out.iter().map(Bytes::len).sum::<usize>() < MAX_PARTS_BYTES && !watch.ended()
            {
                match resp.chunk_ready() {
                    Ok(Some(chunk)) => watch.push(chunk, &mut out),
                    Ok(None) => break,
                    Err(e) => return Err(broke(e)),
                }
            }
            send_parts(sink, &mut out).await?;
        }
        if watch.ended() && !resp.is_done() {
            end_after_terminal(&mut resp, &spec.id);
        }
        let usage = watch.finish(&mut out);
        send_parts(sink, &mut out).await?;
        sink.send(TunnelItem::End { usage }).await?;
        Ok(())
    }
}

/// The answer's terminal event went by: the body's end (the last chunk
/// marker) is taken when it already arrived, so the connection goes back to
/// the pool; a provider that keeps the body open past the terminal event is
/// not waited for, and its connection is closed, never reused (dropping an
/// unfinished response shuts it down).
fn end_after_terminal(resp: &mut crate::upstream::Response, id: &str) {
    // Only framing is expected here; anything else is not relayed.
    let mut extra = 0;
    while let Ok(Some(chunk)) = resp.chunk_ready() {
        extra += chunk.len();
    }
    if !resp.is_done() || extra > 0 {
        tracing::debug!(tunnel = %id, extra, done = resp.is_done(), "provider sent past the terminal event; its connection is closed");
    }
}

/// Most body pieces, and bytes, relayed as one item.
const MAX_PARTS: usize = 64;
const MAX_PARTS_BYTES: usize = 256 * 1024;
/// Largest body sent as one whole item: a terminal item skips the credit
/// window, so it must stay well within it.
const MAX_WHOLE_BYTES: usize = 64 * 1024;
const _: () = assert!(MAX_WHOLE_BYTES as u64 <= iop_core::flow::WINDOW_BYTES / 4);

/// Pieces smaller than this on average are copied into one buffer rather
/// than relayed each as a segment of its own: a read of a bursty stream
/// holds dozens of small events (one HTTP chunk each), and every segment
/// costs more down the line (its field in the frame, its decode and
/// reference count at the edge, its chunk header and iovecs in the client
/// write) than copying its bytes once here.
const COPY_PIECES_BELOW: usize = 2 * 1024;

/// Sends the pieces in `out` as one item (none when there are none).
async fn send_parts<S: TunnelSink>(sink: &mut S, out: &mut Vec<Bytes>) -> Result<(), Halt> {
    out.retain(|p| !p.is_empty());
    coalesce(out);
    let item = match out.len() {
        0 => return Ok(()),
        1 => TunnelItem::Body(out.pop().unwrap_or_default()),
        _ => TunnelItem::Parts(std::mem::take(out)),
    };
    sink.send(item).await?;
    Ok(())
}

/// Joins the pieces of `out` into one when they are small (see
/// [`COPY_PIECES_BELOW`]).
fn coalesce(out: &mut Vec<Bytes>) {
    let total: usize = out.iter().map(Bytes::len).sum();
    if out.len() < 2 || total >= out.len() * COPY_PIECES_BELOW {
        return;
    }
    let mut one = bytes::BytesMut::with_capacity(total);
    out.iter().for_each(|p| one.extend_from_slice(p));
    out.clear();
    out.push(one.freeze());
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use iop_core::{
        config::UpstreamUrl,
        exec::{codes, Usage},
        http::HeaderName,
    };

    use super::*;
    use crate::run::SinkClosed;
    use crate::upstream::{
        test_server::{sse_chunked, sse_chunked_open, with_body, Event, Reply, TestServer},
        UpstreamClient,
    };

    #[derive(Default)]
    struct Items(Vec<TunnelItem>);

    impl TunnelSink for Items {
        async fn send(&mut self, item: TunnelItem) -> Result<(), SinkClosed> {
            self.0.push(item);
            Ok(())
        }
    }

    fn adapter(server: &TestServer, timeout: Duration) -> OpenAiCompatAdapter {
        let url =
            UpstreamUrl { tls: false, host: "127.0.0.1".into(), port: server.addr.port(), path_prefix: "/v1".into() };
        OpenAiCompatAdapter::new("up".into(), url, Some("sk-test"), 4, timeout, UpstreamClient::default())
    }

    fn spec(body: &'static [u8], hide: bool) -> TunnelSpec {
        TunnelSpec {
            id: "t1".into(),
            method: "POST".into(),
            path: "/chat/completions",
            headers: vec![
                (HeaderName::from_static("content-type"), Bytes::from_static(b"application/json")),
                (HeaderName::from_static("x-client"), Bytes::from_static(b"\xfe-raw")),
            ],
            body: Bytes::from_static(body),
            hide_usage_chunk: hide,
            deadline: None,
            credential: None,
        }
    }

    fn run(a: &OpenAiCompatAdapter, spec: TunnelSpec) -> Vec<TunnelItem> {
        iop_core::rt::block_on_current(async {
            let mut items = Items::default();
            a.tunnel(spec, &mut items).await;
            items.0
        })
        .unwrap()
    }

    fn body_of(items: &[TunnelItem]) -> Vec<u8> {
        let mut out = Vec::new();
        for i in items {
            match i {
                TunnelItem::Body(b) => out.extend_from_slice(b),
                TunnelItem::Parts(parts) => parts.iter().for_each(|p| out.extend_from_slice(p)),
                TunnelItem::Whole(w) => w.body.iter().for_each(|p| out.extend_from_slice(p)),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn relays_the_request_and_answer_as_they_are() {
        let answer = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3},"big":123456789012345678901234567890}"#;
        let reply = with_body(200, "application/json", std::str::from_utf8(answer).unwrap());
        let server = TestServer::start(vec![Reply::keep(reply)]);
        let a = adapter(&server, Duration::from_secs(5));
        let sent: &[u8] = br#"{"model":"m","messages":[],"n":99999999999999999999999}"#;
        let items = run(&a, spec(sent, false));
        // It arrived with its head: one whole item.
        let [TunnelItem::Whole(w)] = &items[..] else { panic!("{items:?}") };
        assert_eq!(w.status, 200);
        assert!(w.headers.iter().any(|(n, v)| n == "content-length" && &v[..] == answer.len().to_string().as_bytes()));
        assert_eq!(body_of(&items), answer);
        assert_eq!(w.usage, Some(Usage { input_tokens: 2, output_tokens: 3, ..Default::default() }));
        assert_eq!(server.next_event(), Event::Accepted(0));
        let Event::Request { head, body, .. } = server.next_event() else { panic!() };
        assert_eq!(body, sent, "the body went out unchanged");
        let lower = head.to_ascii_lowercase();
        assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"), "{head}");
        assert!(lower.contains("authorization: bearer sk-test") && lower.contains("x-client: "), "{head}");
    }

    #[test]
    fn errors_pass_through_with_their_headers() {
        let reply = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 7\r\nx-ratelimit-remaining-requests: 0\r\ncontent-length: 26\r\n\r\n{\"error\":{\"code\":\"slow\"}}\n".to_vec();
        let server = TestServer::start(vec![Reply::keep(reply)]);
        let items = run(&adapter(&server, Duration::from_secs(5)), spec(b"{}", false));
        let [TunnelItem::Whole(w)] = &items[..] else { panic!("{items:?}") };
        assert_eq!(w.status, 429);
        assert!(w.headers.iter().any(|(n, v)| n == "retry-after" && &v[..] == b"7"));
        assert!(w.headers.iter().any(|(n, _)| n == "x-ratelimit-remaining-requests"));
        assert_eq!(body_of(&items), b"{\"error\":{\"code\":\"slow\"}}\n");
        assert_eq!(w.usage, None);
    }

    /// Sends on `started` when the start item arrives.
    struct Signalling(Vec<TunnelItem>, std::sync::mpsc::Sender<()>);

    impl TunnelSink for Signalling {
        async fn send(&mut self, item: TunnelItem) -> Result<(), SinkClosed> {
            if matches!(item, TunnelItem::Start { .. }) {
                let _ = self.1.send(());
            }
            self.0.push(item);
            Ok(())
        }
    }

    /// Accepts one connection and reads the request spec(b"{}") sends.
    fn accept_request(listener: &std::net::TcpListener) -> std::net::TcpStream {
        use std::io::Read;
        let (mut s, _) = listener.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") || !req.ends_with(b"{}") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "request cut");
            req.extend_from_slice(&buf[..n]);
        }
        s
    }

    #[test]
    fn a_small_body_of_known_length_that_comes_after_its_head_goes_as_one_whole_item() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let mut s = accept_request(&listener);
            let body =
                format!(r#"{{"usage":{{"prompt_tokens":4,"completion_tokens":5}},"pad":"{}"}}"#, "x".repeat(20_000));
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
            // The head with a little of the body, the rest in pieces: reads
            // of the node that each find only part of it.
            s.write_all(format!("{head}{}", &body[..9]).as_bytes()).unwrap();
            for piece in body.as_bytes()[9..].chunks(7_000) {
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(piece).unwrap();
            }
            body
        });
        let url = UpstreamUrl { tls: false, host: "127.0.0.1".into(), port, path_prefix: String::new() };
        let a = OpenAiCompatAdapter::new("up".into(), url, None, 1, Duration::from_secs(5), UpstreamClient::default());
        let items = run(&a, spec(b"{}", false));
        let body = server.join().unwrap();
        let [TunnelItem::Whole(w)] = &items[..] else { panic!("{items:?}") };
        assert_eq!(body_of(&items), body.as_bytes());
        assert_eq!(w.usage, Some(Usage { input_tokens: 4, output_tokens: 5, ..Default::default() }));
        assert!(w.headers.iter().any(|(n, v)| n == "content-length" && &v[..] == body.len().to_string().as_bytes()));
    }

    #[test]
    fn small_pieces_are_joined_and_large_ones_kept_apart() {
        let small: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("data: {i}\n\n"))).collect();
        let mut out = small.clone();
        coalesce(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0], small.concat());
        let large = vec![Bytes::from(vec![b'a'; 8192]), Bytes::from(vec![b'b'; 8192])];
        let mut out = large.clone();
        coalesce(&mut out);
        assert_eq!(out, large, "relayed from the read buffer, not copied");
        let mut one = vec![Bytes::from_static(b"x")];
        coalesce(&mut one);
        assert_eq!(one, [Bytes::from_static(b"x")]);
    }

    #[test]
    fn a_burst_of_events_goes_as_one_piece_per_read() {
        let events: Vec<String> = (0..30)
            .map(|i| format!(r#"{{"choices":[{{"delta":{{"content":"t{i}"}}}}]}}"#))
            .chain(["[DONE]".into()])
            .collect();
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        let server = TestServer::start(vec![Reply::keep(sse_chunked(&events))]);
        let items = run(&adapter(&server, Duration::from_secs(5)), spec(b"{}", false));
        // Each read's events (one HTTP chunk each) joined: no item of parts.
        let pieces: usize = items
            .iter()
            .map(|i| match i {
                TunnelItem::Body(_) => 1,
                TunnelItem::Parts(p) => p.len(),
                TunnelItem::Whole(w) => w.body.len(),
                _ => 0,
            })
            .sum();
        assert!(!items.iter().any(|i| matches!(i, TunnelItem::Parts(_))), "{items:?}");
        assert!(pieces <= 4, "{pieces} pieces for 31 events: {items:?}");
        let body = String::from_utf8(body_of(&items)).unwrap();
        assert!(body.starts_with("data: {") && body.ends_with("data: [DONE]\n\n"), "{body}");
        assert_eq!(body.matches("data: ").count(), 31);
    }

    #[test]
    fn a_body_that_comes_after_its_head_goes_as_start_body_end() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let mut s = accept_request(&listener);
            // Of unknown length (chunked): relayed as it comes.
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n9\r\n{\"usage\":\r\n")
                .unwrap();
            // The rest only once the node relayed the status.
            started_rx.recv().unwrap();
            s.write_all(b"2a\r\n{\"prompt_tokens\":4,\"completion_tokens\":5}}\r\n0\r\n\r\n").unwrap();
        });
        let url = UpstreamUrl { tls: false, host: "127.0.0.1".into(), port, path_prefix: String::new() };
        let a = OpenAiCompatAdapter::new("up".into(), url, None, 1, Duration::from_secs(5), UpstreamClient::default());
        let items = iop_core::rt::block_on_current(async {
            let mut sink = Signalling(Vec::new(), started_tx);
            a.tunnel(spec(b"{}", false), &mut sink).await;
            sink.0
        })
        .unwrap();
        server.join().unwrap();
        assert!(matches!(&items[0], TunnelItem::Start { status: 200, .. }), "{items:?}");
        assert_eq!(body_of(&items), br#"{"usage":{"prompt_tokens":4,"completion_tokens":5}}"#);
        assert_eq!(
            items.last(),
            Some(&TunnelItem::End { usage: Some(Usage { input_tokens: 4, output_tokens: 5, ..Default::default() }) })
        );
        assert!(items.len() >= 3, "{items:?}");
    }

    #[test]
    fn a_broken_stream_ends_with_an_error_after_the_bytes_it_sent() {
        let server =
            TestServer::start(vec![Reply::close(sse_chunked_open(&[r#"{"choices":[{"delta":{"content":"a"}}]}"#]))]);
        let items = run(&adapter(&server, Duration::from_secs(5)), spec(b"{}", true));
        assert!(matches!(items[0], TunnelItem::Start { status: 200, .. }));
        assert!(body_of(&items).starts_with(b"data: "));
        let Some(TunnelItem::Error(f)) = items.last() else { panic!("{items:?}") };
        assert_eq!((f.code, f.status), (codes::UPSTREAM_PROTOCOL, 502));
    }

    #[test]
    fn the_answer_ends_at_its_terminal_event_and_an_open_connection_is_not_reused() {
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}"#;
        let events = [r#"{"choices":[{"delta":{"content":"a"}}]}"#, usage, "[DONE]"];
        // Kept open after [DONE]; then one that ends its body properly.
        let server = TestServer::start(vec![Reply::keep(sse_chunked_open(&events)), Reply::keep(sse_chunked(&events))]);
        let a = adapter(&server, Duration::from_secs(30));
        let started = std::time::Instant::now();
        let items = run(&a, spec(b"{}", true));
        assert!(started.elapsed() < Duration::from_secs(5), "waited for the provider: {:?}", started.elapsed());
        let body = String::from_utf8(body_of(&items)).unwrap();
        assert!(body.ends_with("data: [DONE]\n\n") && !body.contains("usage"), "{body}");
        let usage_of = |items: &[TunnelItem]| match items.last() {
            Some(TunnelItem::End { usage }) => *usage,
            Some(TunnelItem::Whole(w)) => w.usage,
            other => panic!("{other:?}"),
        };
        assert_eq!(usage_of(&items).map(|u| u.input_tokens), Some(2));
        assert_eq!(a.client().idle_connections("127.0.0.1", server.addr.port()), 0, "the open connection was parked");
        // The provider saw the node leave.
        assert_eq!(server.next_event(), Event::Accepted(0));
        assert!(matches!(server.next_event(), Event::Request { conn: 0, .. }));
        // A body that ends is read to its end: the connection is kept.
        let items = run(&a, spec(b"{}", false));
        assert_eq!(usage_of(&items).map(|u| u.output_tokens), Some(1));
        assert_eq!(a.client().idle_connections("127.0.0.1", server.addr.port()), 1);
    }

    #[test]
    fn an_unreachable_provider_is_an_error_before_start() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = UpstreamUrl { tls: false, host: "127.0.0.1".into(), port, path_prefix: String::new() };
        let a = OpenAiCompatAdapter::new("up".into(), url, None, 1, Duration::from_secs(5), UpstreamClient::default());
        let items = run(&a, spec(b"{}", false));
        let [TunnelItem::Error(f)] = &items[..] else { panic!("{items:?}") };
        assert_eq!((f.code, f.retryable), (codes::UPSTREAM_CONNECT, true));
        assert!(!f.message.contains(&port.to_string()));
    }
}
