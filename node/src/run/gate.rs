//! The node's concurrency gate per provider, shared by every worker thread
//! of the process: each worker has its own link and run manager, and a
//! provider still never runs more than its limit whichever links its runs
//! and tunnels came in on (the adapter-local capacity guard).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex, PoisonError,
    },
};

/// The capacity class a stream draws on (the edge's lease class: a prompt
/// within the model's long-context threshold or above it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `capacity`.
    Normal,
    /// `long_capacity`.
    Long,
}

impl Class {
    /// Both, in index order.
    pub const ALL: [Class; 2] = [Class::Normal, Class::Long];

    /// Its index in per-class arrays.
    pub fn index(self) -> usize {
        match self {
            Class::Normal => 0,
            Class::Long => 1,
        }
    }

    /// The class a request's `profile` names ("long"; anything else is normal).
    pub fn of_profile(profile: &str) -> Self {
        if profile == "long" {
            Class::Long
        } else {
            Class::Normal
        }
    }
}

/// Most edges whose streams a gate counts apart (`edges` in the config).
pub const MAX_EDGES: usize = iop_core::config::MAX_EDGES;

/// One provider's gate: a limit per class, and the slots taken per class
/// and per edge (what the capacity shares count as an edge's own).
#[derive(Debug, Default)]
pub struct Gate {
    /// Both classes' slots (`max_concurrency`) and the long ones of them.
    total: AtomicU32,
    long: AtomicU32,
    limit: [AtomicU32; 2],
    in_flight: [AtomicU32; 2],
    by_edge: [[AtomicU32; 2]; MAX_EDGES],
}

impl Gate {
    /// Takes a slot of `class` for edge `edge` unless the class's limit is reached.
    pub fn try_take(&self, class: Class, edge: usize) -> bool {
        let c = class.index();
        let limit = self.limit[c].load(Ordering::Acquire);
        let taken = self.in_flight[c]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .is_ok();
        if taken {
            if let Some(e) = self.by_edge.get(edge) {
                e[c].fetch_add(1, Ordering::AcqRel);
            }
        }
        taken
    }

    /// Gives a slot taken by [`Gate::try_take`] back.
    pub fn give(&self, class: Class, edge: usize) {
        let c = class.index();
        let dec = |a: &AtomicU32| {
            let _ = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
        };
        dec(&self.in_flight[c]);
        if let Some(e) = self.by_edge.get(edge) {
            dec(&e[c]);
        }
    }

    /// Slots taken now (all workers, both classes).
    pub fn in_flight(&self) -> u32 {
        self.in_flight.iter().map(|a| a.load(Ordering::Acquire)).sum()
    }

    /// The limit (both classes).
    pub fn limit(&self) -> u32 {
        self.limit.iter().map(|a| a.load(Ordering::Acquire)).sum()
    }

    /// The limits per class.
    pub fn limits(&self) -> [u32; 2] {
        [self.limit[0].load(Ordering::Acquire), self.limit[1].load(Ordering::Acquire)]
    }

    fn split(&self) {
        let total = self.total.load(Ordering::Acquire);
        let long = self.long.load(Ordering::Acquire).min(total);
        self.limit[0].store(total - long, Ordering::Release);
        self.limit[1].store(long, Ordering::Release);
    }

    /// Slots edge `edge`'s streams hold now, per class.
    pub fn of_edge(&self, edge: usize) -> [u32; 2] {
        self.by_edge.get(edge).map_or([0, 0], |e| [e[0].load(Ordering::Acquire), e[1].load(Ordering::Acquire)])
    }
}

/// Every provider's gate, by provider id (cold path: touched when a
/// worker applies a provider config).
#[derive(Debug, Default)]
pub struct Gates {
    by_id: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Gates {
    /// No gates yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The gate of provider `id` with `limit` slots in all (created, or
    /// its limit updated: every worker applies the same config); of them,
    /// the long-context ones set by [`Gates::set_long`].
    pub fn configure(&self, id: &str, limit: u32) -> Arc<Gate> {
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = map.entry(id.to_owned()).or_default().clone();
        gate.total.store(limit, Ordering::Release);
        gate.split();
        gate
    }

    /// Of provider `id`'s slots, `long` are for long-context streams (the
    /// config's `long_capacity`; set before the adapters are gated).
    pub fn set_long(&self, id: &str, long: u32) {
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = map.entry(id.to_owned()).or_default();
        gate.long.store(long, Ordering::Release);
        gate.split();
    }

    /// Drops the gates of providers no longer configured (none in use).
    pub fn retain(&self, ids: &[&str]) {
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|id, g| ids.contains(&id.as_str()) || g.in_flight() > 0);
    }

    /// Each provider's limits per class and its slots per class for each of
    /// the first `edges` edges.
    pub fn capacities(&self, edges: usize) -> Vec<(String, [u32; 2], Vec<[u32; 2]>)> {
        let map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<_> = map
            .iter()
            .map(|(id, g)| (id.clone(), g.limits(), (0..edges.min(MAX_EDGES)).map(|e| g.of_edge(e)).collect()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const N: Class = Class::Normal;

    #[test]
    fn each_class_and_edge_counted_apart() {
        let gates = Gates::new();
        gates.set_long("p", 1);
        let g = gates.configure("p", 3);
        assert_eq!(g.limits(), [2, 1]);
        assert!(g.try_take(N, 0) && g.try_take(N, 1));
        assert!(!g.try_take(N, 0), "normal is full");
        assert!(g.try_take(Class::Long, 1));
        assert!(!g.try_take(Class::Long, 0), "long is full");
        assert_eq!((g.of_edge(0), g.of_edge(1), g.in_flight()), ([1, 0], [1, 1], 3));
        g.give(N, 1);
        assert_eq!(g.of_edge(1), [0, 1]);
        assert!(g.try_take(N, 0));
        assert_eq!(gates.capacities(2)[0].2[0], [2, 0]);
        // An edge past the table is counted in the class only.
        assert!(!g.try_take(N, MAX_EDGES));
        g.give(N, 0);
        assert!(g.try_take(N, MAX_EDGES));
        assert_eq!(g.in_flight(), 3);
    }

    #[test]
    fn workers_share_one_limit_per_provider() {
        let gates = Gates::new();
        let a = gates.configure("p", 2);
        let b = gates.configure("p", 2);
        assert!(a.try_take(N, 0) && b.try_take(N, 0));
        assert!(!a.try_take(N, 0) && !b.try_take(N, 0), "two slots in all, whichever worker asks");
        b.give(N, 0);
        assert!(a.try_take(N, 0));
        assert_eq!(a.in_flight(), 2);
        // A new limit applies to the slots already out.
        gates.configure("p", 1);
        a.give(N, 0);
        assert!(!b.try_take(N, 0));
        a.give(N, 0);
        assert!(b.try_take(N, 0));
        assert_eq!(gates.configure("q", 5).in_flight(), 0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let g = gates.configure("r", 100);
                std::thread::spawn(move || (0..1000).filter(|_| g.try_take(N, 0)).count())
            })
            .collect();
        assert_eq!(threads.into_iter().map(|t| t.join().unwrap()).sum::<usize>(), 100);
    }
}
