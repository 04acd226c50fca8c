//! One edge worker core: its listeners, its view of ready nodes, its inbox.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    rc::Rc,
    sync::Arc,
};

use iop_core::{
    config::EdgeConfig,
    rt::{mailbox, signal::LocalCancel},
};

use crate::{
    link::NodeRoute,
    mesh::CoreMsg,
    pool::{PoolView, Shard},
    registry::Generation,
    server,
    shared::Shared,
    transport,
};

/// A config staged by `PrepareConfig`: revision, config and its pool view.
type Staged = (u64, Arc<EdgeConfig>, Arc<PoolView>);

/// A ready node link hosted by this core: its generation and command mailbox.
pub type LocalSession = (Generation, mailbox::Sender<crate::link::SessionCmd>);

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
                    let _ = session.try_send(crate::link::SessionCmd::Close { reason });
                }
                Some(entry) if old.node(node_id) != Some(entry) => {
                    let payload = crate::payload::node_payload(entry, rev, self.shared.leases.as_deref());
                    if session.try_send(crate::link::SessionCmd::Refresh { payload }).is_err() {
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
    monoio::spawn(server::accept_loop(worker.clone(), http, crate::surface::Router));
    monoio::spawn(transport::accept_loop(worker.clone(), nodes));
    // Keeps serving the inbox after Shutdown: draining runs still release
    // leases and fences still apply until the process exits.
    while let Some(msg) = inbox.recv().await {
        worker.apply(msg);
    }
}
