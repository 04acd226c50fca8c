//! Sending one request and reading its response over a pooled connection.

use std::{cell::Cell, fmt, rc::Rc, time::Duration};

use bytes::{Bytes, BytesMut};
use iop_core::net::{tls::ClientTls, Stream};
use iop_core::{
    http::{parse_response_head, write_request_head, BodyDecoder, BodyKind, HeaderName, ResponseHead},
    rt::{clock, io::read_append, time},
};
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};

use super::{
    connect::connect,
    pace::Pacer,
    pool::{Pool, PoolKey},
    ClientConfig, UpstreamError,
};

/// Reads (head and body) start this small (a paced stream brings a few hundred bytes
/// per read, and a read buffer per open stream is what its memory is) and
/// double, up to [`MAX_BODY_READ`], while reads fill them.
const MIN_READ: usize = 512;
const MAX_BODY_READ: usize = 64 * 1024;
/// Largest first body read (see `Inner::read_hint`).
const MAX_READ_HINT: usize = 16 * 1024;

/// One HTTP request to send.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// Method, e.g. "POST".
    pub method: &'a str,
    /// Host name or IP literal (no brackets).
    pub host: &'a str,
    /// TCP port.
    pub port: u16,
    /// Request target: path and query.
    pub target: &'a str,
    /// Extra headers (`Host` and `Content-Length` are added). Values are
    /// bytes: relayed client headers may hold non-UTF-8 octets.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// Request body.
    pub body: &'a [u8],
    /// https: TLS with this config, the host as SNI and the name its
    /// certificate must be valid for.
    pub tls: Option<&'a ClientTls>,
}

impl fmt::Debug for Request<'_> {
    // Header values may hold credentials: print names only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("target", &self.target)
            .field("headers", &self.headers.iter().map(|(n, _)| *n).collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// How often parked connections are checked for a peer's close (one
/// non-blocking peek each; the check runs only while some are parked).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Inner {
    cfg: ClientConfig,
    pool: Pool,
    /// A sweep task is running (it ends once the pool is empty).
    sweeping: Cell<bool>,
    /// Room the first body read of the next response asks for: where the
    /// last response's reads ended, so a provider that sends its events in
    /// bursts is not read again through a doubling series from the
    /// smallest read, each response anew.
    read_hint: Cell<usize>,
}

impl Inner {
    /// Parks `stream` and makes sure a sweep task watches the pool.
    fn park(self: &Rc<Self>, key: PoolKey, stream: Stream) {
        self.pool.put(key, stream);
        if !self.sweeping.replace(true) {
            monoio::spawn(sweep(Rc::downgrade(self)));
        }
    }
}

/// Drops parked connections their peer closed, every [`SWEEP_EVERY`], until
/// the pool is empty or the client is gone.
async fn sweep(client: std::rc::Weak<Inner>) {
    loop {
        // monoio's own timer, not the per-core table (`rt::time`): a client
        // can outlive the runtime that parked its connections (tests run
        // one runtime after another on a thread), and this task with it; a
        // table sleep in that task left the next runtime's timers stuck.
        monoio::time::sleep(SWEEP_EVERY).await;
        let Some(inner) = client.upgrade() else { return };
        if inner.pool.sweep() == 0 {
            inner.sweeping.set(false);
            return;
        }
    }
}

/// HTTP/1.1 client with a keep-alive pool; clones share the pool. Pooled
/// connections are registered with the runtime that opened them: keep a
/// client on one runtime (one per reactor thread).
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Rc<Inner>,
}

impl fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamClient").field("cfg", &self.inner.cfg).finish_non_exhaustive()
    }
}

impl Default for UpstreamClient {
    fn default() -> Self {
        Self::new(ClientConfig::default())
    }
}

/// How one exchange on one connection failed.
enum Attempt {
    /// Not one byte of the request was written: it may go out on another
    /// connection.
    NothingSent(UpstreamError),
    /// Some of the request may have reached the provider: never resent (a
    /// provider that read it may be running it).
    Failed(UpstreamError),
}

impl Attempt {
    fn into_error(self) -> UpstreamError {
        match self {
            Attempt::NothingSent(e) | Attempt::Failed(e) => e,
        }
    }
}

impl UpstreamClient {
    /// A client with its own, empty pool.
    pub fn new(cfg: ClientConfig) -> Self {
        let pool = Pool::new(cfg.max_idle_per_host, cfg.idle_timeout);
        Self { inner: Rc::new(Inner { cfg, pool, sweeping: Cell::new(false), read_hint: Cell::new(MIN_READ) }) }
    }

    /// The client's settings.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// Idle connections parked for `host:port`.
    pub fn idle_connections(&self, host: &str, port: u16) -> usize {
        self.inner.pool.idle_count(host, port, false) + self.inner.pool.idle_count(host, port, true)
    }

    /// Sends `req` and waits for the response head. Reuses an idle
    /// connection when one is parked and still open. A request is sent at
    /// most once: it goes out on a fresh connection only when not one byte
    /// of it was written on the pooled one; once any byte was written, a
    /// failure is returned, never a second copy (the provider may be
    /// running the first).
    pub async fn send(&self, req: &Request<'_>) -> Result<Response, UpstreamError> {
        let tls = req.tls.is_some();
        let wire = encode_request(req);
        let head_request = req.method.eq_ignore_ascii_case("HEAD");
        while let Some((stream, key)) = self.inner.pool.take(req.host, req.port, tls) {
            // A connection the provider closed while parked is found here,
            // before the request is written to it.
            if !stream.idle_and_open() {
                tracing::debug!(host = %req.host, port = req.port, "pooled connection closed by the upstream; dropped");
                continue;
            }
            match self.exchange(stream, wire.clone(), head_request, key, true).await {
                Ok(resp) => return Ok(resp),
                Err(Attempt::NothingSent(e)) => {
                    tracing::debug!(host = %req.host, port = req.port, error = %e, "pooled connection refused the request before any byte; using a fresh one");
                    break;
                }
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        let stream = connect(req.host, req.port, req.tls, self.inner.cfg.connect_timeout).await?;
        let key = PoolKey::new(req.host, req.port, tls);
        self.exchange(stream, wire, head_request, key, false).await.map_err(Attempt::into_error)
    }

    async fn exchange(
        &self,
        stream: Stream,
        wire: Bytes,
        head_request: bool,
        key: PoolKey,
        reused: bool,
    ) -> Result<Response, Attempt> {
        let mut live = Live(Some(stream));
        let Live(Some(stream)) = &mut live else {
            return Err(Attempt::NothingSent(UpstreamError::Closed("before the request was written")));
        };
        // The first write tells whether anything went out at all.
        let len = wire.len();
        let (res, wire) = stream.write(wire).await;
        match res {
            Ok(n) if n >= len => {}
            Ok(0) => return Err(Attempt::NothingSent(UpstreamError::Closed("before the request was written"))),
            Ok(n) => {
                let (res, _) = stream.write_all(wire.slice(n..)).await;
                res.map_err(|e| Attempt::Failed(UpstreamError::Io(e)))?;
            }
            Err(e) => return Err(Attempt::NothingSent(UpstreamError::Io(e))),
        }
        let limits = self.inner.cfg.limits;
        // The head's header values are slices of this buffer, and the body's
        // reads go on in it: it is the room the last response's reads ended
        // with (a paced stream's few hundred bytes, a small answer's head and
        // body at once), and it grows only for a big head.
        let room = self.inner.read_hint.get().max(MIN_READ);
        let mut buf = BytesMut::with_capacity(room);
        let mut received = false;
        let mut filled = false;
        let head = loop {
            if received {
                if let Some(head) =
                    parse_response_head(&mut buf, &limits, head_request).map_err(|e| Attempt::Failed(e.into()))?
                {
                    break head;
                }
            }
            match read_append(stream, &mut buf, MIN_READ).await {
                Ok(0) if received => {
                    return Err(Attempt::Failed(UpstreamError::Closed("in the middle of the response head")))
                }
                Ok(0) => return Err(Attempt::Failed(UpstreamError::Closed("before responding"))),
                Ok(n) => {
                    // The first read filled its room: more is waiting.
                    filled |= !received && n >= room;
                    received = true;
                }
                Err(e) => return Err(Attempt::Failed(UpstreamError::Io(e))),
            }
        };
        let decoder = BodyDecoder::new(head.body, limits.max_body_bytes);
        let mut resp = Response {
            head,
            decoder,
            buf,
            conn: live.0.take(),
            client: Rc::clone(&self.inner),
            key,
            reused,
            done: false,
            read_size: if filled { (room * 2).min(MAX_BODY_READ) } else { self.inner.read_hint.get() },
            pacer: Pacer::default(),
        };
        if resp.decoder.is_done() {
            resp.finish();
        }
        Ok(resp)
    }
}

/// Head and body in one buffer, so the request goes out in one write.
fn encode_request(req: &Request<'_>) -> Bytes {
    let mut out = BytesMut::with_capacity(
        256 + req.body.len() + req.headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum::<usize>(),
    );
    let bodyless = matches!(req.method, "GET" | "HEAD" | "DELETE" | "OPTIONS") && req.body.is_empty();
    let content_length = if bodyless { None } else { Some(req.body.len()) };
    write_request_head(&mut out, req.method, req.target, (req.host, Some(req.port)), req.headers, content_length);
    out.extend_from_slice(req.body);
    out.freeze()
}

/// A connection in the middle of an exchange. Dropped before the exchange
/// ends (a cancelled run, a timeout), it is shut down at once: the provider
/// sees the client leave and stops generating, without waiting for the ring
/// to cancel the read in flight and close the descriptor.
struct Live(Option<Stream>);

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(stream) = &self.0 {
            stream.shutdown_now();
        }
    }
}

/// A response whose head arrived; the body is read with [`Response::chunk`].
/// Dropping it before the end of the body shuts the connection down at once.
pub struct Response {
    head: ResponseHead,
    decoder: BodyDecoder,
    buf: BytesMut,
    conn: Option<Stream>,
    client: Rc<Inner>,
    key: PoolKey,
    reused: bool,
    done: bool,
    /// Room the next body read asks for.
    read_size: usize,
    /// When the next body read may start.
    pacer: Pacer,
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.head.status)
            .field("body", &self.head.body)
            .field("reused", &self.reused)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Drop for Response {
    fn drop(&mut self) {
        self.client.read_hint.set(self.read_size.min(MAX_READ_HINT));
        // Still held: the body did not end (a finished one is parked or closed).
        if let Some(stream) = &self.conn {
            stream.shutdown_now();
        }
    }
}

impl Response {
    /// Status code.
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// The parsed head.
    pub fn head(&self) -> &ResponseHead {
        &self.head
    }

    /// First value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head.headers.iter().find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| &v[..])
    }

    /// Moves the head's headers out (`header` finds none after): relaying
    /// them costs no reference count per name and value.
    pub fn take_headers(&mut self) -> Vec<(HeaderName, Bytes)> {
        std::mem::take(&mut self.head.headers)
    }

    /// Whether the request went out on a pooled connection.
    pub fn reused_connection(&self) -> bool {
        self.reused
    }

    /// The body bytes still to come when the head announced a length (what
    /// is already read and not yet handed out counts as come).
    pub fn length_left(&self) -> Option<u64> {
        let left = self.decoder.length_left()?;
        Some(left.saturating_sub(self.buf.len() as u64))
    }

    /// The body was read to its end.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The body bytes already read, as one piece however many HTTP chunks
    /// they span, without reading more: `Ok(None)` when more must be read
    /// first (or the body ended: see `is_done`).
    pub fn chunk_ready(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let before = self.buf.len();
            let data = self.decoder.decode_joined(&mut self.buf)?;
            if self.decoder.is_done() {
                self.finish();
            }
            if let Some(data) = data.filter(|d| !d.is_empty()) {
                return Ok(Some(data));
            }
            if self.done || self.buf.len() >= before {
                return Ok(None);
            }
            // Framing bytes were consumed: decode again.
        }
    }

    /// Next decoded body chunk; `Ok(None)` at the end of the body. A fast
    /// body is read at most once per the client's `coalesce` window (see
    /// `pace.rs`).
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        loop {
            if let Some(data) = self.chunk_ready()? {
                return Ok(Some(data));
            }
            if self.done {
                return Ok(None);
            }
            let window = self.client.cfg.coalesce;
            let started = if window.is_zero() {
                None
            } else {
                let now = clock::now();
                match self.pacer.wait_until(now) {
                    Some(until) => {
                        time::sleep_until(until).await;
                        Some(clock::now())
                    }
                    None => Some(now),
                }
            };
            // A body of known length asks for what is left of it (bounded):
            // one read instead of a doubling series from the smallest.
            let want = self.length_left().map_or(self.read_size, |left| {
                usize::try_from(left).unwrap_or(usize::MAX).clamp(self.read_size, MAX_BODY_READ)
            });
            let Some(stream) = self.conn.as_mut() else {
                return Err(UpstreamError::Closed("before the end of the body"));
            };
            let room = self.buf.capacity() - self.buf.len();
            let ask = if room >= want { room } else { want };
            let read = read_append(stream, &mut self.buf, want).await;
            match read {
                // The read filled what it had: ask for more next time.
                Ok(n) if n >= ask => self.read_size = (self.read_size * 2).min(MAX_BODY_READ),
                // Far less came than was asked for (a paced stream): a
                // smaller room, which the read holds while it waits. Not for
                // a body of known length: its last read brings what is left,
                // and the next answer's head read should still take it whole.
                Ok(n) if n > 0 && n * 4 < self.read_size && self.length_left().is_none() => {
                    self.read_size = (self.read_size / 2).max(MIN_READ)
                }
                _ => {}
            }
            if let Some(started) = started {
                let n = *read.as_ref().unwrap_or(&0);
                self.pacer.read(window, started, clock::now(), n, ask);
            }
            match read {
                Ok(0) => {
                    // The connection is finished either way.
                    self.conn = None;
                    self.decoder.finish_on_eof().map_err(|_| UpstreamError::Closed("before the end of the body"))?;
                    self.done = true;
                    // Bytes the decoder could still hand out after EOF.
                    if let Some(rest) = self.decoder.decode(&mut self.buf)?.filter(|d| !d.is_empty()) {
                        return Ok(Some(rest));
                    }
                    return Ok(None);
                }
                Ok(_) => {}
                Err(e) => {
                    self.conn = None;
                    return Err(UpstreamError::Io(e));
                }
            }
        }
    }

    /// Reads the rest of the body, keeping at most `max` bytes. Returns the
    /// bytes and whether the body was longer (then the connection is closed
    /// rather than read to its end).
    pub async fn read_to_end(&mut self, max: usize) -> Result<(Bytes, bool), UpstreamError> {
        let mut out = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            let room = max.saturating_sub(out.len());
            if chunk.len() > room {
                out.extend_from_slice(&chunk[..room]);
                self.conn = None;
                self.done = true;
                return Ok((out.freeze(), true));
            }
            out.extend_from_slice(&chunk);
        }
        Ok((out.freeze(), false))
    }

    /// The body ended: park the connection if it can carry another request.
    fn finish(&mut self) {
        self.done = true;
        let Some(stream) = self.conn.take() else { return };
        let reusable = self.head.keep_alive && self.buf.is_empty() && self.head.body != BodyKind::UntilClose;
        if reusable {
            self.client.park(self.key.clone(), stream);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::upstream::test_server::{with_body, Event, Reply, TestServer};

    fn get(port: u16) -> Request<'static> {
        Request {
            method: "GET",
            host: "127.0.0.1",
            port,
            target: "/x",
            headers: &[("x-test", b"1")],
            body: b"",
            tls: None,
        }
    }

    async fn body_of(client: &UpstreamClient, req: &Request<'_>) -> (u16, Bytes, bool) {
        let mut resp = client.send(req).await.unwrap();
        let reused = resp.reused_connection();
        let (body, truncated) = resp.read_to_end(1 << 20).await.unwrap();
        assert!(!truncated);
        (resp.status(), body, reused)
    }

    #[test]
    fn sequential_requests_share_one_connection() {
        let server = TestServer::start(vec![
            Reply::keep(with_body(200, "text/plain", "one")),
            Reply::keep(with_body(201, "text/plain", "two")),
        ]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (a, b, idle) = iop_core::rt::block_on_current(async {
            let a = body_of(&client, &get(port)).await;
            let b = body_of(&client, &get(port)).await;
            (a, b, client.idle_connections("127.0.0.1", port))
        })
        .unwrap();
        assert_eq!(a, (200, Bytes::from_static(b"one"), false));
        assert_eq!(b, (201, Bytes::from_static(b"two"), true));
        assert_eq!(idle, 1);
        assert_eq!(server.next_event(), Event::Accepted(0));
        let Event::Request { conn: 0, head, body } = server.next_event() else { panic!() };
        assert!(head.starts_with("GET /x HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains(&format!("\r\nhost: 127.0.0.1:{port}")), "{head}");
        assert!(body.is_empty());
        assert!(matches!(server.next_event(), Event::Request { conn: 0, .. }));
    }

    #[test]
    fn the_next_response_starts_reading_where_the_last_one_ended() {
        use crate::upstream::test_server::sse_chunked;
        let events: Vec<String> = (0..400).map(|i| format!(r#"{{"n":{i},"pad":"{}"}}"#, "x".repeat(100))).collect();
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        let server = TestServer::start(vec![Reply::keep(sse_chunked(&events)), Reply::keep(sse_chunked(&events[..1]))]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (first, second) = iop_core::rt::block_on_current(async {
            // A big body sent at once: the reads grow as they fill.
            let mut resp = client.send(&get(port)).await.unwrap();
            // The head's read filled its room: the body's reads start at twice it.
            assert_eq!(resp.read_size, 2 * MIN_READ);
            while resp.chunk().await.unwrap().is_some() {}
            let grown = resp.read_size;
            drop(resp);
            let resp = client.send(&get(port)).await.unwrap();
            (grown, resp.read_size)
        })
        .unwrap();
        assert!(first > MIN_READ, "{first}");
        assert_eq!(second, first.min(MAX_READ_HINT));
    }

    #[test]
    fn a_small_answer_is_read_with_its_head_from_the_second_on() {
        // Head and body together larger than the first read's room, smaller than twice it.
        let body = "x".repeat(MIN_READ + 100);
        let replies = (0..3).map(|_| Reply::keep(with_body(200, "text/plain", &body))).collect();
        let server = TestServer::start(replies);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let whole_at_once = iop_core::rt::block_on_current(async {
            let mut at_once = Vec::new();
            for _ in 0..3 {
                let mut resp = client.send(&get(port)).await.unwrap();
                at_once.push(resp.length_left() == Some(0));
                while resp.chunk().await.unwrap().is_some() {}
            }
            at_once
        })
        .unwrap();
        // The first is read in two; its last read, small, does not shrink the
        // room the next head is read into.
        assert_eq!(whole_at_once, vec![false, true, true]);
    }

    #[test]
    fn stale_pooled_connection_is_retried_on_a_fresh_one() {
        // The server says keep-alive but closes after the first reply.
        let server = TestServer::start(vec![
            Reply::close(with_body(200, "text/plain", "one")),
            Reply::keep(with_body(200, "text/plain", "two")),
        ]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (a, b) = iop_core::rt::block_on_current(async {
            let a = body_of(&client, &get(port)).await;
            // Let the FIN arrive so the parked connection is surely dead.
            monoio::time::sleep(Duration::from_millis(50)).await;
            let b = body_of(&client, &get(port)).await;
            (a, b)
        })
        .unwrap();
        assert_eq!(a.1, Bytes::from_static(b"one"));
        assert_eq!((b.1, b.2), (Bytes::from_static(b"two"), false));
        let accepted = [server.next_event(), server.next_event(), server.next_event()]
            .into_iter()
            .chain(server.drain())
            .filter(|e| matches!(e, Event::Accepted(_)))
            .count();
        assert!(accepted >= 2, "a fresh connection was opened");
    }

    #[test]
    fn a_parked_connection_the_upstream_closes_is_dropped_without_a_request() {
        // Two connections parked: the server closes the first after its
        // reply, keeps the second open.
        let server = TestServer::start(vec![
            Reply::close(with_body(200, "text/plain", "one")),
            Reply::keep(with_body(200, "text/plain", "two")),
        ]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (parked, swept) = iop_core::rt::block_on_current(async {
            let mut first = client.send(&get(port)).await.unwrap();
            let mut second = client.send(&get(port)).await.unwrap();
            first.read_to_end(64).await.unwrap();
            second.read_to_end(64).await.unwrap();
            let parked = client.idle_connections("127.0.0.1", port);
            // No request follows: only the sweep can notice the close.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while client.idle_connections("127.0.0.1", port) > 1 && std::time::Instant::now() < deadline {
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            (parked, client.idle_connections("127.0.0.1", port))
        })
        .unwrap();
        assert_eq!((parked, swept), (2, 1), "the closed connection was dropped, the open one kept");
    }

    #[test]
    fn a_request_the_upstream_read_is_never_sent_again() {
        // One reply, then the server reads the next request on the same
        // (pooled, open) connection and closes without answering.
        let server = TestServer::start(vec![Reply::keep(with_body(200, "text/plain", "one"))]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let post = Request { method: "POST", body: b"{\"n\":1}", ..get(port) };
        let second = iop_core::rt::block_on_current(async {
            let (status, _, _) = body_of(&client, &post).await;
            assert_eq!(status, 200);
            assert_eq!(client.idle_connections("127.0.0.1", port), 1);
            client.send(&post).await.map(|r| r.status())
        })
        .unwrap();
        let err = second.unwrap_err();
        assert!(matches!(err, UpstreamError::Closed(_) | UpstreamError::Io(_)), "{err:?}");
        // Give a wrongful resend time to arrive before counting.
        std::thread::sleep(Duration::from_millis(100));
        let events: Vec<_> =
            std::iter::from_fn(|| server.events.recv_timeout(Duration::from_millis(50)).ok()).collect();
        let requests = events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
        let accepted = events.iter().filter(|e| matches!(e, Event::Accepted(_))).count();
        assert_eq!((requests, accepted), (2, 1), "the request was sent exactly once: {events:?}");
    }

    #[test]
    fn unfinished_or_close_responses_are_not_pooled() {
        let partial = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789".to_vec();
        let close = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbye".to_vec();
        let server = TestServer::start(vec![Reply::keep(partial), Reply::keep(close)]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (idle_after_partial, idle_after_close, second_reused) = iop_core::rt::block_on_current(async {
            let mut resp = client.send(&get(port)).await.unwrap();
            assert_eq!(resp.chunk().await.unwrap().as_deref(), Some(&b"0123456789"[..]));
            drop(resp);
            let idle_after_partial = client.idle_connections("127.0.0.1", port);
            let (status, body, reused) = body_of(&client, &get(port)).await;
            assert_eq!((status, &body[..]), (200, &b"bye"[..]));
            (idle_after_partial, client.idle_connections("127.0.0.1", port), reused)
        })
        .unwrap();
        assert_eq!((idle_after_partial, idle_after_close, second_reused), (0, 0, false));
        let events: Vec<_> = (0..5).map(|_| server.next_event()).collect();
        assert!(events.contains(&Event::Eof(0)), "the unfinished connection was closed: {events:?}");
        assert!(events.contains(&Event::Accepted(1)), "{events:?}");
    }

    /// A provider that answers with a chunked body written as `pieces`
    /// separate writes, `gap` apart.
    fn trickling_server(pieces: usize, gap: Duration) -> u16 {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
            for i in 0..pieces {
                std::thread::sleep(gap);
                s.write_all(format!("2\r\n{i:02}\r\n").as_bytes()).unwrap();
            }
            s.write_all(b"0\r\n\r\n").unwrap();
        });
        port
    }

    #[test]
    fn a_fast_stream_is_read_once_per_window_and_loses_nothing() {
        let window = Duration::from_millis(40);
        let port = trickling_server(8, Duration::from_millis(1));
        let client = UpstreamClient::new(ClientConfig { coalesce: window, ..ClientConfig::default() });
        let got = iop_core::rt::block_on_current(async {
            let mut resp = client.send(&get(port)).await.unwrap();
            let mut got = Vec::new();
            while let Some(piece) = resp.chunk().await.unwrap() {
                got.push((piece, std::time::Instant::now()));
            }
            got
        })
        .unwrap();
        let body: Vec<u8> = got.iter().flat_map(|(b, _)| b.to_vec()).collect();
        assert_eq!(body, b"0001020304050607".to_vec());
        // Two quick reads, then the third waits out the window although
        // the provider wrote its pieces a millisecond apart.
        let held = got.iter().zip(&got[1..]).map(|(a, b)| b.1 - a.1).max().unwrap();
        assert!(held >= window - Duration::from_millis(5), "no read was held: the longest gap was {held:?}");
    }

    #[test]
    fn an_abandoned_exchange_ends_its_connection_before_the_reactor_runs_again() {
        let open = crate::upstream::test_server::sse_chunked_open(&["{\"n\":1}"]);
        let server = TestServer::start(vec![Reply::keep(open)]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        iop_core::rt::block_on_current(async {
            let mut resp = client.send(&get(port)).await.unwrap();
            assert!(resp.chunk().await.unwrap().is_some());
            // A read in flight when the run is cancelled, as in a relay.
            let pending = iop_core::rt::time::timeout(Duration::from_millis(1), resp.chunk()).await;
            assert!(pending.is_err(), "the stream stays open");
            drop(resp);
            // Blocking this reactor: only a close made right at the drop, not
            // one queued on the ring, can reach the provider now.
            let eof = std::iter::from_fn(|| server.events.recv_timeout(Duration::from_secs(2)).ok())
                .find(|e| matches!(e, Event::Eof(_)));
            assert_eq!(eof, Some(Event::Eof(0)), "the provider saw the connection end at the drop");
        })
        .unwrap();
    }

    #[test]
    fn read_to_end_truncates_and_closes() {
        let mut long = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
        long.extend(std::iter::repeat_n(b'a', 100_000));
        let server = TestServer::start(vec![Reply::keep(long)]);
        let port = server.addr.port();
        let client = UpstreamClient::default();
        let (body, truncated, idle) = iop_core::rt::block_on_current(async {
            let mut resp = client.send(&get(port)).await.unwrap();
            let (body, truncated) = resp.read_to_end(1000).await.unwrap();
            assert!(resp.is_done());
            assert_eq!(resp.chunk().await.unwrap(), None);
            (body, truncated, client.idle_connections("127.0.0.1", port))
        })
        .unwrap();
        assert_eq!((body.len(), truncated, idle), (1000, true, 0));
    }

    #[test]
    fn pool_is_bounded_and_expires() {
        let server = TestServer::start((0..3).map(|_| Reply::keep(with_body(200, "text/plain", "x"))).collect());
        let port = server.addr.port();
        let client = UpstreamClient::new(ClientConfig {
            max_idle_per_host: 1,
            idle_timeout: Duration::from_millis(100),
            ..ClientConfig::default()
        });
        let reused = iop_core::rt::block_on_current(async {
            // Two responses open at once need two connections; one stays.
            let mut r1 = client.send(&get(port)).await.unwrap();
            let mut r2 = client.send(&get(port)).await.unwrap();
            r1.read_to_end(16).await.unwrap();
            r2.read_to_end(16).await.unwrap();
            assert_eq!(client.idle_connections("127.0.0.1", port), 1);
            monoio::time::sleep(Duration::from_millis(150)).await;
            let r3 = client.send(&get(port)).await.unwrap();
            r3.reused_connection()
        })
        .unwrap();
        assert!(!reused, "an expired connection was reused");
    }

    #[test]
    fn connect_errors_are_classified() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = UpstreamClient::default();
        let err = iop_core::rt::block_on_current(async { client.send(&get(port)).await.unwrap_err() }).unwrap();
        assert!(err.is_connect(), "{err:?}");
        let req = Request { host: "no-such-host.invalid", ..get(80) };
        let err = iop_core::rt::block_on_current(async { client.send(&req).await.unwrap_err() }).unwrap();
        assert!(matches!(err, UpstreamError::Resolve { .. }), "{err:?}");
    }

    #[test]
    fn request_debug_hides_header_values() {
        let req = Request { headers: &[("authorization", b"Bearer sk-secret")], ..get(1) };
        let dbg = format!("{req:?}");
        assert!(dbg.contains("authorization") && !dbg.contains("sk-secret"), "{dbg}");
    }

    #[test]
    fn garbage_head_is_an_error() {
        let server = TestServer::start(vec![Reply::close(b"NOT HTTP AT ALL\r\n\r\n".to_vec())]);
        let client = UpstreamClient::default();
        let err =
            iop_core::rt::block_on_current(async { client.send(&get(server.addr.port())).await.unwrap_err() }).unwrap();
        assert!(matches!(err, UpstreamError::Http(_)), "{err:?}");
        assert!(!err.is_connect());
    }
}
