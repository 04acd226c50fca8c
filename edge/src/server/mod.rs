//! The client-facing HTTP/1.1 server: accept loop and connection handling.
//! Parsing is `iop_core::http`; routing is in `surface`.

mod body;
mod conn;
mod exchange;
mod reader;
mod watch;

use std::{rc::Rc, time::Duration};

pub use body::{Body, BodyBudget, BodyPermit};
pub use conn::{Conn, Responder};
pub use exchange::{Exchange, Finish};
use iop_core::limits::LogThrottle;
pub use reader::ReadSide;
pub use watch::{with_disconnect_watch, STREAM_WATCH, WHOLE_WATCH};

use crate::{accept::Gate, worker::Worker};

/// One warning per interval for floods of refused or failed accepts.
static REFUSED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts client connections on this core, at most `http.max_connections`
/// open on the edge; on shutdown the listener is dropped, so new clients
/// are refused at once.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
    let gate = Gate {
        what: "client connection",
        key: "http.max_connections",
        slots: worker.shared.connections.clone(),
        refused_log: &REFUSED_LOG,
        failed_log: &FAILED_LOG,
    };
    let serve = |stream, peer, slot| {
        monoio::spawn(conn::serve(worker.clone(), stream, peer, slot));
    };
    crate::accept::accept_loop(listener, Some(&worker.stop), &gate, || worker.max_connections(), serve).await;
}
