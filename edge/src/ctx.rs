//! The state of one worker core (`Ctx`, in an `Rc` on its thread): its
//! config and revision, its view of ready nodes, the shard of resources it
//! owns, the node sessions it hosts, its id sequences and body budget.
//! Everything a request, a session or a probe on the core reads; the root
//! that builds it and applies the core's inbox is `worker.rs`.

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
    budget::BodyBudget,
    link::{NodeRoute, SessionCmd},
    pool::{PoolView, Shard},
    registry::Generation,
    shared::Shared,
};

/// A config staged by `PrepareConfig`: revision, config and its pool view.
pub(crate) type Staged = (u64, Arc<EdgeConfig>, Arc<PoolView>);

/// The config as one core sees it, shared with what outlives a request on
/// the core (a link's credential leases read it at each seal).
pub type ConfigCell = Rc<RefCell<Arc<EdgeConfig>>>;

/// A ready node link hosted by this core: its generation and command mailbox.
pub type LocalSession = (Generation, mailbox::Sender<SessionCmd>);

/// A node link: node id and link index.
pub type LinkKey = (String, u32);

/// Per-core state; lives in an `Rc` on its own thread.
pub struct Ctx {
    /// Core index.
    pub index: usize,
    /// Process-wide state.
    pub shared: Arc<Shared>,
    /// Configuration as this core sees it.
    pub config: ConfigCell,
    /// Ready nodes by id.
    pub routes: RefCell<HashMap<String, NodeRoute>>,
    pub(crate) run_seq: Cell<u64>,
    pub(crate) waiter_seq: Cell<u64>,
    /// Published load of every resource, as of this core's config.
    pub pool: RefCell<Arc<PoolView>>,
    /// Authoritative state of the resources this core owns.
    pub shard: RefCell<Shard>,
    /// Ready node links whose sessions run on this core.
    pub local_sessions: RefCell<HashMap<LinkKey, LocalSession>>,
    /// Rotates the link a run goes to.
    pub(crate) link_turn: Cell<usize>,
    /// Revision of `config`.
    pub revision: Cell<u64>,
    /// A prepared config waiting for its commit.
    pub(crate) pending: RefCell<Option<Staged>>,
    /// Raised when the worker stops.
    pub stop: LocalCancel,
    /// Request body bytes being received and parsed on this core.
    pub body_budget: BodyBudget,
}

impl Ctx {
    /// The state of core `index`.
    pub fn new(index: usize, shared: Arc<Shared>, pool: Arc<PoolView>) -> Self {
        let config = shared.config.clone();
        let mut shard = Shard::new(index, shared.workers, shared.inboxes[index].clone());
        shard.apply_config(&config, &pool);
        Self {
            index,
            shared,
            config: Rc::new(RefCell::new(config)),
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
            body_budget: BodyBudget::default(),
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
}
