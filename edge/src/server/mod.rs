//! The client-facing HTTP/1.1 server: accept loop and connection handling.
//! Parsing is `iop_core::http`; routing is in `surface`.

mod conn;
mod watch;

use std::{rc::Rc, time::Duration};

pub use conn::Conn;
pub use watch::with_disconnect_watch;

use crate::worker::Worker;

/// Accepts client connections on this core.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
    loop {
        // On shutdown the listener is dropped: new clients are refused at once.
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = worker.stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, _peer)) => {
                monoio::spawn(conn::serve(worker.clone(), stream));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "client accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
