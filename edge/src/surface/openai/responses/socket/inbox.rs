//! The client's side of a Responses API WebSocket: its frames read into
//! messages and acted on, between responses and while one streams.
//!
//! Between responses ([`Inbox::next`]) the socket waits for a message at
//! most `http.idle_timeout_sec` (and closes with 1001 on the edge's drain).
//! While a response streams ([`Inbox::during`]) it is read with no deadline
//! of its own (the stream's deadline and stall watchdog bound a response;
//! a long one must not be cut by a quiet client):
//! - a ping is answered at once, between two event frames (each event is
//!   one whole frame, so a control frame may go between them, RFC 6455
//!   §5.4);
//! - a text message (the next `response.create`) is kept as it came, to be
//!   answered after the current response, in order; one at most waits: a
//!   client that sends another meanwhile is closed with 1008 (policy). The
//!   OpenAI API answers a socket's messages in order too and documents no
//!   bound; this one bounds what a socket holds to two messages (the one
//!   being answered and the one waiting);
//! - a pong is ignored;
//! - a close ends the socket with a close frame (1000), a binary message
//!   with 1003, a broken frame with its code (1002, 1007, 1009), and EOF or
//!   a broken socket ends it at once. Any of these drops the response's
//!   stream, which cancels it on the node and closes the provider request.

use std::{
    future::{poll_fn, Future},
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use iop_core::ws::{self, close_code, Limits, Message, Reader};

use crate::{
    ctx::Ctx,
    server::{Conn, STREAM_WATCH},
};

/// How often a socket waiting for its next message looks at the edge's
/// drain (it then closes with 1001, going away).
const DRAIN_CHECK: Duration = Duration::from_secs(1);

/// A read between responses, or one finishing a frame begun while a
/// response streamed: room for a `response.create` in a few reads.
const MESSAGE_READ: usize = 4096;

/// The close reason for a second message sent while one already waits.
const ONE_WAITING: &str = "one response.create is answered at a time and one more may wait; wait for a response's end";

/// How a socket ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The client went away or stopped reading: nothing more is sent.
    Gone,
    /// A close frame with this code and reason, then the end.
    Close(u16, &'static str),
}

/// What a client message asks of the socket.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Answer this text message now.
    Serve(Bytes),
    /// Send a pong with this payload.
    Pong(Bytes),
    /// Nothing now: a pong, or a text kept for after the response.
    Nothing,
    /// End the socket.
    End(End),
}

/// The client's frames, and the message kept for after the response that
/// streams.
pub struct Inbox {
    reader: Reader,
    /// A text message that came while a response streamed.
    pending: Option<Bytes>,
}

impl Inbox {
    /// The inbox of a socket just upgraded.
    pub fn new(limits: Limits) -> Self {
        Self { reader: Reader::new(limits), pending: None }
    }

    /// The frame and message limits of the socket.
    pub fn limits(&self) -> Limits {
        self.reader.limits()
    }

    /// What `msg` asks; `busy` while a response streams (a text is then
    /// kept, never served).
    fn act(&mut self, msg: Message, busy: bool) -> Action {
        match msg {
            Message::Text(text) if !busy => Action::Serve(text),
            Message::Text(text) => match self.pending {
                None => {
                    self.pending = Some(text);
                    Action::Nothing
                }
                Some(_) => Action::End(End::Close(close_code::POLICY, ONE_WAITING)),
            },
            Message::Ping(payload) => Action::Pong(payload),
            Message::Pong(_) => Action::Nothing,
            Message::Binary(_) => {
                Action::End(End::Close(close_code::UNSUPPORTED, "send response.create as a text message"))
            }
            Message::Close(_) => Action::End(End::Close(close_code::NORMAL, "")),
        }
    }

    /// The next whole message in `conn.buf`; a broken frame ends the socket.
    fn read(&mut self, conn: &mut Conn) -> Result<Option<Message>, End> {
        self.reader.read(&mut conn.buf).map_err(|e| {
            tracing::debug!(peer = %conn.peer, code = e.code(), "websocket protocol error");
            End::Close(e.close_code(), e.code())
        })
    }

    /// The next message to answer: the one kept while the last response
    /// streamed, else the next to arrive. Pings meanwhile are answered; the
    /// socket ends when idle for `idle` (1008) or when the edge drains
    /// (1001).
    pub async fn next(&mut self, worker: &Ctx, conn: &mut Conn, idle: Duration) -> Result<Bytes, End> {
        if let Some(text) = self.pending.take() {
            return Ok(text);
        }
        let mut idle_for = Duration::ZERO;
        loop {
            if let Some(msg) = self.read(conn)? {
                match self.act(msg, false) {
                    Action::Serve(text) => return Ok(text),
                    Action::Pong(payload) => {
                        ws::write::pong(&mut conn.out, &payload);
                        if !write_out(conn, idle).await {
                            return Err(End::Gone);
                        }
                    }
                    Action::Nothing => {}
                    Action::End(end) => return Err(end),
                }
                continue;
            }
            if worker.shared.draining.load(std::sync::atomic::Ordering::Acquire) {
                return Err(End::Close(close_code::GOING_AWAY, "the gateway is shutting down"));
            }
            if idle_for >= idle {
                return Err(End::Close(close_code::POLICY, "idle for too long"));
            }
            let wait = DRAIN_CHECK.min(idle - idle_for);
            // A read cut by the timeout stays posted: its bytes land at the next.
            match iop_core::rt::time::timeout(wait, conn.rd.read_append(&mut conn.buf, MESSAGE_READ)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Err(End::Gone),
                Ok(Ok(_)) => idle_for = Duration::ZERO,
                Err(_) => idle_for += wait,
            }
        }
    }

    /// Awaits `step` of the response that streams (its place in the queue,
    /// its stream's next item) while acting on what the client sends:
    /// `Err` when that ends the socket, `step` dropped. `write_timeout`
    /// bounds the write of a pong.
    pub async fn during<F: Future>(
        &mut self,
        conn: &mut Conn,
        step: F,
        write_timeout: Duration,
    ) -> Result<F::Output, End> {
        let mut step = std::pin::pin!(step);
        loop {
            self.act_on_buffered(conn, write_timeout).await?;
            // Posted once for the whole response (a no-op while it is): it
            // outlives each step and becomes the next message's read.
            let reserve = if conn.buf.is_empty() { STREAM_WATCH } else { MESSAGE_READ };
            conn.rd.post(&mut conn.buf, reserve);
            let Conn { rd, buf, .. } = &mut *conn;
            let first = poll_fn(|cx| {
                if let Poll::Ready(read) = rd.poll_read(cx, buf) {
                    return Poll::Ready(Err(read));
                }
                step.as_mut().poll(cx).map(Ok)
            })
            .await;
            match first {
                Ok(out) => return Ok(out),
                Err(Ok(n)) if n > 0 => {}
                Err(_) => return Err(End::Gone),
            }
        }
    }

    /// Acts on the whole messages `conn.buf` holds while a response
    /// streams; the pongs they ask for are written before the next event.
    async fn act_on_buffered(&mut self, conn: &mut Conn, write_timeout: Duration) -> Result<(), End> {
        while let Some(msg) = self.read(conn)? {
            match self.act(msg, true) {
                Action::Pong(payload) => ws::write::pong(&mut conn.out, &payload),
                Action::End(end) => return Err(end),
                // While busy a text is kept, never served.
                Action::Serve(_) | Action::Nothing => {}
            }
        }
        if conn.out.is_empty() || write_out(conn, write_timeout).await {
            Ok(())
        } else {
            Err(End::Gone)
        }
    }
}

/// Writes what `conn.out` holds within `timeout`; false when the socket is
/// gone or stopped reading.
pub(super) async fn write_out(conn: &mut Conn, timeout: Duration) -> bool {
    matches!(iop_core::rt::time::timeout(timeout, conn.flush()).await, Ok(Ok(())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn text(s: &str) -> Message {
        Message::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn between_responses_a_text_is_served_and_control_frames_answered() {
        let mut inbox = Inbox::new(Limits::default());
        assert_eq!(inbox.act(text("a"), false), Action::Serve(Bytes::from_static(b"a")));
        assert_eq!(inbox.act(Message::Ping(Bytes::from_static(b"p")), false), Action::Pong(Bytes::from_static(b"p")));
        assert_eq!(inbox.act(Message::Pong(Bytes::new()), false), Action::Nothing);
        assert_eq!(
            inbox.act(Message::Binary(Bytes::new()), false),
            Action::End(End::Close(1003, "send response.create as a text message"))
        );
        assert_eq!(inbox.act(Message::Close(Some((1000, String::new()))), false), Action::End(End::Close(1000, "")));
        assert!(inbox.pending.is_none());
    }

    #[test]
    fn while_a_response_streams_one_text_waits_and_a_second_closes_with_1008() {
        let mut inbox = Inbox::new(Limits::default());
        // Pings are answered whatever waits.
        assert_eq!(inbox.act(Message::Ping(Bytes::from_static(b"1")), true), Action::Pong(Bytes::from_static(b"1")));
        assert_eq!(inbox.act(text("next"), true), Action::Nothing);
        assert_eq!(inbox.act(Message::Ping(Bytes::from_static(b"2")), true), Action::Pong(Bytes::from_static(b"2")));
        assert_eq!(inbox.act(text("one too many"), true), Action::End(End::Close(1008, ONE_WAITING)));
        assert_eq!(inbox.pending.as_deref(), Some(&b"next"[..]), "the first kept, as it came");
        // Once it is taken (served), the next response may keep another.
        assert_eq!(inbox.pending.take().as_deref(), Some(&b"next"[..]));
        assert_eq!(inbox.act(text("later"), true), Action::Nothing);
        // A close or a binary message ends the socket mid-response too.
        assert_eq!(inbox.act(Message::Close(None), true), Action::End(End::Close(1000, "")));
        assert_eq!(
            inbox.act(Message::Binary(Bytes::new()), true),
            Action::End(End::Close(1003, "send response.create as a text message"))
        );
        assert!(ONE_WAITING.len() <= 123, "fits in a close frame");
    }
}
