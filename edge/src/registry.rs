//! Authoritative node registry: which registration (generation) owns each
//! configured node, which links (connections) of that node process belong
//! to it, and whether it is dispatch-ready. Plain data behind one
//! cold-path lock; every transition is decided here so that stale
//! connections can never change what the current one owns.

use std::collections::{BTreeMap, HashMap};

use iop_core::config::EdgeConfig;

/// Registration generation: unique per registration of a node process,
/// increasing. All links of one process share it.
pub type Generation = u64;

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterRefusal {
    /// No configured node has this token.
    #[error("unknown node token")]
    UnknownToken,
    /// Another process (or this link of it) already owns this node.
    #[error("node `{0}` already has a live connection")]
    Duplicate(String),
    /// Managed mode: the peer's certificate is not for the node its token
    /// names.
    #[error("the client certificate is not for node `{0}`")]
    IdentityMismatch(String),
}

/// Which link of which node process a connection is (from its
/// `RegisterRequest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkId {
    /// The node process's instance (random per start).
    pub instance: u64,
    /// This link's index.
    pub index: u32,
    /// How many links the process opens (at least 1).
    pub count: u32,
}

impl LinkId {
    /// The single link of a node that opens one.
    pub const SINGLE: LinkId = LinkId { instance: 0, index: 0, count: 1 };
}

/// What the registry can tell of a ready link's handle (for the snapshot).
pub trait LinkFlags {
    /// The link did not answer a probe and has not spoken since.
    fn suspect(&self) -> bool {
        false
    }
}

impl LinkFlags for () {}

/// A ready link: its index, the edge core hosting it, and its handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyLink<H> {
    /// Link index.
    pub index: u32,
    /// Edge core hosting the link's session.
    pub worker: usize,
    /// How to reach the session (its command mailbox).
    pub handle: H,
}

/// The ready links of a node's generation after a change, with a version
/// that grows with every change (so cores keep the newest list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSet<H> {
    /// Grows with every change of any node's links.
    pub version: u64,
    /// Ready links, by index.
    pub links: Vec<ReadyLink<H>>,
    /// The node is draining (already fenced): nothing to route to.
    pub draining: bool,
}

/// Outcome of a ready request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyOutcome<H> {
    /// The first ready link of the generation: the node is now dispatchable.
    BecameReady(LinkSet<H>),
    /// Another link of an already ready node is ready: its links changed.
    LinkReady(LinkSet<H>),
    /// This link was already ready (idempotent ack).
    AlreadyReady,
    /// The link is not part of the node's current generation.
    Stale,
}

/// Outcome of a disconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisconnectOutcome<H> {
    /// The generation ended (its last ready link, or its last link, is
    /// gone); `was_ready` says whether it had been dispatchable.
    Current {
        /// It had been ready, so cores must drop it.
        was_ready: bool,
    },
    /// A link ended; the generation goes on with these ready links.
    LinkGone(LinkSet<H>),
    /// A stale connection ended; nothing changes.
    Stale,
}

#[derive(Debug)]
struct Link<H> {
    worker: usize,
    /// Set once the link reported ready.
    ready: Option<H>,
}

#[derive(Debug)]
struct Owner<H> {
    generation: Generation,
    instance: u64,
    /// Whether any link was ready (then the node is dispatchable until its
    /// last ready link goes).
    ready: bool,
    /// The node said it is shutting down: fenced, its links only finish.
    draining: bool,
    links: BTreeMap<u32, Link<H>>,
}

impl<H: Clone> Owner<H> {
    fn ready_links(&self, version: u64) -> LinkSet<H> {
        let links = self
            .links
            .iter()
            .filter_map(|(i, l)| l.ready.clone().map(|handle| ReadyLink { index: *i, worker: l.worker, handle }))
            .collect();
        LinkSet { version, links, draining: self.draining }
    }
}

/// One link of a node, for the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link index.
    pub index: u32,
    /// Edge core hosting it.
    pub worker: usize,
    /// Reported ready.
    pub ready: bool,
    /// Ready but not answering (see `link::Suspicion`).
    pub suspect: bool,
}

/// Live view of one node for the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// Node id.
    pub id: String,
    /// A registration owns the node.
    pub connected: bool,
    /// It is dispatch-ready (at least one ready link).
    pub ready: bool,
    /// It said it is shutting down (fenced; its runs in flight finish).
    pub draining: bool,
    /// Every ready link is suspect: it takes no new dispatch.
    pub suspect: bool,
    /// Its generation (0 when none).
    pub generation: Generation,
    /// Edge core hosting its first link.
    pub worker: Option<usize>,
    /// Its links.
    pub links: Vec<LinkStatus>,
}

/// The registry. `H` is what reaches a link's session (its mailbox); tests
/// use `()`.
#[derive(Debug)]
pub struct Registry<H> {
    owners: HashMap<String, Owner<H>>,
    next_generation: Generation,
    /// New generations registered per node id (for the reconnect count).
    registrations: HashMap<String, u64>,
    version: u64,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Self { owners: HashMap::new(), next_generation: 0, registrations: HashMap::new(), version: 0 }
    }
}

impl<H: Clone + LinkFlags> Registry<H> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims the node owning `token` for `link`, hosted on core `worker`
    /// (pending until ready). The first link of a process starts a new
    /// generation; its other links join it. A link of another process, or a
    /// second connection for the same link, is a duplicate.
    pub fn register(
        &mut self,
        config: &EdgeConfig,
        token: &str,
        link: LinkId,
        worker: usize,
    ) -> Result<(String, Generation), RegisterRefusal> {
        let node = config.node_by_token(token).ok_or(RegisterRefusal::UnknownToken)?;
        let duplicate = || RegisterRefusal::Duplicate(node.id.clone());
        if let Some(o) = self.owners.get_mut(&node.id) {
            if o.instance != link.instance || link.instance == 0 || o.links.contains_key(&link.index) {
                return Err(duplicate());
            }
            o.links.insert(link.index, Link { worker, ready: None });
            return Ok((node.id.clone(), o.generation));
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        *self.registrations.entry(node.id.clone()).or_default() += 1;
        let mut links = BTreeMap::new();
        links.insert(link.index, Link { worker, ready: None });
        let owner = Owner { generation, instance: link.instance, ready: false, draining: false, links };
        self.owners.insert(node.id.clone(), owner);
        Ok((node.id.clone(), generation))
    }

    /// Link `link` of `generation` reports ready; `handle` reaches its session.
    pub fn ready(&mut self, node_id: &str, generation: Generation, link: u32, handle: H) -> ReadyOutcome<H> {
        let Some(o) = self.owners.get_mut(node_id).filter(|o| o.generation == generation) else {
            return ReadyOutcome::Stale;
        };
        if o.draining {
            return ReadyOutcome::Stale;
        }
        let Some(l) = o.links.get_mut(&link) else { return ReadyOutcome::Stale };
        if l.ready.is_some() {
            return ReadyOutcome::AlreadyReady;
        }
        l.ready = Some(handle);
        self.version += 1;
        let set = o.ready_links(self.version);
        if std::mem::replace(&mut o.ready, true) {
            ReadyOutcome::LinkReady(set)
        } else {
            ReadyOutcome::BecameReady(set)
        }
    }

    /// Link `link` of `generation` ended. The generation ends with its last
    /// ready link (links still pending then are orphaned: their ready is
    /// stale and they register anew), or with its last link before any
    /// was ready.
    pub fn disconnect(&mut self, node_id: &str, generation: Generation, link: u32) -> DisconnectOutcome<H> {
        let Some(o) = self.owners.get_mut(node_id).filter(|o| o.generation == generation) else {
            return DisconnectOutcome::Stale;
        };
        if o.links.remove(&link).is_none() {
            return DisconnectOutcome::Stale;
        }
        let any_ready = o.links.values().any(|l| l.ready.is_some());
        if o.links.is_empty() || (o.ready && !any_ready) {
            let was_ready = o.ready;
            self.owners.remove(node_id);
            return DisconnectOutcome::Current { was_ready };
        }
        self.version += 1;
        DisconnectOutcome::LinkGone(o.ready_links(self.version))
    }

    /// The node of `generation` is draining: no link of it becomes ready
    /// again, and link changes carry `draining` (nothing to route).
    pub fn drain(&mut self, node_id: &str, generation: Generation) {
        if let Some(o) = self.owners.get_mut(node_id).filter(|o| o.generation == generation) {
            o.draining = true;
        }
    }

    /// Whether `generation` is the node's current generation and ready.
    pub fn is_current_ready(&self, node_id: &str, generation: Generation) -> bool {
        self.owners.get(node_id).is_some_and(|o| o.generation == generation && o.ready && !o.draining)
    }

    /// Connections of `node` registered after its first (new generations).
    pub fn reconnects(&self, node: &str) -> u64 {
        self.registrations.get(node).map_or(0, |n| n.saturating_sub(1))
    }

    /// Status of every configured node, in config order.
    pub fn statuses(&self, config: &EdgeConfig) -> Vec<NodeStatus> {
        config
            .nodes
            .iter()
            .map(|n| {
                let owner = self.owners.get(&n.id);
                let links: Vec<LinkStatus> = owner
                    .map(|o| {
                        o.links
                            .iter()
                            .map(|(i, l)| LinkStatus {
                                index: *i,
                                worker: l.worker,
                                ready: l.ready.is_some(),
                                suspect: l.ready.as_ref().is_some_and(LinkFlags::suspect),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let ready = owner.is_some_and(|o| o.ready);
                NodeStatus {
                    id: n.id.clone(),
                    connected: owner.is_some(),
                    ready,
                    draining: owner.is_some_and(|o| o.draining),
                    suspect: ready && links.iter().filter(|l| l.ready).all(|l| l.suspect),
                    generation: owner.map(|o| o.generation).unwrap_or(0),
                    worker: links.first().map(|l| l.worker),
                    links,
                }
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn config() -> EdgeConfig {
        let text = r#"
            [http]
            listen = "127.0.0.1:0"
            [node_listener]
            listen = "127.0.0.1:0"
            [[nodes]]
            id = "a"
            token = "tok-a"
            [[nodes.providers]]
            id = "p"
            kind = "mock"
            [[models]]
            name = "m"
            provider = "p"
        "#;
        EdgeConfig::from_toml(text, &|_| None).unwrap()
    }

    fn link(instance: u64, index: u32, count: u32) -> LinkId {
        LinkId { instance, index, count }
    }

    fn indexes(set: &LinkSet<()>) -> Vec<u32> {
        set.links.iter().map(|l| l.index).collect()
    }

    #[test]
    fn unknown_token_and_duplicate_are_refused() {
        let cfg = config();
        let mut r = Registry::<()>::new();
        assert_eq!(r.register(&cfg, "nope", LinkId::SINGLE, 0), Err(RegisterRefusal::UnknownToken));
        let (id, _g) = r.register(&cfg, "tok-a", LinkId::SINGLE, 0).unwrap();
        assert_eq!(id, "a");
        assert_eq!(r.register(&cfg, "tok-a", LinkId::SINGLE, 0), Err(RegisterRefusal::Duplicate("a".into())));
    }

    #[test]
    fn ready_is_gated_on_the_current_generation() {
        let cfg = config();
        let mut r = Registry::<()>::new();
        let (_, g1) = r.register(&cfg, "tok-a", LinkId::SINGLE, 0).unwrap();
        assert!(!r.is_current_ready("a", g1), "not dispatchable before ready");
        assert_eq!(r.ready("a", g1 + 100, 0, ()), ReadyOutcome::Stale);
        assert!(matches!(r.ready("a", g1, 0, ()), ReadyOutcome::BecameReady(_)));
        assert_eq!(r.ready("a", g1, 0, ()), ReadyOutcome::AlreadyReady);
        assert!(r.is_current_ready("a", g1));
    }

    #[test]
    fn stale_disconnect_changes_nothing() {
        let cfg = config();
        let mut r = Registry::<()>::new();
        let (_, g1) = r.register(&cfg, "tok-a", LinkId::SINGLE, 0).unwrap();
        r.ready("a", g1, 0, ());
        assert_eq!(r.disconnect("a", g1, 0), DisconnectOutcome::Current { was_ready: true });
        let (_, g2) = r.register(&cfg, "tok-a", LinkId::SINGLE, 0).unwrap();
        assert!(g2 > g1);
        // The old connection's late disconnect and ready are ignored.
        assert_eq!(r.disconnect("a", g1, 0), DisconnectOutcome::Stale);
        assert_eq!(r.ready("a", g1, 0, ()), ReadyOutcome::Stale);
        assert!(matches!(r.ready("a", g2, 0, ()), ReadyOutcome::BecameReady(_)));
        assert!(r.is_current_ready("a", g2));
        let st = r.statuses(&cfg);
        let links = vec![LinkStatus { index: 0, worker: 0, ready: true, suspect: false }];
        assert_eq!(
            st,
            vec![NodeStatus {
                id: "a".into(),
                connected: true,
                ready: true,
                draining: false,
                suspect: false,
                generation: g2,
                worker: Some(0),
                links
            }]
        );
    }

    #[test]
    fn links_of_one_process_share_a_generation_and_leave_it_one_by_one() {
        let cfg = config();
        let mut r = Registry::<()>::new();
        let (_, g) = r.register(&cfg, "tok-a", link(7, 0, 3), 0).unwrap();
        assert_eq!(r.register(&cfg, "tok-a", link(7, 2, 3), 1).unwrap().1, g);
        assert_eq!(r.register(&cfg, "tok-a", link(7, 1, 3), 1).unwrap().1, g);
        // The same link twice, another process, or a single-link node: duplicates.
        for other in [link(7, 1, 3), link(8, 3, 4), LinkId::SINGLE] {
            assert_eq!(r.register(&cfg, "tok-a", other, 0), Err(RegisterRefusal::Duplicate("a".into())));
        }
        let ReadyOutcome::BecameReady(first) = r.ready("a", g, 2, ()) else { panic!() };
        assert_eq!(indexes(&first), vec![2]);
        let ReadyOutcome::LinkReady(both) = r.ready("a", g, 0, ()) else { panic!() };
        assert_eq!(indexes(&both), vec![0, 2]);
        assert!(both.version > first.version);
        // One link dies: the node stays ready on the others, same generation.
        let DisconnectOutcome::LinkGone(left) = r.disconnect("a", g, 0) else { panic!() };
        assert_eq!(indexes(&left), vec![2]);
        assert!(r.is_current_ready("a", g));
        // It comes back (a partial reconnect) into the same generation.
        assert_eq!(r.register(&cfg, "tok-a", link(7, 0, 3), 0).unwrap().1, g);
        let ReadyOutcome::LinkReady(again) = r.ready("a", g, 0, ()) else { panic!() };
        assert_eq!(indexes(&again), vec![0, 2]);
        let st = &r.statuses(&cfg)[0];
        assert_eq!(st.links.iter().map(|l| (l.index, l.ready)).collect::<Vec<_>>(), [(0, true), (1, false), (2, true)]);
        // The last ready link ends the generation, though link 1 is pending.
        assert!(matches!(r.disconnect("a", g, 0), DisconnectOutcome::LinkGone(_)));
        assert_eq!(r.disconnect("a", g, 2), DisconnectOutcome::Current { was_ready: true });
        assert!(!r.is_current_ready("a", g));
        // The orphaned pending link is stale now; a new process starts anew.
        assert_eq!(r.ready("a", g, 1, ()), ReadyOutcome::Stale);
        assert_eq!(r.disconnect("a", g, 1), DisconnectOutcome::Stale);
        let (_, g2) = r.register(&cfg, "tok-a", link(9, 0, 2), 1).unwrap();
        assert!(g2 > g);
    }

    #[test]
    fn a_generation_that_never_got_ready_ends_with_its_last_link() {
        let cfg = config();
        let mut r = Registry::<()>::new();
        let (_, g) = r.register(&cfg, "tok-a", link(5, 0, 2), 0).unwrap();
        r.register(&cfg, "tok-a", link(5, 1, 2), 1).unwrap();
        assert!(matches!(r.disconnect("a", g, 0), DisconnectOutcome::LinkGone(ref s) if s.links.is_empty()));
        assert_eq!(r.disconnect("a", g, 1), DisconnectOutcome::Current { was_ready: false });
        assert!(!r.statuses(&cfg)[0].connected);
    }
}
