//! Node transport: the listener nodes dial, the registration/ready
//! handshake, and one session task per node connection.

mod commands;
mod handshake;
mod pump;
pub mod runs;
mod session;
mod shares;
mod suspect;

use std::{rc::Rc, time::Duration};

use iop_core::{config::NODE_TLS_HANDSHAKES, limits::LogThrottle};

use crate::link::{LinkHandle, SessionCmd, Suspicion, SESSION_CMD_CAPACITY};
use crate::{accept::Refused, ctx::Ctx, limits::handshakes::HandshakeLimits};

pub use runs::{Routed, RunTable};
pub use session::serve_arrival as session_serve_arrival;

fn envelope(correlation_id: u64, body: iop_core::wire::pb::envelope::Body) -> iop_core::wire::pb::Envelope {
    iop_core::wire::pb::Envelope { correlation_id, body: Some(body) }
}

/// Frames a session routes before letting other tasks on its core (e.g. the
/// clients consuming those events) run.
pub const FRAMES_PER_YIELD: u32 = 256;

/// Frame bytes a session routes before letting other tasks on its core run
/// (large frames reach this long before `FRAMES_PER_YIELD`).
pub const BYTES_PER_YIELD: u64 = 1024 * 1024;

/// One warning per interval for floods of refused or failed node accepts.
static REFUSED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts node connections on this core. Each takes a handshake slot
/// ([`crate::limits::handshakes`]: per address, with a reserve, closing the
/// oldest silent handshake rather than refusing a newcomer) and, with
/// `[node_listener.tls]`, a place in its address's TLS handshake limits;
/// otherwise it is closed at accept. Sessions outlive a shutdown (runs in
/// flight finish), so this loop does too.
pub async fn accept_loop(worker: Rc<Ctx>, listener: monoio::net::TcpListener) {
    let gate = crate::accept::Gate {
        what: "node connection",
        refused_log: &REFUSED_LOG,
        failed_log: &FAILED_LOG,
        yield_after_accept: true,
    };
    let admit = |peer: std::net::SocketAddr| {
        let (limits, tls_limits) = {
            let cfg = worker.config.borrow();
            (HandshakeLimits::from(&cfg.node_handshake), cfg.node_tls.as_ref().map(|t| t.handshakes))
        };
        // TLS first: a refused newcomer closes nobody's handshake.
        let tls = match &worker.shared.node_tls {
            None => None,
            Some(_) => {
                let limits = tls_limits.unwrap_or(NODE_TLS_HANDSHAKES);
                let ticket = worker.shared.node_tls_limit.admit(peer.ip(), limits).map_err(|why| {
                    crate::metrics::conn_limit("node", why.label());
                    Refused::tls("node_listener.tls", why, limits)
                })?;
                Some(ticket)
            }
        };
        let admitted = worker.shared.handshakes.admit(peer.ip(), limits).map_err(|_| {
            crate::metrics::conn_limit("node", "refused_full");
            Refused { key: "node_listener.max_handshakes", limit: limits.max }
        })?;
        if let Some(evicted) = admitted.evicted {
            crate::metrics::conn_limit("node", evicted.label());
        }
        Ok(handshake::Admission { slot: admitted.slot, tls })
    };
    let serve = |stream, peer, admission| {
        monoio::spawn(handshake::serve(worker.clone(), stream, peer, admission));
    };
    crate::accept::accept_loop(listener, None, &gate, admit, serve).await;
}
