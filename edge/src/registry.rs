//! Authoritative node registry: which connection (generation) owns each
//! configured node, and whether it is dispatch-ready. Plain data behind one
//! cold-path lock; every transition is decided here so that stale
//! connections can never change what the current one owns.

use std::collections::HashMap;

use iop_core::config::EdgeConfig;

/// Connection generation: unique per accepted node connection, increasing.
pub type Generation = u64;

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterRefusal {
    /// No configured node has this token.
    #[error("unknown node token")]
    UnknownToken,
    /// Another connection already owns this node.
    #[error("node `{0}` already has a live connection")]
    Duplicate(String),
}

/// Outcome of a ready request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyOutcome {
    /// First ready of the current connection: it is now dispatchable.
    BecameReady,
    /// The current connection was already ready (idempotent ack).
    AlreadyReady,
    /// The connection is not the node's current one.
    Stale,
}

/// Outcome of a disconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectOutcome {
    /// The current connection ended; `was_ready` says whether it had been dispatchable.
    Current {
        /// It had been ready, so cores must drop it.
        was_ready: bool,
    },
    /// A stale connection ended; nothing changes.
    Stale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Ready,
}

#[derive(Debug)]
struct Owner {
    generation: Generation,
    state: State,
    /// Worker core hosting the connection.
    worker: usize,
}

/// Live view of one node for the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// Node id.
    pub id: String,
    /// A connection owns the node.
    pub connected: bool,
    /// That connection is dispatch-ready.
    pub ready: bool,
    /// Generation of the owning connection (0 when none).
    pub generation: Generation,
    /// Worker core hosting that connection.
    pub worker: Option<usize>,
}

/// The registry.
#[derive(Debug, Default)]
pub struct Registry {
    owners: HashMap<String, Owner>,
    next_generation: Generation,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims the node owning `token` for a new connection on core `worker`
    /// (pending until ready).
    pub fn register(
        &mut self,
        config: &EdgeConfig,
        token: &str,
        worker: usize,
    ) -> Result<(String, Generation), RegisterRefusal> {
        let node = config.node_by_token(token).ok_or(RegisterRefusal::UnknownToken)?;
        if self.owners.contains_key(&node.id) {
            return Err(RegisterRefusal::Duplicate(node.id.clone()));
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        self.owners.insert(node.id.clone(), Owner { generation, state: State::Pending, worker });
        Ok((node.id.clone(), generation))
    }

    /// The connection `generation` reports ready.
    pub fn ready(&mut self, node_id: &str, generation: Generation) -> ReadyOutcome {
        match self.owners.get_mut(node_id) {
            Some(o) if o.generation == generation => match o.state {
                State::Pending => {
                    o.state = State::Ready;
                    ReadyOutcome::BecameReady
                }
                State::Ready => ReadyOutcome::AlreadyReady,
            },
            _ => ReadyOutcome::Stale,
        }
    }

    /// The connection `generation` ended.
    pub fn disconnect(&mut self, node_id: &str, generation: Generation) -> DisconnectOutcome {
        match self.owners.get(node_id) {
            Some(o) if o.generation == generation => {
                let was_ready = o.state == State::Ready;
                self.owners.remove(node_id);
                DisconnectOutcome::Current { was_ready }
            }
            _ => DisconnectOutcome::Stale,
        }
    }

    /// Whether `generation` is the node's current, ready connection.
    pub fn is_current_ready(&self, node_id: &str, generation: Generation) -> bool {
        self.owners.get(node_id).is_some_and(|o| o.generation == generation && o.state == State::Ready)
    }

    /// Status of every configured node, in config order.
    pub fn statuses(&self, config: &EdgeConfig) -> Vec<NodeStatus> {
        config
            .nodes
            .iter()
            .map(|n| {
                let owner = self.owners.get(&n.id);
                NodeStatus {
                    id: n.id.clone(),
                    connected: owner.is_some(),
                    ready: owner.is_some_and(|o| o.state == State::Ready),
                    generation: owner.map(|o| o.generation).unwrap_or(0),
                    worker: owner.map(|o| o.worker),
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

    #[test]
    fn unknown_token_and_duplicate_are_refused() {
        let cfg = config();
        let mut r = Registry::new();
        assert_eq!(r.register(&cfg, "nope", 0), Err(RegisterRefusal::UnknownToken));
        let (id, _g) = r.register(&cfg, "tok-a", 0).unwrap();
        assert_eq!(id, "a");
        assert_eq!(r.register(&cfg, "tok-a", 0), Err(RegisterRefusal::Duplicate("a".into())));
    }

    #[test]
    fn ready_is_gated_on_the_current_generation() {
        let cfg = config();
        let mut r = Registry::new();
        let (_, g1) = r.register(&cfg, "tok-a", 0).unwrap();
        assert!(!r.is_current_ready("a", g1), "not dispatchable before ready");
        assert_eq!(r.ready("a", g1 + 100), ReadyOutcome::Stale);
        assert_eq!(r.ready("a", g1), ReadyOutcome::BecameReady);
        assert_eq!(r.ready("a", g1), ReadyOutcome::AlreadyReady);
        assert!(r.is_current_ready("a", g1));
    }

    #[test]
    fn stale_disconnect_changes_nothing() {
        let cfg = config();
        let mut r = Registry::new();
        let (_, g1) = r.register(&cfg, "tok-a", 0).unwrap();
        r.ready("a", g1);
        assert_eq!(r.disconnect("a", g1), DisconnectOutcome::Current { was_ready: true });
        let (_, g2) = r.register(&cfg, "tok-a", 0).unwrap();
        assert!(g2 > g1);
        // The old connection's late disconnect and ready are ignored.
        assert_eq!(r.disconnect("a", g1), DisconnectOutcome::Stale);
        assert_eq!(r.ready("a", g1), ReadyOutcome::Stale);
        assert_eq!(r.ready("a", g2), ReadyOutcome::BecameReady);
        assert!(r.is_current_ready("a", g2));
        let st = r.statuses(&cfg);
        assert_eq!(
            st,
            vec![NodeStatus { id: "a".into(), connected: true, ready: true, generation: g2, worker: Some(0) }]
        );
    }
}
