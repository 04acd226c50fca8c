//! How any core reaches a ready node: its route (the ready links of its
//! generation) and, per link, the core hosting the session and the
//! session's command mailbox.

use std::sync::Arc;

use iop_core::rt::mailbox;

use crate::{registry::Generation, transport};

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
