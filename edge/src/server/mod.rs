//! The client-facing HTTP/1.1 server: accept loop and connection handling.
//! Parsing is `iop_core::http`; what answers a request is the [`Handler`]
//! the server is given (the API surfaces), which it does not know.

mod body;
mod conn;
mod exchange;
mod reader;
pub mod session_id;
mod watch;

use std::{future::Future, rc::Rc, time::Duration};

pub use body::{Body, BodyBudget, BodyPermit};
pub use conn::{Conn, Responder};
pub use exchange::{Exchange, Finish};
use iop_core::{config::HTTP_TLS_HANDSHAKES, http::RequestHead, limits::LogThrottle};
pub use reader::ReadSide;
pub use watch::{with_disconnect_watch, STREAM_WATCH, WHOLE_WATCH};

use crate::{
    accept::{Gate, Refused},
    ctx::Ctx,
};

/// What the server drives for each request it reads.
pub trait Handler: Clone + 'static {
    /// Answers one request; returns whether the connection may stay open.
    fn handle<'a>(
        &'a self,
        worker: &'a Rc<Ctx>,
        conn: &'a mut Conn,
        head: RequestHead,
        body: Body,
    ) -> impl Future<Output = bool> + 'a;

    /// The JSON body refusing a request the server could not read
    /// (unparsable, too large, too slow, no body budget), before any route
    /// was chosen.
    fn refusal_body(&self, status: u16, message: &str, code: &str) -> Vec<u8>;
}

/// One warning per interval for floods of refused or failed accepts.
static REFUSED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts client connections on this core, at most `http.max_connections`
/// open on the edge, and with `[http.tls]` at most as many TLS handshakes
/// per address as its limits allow; on shutdown the listener is dropped, so
/// new clients are refused at once.
pub async fn accept_loop<H: Handler>(worker: Rc<Ctx>, listener: monoio::net::TcpListener, handler: H) {
    let gate = Gate {
        what: "client connection",
        refused_log: &REFUSED_LOG,
        failed_log: &FAILED_LOG,
        yield_after_accept: false,
    };
    let admit = |peer: std::net::SocketAddr| {
        let limit = worker.max_connections();
        let slot =
            worker.shared.connections.try_acquire(limit).ok_or(Refused { key: "http.max_connections", limit })?;
        let tls = match &worker.shared.http_tls {
            None => None,
            Some(_) => {
                let limits = worker.config.borrow().http.tls.as_ref().map_or(HTTP_TLS_HANDSHAKES, |t| t.handshakes);
                let ticket = worker.shared.http_tls_limit.admit(peer.ip(), limits).map_err(|why| {
                    crate::metrics::conn_limit("http", why.label());
                    Refused::tls("http.tls", why, limits)
                })?;
                Some(ticket)
            }
        };
        Ok((slot, tls))
    };
    let serve = |stream, peer, (slot, tls)| match tls {
        None => {
            monoio::spawn(conn::serve(worker.clone(), handler.clone(), stream, peer, slot));
        }
        Some(ticket) => {
            monoio::spawn(conn::serve_tls(worker.clone(), handler.clone(), stream, peer, slot, ticket));
        }
    };
    crate::accept::accept_loop(listener, Some(&worker.stop), &gate, admit, serve).await;
}
