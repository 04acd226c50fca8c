//! A tiny scripted HTTP/1.1 server for tests: runs its own monoio runtime on
//! a std thread, answers each request with the next canned reply and reports
//! accepts, requests and client EOFs over a channel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{cell::RefCell, collections::VecDeque, net::SocketAddr, rc::Rc, sync::mpsc, time::Duration};

use monoio::{
    io::{AsyncReadRent, AsyncWriteRentExt},
    net::{TcpListener, TcpStream},
};

/// What the server saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Connection `n` was accepted.
    Accepted(usize),
    /// A complete request arrived on connection `conn`.
    Request { conn: usize, head: String, body: Vec<u8> },
    /// The client closed connection `n`.
    Eof(usize),
}

/// One canned reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// Raw bytes written after the request arrived.
    pub(crate) bytes: Vec<u8>,
    /// Close the connection after writing (even if the bytes said keep-alive).
    pub(crate) close: bool,
}

impl Reply {
    /// A reply that leaves the connection open.
    pub(crate) fn keep(bytes: Vec<u8>) -> Self {
        Self { bytes, close: false }
    }

    /// A reply after which the server closes the connection.
    pub(crate) fn close(bytes: Vec<u8>) -> Self {
        Self { bytes, close: true }
    }
}

/// A running test server.
pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    pub(crate) events: mpsc::Receiver<Event>,
}

impl TestServer {
    /// Starts a server that answers requests with `replies`, in order; once
    /// they run out, connections are closed.
    pub(crate) fn start(replies: Vec<Reply>) -> Self {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::Builder::new()
            .name("test-upstream".into())
            .spawn(move || {
                iop_core::rt::block_on_current(serve(std_listener, replies, tx)).unwrap();
            })
            .unwrap();
        Self { addr, events }
    }

    /// The next event (fails the test after 5 s).
    pub(crate) fn next_event(&self) -> Event {
        self.events.recv_timeout(Duration::from_secs(5)).expect("test server event")
    }

    /// Events that arrived so far, without waiting.
    pub(crate) fn drain(&self) -> Vec<Event> {
        self.events.try_iter().collect()
    }
}

async fn serve(std_listener: std::net::TcpListener, replies: Vec<Reply>, tx: mpsc::Sender<Event>) {
    let listener = TcpListener::from_std(std_listener).unwrap();
    let replies = Rc::new(RefCell::new(VecDeque::from(replies)));
    let mut next_conn = 0;
    loop {
        let Ok((stream, _)) = listener.accept().await else { return };
        let conn = next_conn;
        next_conn += 1;
        if tx.send(Event::Accepted(conn)).is_err() {
            return;
        }
        monoio::spawn(handle(stream, conn, Rc::clone(&replies), tx.clone()));
    }
}

async fn handle(mut stream: TcpStream, conn: usize, replies: Rc<RefCell<VecDeque<Reply>>>, tx: mpsc::Sender<Event>) {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let Some((head, body)) = read_request(&mut stream, &mut pending).await else {
            let _ = tx.send(Event::Eof(conn));
            return;
        };
        let _ = tx.send(Event::Request { conn, head, body });
        let Some(reply) = replies.borrow_mut().pop_front() else { return };
        let (res, _) = stream.write_all(reply.bytes).await;
        if res.is_err() || reply.close {
            return;
        }
    }
}

/// One request (head text, body by Content-Length); `None` on EOF.
async fn read_request(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if pending.len() >= end + 4 + len {
                let body = pending[end + 4..end + 4 + len].to_vec();
                pending.drain(..end + 4 + len);
                return Some((head, body));
            }
        }
        let buf = Vec::with_capacity(8192);
        let (res, buf) = stream.read(buf).await;
        match res {
            Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

/// A chunked `text/event-stream` response with one `data:` event per item,
/// each in its own chunk.
pub(crate) fn sse_chunked(events: &[&str]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for ev in events {
        let data = format!("data: {ev}\n\n");
        out.extend_from_slice(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// The head and the first events of a chunked SSE response that never ends.
pub(crate) fn sse_chunked_open(events: &[&str]) -> Vec<u8> {
    let mut out = sse_chunked(events);
    out.truncate(out.len() - b"0\r\n\r\n".len());
    out
}

/// A response with a Content-Length body.
pub(crate) fn with_body(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}", body.len())
        .into_bytes()
}
