//! Capacity shares: how a node that serves several edges splits each
//! provider's capacity among them, so that each edge admits only within
//! its own share (its fast path stays local) and the edges never contend
//! at this node's gate.
//!
//! The gate ([`crate::run::Gates`]) stays the truth: it refuses a run past
//! a class's limit whatever the shares say. Shares only keep the edges from
//! asking for more than there is. The rules (DESIGN.md, "Capacity shares"):
//!
//! - An edge's *commitment* is what it may be using now: the largest of
//!   every share announced to it since its last acknowledgement (it may
//!   still act on any of them), the in-use count it last reported, and the
//!   runs of its links this node holds. A share grows only into what no
//!   other edge's commitment covers, so the shares in force never add up to
//!   more than the capacity. A shrinking share is announced at once and
//!   drains: no slot in use is taken back.
//! - Targets are max-min fair on the edges' demand (in use + waiting); what
//!   no demand claims is split evenly, so an idle edge still has room to
//!   start. An edge with no link gets nothing; its runs drain.
//!
//! One table per process behind a mutex: it changes when an edge joins or
//! leaves and when an edge reports its demand (a few times a second), never
//! per request.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use iop_core::{rt::mailbox, wire::pb};

use crate::run::{Class, Gates};

/// Where a session's announcements go (its link's writer task).
pub type Announcer = mailbox::Sender<pb::CapacityShares>;

/// The process's share table.
pub struct Shares {
    inner: Mutex<Inner>,
    gates: Arc<Gates>,
}

impl std::fmt::Debug for Shares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        let mut d = f.debug_struct("Shares");
        d.field("epoch", &inner.epoch);
        for (i, e) in inner.edges.iter().enumerate() {
            let mut ids: Vec<&String> = e.shares.keys().chain(e.demand.keys()).collect();
            ids.sort();
            ids.dedup();
            let per: Vec<String> = ids
                .iter()
                .map(|id| {
                    let d = e.demand.get(*id).copied().unwrap_or_default();
                    format!(
                        "{id}: share {:?} held {:?} in use {:?} waiting {}",
                        e.shares.get(*id),
                        e.held.get(*id),
                        d.in_use,
                        d.waiting
                    )
                })
                .collect();
            d.field(
                &format!("edge{i}"),
                &format_args!(
                    "links {} applied {} announced {} [{}]",
                    e.links.len(),
                    e.applied,
                    e.announced_epoch,
                    per.join("; ")
                ),
            );
        }
        d.finish()
    }
}

#[derive(Default)]
struct Inner {
    epoch: u64,
    next_link: u64,
    edges: Vec<EdgeState>,
}

#[derive(Default)]
struct EdgeState {
    /// Live sessions to this edge (one per worker): where to announce.
    links: Vec<(u64, Announcer)>,
    /// Its last report, by provider.
    demand: HashMap<String, Demand>,
    /// The newest announcement it applied.
    applied: u64,
    /// The newest announcement sent to it.
    announced_epoch: u64,
    /// The shares last announced, by provider.
    shares: HashMap<String, [u32; 2]>,
    /// The largest shares announced since its last acknowledgement.
    held: HashMap<String, [u32; 2]>,
}

/// One edge's demand for one provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Demand {
    in_use: [u32; 2],
    waiting: u32,
}

/// A session's place in the table; leaving it (drop) rebalances.
pub struct Membership {
    shares: Arc<Shares>,
    edge: usize,
    link: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shares.leave(self.edge, self.link);
    }
}

impl Shares {
    /// A table for `edges` edges over the process's `gates`.
    pub fn new(edges: usize, gates: Arc<Gates>) -> Arc<Self> {
        let inner = Inner { edges: (0..edges).map(|_| EdgeState::default()).collect(), ..Inner::default() };
        Arc::new(Self { inner: Mutex::new(inner), gates })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A session to edge `edge` is about to report ready: it joins the
    /// table, and gets the shares to announce with its ready (the other
    /// edges' shrink at once; their announcements go to their links).
    pub fn join(self: &Arc<Self>, edge: usize, announce: Announcer) -> (Membership, pb::CapacityShares) {
        let mut inner = self.lock();
        inner.next_link += 1;
        let link = inner.next_link;
        if let Some(e) = inner.edges.get_mut(edge) {
            e.links.push((link, announce));
        }
        self.rebalance(&mut inner);
        let mine = inner.edges.get(edge).map(current).unwrap_or_default();
        drop(inner);
        (Membership { shares: self.clone(), edge, link }, mine)
    }

    fn leave(&self, edge: usize, link: u64) {
        let mut inner = self.lock();
        if let Some(e) = inner.edges.get_mut(edge) {
            e.links.retain(|(id, _)| *id != link);
            if e.links.is_empty() {
                // Gone: what it may still hold is what its runs hold here.
                e.demand.clear();
                e.held.clear();
                e.shares.clear();
                e.applied = e.announced_epoch;
            }
        }
        self.rebalance(&mut inner);
    }

    /// Edge `edge` reported its demand, having applied announcement `applied`.
    pub fn report(&self, edge: usize, d: &pb::ShareDemand) {
        let mut inner = self.lock();
        let Some(e) = inner.edges.get_mut(edge) else { return };
        if d.applied_epoch >= e.announced_epoch {
            // Acknowledged: it acts on the last announcement only.
            e.held = e.shares.clone();
        }
        e.applied = e.applied.max(d.applied_epoch);
        e.demand = d
            .providers
            .iter()
            .map(|p| (p.provider.clone(), Demand { in_use: [p.in_use_normal, p.in_use_long], waiting: p.waiting }))
            .collect();
        self.rebalance(&mut inner);
    }

    /// The providers' capacities changed (a config refresh).
    pub fn reconfigured(&self) {
        let mut inner = self.lock();
        self.rebalance(&mut inner);
    }

    /// A run of edge `edge` ended while that edge had no link: its
    /// commitment shrank, the others may grow.
    pub fn drained(&self, edge: usize) {
        let mut inner = self.lock();
        if inner.edges.get(edge).is_some_and(|e| e.links.is_empty()) {
            self.rebalance(&mut inner);
        }
    }

    /// Recomputes every share; announces the changed ones.
    fn rebalance(&self, inner: &mut Inner) {
        let n = inner.edges.len();
        let providers = self.gates.capacities(n);
        let mut changed = vec![false; n];
        let connected: Vec<bool> = inner.edges.iter().map(|e| !e.links.is_empty()).collect();
        let (mut demand, mut committed, mut old, mut fresh) =
            (vec![0u32; n], vec![0u32; n], vec![0u32; n], vec![false; n]);
        for (id, caps, by_edge) in &providers {
            for class in Class::ALL {
                let c = class.index();
                let cap = caps[c];
                for (i, e) in inner.edges.iter().enumerate() {
                    let d = e.demand.get(id);
                    let share = e.shares.get(id);
                    demand[i] = d.map_or(0, |d| d.in_use[c].saturating_add(d.waiting));
                    old[i] = share.map_or(0, |s| s[c]);
                    fresh[i] = share.is_none();
                    // What it may be using now, whatever it is granted.
                    let held = e.held.get(id).map_or(0, |h| h[c]);
                    let reported = d.map_or(0, |d| d.in_use[c]);
                    let here = by_edge.get(i).map_or(0, |b| b[c]);
                    committed[i] = held.max(old[i]).max(reported).max(here);
                }
                let target = targets(cap, &demand, &connected);
                let mut total = committed.iter().fold(0u32, |a, b| a.saturating_add(*b));
                // Shrink first (at once, it drains), then grow into what is free.
                for grow in [false, true] {
                    for i in 0..n {
                        // An edge not linked holds no share: it joins fresh,
                        // and its first share gets an epoch of its own.
                        if !connected[i] || (target[i] > old[i]) != grow {
                            continue;
                        }
                        let new = if grow {
                            let others = total.saturating_sub(committed[i]);
                            target[i].min(cap.saturating_sub(others)).max(old[i])
                        } else {
                            target[i]
                        };
                        if new == old[i] && !fresh[i] {
                            continue;
                        }
                        let e = &mut inner.edges[i];
                        e.shares.entry(id.clone()).or_default()[c] = new;
                        let h = e.held.entry(id.clone()).or_default();
                        h[c] = h[c].max(new);
                        // A first share is announced too (with an epoch of its own).
                        changed[i] = true;
                        let before = committed[i];
                        committed[i] = committed[i].max(new);
                        total = total.saturating_sub(before).saturating_add(committed[i]);
                    }
                }
            }
        }
        // Providers gone from the config: nothing to share.
        for e in &mut inner.edges {
            e.shares.retain(|id, _| providers.iter().any(|(p, _, _)| p == id));
        }
        for (i, changed) in changed.into_iter().enumerate() {
            if !changed || inner.edges[i].links.is_empty() {
                continue;
            }
            inner.epoch += 1;
            let epoch = inner.epoch;
            let e = &mut inner.edges[i];
            e.announced_epoch = epoch;
            let msg = pb::CapacityShares { epoch, ..current(e) };
            for (_, tx) in &e.links {
                // A full mailbox means that link is stuck; another carries it.
                let _ = tx.try_send(msg.clone());
            }
        }
    }

    /// Edge `edge`'s shares now (for tests and the status command).
    pub fn of(&self, edge: usize) -> Vec<(String, [u32; 2])> {
        let inner = self.lock();
        let mut v: Vec<_> =
            inner.edges.get(edge).map(|e| e.shares.iter().map(|(k, s)| (k.clone(), *s)).collect()).unwrap_or_default();
        v.sort();
        v
    }
}

/// The announcement of `e`'s current shares.
fn current(e: &EdgeState) -> pb::CapacityShares {
    let mut shares: Vec<pb::ProviderShare> =
        e.shares.iter().map(|(id, s)| pb::ProviderShare { provider: id.clone(), normal: s[0], long: s[1] }).collect();
    shares.sort_by(|a, b| a.provider.cmp(&b.provider));
    pb::CapacityShares { epoch: e.announced_epoch, shares }
}

/// Max-min fair targets of `cap` over the connected edges' `demand`; what
/// no demand claims is split evenly (the remainder to the first edges), so
/// the targets of connected edges add up to `cap`.
pub(crate) fn targets(cap: u32, demand: &[u32], connected: &[bool]) -> Vec<u32> {
    let n = demand.len();
    let mut out = vec![0u32; n];
    let live: Vec<usize> = (0..n).filter(|&i| connected.get(i).copied().unwrap_or(false)).collect();
    if live.is_empty() {
        return out;
    }
    let mut by_demand = live.clone();
    by_demand.sort_by_key(|&i| (demand[i], i));
    let mut left = cap;
    let mut remaining = by_demand.len() as u32;
    for &i in &by_demand {
        let fair = left / remaining;
        let give = demand[i].min(fair);
        out[i] = give;
        left -= give;
        remaining -= 1;
    }
    let k = live.len() as u32;
    for (rank, &i) in live.iter().enumerate() {
        out[i] += left / k + u32::from((rank as u32) < left % k);
    }
    out
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;
