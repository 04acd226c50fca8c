//! Node transport: the listener nodes dial, the registration/ready
//! handshake, and one session task per node connection.

mod commands;
mod events;
pub mod runs;
mod session;
mod suspect;

use std::{rc::Rc, time::Duration};

use iop_core::{config::NODE_TLS_HANDSHAKES, exec::ExecEvent, limits::LogThrottle, tunnel::TunnelItem, wire::pb};

use crate::{accept::Refused, limits::handshakes::HandshakeLimits, worker::Worker};

pub use events::{channel, cost_of, Queued, StreamRx, StreamTx, Undelivered, RUN_EVENT_CAPACITY};
pub use runs::{Failing, Routed, RunTable};
pub use session::{serve_arrival as session_serve_arrival, Arrival};
pub use suspect::Suspicion;

/// Events of one run, delivered to the core serving its client.
pub type RunEvents = StreamTx<ExecEvent>;
/// The client side of [`RunEvents`].
pub type RunReceiver = StreamRx<ExecEvent>;
/// Items of one tunnel, delivered to the core serving its client.
pub type TunnelEvents = StreamTx<TunnelItem>;
/// The client side of [`TunnelEvents`].
pub type TunnelReceiver = StreamRx<TunnelItem>;

/// A ready link as the registry and the routes hold it: its session's
/// command mailbox and whether it is suspect.
#[derive(Clone)]
pub struct LinkHandle {
    /// The session's command mailbox.
    pub session: iop_core::rt::mailbox::Sender<SessionCmd>,
    /// Set while the link does not answer (see [`Suspicion`]).
    pub suspicion: Suspicion,
}

impl crate::registry::LinkFlags for LinkHandle {
    fn suspect(&self) -> bool {
        self.suspicion.is_suspect()
    }
}

/// Frames a session routes before letting other tasks on its core (e.g. the
/// clients consuming those events) run.
pub const FRAMES_PER_YIELD: u32 = 256;

/// Frame bytes a session routes before letting other tasks on its core run
/// (large frames reach this long before `FRAMES_PER_YIELD`).
pub const BYTES_PER_YIELD: u64 = 1024 * 1024;

/// Capacity of a session's command mailbox.
pub const SESSION_CMD_CAPACITY: usize = 4096;

/// Commands other cores send to a node session.
pub enum SessionCmd {
    /// Open a provider tunnel; its items go to `events`.
    Tunnel {
        /// The request as sent to the node (boxed: see `Run`).
        req: Box<pb::ProviderTunnelRequest>,
        /// Where the tunnel's items go.
        events: TunnelEvents,
        /// The tunnel's capacity, owned by the session like a run's.
        lease: crate::pool::Lease,
    },
    /// Start a run; its events go to `events`.
    Run {
        /// The request as sent to the node (boxed: mailbox slots are
        /// preallocated at the size of the largest command).
        req: Box<pb::RunRequest>,
        /// Where the run's events go.
        events: RunEvents,
        /// The run's capacity: the session owns it for the run's lifetime
        /// and drops it when the run ends, however it ends.
        lease: crate::pool::Lease,
    },
    /// The client's task took `bytes` (cost) of stream `id`: grant the
    /// node that much more of its window.
    Credit {
        /// Run or tunnel id.
        id: String,
        /// Cost taken since the last grant.
        bytes: u64,
    },
    /// Cancel a run or tunnel (client gone, deadline).
    Cancel {
        /// Run or tunnel id.
        run_id: String,
        /// Why, for the node's logs.
        reason: &'static str,
    },
    /// Send a node command; the node's response goes to `reply` (dropped
    /// when the session ends or has too many waiting).
    Command {
        /// The command.
        req: pb::NodeCommandRequest,
        /// Gets the response.
        reply: iop_core::rt::oneshot::OneshotSender<pb::NodeCommandResponse>,
    },
    /// Push a changed node config (live reload).
    Refresh {
        /// The node's new config.
        payload: pb::NodeConfigPayload,
    },
    /// Probe the link now (a sibling link of the same node went suspect:
    /// a frozen process freezes every link, idle ones included).
    Probe,
    /// Close the connection (e.g. the node was removed from the config).
    Close {
        /// Logged close reason.
        reason: String,
    },
}

/// One warning per interval for floods of refused or failed node accepts.
static REFUSED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts node connections on this core. Each takes a handshake slot
/// ([`crate::limits::handshakes`]: per address, with a reserve, closing the
/// oldest silent handshake rather than refusing a newcomer) and, with
/// `[node_listener.tls]`, a place in its address's TLS handshake limits;
/// otherwise it is closed at accept. Sessions outlive a shutdown (runs in
/// flight finish), so this loop does too.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
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
        Ok(session::Admission { slot: admitted.slot, tls })
    };
    let serve = |stream, peer, admission| {
        monoio::spawn(session::serve(worker.clone(), stream, peer, admission));
    };
    crate::accept::accept_loop(listener, None, &gate, admit, serve).await;
}
