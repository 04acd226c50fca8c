//! One edge worker core: its listeners, its view of ready nodes, its inbox.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    rc::Rc,
    sync::Arc,
};

use iop_core::{
    config::EdgeConfig,
    rt::{mailbox, oneshot::OneshotSender, signal::LocalCancel},
};

use crate::{
    pool::{Lease, LeaseClass, PoolView, ResourceKey, ResourceLoad, Shard, Waiter},
    registry::Generation,
    server,
    shared::Shared,
    transport,
};

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
    pub session: mailbox::Sender<transport::SessionCmd>,
    /// Set while the link does not answer: tried last.
    pub suspicion: transport::Suspicion,
}

impl NodeRoute {
    /// The route of `set`.
    pub fn new(generation: Generation, set: crate::registry::LinkSet<transport::LinkHandle>) -> Self {
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

/// Messages between cores.
pub enum CoreMsg {
    /// A node's generation became ready, or its ready links changed.
    NodeReady {
        /// Node id.
        node_id: String,
        /// How to reach it.
        route: NodeRoute,
    },
    /// A node's connection `generation` ended.
    NodeGone {
        /// Node id.
        node_id: String,
        /// The generation that ended.
        generation: Generation,
    },
    /// A link of this node became suspect or answered again: the owner of
    /// each of its resources decides whether the node still takes work.
    LinkSuspicion {
        /// Node id.
        node_id: String,
    },
    /// Try to take a lease on a resource this core owns.
    Acquire {
        /// Resource.
        key: ResourceKey,
        /// Pool.
        class: LeaseClass,
        /// Gets the lease, or None when there is no room.
        reply: OneshotSender<Option<Lease>>,
    },
    /// Queue a waiter on a resource this core owns.
    Wait {
        /// Resource.
        key: ResourceKey,
        /// The shared waiter slot.
        waiter: Arc<Waiter>,
    },
    /// A copy of this core's metrics, for a scrape.
    Metrics {
        /// Gets the copy.
        reply: OneshotSender<crate::metrics::CoreMetrics>,
    },
    /// A health observation about a resource this core owns.
    Health(Box<crate::pool::HealthReport>),
    /// A lease of a fenced connection, to drop after the fence
    /// ([`Lease::release_after_fence`]).
    DropLease(Lease),
    /// A lease on a resource this core owns ended.
    Release {
        /// Resource.
        key: ResourceKey,
        /// Pool.
        class: LeaseClass,
        /// The counters the lease was counted in: a lease from before its
        /// resource was removed and re-added by a reload must not free the
        /// new resource's capacity.
        load: Arc<ResourceLoad>,
    },
    /// A waiter left; drop finished entries from the resource's queue.
    Compact {
        /// Resource.
        key: ResourceKey,
    },
    /// Phase one of a live reload: stage `config` and ack on `ack`.
    PrepareConfig {
        /// New revision.
        revision: u64,
        /// The validated config.
        config: Arc<EdgeConfig>,
        /// Its pool view (counters of kept resources carried over).
        pool: Arc<PoolView>,
        /// Receives this core's index once staged.
        ack: crossbeam_channel::Sender<usize>,
    },
    /// Phase two: switch to the staged config `revision`.
    CommitConfig {
        /// Revision to commit.
        revision: u64,
    },
    /// Serve this registering node link here (its link belongs on this core).
    AdoptLink(Box<transport::Arrival>),
    /// Stop serving.
    Shutdown,
}

/// A config staged by `PrepareConfig`: revision, config and its pool view.
type Staged = (u64, Arc<EdgeConfig>, Arc<PoolView>);

/// A ready node link hosted by this core: its generation and command mailbox.
pub type LocalSession = (Generation, mailbox::Sender<transport::SessionCmd>);

/// A node link: node id and link index.
pub type LinkKey = (String, u32);

/// Per-core state; lives in an `Rc` on its own thread.
pub struct Worker {
    /// Core index.
    pub index: usize,
    /// Process-wide state.
    pub shared: Arc<Shared>,
    /// Configuration as this core sees it.
    pub config: RefCell<Arc<EdgeConfig>>,
    /// Ready nodes by id.
    pub routes: RefCell<HashMap<String, NodeRoute>>,
    run_seq: Cell<u64>,
    waiter_seq: Cell<u64>,
    /// Published load of every resource, as of this core's config.
    pub pool: RefCell<Arc<PoolView>>,
    /// Authoritative state of the resources this core owns.
    pub shard: RefCell<Shard>,
    /// Ready node links whose sessions run on this core.
    pub local_sessions: RefCell<HashMap<LinkKey, LocalSession>>,
    /// Rotates the link a run goes to.
    link_turn: Cell<usize>,
    /// Revision of `config`.
    pub revision: Cell<u64>,
    /// A prepared config waiting for its commit.
    pending: RefCell<Option<Staged>>,
    /// Raised when the worker stops.
    pub stop: LocalCancel,
    /// Request body bytes being received and parsed on this core.
    pub body_budget: server::BodyBudget,
}

impl Worker {
    /// A worker for core `index`.
    pub fn new(index: usize, shared: Arc<Shared>, pool: Arc<PoolView>) -> Self {
        let config = shared.config.clone();
        let mut shard = Shard::new(index, shared.workers, shared.inboxes[index].clone());
        shard.apply_config(&config, &pool);
        Self {
            index,
            shared,
            config: RefCell::new(config),
            routes: RefCell::new(HashMap::new()),
            run_seq: Cell::new(0),
            waiter_seq: Cell::new(0),
            pool: RefCell::new(pool),
            shard: RefCell::new(shard),
            local_sessions: RefCell::new(HashMap::new()),
            link_turn: Cell::new(0),
            revision: Cell::new(1),
            pending: RefCell::new(None),
            stop: LocalCancel::new(),
            body_budget: server::BodyBudget::default(),
        }
    }

    /// Client connections allowed at once on the edge (`http.max_connections`,
    /// by default derived from the open-file limit).
    pub fn max_connections(&self) -> usize {
        self.config.borrow().http.max_connections.unwrap_or(self.shared.default_max_connections)
    }

    /// Arrival number for a new waiter (per core; with the core index it orders logs).
    pub fn next_waiter_seq(&self) -> u64 {
        let n = self.waiter_seq.get() + 1;
        self.waiter_seq.set(n);
        n
    }

    /// The next position for [`NodeRoute::order`].
    pub fn next_link_turn(&self) -> usize {
        let n = self.link_turn.get().wrapping_add(1);
        self.link_turn.set(n);
        n
    }

    /// A run id unique in this process and across edge instances.
    pub fn next_run_id(&self) -> String {
        let n = self.run_seq.get() + 1;
        self.run_seq.set(n);
        // Without format!: one allocation per request, no formatter.
        let instance = &self.shared.instance;
        let mut id = String::with_capacity(instance.len() + 24);
        id.push_str(instance);
        id.push('-');
        iop_core::http::push_decimal(&mut id, self.index as u64);
        id.push('-');
        iop_core::http::push_decimal(&mut id, n);
        id
    }

    fn apply(self: &Rc<Self>, msg: CoreMsg) {
        match msg {
            CoreMsg::NodeReady { node_id, route } => {
                let generation = route.generation;
                if self.shard.borrow().is_fenced(&node_id, generation) {
                    // A link set of a generation whose fence came first.
                    return;
                }
                self.shard.borrow_mut().set_route(&node_id, &route);
                {
                    let mut routes = self.routes.borrow_mut();
                    // Generations and link sets only grow; never let an older one replace a newer.
                    if routes.get(&node_id).is_none_or(|r| route.newer_than(r)) {
                        routes.insert(node_id.clone(), route);
                    }
                }
                let fresh = self.shard.borrow_mut().node_ready(&node_id, generation);
                for key in fresh {
                    monoio::spawn(crate::recovery::first_probe(self.clone(), key, generation));
                }
            }
            CoreMsg::NodeGone { node_id, generation } => {
                {
                    let mut routes = self.routes.borrow_mut();
                    if routes.get(&node_id).is_some_and(|r| r.generation == generation) {
                        routes.remove(&node_id);
                    }
                }
                self.shard.borrow_mut().node_gone(&node_id, generation);
            }
            CoreMsg::LinkSuspicion { node_id } => self.shard.borrow_mut().refresh_suspicion(&node_id),
            CoreMsg::Acquire { key, class, reply } => {
                let lease = self.shard.borrow_mut().try_acquire(&key, class);
                reply.send(lease);
            }
            CoreMsg::Wait { key, waiter } => self.shard.borrow_mut().wait(&key, waiter),
            CoreMsg::Release { key, class, load } => self.shard.borrow_mut().release(&key, class, &load),
            CoreMsg::DropLease(lease) => drop(lease),
            CoreMsg::Health(report) => crate::recovery::observe(self, &report),
            CoreMsg::Metrics { reply } => reply.send(crate::metrics::snapshot()),
            CoreMsg::Compact { key } => self.shard.borrow_mut().compact(&key),
            CoreMsg::PrepareConfig { revision, config, pool, ack } => {
                *self.pending.borrow_mut() = Some((revision, config, pool));
                let _ = ack.send(self.index);
            }
            CoreMsg::CommitConfig { revision } => self.commit(revision),
            CoreMsg::AdoptLink(arrival) => {
                monoio::spawn(transport::session_serve_arrival(self.clone(), *arrival));
            }
            CoreMsg::Shutdown => self.stop.cancel(),
        }
    }
}

impl Worker {
    /// Switches to the staged config: capacities on owned resources, the
    /// pool view, and a refresh (or close) for this core's node sessions
    /// whose config changed.
    fn commit(&self, revision: u64) {
        let staged = self.pending.borrow_mut().take();
        let Some((rev, config, pool)) = staged.filter(|(r, _, _)| *r == revision) else {
            tracing::warn!(worker = self.index, revision, "commit without a matching prepared config ignored");
            return;
        };
        let old = self.config.replace(config.clone());
        *self.pool.borrow_mut() = pool.clone();
        self.revision.set(rev);
        self.shard.borrow_mut().apply_config(&config, &pool);
        for ((node_id, _), (_, session)) in self.local_sessions.borrow().iter() {
            match config.node(node_id) {
                None => {
                    let reason = "node removed from the edge config".to_owned();
                    let _ = session.try_send(transport::SessionCmd::Close { reason });
                }
                Some(entry) if old.node(node_id) != Some(entry) => {
                    let payload = crate::payload::node_payload(entry, rev, self.shared.leases.as_deref());
                    if session.try_send(transport::SessionCmd::Refresh { payload }).is_err() {
                        tracing::warn!(node = %node_id, "could not queue the config refresh for the node");
                    }
                }
                Some(_) => {}
            }
        }
    }
}

/// Runs worker `index`: accepts clients and nodes on this core's listeners
/// and applies inbox messages until shutdown.
pub async fn run(
    worker: Rc<Worker>,
    http: std::net::TcpListener,
    nodes: std::net::TcpListener,
    inbox: mailbox::Receiver<CoreMsg>,
) {
    let http = match monoio::net::TcpListener::from_std(http) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = worker.index, error = %e, "cannot adopt HTTP listener");
            return;
        }
    };
    let nodes = match monoio::net::TcpListener::from_std(nodes) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = worker.index, error = %e, "cannot adopt node listener");
            return;
        }
    };
    monoio::spawn(server::accept_loop(worker.clone(), http));
    monoio::spawn(transport::accept_loop(worker.clone(), nodes));
    // Keeps serving the inbox after Shutdown: draining runs still release
    // leases and fences still apply until the process exits.
    while let Some(msg) = inbox.recv().await {
        worker.apply(msg);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn link(index: u32, worker: usize, suspect: bool) -> LinkRoute {
        let suspicion = transport::Suspicion::default();
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
