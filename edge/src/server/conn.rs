//! One client connection: read a request, hand it to the surface, write
//! the answer, repeat while keep-alive.

use std::{io, rc::Rc};

use bytes::{Bytes, BytesMut};
use iop_core::{
    http::{self, BodyDecoder, Framing, HttpError, Limits, RequestHead},
    rt::io::read_append,
};
use monoio::{
    io::{AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable},
    net::TcpStream,
};

use std::sync::atomic::Ordering;

use crate::{shared::ActiveRequest, surface, worker::Worker};

const READ_RESERVE: usize = 16 * 1024;

/// A client connection's halves and buffers.
pub struct Conn {
    /// Read half.
    pub rd: OwnedReadHalf<TcpStream>,
    /// Write half.
    pub wr: OwnedWriteHalf<TcpStream>,
    /// Received bytes not yet parsed (may hold a pipelined request).
    pub buf: BytesMut,
    /// Outgoing bytes, written by `flush`.
    pub out: BytesMut,
}

impl Conn {
    /// Writes and clears `out`.
    pub async fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        let (res, mut out) = self.wr.write_all(out).await;
        out.clear();
        self.out = out;
        res.map(|_| ())
    }

    /// Writes a complete response with a body.
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
        http::write_response_head(&mut self.out, status, &headers, Framing::Length(body.len()), keep_alive);
        self.out.extend_from_slice(body);
        self.flush().await
    }
}

/// Serves one client connection until it closes or must be closed.
pub async fn serve(worker: Rc<Worker>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (limits, idle) = {
        let cfg = worker.config.borrow();
        let limits = Limits {
            max_head_bytes: cfg.http.max_header_bytes,
            max_body_bytes: cfg.http.max_body_bytes,
            ..Limits::default()
        };
        (limits, cfg.http.idle_timeout)
    };
    let (rd, wr) = stream.into_split();
    let mut conn = Conn { rd, wr, buf: BytesMut::with_capacity(READ_RESERVE), out: BytesMut::with_capacity(4096) };
    loop {
        let head = match read_head(&mut conn, &limits, idle).await {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(ConnError::Http(e)) => {
                let _ = reject(&mut conn, &e).await;
                return;
            }
            Err(ConnError::Io) => return,
        };
        if head.expect_continue {
            conn.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if conn.flush().await.is_err() {
                return;
            }
        }
        let body = match read_body(&mut conn, &head, &limits).await {
            Ok(body) => body,
            Err(ConnError::Http(e)) => {
                let _ = reject(&mut conn, &e).await;
                return;
            }
            Err(ConnError::Io) => return,
        };
        let keep_alive = {
            let _active = ActiveRequest::new(&worker.shared);
            surface::handle(&worker, &mut conn, &head, body).await
        };
        if !keep_alive || !head.keep_alive || worker.shared.draining.load(Ordering::Acquire) {
            return;
        }
    }
}

enum ConnError {
    Http(HttpError),
    Io,
}

/// Reads until a request head parses. `Ok(None)`: the client closed (or idled out) between requests.
async fn read_head(
    conn: &mut Conn,
    limits: &Limits,
    idle: std::time::Duration,
) -> Result<Option<RequestHead>, ConnError> {
    loop {
        if let Some(head) = http::parse_request_head(&mut conn.buf, limits).map_err(ConnError::Http)? {
            return Ok(Some(head));
        }
        // An idle timeout closes the connection, so a dropped read loses nothing we need.
        match monoio::time::timeout(idle, read_append(&mut conn.rd, &mut conn.buf, READ_RESERVE)).await {
            Err(_) => return Ok(None),
            Ok(Ok(0)) => {
                return if conn.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ConnError::Http(HttpError::Malformed("truncated request head")))
                };
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(ConnError::Io),
        }
    }
}

async fn read_body(conn: &mut Conn, head: &RequestHead, limits: &Limits) -> Result<Bytes, ConnError> {
    let mut decoder = BodyDecoder::new(head.body, limits.max_body_bytes);
    let mut body = BytesMut::new();
    let mut first: Option<Bytes> = None;
    loop {
        while let Some(piece) = decoder.decode(&mut conn.buf).map_err(ConnError::Http)? {
            // The common case (one Content-Length piece) stays zero-copy.
            match first.take() {
                None if body.is_empty() => first = Some(piece),
                prev => {
                    if let Some(p) = prev {
                        body.extend_from_slice(&p);
                    }
                    body.extend_from_slice(&piece);
                }
            }
        }
        if decoder.is_done() {
            return Ok(match first {
                Some(p) if body.is_empty() => p,
                _ => body.freeze(),
            });
        }
        match read_append(&mut conn.rd, &mut conn.buf, READ_RESERVE).await {
            Ok(0) => {
                decoder.finish_on_eof().map_err(ConnError::Http)?;
                return Err(ConnError::Http(HttpError::Malformed("truncated request body")));
            }
            Ok(_) => {}
            Err(_) => return Err(ConnError::Io),
        }
    }
}

async fn reject(conn: &mut Conn, e: &HttpError) -> io::Result<()> {
    let status = e.status();
    let body = crate::surface::openai::error::body(status, &e.to_string(), None);
    conn.respond(status, "application/json", &[], &body, false).await
}
