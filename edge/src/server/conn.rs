//! One client connection: read a request within its deadlines, hand it to
//! the handler it was given, write the answer, repeat while keep-alive.
//!
//! Deadlines (all from `[http]`): a new connection must deliver its first
//! head within `header_timeout` of being accepted; between requests the
//! connection may idle for `idle_timeout`, and once a head has begun it must
//! be complete within `header_timeout` however it trickles; a body must make
//! progress every `body_timeout`; head and body together must arrive within
//! `read_timeout`. An expired deadline with a request begun is answered with
//! 408 and the connection closed.

use std::{
    cell::RefCell,
    io,
    rc::Rc,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use bytes::BytesMut;
use iop_core::config::{EdgeConfig, HttpSettings};
use iop_core::net::{Stream, WriteHalf};
use iop_core::{
    http::{self, BodyDecoder, BodyKind, Framing, HttpError, Limits, RequestHead, StreamFraming},
    limits::SlotGuard,
};
use monoio::{
    io::{AsyncWriteRent, AsyncWriteRentExt},
    net::TcpStream,
    time::Instant,
};

use super::Handler;
use super::{
    body::{Body, BodyPermit},
    reader::ReadSide,
};
use crate::{ctx::Ctx, limits::tls::TlsTicket, shared::ActiveRequest};

const READ_RESERVE: usize = 16 * 1024;
/// Room for a request head: most fit; an idle connection holds only this.
const HEAD_RESERVE: usize = 4 * 1024;
/// After an error response, unread input is drained for at most this long
/// and this many bytes before closing, so the client reads the response
/// instead of a reset (a "lingering close").
const LINGER_TIME: Duration = Duration::from_secs(2);
/// Buffers larger than this are given back after a request, so an idle
/// keep-alive connection holds little memory whatever it carried before.
const MAX_IDLE_BUFFER: usize = 64 * 1024;

/// A client connection's halves and buffers.
pub struct Conn {
    /// Read half (a read may be posted on it across requests).
    pub rd: ReadSide,
    /// Write half.
    pub wr: WriteHalf,
    /// Received bytes not yet parsed (may hold a pipelined request).
    pub buf: BytesMut,
    /// Outgoing bytes, written by `flush`.
    pub out: BytesMut,
    /// The current request is `HEAD`: responses carry their head only.
    pub head_only: bool,
    /// How the current request's streamed answers are framed (by its HTTP
    /// version: an HTTP/1.0 client gets raw bytes and a close).
    pub stream_framing: StreamFraming,
    /// The client's address (for per-address limits and logs).
    pub peer: std::net::SocketAddr,
    /// What the current request did (its metrics and access-log line).
    pub exchange: super::Exchange,
}

impl Conn {
    /// Writes and clears `out`.
    pub async fn flush(&mut self) -> io::Result<()> {
        flush_out(&mut self.wr, &mut self.out).await
    }

    /// Writes a complete response with a body (its head only for `HEAD`).
    pub async fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra: &[(&str, &str)],
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        self.responder().respond(status, content_type, extra, body, keep_alive).await
    }

    /// The writing side, apart from the read half (which a disconnect watch
    /// may hold meanwhile).
    pub fn responder(&mut self) -> Responder<'_> {
        Responder {
            wr: &mut self.wr,
            out: &mut self.out,
            head_only: self.head_only,
            stream_framing: self.stream_framing,
            ex: &mut self.exchange,
        }
    }

    /// Gives back buffer memory a large request or response left behind.
    fn shrink(&mut self) {
        if self.buf.capacity() > MAX_IDLE_BUFFER && self.buf.len() <= READ_RESERVE {
            self.buf = BytesMut::from(&self.buf[..]);
        }
        if self.out.capacity() > MAX_IDLE_BUFFER {
            self.out = BytesMut::new();
        }
    }
}

/// The writing side of a connection.
pub struct Responder<'a> {
    /// Write half.
    pub wr: &'a mut WriteHalf,
    /// Outgoing bytes, written by `respond`.
    pub out: &'a mut BytesMut,
    /// Responses carry their head only.
    pub head_only: bool,
    /// How a streamed answer is framed.
    pub stream_framing: StreamFraming,
    /// The request's record (status, first byte).
    pub ex: &'a mut super::Exchange,
}

impl Responder<'_> {
    /// Writes a complete response with a body (its head only for `HEAD`).
    pub async fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra: &[(&str, &str)],
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(extra.len() + 1);
        headers.push(("content-type", content_type));
        headers.extend_from_slice(extra);
        http::write_response_head(self.out, status, &headers, Framing::Length(body.len()), keep_alive);
        if !self.head_only {
            self.out.extend_from_slice(body);
        }
        self.ex.status(status);
        self.ex.wrote();
        flush_out(self.wr, self.out).await
    }
}

/// Writes and clears `out`.
async fn flush_out(wr: &mut WriteHalf, out: &mut BytesMut) -> io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let taken = std::mem::take(out);
    // Boxed: the write's state is large, brief, and would otherwise be
    // part of every (long-lived) future that might respond.
    let (res, mut taken) = Box::pin(wr.write_all(taken)).await;
    taken.clear();
    *out = taken;
    res.map(|_| ())
}

/// The read deadlines of one connection, fixed at accept.
#[derive(Clone, Copy)]
struct Timeouts {
    idle: Duration,
    header: Duration,
    body: Duration,
    read: Duration,
}

/// What a connection's requests record, fixed at accept.
struct Logging {
    /// One access-log line per request.
    access_log: bool,
    /// The header a request's session id is read from (None: off).
    session_header: Option<String>,
}

/// What a connection is served with, read from the config at accept.
struct Settings {
    limits: Limits,
    timeouts: Timeouts,
    logging: Logging,
}

impl Settings {
    fn of(h: &HttpSettings) -> Self {
        Self {
            limits: Limits {
                max_head_bytes: h.max_header_bytes,
                max_body_bytes: h.max_body_bytes,
                ..Limits::default()
            },
            timeouts: Timeouts {
                idle: h.idle_timeout,
                header: h.header_timeout,
                body: h.body_timeout,
                read: h.read_timeout,
            },
            logging: Logging { access_log: h.access_log, session_header: h.session_header.clone() },
        }
    }
}

/// A connection's [`Settings`] and when it was accepted.
struct Setup {
    /// Shared by the connections a core accepts under one config: a copy
    /// in each would be 112 bytes more under every open stream.
    settings: Rc<Settings>,
    /// The first head is timed from accept: a connection that never sends
    /// a byte does not hold its slot for a whole idle timeout.
    accepted: Instant,
}

impl Setup {
    fn of(worker: &Ctx) -> Self {
        thread_local! {
            /// This core's settings and the config they were read from.
            static LAST: RefCell<Option<(Arc<EdgeConfig>, Rc<Settings>)>> = const { RefCell::new(None) };
        }
        let cfg = worker.config.borrow();
        let settings = LAST.with_borrow_mut(|last| match last {
            Some((read_from, settings)) if Arc::ptr_eq(read_from, &cfg) => settings.clone(),
            _ => {
                let settings = Rc::new(Settings::of(&cfg.http));
                *last = Some((cfg.clone(), settings.clone()));
                settings
            }
        });
        Self { settings, accepted: Instant::now() }
    }
}

impl Conn {
    fn new(stream: Stream, peer: std::net::SocketAddr) -> Self {
        let (rd, wr) = stream.into_split();
        Self {
            rd: ReadSide::new(rd),
            wr,
            buf: BytesMut::new(),
            out: BytesMut::new(),
            head_only: false,
            stream_framing: StreamFraming::Chunked,
            peer,
            exchange: super::Exchange::default(),
        }
    }
}

/// Serves one plain-TCP client connection until it closes or must be
/// closed. `slot` counts it against `http.max_connections` while it lives.
///
/// The connection is built before the task's future: an async fn's
/// argument moved into a local is held twice by its state, and every open
/// connection (every open stream's) holds this state all its life.
pub fn serve<H: Handler>(
    worker: Rc<Ctx>,
    handler: H,
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    slot: SlotGuard,
) -> impl std::future::Future<Output = ()> {
    let _ = tcp.set_nodelay(true);
    let setup = Setup::of(&worker);
    served(worker, handler, Conn::new(Stream::Plain(tcp), peer), setup, slot, false)
}

/// [`serve`] for a connection that begins with a TLS handshake;
/// `tls_ticket` counts the handshake against its address until it ends.
pub async fn serve_tls<H: Handler>(
    worker: Rc<Ctx>,
    handler: H,
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    slot: SlotGuard,
    tls_ticket: TlsTicket,
) {
    let _ = tcp.set_nodelay(true);
    let setup = Setup::of(&worker);
    let stream = match &worker.shared.http_tls {
        None => Stream::Plain(tcp),
        // The handshake counts against the first head's deadline.
        Some(tls) => match iop_core::rt::time::timeout(setup.settings.timeouts.header, Box::pin(tls.accept(tcp))).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return handshake_failed(peer, &e.to_string()),
            Err(_) => return handshake_failed(peer, "timed out"),
        },
    };
    drop(tls_ticket);
    let tls = matches!(stream, Stream::Tls(_));
    served(worker, handler, Conn::new(stream, peer), setup, slot, tls).await
}

/// Answers the connection's requests, then closes it (with TLS's
/// `close_notify`). An async block, not an async fn: an async fn's state
/// holds each argument twice (the connection among them).
#[allow(clippy::manual_async_fn)]
fn served<H: Handler>(
    worker: Rc<Ctx>,
    handler: H,
    mut conn: Conn,
    setup: Setup,
    slot: SlotGuard,
    tls: bool,
) -> impl std::future::Future<Output = ()> {
    async move {
        let _slot = slot;
        requests(&worker, &handler, &mut conn, &setup).await;
        if tls {
            // The client learns the close was meant (close_notify), not a cut.
            let _ = iop_core::rt::time::timeout(LINGER_TIME, Box::pin(conn.wr.shutdown())).await;
        }
    }
}

/// Reads and answers requests until the connection must close. A block,
/// as [`served`]: the references are held once.
#[allow(clippy::manual_async_fn)]
fn requests<'a, H: Handler>(
    worker: &'a Rc<Ctx>,
    handler: &'a H,
    conn: &'a mut Conn,
    setup: &'a Setup,
) -> impl std::future::Future<Output = ()> + 'a {
    async move {
        let mut accepted = Some(setup.accepted);
        loop {
            // Read in a function of its own: what reading needs (and the head's
            // storage, which a borrow would keep) is not held beside the
            // answer's state.
            let Some((head, body)) = read_request(worker, handler, conn, setup, accepted.take()).await else {
                return;
            };
            let asked_keep_alive = head.keep_alive;
            let keep_alive = {
                let _active = ActiveRequest::new(&worker.shared);
                handler.handle(worker, conn, head, body).await
            };
            conn.exchange.done(setup.settings.logging.access_log);
            if !keep_alive || !asked_keep_alive || worker.shared.draining.load(Ordering::Acquire) {
                return;
            }
            conn.shrink();
        }
    }
}

/// Reads the next request whole: its head, a `100 Continue` when asked, its
/// body. `None`: the connection must close (what could be answered was).
/// `accepted`: when the connection was, for its first head.
#[allow(clippy::manual_async_fn)]
fn read_request<'a, H: Handler>(
    worker: &'a Rc<Ctx>,
    handler: &'a H,
    conn: &'a mut Conn,
    setup: &'a Setup,
    accepted: Option<Instant>,
) -> impl std::future::Future<Output = Option<(RequestHead, Body)>> + 'a {
    // Blocks, not async fns (their arguments would be held twice), and the
    // head's wait apart from the rest: each laid out in a state of its own,
    // not side by side in one (an idle connection waits in the first).
    async move {
        let Settings { limits, timeouts, logging } = &*setup.settings;
        match read_head(conn, limits, timeouts, accepted).await {
            Ok(Some((head, read_deadline))) => read_rest(worker, handler, conn, setup, head, read_deadline).await,
            Ok(None) => None,
            Err(e) => {
                conn.exchange.begin_unread();
                Box::pin(fail(conn, handler, e, 0, logging.access_log)).await;
                None
            }
        }
    }
}

/// What follows a request's head: a `100 Continue` when asked, its body.
#[allow(clippy::manual_async_fn)]
fn read_rest<'a, H: Handler>(
    worker: &'a Rc<Ctx>,
    handler: &'a H,
    conn: &'a mut Conn,
    setup: &'a Setup,
    head: RequestHead,
    read_deadline: Instant,
) -> impl std::future::Future<Output = Option<(RequestHead, Body)>> + 'a {
    async move {
        let Settings { limits, timeouts, logging } = &*setup.settings;
        let access_log = logging.access_log;
        conn.head_only = head.method == "HEAD";
        conn.stream_framing = StreamFraming::for_version(head.version);
        conn.exchange.begin(&head, logging.session_header.as_deref());
        let declared = match head.body {
            BodyKind::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        let permit = match reserve_body(worker, &head) {
            Ok(p) => p,
            // Not read; drained so the client sees the 503.
            Err(e) => {
                Box::pin(fail(conn, handler, e, declared, access_log)).await;
                return None;
            }
        };
        // Never set for HTTP/1.0, which must not get a 100 (RFC 9110 §10.1.1).
        if head.expect_continue && head.body != BodyKind::Empty {
            conn.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if conn.flush().await.is_err() {
                return None;
            }
        }
        let read = match body_at_hand(conn, &head, permit) {
            Ok(body) => Ok(body),
            // Boxed: a body still to come is rarer than one read with its head,
            // and the wait's state would size every reading's.
            Err(permit) => Box::pin(read_body(conn, worker, &head, limits, permit, timeouts, read_deadline)).await,
        };
        let body = match read {
            Ok(body) => body,
            Err(e) => {
                Box::pin(fail(conn, handler, e, 0, access_log)).await;
                return None;
            }
        };
        if conn.buf.is_empty() {
            // The request is read: its read buffer is not kept for the
            // (maybe long) response. A next request gets a fresh one.
            conn.buf = BytesMut::new();
        }
        Some((head, body))
    }
}

/// A client whose TLS handshake failed (plain HTTP on a TLS port among
/// them) is closed without an answer; a debug line, at most one a second.
fn handshake_failed(peer: std::net::SocketAddr, why: &str) {
    static LOG: iop_core::limits::LogThrottle = iop_core::limits::LogThrottle::new(Duration::from_secs(1));
    if let Some(more) = LOG.allow() {
        tracing::debug!(%peer, error = why, failed_since_last_report = more, "client TLS handshake failed");
    }
}

/// Why a request could not be read.
enum ConnError {
    /// Unparsable or over a size limit: answered with its status.
    Http(HttpError),
    /// A read deadline passed with the request begun (408).
    Timeout(&'static str),
    /// The core's in-flight body budget is spent (503).
    Busy,
    /// The socket failed or the client left: nothing to answer.
    Io,
}

/// Answers what can be answered, then the connection closes (lingering:
/// see [`linger`]). `unread` is what the client may still be sending.
async fn fail<H: Handler>(conn: &mut Conn, handler: &H, e: ConnError, unread: usize, access_log: bool) {
    let (status, message, code, extra): (u16, String, &str, &[(&str, &str)]) = match e {
        // Nothing was answered: no request to count.
        ConnError::Io => return,
        ConnError::Http(e) => (e.status(), e.to_string(), e.code(), &[]),
        ConnError::Timeout(what) => (408, format!("the {what} did not arrive in time"), "request_timeout", &[]),
        ConnError::Busy => (
            503,
            "the server is receiving too many request bodies; retry shortly".to_owned(),
            "server_busy",
            &[("retry-after", "1")],
        ),
    };
    conn.head_only = false;
    let body = handler.refusal_body(status, &message, code);
    let answered = conn.respond(status, "application/json", extra, &body, false).await.is_ok();
    conn.exchange.done(access_log);
    if answered {
        linger(conn, unread).await;
    }
}

/// Half-closes, then reads and discards what the client still sends (at
/// most `max(unread, 64 KiB)` bytes, for at most [`LINGER_TIME`]) until it
/// closes too. Closing with unread input would make the kernel send a reset,
/// which can destroy the response before the client reads it.
async fn linger(conn: &mut Conn, unread: usize) {
    // Bounded: a TLS close_notify is a write, to a peer that may not read.
    let _ = iop_core::rt::time::timeout(LINGER_TIME, conn.wr.shutdown()).await;
    let mut left = unread.max(64 * 1024);
    let deadline = Instant::now() + LINGER_TIME;
    let mut scratch = std::mem::take(&mut conn.buf);
    while left > 0 {
        scratch.clear();
        // The connection is closing: a timed-out read loses nothing.
        match iop_core::rt::time::timeout_at(deadline, conn.rd.read_append(&mut scratch, READ_RESERVE)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => return,
        }
    }
}

/// Reads until a request head parses. `accepted` is set for the first
/// request of a connection. Returns the head and the deadline for the rest
/// of the request; `Ok(None)` when the client closed or idled out between
/// requests (nothing to answer).
async fn read_head(
    conn: &mut Conn,
    limits: &Limits,
    t: &Timeouts,
    accepted: Option<Instant>,
) -> Result<Option<(RequestHead, Instant)>, ConnError> {
    // When the current head began (a pipelined one began already).
    let mut began = accepted.or_else(|| (!conn.buf.is_empty()).then(Instant::now));
    // The parser restarts from the first byte each time, so it runs only
    // once a blank line (or too much) has arrived: a head trickled a byte at
    // a time costs one scan of each byte, not one parse per byte.
    let mut scanned = 0;
    loop {
        let ready = head_end_seen(&conn.buf, &mut scanned) || conn.buf.len() > limits.max_head_bytes;
        if ready {
            if let Some(head) = http::parse_request_head(&mut conn.buf, limits).map_err(ConnError::Http)? {
                let began = began.unwrap_or_else(Instant::now);
                return Ok(Some((head, began + t.read)));
            }
        }
        let deadline = match began {
            Some(b) => b + t.header.min(t.read),
            None => Instant::now() + t.idle,
        };
        // A timeout leaves the read posted (see `ReadSide`): a 408's
        // lingering close reads on from it.
        let partial = !conn.buf.is_empty();
        match iop_core::rt::time::timeout_at(deadline, conn.rd.read_append(&mut conn.buf, HEAD_RESERVE)).await {
            Err(_) if !partial => return Ok(None),
            Err(_) => return Err(ConnError::Timeout("request head")),
            Ok(Ok(0)) if conn.buf.is_empty() => return Ok(None),
            Ok(Ok(0)) => return Err(ConnError::Http(HttpError::Malformed("truncated request head"))),
            Ok(Ok(_)) => {
                began.get_or_insert_with(Instant::now);
            }
            Ok(Err(_)) => return Err(ConnError::Io),
        }
    }
}

/// Whether `buf` holds a line end followed by an empty line (`\n\n` or
/// `\n\r\n`), looking only at bytes after `scanned` (and the two before).
fn head_end_seen(buf: &[u8], scanned: &mut usize) -> bool {
    let from = scanned.saturating_sub(2);
    *scanned = buf.len();
    memchr::memchr_iter(b'\n', &buf[from..]).any(|i| {
        let rest = &buf[from + i + 1..];
        rest.first() == Some(&b'\n') || rest.starts_with(b"\r\n")
    })
}

/// Takes the declared body size from the core's budget before reading it
/// (and before `100 Continue`); a chunked body is counted as it arrives.
fn reserve_body(worker: &Ctx, head: &RequestHead) -> Result<Option<BodyPermit>, ConnError> {
    let limit = worker.config.borrow().http.max_inflight_body_bytes;
    let declared = match head.body {
        BodyKind::Empty | BodyKind::Length(0) => return Ok(None),
        // Within max_body_bytes (checked by the head parser), so it fits a usize.
        BodyKind::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
        BodyKind::Chunked | BodyKind::UntilClose => 0,
    };
    worker.body_budget.try_reserve(declared, limit).map(Some).ok_or(ConnError::Busy)
}

/// One read for the body, bounded by the progress and total deadlines.
async fn read_more(conn: &mut Conn, reserve: usize, t: &Timeouts, read_deadline: Instant) -> Result<usize, ConnError> {
    let deadline = (Instant::now() + t.body).min(read_deadline);
    match iop_core::rt::time::timeout_at(deadline, conn.rd.read_append(&mut conn.buf, reserve)).await {
        Err(_) => Err(ConnError::Timeout("request body")),
        Ok(Ok(n)) => Ok(n),
        Ok(Err(_)) => Err(ConnError::Io),
    }
}

/// The body when it needs no read: none, or a `Content-Length` body that
/// came with the head. `Err` gives the permit back for [`read_body`].
fn body_at_hand(conn: &mut Conn, head: &RequestHead, permit: Option<BodyPermit>) -> Result<Body, Option<BodyPermit>> {
    let Some(permit) = permit else { return Ok(Body::new(bytes::Bytes::new(), None)) };
    if let BodyKind::Length(n) = head.body {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if conn.buf.len() >= n {
            return Ok(Body::new(conn.buf.split_to(n).freeze(), Some(permit)));
        }
    }
    Err(Some(permit))
}

async fn read_body(
    conn: &mut Conn,
    worker: &Ctx,
    head: &RequestHead,
    limits: &Limits,
    permit: Option<BodyPermit>,
    t: &Timeouts,
    read_deadline: Instant,
) -> Result<Body, ConnError> {
    let Some(mut permit) = permit else { return Ok(Body::new(bytes::Bytes::new(), None)) };
    if let BodyKind::Length(n) = head.body {
        // Within max_body_bytes: room for the whole body once, then one
        // zero-copy split (no growth by doubling, no copy of pieces).
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        conn.buf.reserve(n.saturating_sub(conn.buf.len()));
        while conn.buf.len() < n {
            if read_more(conn, n - conn.buf.len(), t, read_deadline).await? == 0 {
                return Err(ConnError::Http(HttpError::Malformed("truncated request body")));
            }
        }
        return Ok(Body::new(conn.buf.split_to(n).freeze(), Some(permit)));
    }
    let limit = worker.config.borrow().http.max_inflight_body_bytes;
    let mut decoder = BodyDecoder::new(head.body, limits.max_body_bytes);
    let mut body = BytesMut::new();
    loop {
        while let Some(piece) = decoder.decode(&mut conn.buf).map_err(ConnError::Http)? {
            if !permit.grow(piece.len(), limit) {
                return Err(ConnError::Busy);
            }
            body.extend_from_slice(&piece);
        }
        if decoder.is_done() {
            return Ok(Body::new(body.freeze(), Some(permit)));
        }
        if read_more(conn, READ_RESERVE, t, read_deadline).await? == 0 {
            decoder.finish_on_eof().map_err(ConnError::Http)?;
            return Err(ConnError::Http(HttpError::Malformed("truncated request body")));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn head_end_is_found_however_the_head_is_split() {
        for head in
            [&b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..], b"GET / HTTP/1.1\nhost: x\n\n", b"GET / HTTP/1.1\r\n\r\n"]
        {
            // Fed one byte at a time: found exactly when the last byte arrives.
            let mut scanned = 0;
            for end in 1..=head.len() {
                assert_eq!(head_end_seen(&head[..end], &mut scanned), end == head.len(), "{head:?} at {end}");
            }
            // And at every two-piece split.
            for split in 0..head.len() {
                let mut scanned = 0;
                let _ = head_end_seen(&head[..split], &mut scanned);
                assert!(head_end_seen(head, &mut scanned));
            }
        }
        let mut scanned = 0;
        assert!(!head_end_seen(b"GET / HTTP/1.1\r\nhost: x\r\n", &mut scanned));
    }
}
