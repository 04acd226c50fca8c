//! How any core reaches a ready node: its route (the ready links of its
//! generation) and, per link, the core hosting the session, the session's
//! command mailbox, the commands it takes and whether the link is suspect.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use iop_core::{rt::mailbox, wire::pb};

use crate::{
    registry::Generation,
    stream::{RunEvents, TunnelEvents},
};

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
    /// Send a workspace call; the node's answer goes to `reply` (dropped
    /// when the session ends or has too many waiting: the caller sees the
    /// link gone and fails closed).
    Workspace {
        /// The call (boxed: see `Run`).
        call: Box<iop_core::wire::WorkspaceCall>,
        /// Gets the answer.
        reply: iop_core::rt::oneshot::OneshotSender<iop_core::wire::WorkspaceAnswer>,
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

/// Whether a link is suspect; shared by its session (which sets it) and
/// every route that holds the link (which read it when dispatching).
#[derive(Debug, Clone, Default)]
pub struct Suspicion(Arc<AtomicBool>);

impl Suspicion {
    /// The link did not answer a probe and has not spoken since.
    pub fn is_suspect(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Sets the state; whether it changed.
    pub(crate) fn set(&self, suspect: bool) -> bool {
        self.0.swap(suspect, Ordering::AcqRel) != suspect
    }
}

/// A node connection that sent a valid `RegisterRequest`, ready to be
/// served by the core its link belongs on.
pub struct Arrival {
    /// The connection (its read buffer empty: nothing past the request).
    pub stream: iop_core::net::Detached,
    /// Bytes read past the request.
    pub leftover: bytes::BytesMut,
    /// The request.
    pub request: pb::RegisterRequest,
    /// Its correlation id.
    pub correlation_id: u64,
    /// The node's address.
    pub peer: std::net::SocketAddr,
    /// When register and ready must both be done.
    pub deadline: std::time::Instant,
    /// Its place among the handshakes in progress.
    pub handshake: iop_core::limits::SlotGuard,
    /// The node its token names.
    pub node: String,
}

/// A ready node as seen by one core: the ready links of its generation.
#[derive(Clone)]
pub struct NodeRoute {
    /// Generation the route belongs to.
    pub generation: Generation,
    /// Grows with every change of the link set (see [`crate::registry::LinkSet`]).
    pub version: u64,
    /// The ready links (at least one), by index.
    pub links: Arc<[LinkRoute]>,
}

/// One ready link of a node.
#[derive(Clone)]
pub struct LinkRoute {
    /// Link index.
    pub index: u32,
    /// Edge core hosting its session.
    pub worker: usize,
    /// Command mailbox of its session task.
    pub session: mailbox::Sender<SessionCmd>,
    /// Set while the link does not answer: tried last.
    pub suspicion: Suspicion,
}

impl NodeRoute {
    /// The route of `set`.
    pub fn new(generation: Generation, set: crate::registry::LinkSet<LinkHandle>) -> Self {
        let links = set
            .links
            .into_iter()
            .map(|l| LinkRoute {
                index: l.index,
                worker: l.worker,
                session: l.handle.session,
                suspicion: l.handle.suspicion,
            })
            .collect::<Vec<_>>()
            .into();
        Self { generation, version: set.version, links }
    }

    /// Whether this route supersedes `other` (a later generation, or a
    /// later link set of the same one).
    pub fn newer_than(&self, other: &NodeRoute) -> bool {
        (self.generation, self.version) > (other.generation, other.version)
    }

    /// The links in the order a client on core `me` should try them: one on
    /// `me` first (its stream then never crosses cores), then the others
    /// from a position that rotates with `turn`, so runs spread over links;
    /// suspect links after all of those (only a grant that raced the
    /// suspicion reaches them).
    pub fn order(&self, me: usize, turn: usize) -> Vec<&LinkRoute> {
        let n = self.links.len();
        let mut out: Vec<&LinkRoute> = Vec::with_capacity(n);
        let answering = |l: &&LinkRoute| !l.suspicion.is_suspect();
        let locals = self.links.iter().filter(|l| l.worker == me).filter(answering).count();
        if locals > 0 {
            out.extend(self.links.iter().filter(|l| l.worker == me).filter(answering).nth(turn % locals));
        }
        for suspect in [false, true] {
            for i in 0..n {
                let l = &self.links[(turn + i) % n];
                if l.suspicion.is_suspect() == suspect && !out.iter().any(|o| o.index == l.index) {
                    out.push(l);
                }
            }
        }
        out
    }

    /// Every link is suspect: the node takes no new dispatch.
    pub fn all_suspect(&self) -> bool {
        !self.links.is_empty() && self.links.iter().all(|l| l.suspicion.is_suspect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn link(index: u32, worker: usize, suspect: bool) -> LinkRoute {
        let suspicion = Suspicion::default();
        suspicion.set(suspect);
        LinkRoute { index, worker, session: mailbox::mailbox(1).0, suspicion }
    }

    fn order(route: &NodeRoute, me: usize, turn: usize) -> Vec<u32> {
        route.order(me, turn).iter().map(|l| l.index).collect()
    }

    #[test]
    fn routes_try_the_local_link_first_and_suspect_links_last() {
        let route = |links: Vec<LinkRoute>| NodeRoute { generation: 1, version: 1, links: links.into() };
        let r = route(vec![link(0, 0, false), link(1, 1, false), link(2, 0, false)]);
        assert_eq!(order(&r, 1, 0), [1, 0, 2]);
        assert_eq!(order(&r, 0, 1), [2, 1, 0]);
        assert!(!r.all_suspect());
        // The local link is suspect: the others first, it last.
        let r = route(vec![link(0, 0, true), link(1, 1, false), link(2, 1, false)]);
        assert_eq!(order(&r, 0, 0), [1, 2, 0]);
        assert_eq!(order(&r, 0, 2), [2, 1, 0]);
        assert!(!r.all_suspect());
        // Every link suspect: all are still listed (a grant that raced the
        // suspicion goes somewhere), and the node is suspect.
        let r = route(vec![link(0, 0, true), link(1, 1, true)]);
        assert_eq!(order(&r, 1, 0), [0, 1]);
        assert!(r.all_suspect());
        assert!(!route(vec![]).all_suspect());
    }
}
