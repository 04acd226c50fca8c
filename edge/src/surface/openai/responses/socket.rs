//! The Responses API's WebSocket mode: `GET /v1/responses` with `Upgrade:
//! websocket`, then `response.create` messages on the one socket, answered
//! one after another, each as the same events a streamed `POST` gets, one
//! JSON text frame per event ([`super::turn`]). A `previous_response_id`
//! naming the socket's own last response continues it (its input and
//! output are put before the new input); nothing is stored beyond the
//! socket. Pings are answered, close codes follow RFC 6455, frames and
//! messages are bounded by `http.max_body_bytes`, a socket idle for
//! `http.idle_timeout_sec` is closed, and `http.max_websockets` caps the
//! sockets open at once.

use std::{rc::Rc, sync::Arc, time::Duration};

use iop_core::{
    http::RequestHead,
    ws::{self, close_code, Limits, Message, Reader},
};

use super::turn::{self, History};
use crate::{ctx::Ctx, pool::keys::KeyState, server::Conn, surface::dialect::Dialect};

/// How often a socket waiting for its next message looks at the edge's
/// drain (it then closes with 1001, going away).
const DRAIN_CHECK: Duration = Duration::from_secs(1);

/// Whether `head` asks to upgrade to a WebSocket.
pub fn wants_upgrade(head: &RequestHead) -> bool {
    head.header("upgrade").is_some()
}

/// Serves one WebSocket from its upgrade request to its close; resolves to
/// false (the connection is never reused for HTTP). Each response it
/// carries has its own access-log line and metrics; the socket's own line
/// (status 101, its whole duration) comes last.
pub async fn serve(worker: &Rc<Ctx>, conn: &mut Conn, head: RequestHead, key: Option<Arc<KeyState>>) -> bool {
    let opened = std::time::Instant::now();
    let upgraded = socket(worker, conn, &head, key).await;
    if upgraded {
        conn.exchange.begin_at(&head, opened);
        conn.exchange.set_surface(crate::surface::route::Route::Responses.label());
        conn.exchange.status(101);
    }
    false
}

/// The socket; true when it was upgraded (whatever ended it).
async fn socket(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, key: Option<Arc<KeyState>>) -> bool {
    let info = match ws::check_upgrade(head) {
        Ok(info) => info,
        Err(e) => {
            let body = Dialect::OpenAi.error_body(e.status(), &e.to_string(), e.code());
            let _ = conn.respond(e.status(), "application/json", e.headers(), &body, false).await;
            return false;
        }
    };
    let (max, limits, idle) = {
        let config = worker.config.borrow();
        let max_bytes = config.http.max_body_bytes;
        (
            config.http.max_websockets,
            Limits { max_frame_bytes: max_bytes, max_message_bytes: max_bytes },
            config.http.idle_timeout,
        )
    };
    let draining = worker.shared.draining.load(std::sync::atomic::Ordering::Acquire);
    let slot = (!draining).then(|| worker.shared.websockets.try_acquire(max)).flatten();
    let Some(_slot) = slot else {
        let msg = if max == 0 {
            "the Responses API WebSocket mode is off on this gateway (http.max_websockets = 0)"
        } else {
            "too many Responses API WebSockets are open; retry later or use POST /v1/responses"
        };
        let body = Dialect::OpenAi.error_body(503, msg, "websockets_full");
        let _ = conn.respond(503, "application/json", &[("retry-after", "1")], &body, false).await;
        return false;
    };
    conn.out.clear();
    match info.protocols.first() {
        // The subprotocol a client offers is echoed: a browser fails the
        // socket otherwise. None of ours is needed.
        Some(p) => ws::handshake::write_accept_protocol(&mut conn.out, &info.accept, Some(p)),
        None => ws::write_accept(&mut conn.out, &info.accept),
    }
    conn.exchange.status(101);
    if !write_out(conn, idle).await {
        return true;
    }
    let mut reader = Reader::new(limits);
    let mut history: Option<History> = None;
    loop {
        let msg = match next_message(worker, conn, &mut reader, idle).await {
            Next::Message(m) => m,
            Next::Gone => return false,
            Next::Close(code, reason) => {
                ws::write::close(&mut conn.out, code, reason);
                let _ = write_out(conn, idle).await;
                return true;
            }
        };
        match msg {
            Message::Text(text) => {
                if !turn::respond(worker, conn, head, key.as_deref(), &text, &mut history, limits).await {
                    return true;
                }
            }
            Message::Ping(payload) => ws::write::pong(&mut conn.out, &payload),
            Message::Pong(_) => continue,
            Message::Binary(_) => {
                ws::write::close(&mut conn.out, close_code::UNSUPPORTED, "send response.create as a text message");
                let _ = write_out(conn, idle).await;
                return true;
            }
            Message::Close(_) => {
                ws::write::close(&mut conn.out, close_code::NORMAL, "");
                let _ = write_out(conn, idle).await;
                return true;
            }
        }
        if !write_out(conn, idle).await {
            return true;
        }
    }
}

enum Next {
    Message(Message),
    /// The client went away (or its socket broke): nothing more to send.
    Gone,
    /// The socket ends with this close frame.
    Close(u16, &'static str),
}

/// The client's next message, reading as needed: a protocol error, an idle
/// socket or the edge's drain end the socket with their close code.
async fn next_message(worker: &Ctx, conn: &mut Conn, reader: &mut Reader, idle: Duration) -> Next {
    let mut idle_for = Duration::ZERO;
    loop {
        match reader.read(&mut conn.buf) {
            Ok(Some(m)) => return Next::Message(m),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %conn.peer, code = e.code(), "websocket protocol error");
                return Next::Close(e.close_code(), e.code());
            }
        }
        if worker.shared.draining.load(std::sync::atomic::Ordering::Acquire) {
            return Next::Close(close_code::GOING_AWAY, "the gateway is shutting down");
        }
        if idle_for >= idle {
            return Next::Close(close_code::POLICY, "idle for too long");
        }
        let wait = DRAIN_CHECK.min(idle - idle_for);
        // A read cut by the timeout stays posted: its bytes land at the next.
        match iop_core::rt::time::timeout(wait, conn.rd.read_append(&mut conn.buf, 4096)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Next::Gone,
            Ok(Ok(_)) => idle_for = Duration::ZERO,
            Err(_) => idle_for += wait,
        }
    }
}

/// Writes what `conn.out` holds within `timeout`; false when the socket is
/// gone or stopped reading.
pub(super) async fn write_out(conn: &mut Conn, timeout: Duration) -> bool {
    matches!(iop_core::rt::time::timeout(timeout, conn.flush()).await, Ok(Ok(())))
}
