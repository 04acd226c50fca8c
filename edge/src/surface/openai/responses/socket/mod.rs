//! The Responses API's WebSocket mode: `GET /v1/responses` with `Upgrade:
//! websocket`, then `response.create` messages on the one socket, answered
//! one after another, each as the same events a streamed `POST` gets, one
//! JSON text frame per event ([`turn`], [`relay`]). A `previous_response_id`
//! naming the socket's own last response continues it (its input and
//! output are put before the new input); nothing is stored beyond the
//! socket. Close codes follow RFC 6455, frames and messages are bounded by
//! `http.max_body_bytes`, a socket idle for `http.idle_timeout_sec` between
//! responses is closed, and `http.max_websockets` caps the sockets open at
//! once. The client is read while a response streams too ([`inbox`]): a
//! ping is answered at once, a close cancels the response, the next
//! `response.create` waits for the response's end (one at most).

mod inbox;
mod refused;
mod relay;
mod turn;

use std::{rc::Rc, sync::Arc};

use iop_core::{
    http::RequestHead,
    ws::{self, Limits},
};

use self::{
    inbox::{write_out, End, Inbox},
    turn::History,
};
use crate::{ctx::Ctx, pool::keys::KeyState, server::Conn, surface::dialect::Dialect};

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
        let session_header = worker.config.borrow().http.session_header.clone();
        conn.exchange.begin_at(&head, opened, session_header.as_deref());
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
    let mut inbox = Inbox::new(limits);
    let mut history: Option<History> = None;
    loop {
        let text = match inbox.next(worker, conn, idle).await {
            Ok(text) => text,
            Err(end) => return close(conn, end, idle).await,
        };
        if let Err(end) = turn::respond(worker, conn, head, key.as_ref(), &text, &mut history, &mut inbox).await {
            return close(conn, end, idle).await;
        }
        // The error event of a message that could not be served.
        if !write_out(conn, idle).await {
            return true;
        }
    }
}

/// Ends an upgraded socket as `end` says; true.
async fn close(conn: &mut Conn, end: End, timeout: std::time::Duration) -> bool {
    if let End::Close(code, reason) = end {
        ws::write::close(&mut conn.out, code, reason);
        let _ = write_out(conn, timeout).await;
    }
    true
}
