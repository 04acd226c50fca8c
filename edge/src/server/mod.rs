//! The client-facing HTTP/1.1 server: accept loop and connection handling.
//! Parsing is `iop_core::http`; routing is in `surface`.

mod body;
mod conn;
mod watch;

use std::{rc::Rc, time::Duration};

pub use body::{Body, BodyBudget, BodyPermit};
pub use conn::Conn;
use iop_core::limits::LogThrottle;
pub use watch::with_disconnect_watch;

use crate::worker::Worker;

/// One warning per interval for floods of refused or failed accepts.
static CONNECTION_LIMIT_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static ACCEPT_FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts client connections on this core.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
    loop {
        // On shutdown the listener is dropped: new clients are refused at once.
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = worker.stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let limit = worker.max_connections();
                match worker.shared.connections.try_acquire(limit) {
                    Some(slot) => {
                        monoio::spawn(conn::serve(worker.clone(), stream, peer, slot));
                    }
                    None => {
                        // Closed at once, before descriptors run out.
                        drop(stream);
                        if let Some(more) = CONNECTION_LIMIT_LOG.allow() {
                            tracing::warn!(
                                limit,
                                refused_since_last_report = more + 1,
                                "client connection limit (http.max_connections) reached; refusing new connections"
                            );
                        }
                    }
                }
            }
            Err(e) => {
                if let Some(more) = ACCEPT_FAILED_LOG.allow() {
                    tracing::warn!(error = %e, failed_since_last_report = more + 1, "client accept failed");
                }
                // EMFILE and friends: back off instead of spinning.
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
