//! The authoritative state of the resources one core owns: capacity
//! counters, online/generation, and FIFO waiters. Plain data driven by
//! messages, so it is testable without sockets.

use std::{
    collections::{HashMap, VecDeque},
    sync::{atomic::Ordering, Arc},
};

use iop_core::{config::EdgeConfig, rt::mailbox};

use super::{
    overlay::{HealthState, Overlay},
    HealthReport, Lease, LeaseClass, Observed, PoolView, ResourceKey, ResourceLoad, Waiter,
};
use crate::{
    link::NodeRoute,
    mesh::{owner_of, CoreMsg},
    registry::Generation,
};

struct Resource {
    load: Arc<ResourceLoad>,
    normal: u32,
    long: u32,
    online: bool,
    /// The runtime health overlay of the current generation.
    health: HealthState,
    generation: Generation,
    /// The node connection that brought this resource online.
    route: Option<NodeRoute>,
    /// Every link of `route` is suspect: no capacity is offered (waiters
    /// stay queued; they lose no candidate).
    suspect: bool,
    /// Waiters per class (normal, long): separate pools, separate queues.
    fifo: [VecDeque<Arc<Waiter>>; 2],
}

fn slot(class: LeaseClass) -> usize {
    match class {
        LeaseClass::Normal => 0,
        LeaseClass::Long => 1,
    }
}

impl Resource {
    /// Online and not lowered by the overlay.
    fn live(&self) -> bool {
        self.online && self.health.overlay == Overlay::Healthy
    }

    /// Tells the waiters their candidate stopped (`false`) or started
    /// (`true`) being live.
    fn tell_waiters(&self, live: bool) {
        for w in self.waiters() {
            if w.is_waiting() {
                w.candidate_changed(live);
            }
        }
    }

    fn cap(&self, class: LeaseClass) -> u32 {
        if !self.live() || self.suspect {
            return 0;
        }
        let configured = match class {
            LeaseClass::Normal => self.normal,
            LeaseClass::Long => self.long,
        };
        // The shard's own generation: a node just back has its share (in
        // force for the new generation) before `publish` stores it.
        self.load.shared_in(class, configured, self.generation)
    }

    /// Takes one lease of `class` from the shared count if there is room.
    fn take(&self, class: LeaseClass) -> bool {
        self.load.try_take(class, self.cap(class))
    }

    fn waiters(&self) -> impl Iterator<Item = &Arc<Waiter>> {
        self.fifo.iter().flatten()
    }

    fn compact(&mut self) {
        for q in &mut self.fifo {
            q.retain(|w| w.is_waiting());
        }
    }

    fn publish(&self) {
        let l = &self.load;
        l.configured_normal.store(self.normal, Ordering::Relaxed);
        l.configured_long.store(self.long, Ordering::Relaxed);
        l.generation.store(if self.online { self.generation } else { 0 }, Ordering::Release);
        // Before any grant attempt that follows: a lease given back after
        // this store sees the waiters and tells this owner (see `Lease::drop`).
        l.waiters.store((self.fifo[0].len() + self.fifo[1].len()) as u32, Ordering::SeqCst);
        l.health.store(self.health.overlay.to_u8(), Ordering::Release);
        l.suspect.store(self.suspect, Ordering::Release);
        l.online.store(self.online, Ordering::Release);
    }

    /// Follows the suspicion of the route's links; true when it cleared
    /// (capacity is offered again: grant the queue).
    fn follow_suspicion(&mut self) -> bool {
        let suspect = self.online && self.route.as_ref().is_some_and(NodeRoute::all_suspect);
        let cleared = self.suspect && !suspect;
        if self.suspect != suspect {
            self.suspect = suspect;
            self.publish();
        }
        cleared
    }
}

/// Owner-core state of this core's resources.
pub struct Shard {
    index: usize,
    workers: usize,
    inbox: mailbox::Sender<CoreMsg>,
    resources: HashMap<ResourceKey, Resource>,
    /// Ready node connections, so resources added by a reload start online.
    ready: HashMap<String, NodeRoute>,
    /// The newest generation of each node that ended. Links of one node end
    /// on different cores, so a route published by one (the set without the
    /// link it lost) can arrive after another's fence of the same
    /// generation: it must not revive that generation.
    fenced: HashMap<String, Generation>,
    /// Releases for resources this shard does not know (removed by a reload).
    pub stray_releases: u64,
}

impl Shard {
    /// The shard of core `index` of `workers`; `inbox` is this core's own
    /// inbox (where lease guards send their release).
    pub fn new(index: usize, workers: usize, inbox: mailbox::Sender<CoreMsg>) -> Self {
        Self {
            index,
            workers,
            inbox,
            resources: HashMap::new(),
            ready: HashMap::new(),
            fenced: HashMap::new(),
            stray_releases: 0,
        }
    }

    /// Adopts the resources of `config` owned by this core (prepared `view`
    /// counters). Capacities change in place; removed resources go offline
    /// and their waiters are re-evaluated; new ones start offline.
    pub fn apply_config(&mut self, config: &EdgeConfig, view: &PoolView) {
        let mut keep = HashMap::new();
        for node in &config.nodes {
            for p in &node.providers {
                let key = ResourceKey::new(&node.id, &p.id);
                if owner_of(&key, self.workers) != self.index {
                    continue;
                }
                let Some(load) = view.resources.get(&key) else { continue };
                // A resource new to this config on an already-ready node starts online.
                let route = self.ready.get(&node.id).cloned();
                let mut r = self.resources.remove(&key).unwrap_or_else(|| Resource {
                    load: load.clone(),
                    normal: 0,
                    long: 0,
                    online: route.is_some(),
                    health: HealthState::default(),
                    generation: route.as_ref().map(|r| r.generation).unwrap_or(0),
                    route,
                    suspect: false,
                    fifo: [VecDeque::new(), VecDeque::new()],
                });
                r.normal = p.capacity.get();
                r.long = p.long_capacity;
                keep.insert(key, r);
            }
        }
        // Removed resources: their waiters lose a candidate.
        for (_, mut r) in self.resources.drain() {
            if r.live() {
                r.tell_waiters(false);
            }
            r.fifo = [VecDeque::new(), VecDeque::new()];
            r.online = false;
            r.publish();
        }
        self.resources = keep;
        let keys: Vec<_> = self.resources.keys().cloned().collect();
        for key in keys {
            self.pump(&key);
        }
    }

    /// Takes one lease of `class` on `key` if there is room and nobody is
    /// queued ahead (FIFO fairness).
    pub fn try_acquire(&mut self, key: &ResourceKey, class: LeaseClass) -> Option<Lease> {
        let r = self.resources.get_mut(key)?;
        r.compact();
        if !r.fifo[slot(class)].is_empty() || !r.take(class) {
            r.publish();
            return None;
        }
        r.publish();
        Some(Lease::new(key.clone(), class, r.load.clone(), self.inbox.clone(), r.route.clone()))
    }

    /// Queues `waiter` on `key` (granting at once if there is room).
    pub fn wait(&mut self, key: &ResourceKey, waiter: Arc<Waiter>) {
        let Some(r) = self.resources.get_mut(key) else {
            // Unknown here (config changed meanwhile): not a live candidate.
            waiter.candidate_changed(false);
            return;
        };
        if !waiter.is_waiting() {
            return;
        }
        if !r.live() {
            waiter.candidate_changed(false);
        }
        r.fifo[slot(waiter.class)].push_back(waiter);
        r.publish();
        self.pump(key);
    }

    /// A lease of `class` on `key` was given back (its guard already took
    /// it off the count) while someone may be waiting: grant what is free.
    pub fn release(&mut self, key: &ResourceKey, _class: LeaseClass, load: &Arc<ResourceLoad>) {
        if !self.resources.get(key).is_some_and(|r| Arc::ptr_eq(&r.load, load)) {
            // Removed (or removed and re-added) by a reload since the lease was granted.
            self.stray_releases += 1;
            return;
        }
        self.pump(key);
    }

    /// Drops finished waiters from `key`'s queue (a client left or was served elsewhere).
    pub fn compact(&mut self, key: &ResourceKey) {
        if let Some(r) = self.resources.get_mut(key) {
            r.compact();
            r.publish();
        }
    }

    /// Records the session of `node`'s ready connection; leases granted on
    /// its resources carry it. Call before [`Shard::node_ready`].
    pub fn set_route(&mut self, node: &str, route: &NodeRoute) {
        if self.is_fenced(node, route.generation) {
            return;
        }
        if self.ready.get(node).is_none_or(|old| route.newer_than(old)) {
            self.ready.insert(node.to_owned(), route.clone());
        }
        for (key, r) in self.resources.iter_mut() {
            if &*key.node == node && r.route.as_ref().is_none_or(|old| route.newer_than(old)) {
                r.route = Some(route.clone());
            }
        }
        self.refresh_suspicion(node);
    }

    /// A link of `node` became suspect or answered: its resources offer
    /// capacity only while some link of their route answers.
    pub fn refresh_suspicion(&mut self, node: &str) {
        let cleared: Vec<ResourceKey> = self
            .resources
            .iter_mut()
            .filter(|(key, _)| &*key.node == node)
            .filter_map(|(key, r)| r.follow_suspicion().then(|| key.clone()))
            .collect();
        for key in cleared {
            self.pump(&key);
        }
    }

    /// Whether a ready route of `node` is kept (for tests).
    #[cfg(test)]
    pub fn has_ready(&self, node: &str) -> bool {
        self.ready.contains_key(node)
    }

    /// Whether `node`'s connection `generation` already ended.
    pub fn is_fenced(&self, node: &str, generation: Generation) -> bool {
        self.fenced.get(node).is_some_and(|g| generation <= *g)
    }

    /// Node `node` became ready with connection `generation`; returns the
    /// resources that came online with it (each gets a first probe).
    pub fn node_ready(&mut self, node: &str, generation: Generation) -> Vec<ResourceKey> {
        let keys: Vec<_> = self.resources.keys().filter(|k| &*k.node == node).cloned().collect();
        let mut fresh = Vec::new();
        for key in keys {
            let Some(r) = self.resources.get_mut(&key) else { continue };
            // Generations only grow: an older (or repeated) ready changes nothing.
            if generation <= r.generation {
                continue;
            }
            let was_live = r.live();
            r.generation = generation;
            r.online = true;
            // A new connection starts with nothing against it.
            r.health.reset();
            if !was_live {
                r.tell_waiters(true);
            }
            self.pump(&key);
            fresh.push(key);
        }
        fresh
    }

    /// Node `node`'s connection `generation` ended. Stale generations change nothing.
    pub fn node_gone(&mut self, node: &str, generation: Generation) {
        let fenced = self.fenced.entry(node.to_owned()).or_insert(generation);
        *fenced = (*fenced).max(generation);
        if self.ready.get(node).is_some_and(|r| r.generation == generation) {
            self.ready.remove(node);
        }
        for (key, r) in self.resources.iter_mut() {
            if &*key.node != node || r.generation != generation || !r.online {
                continue;
            }
            if r.live() {
                r.tell_waiters(false);
            }
            r.online = false;
            r.route = None;
            r.suspect = false;
            r.compact();
            r.publish();
        }
    }

    /// Grants queued waiters, oldest first, while `key` has room (its
    /// node's share for this edge may have grown).
    pub fn pump(&mut self, key: &ResourceKey) {
        let Some(r) = self.resources.get_mut(key) else { return };
        for class in [LeaseClass::Normal, LeaseClass::Long] {
            while !r.fifo[slot(class)].is_empty() && r.take(class) {
                let Some(w) = r.fifo[slot(class)].pop_front() else { break };
                // Waiters served elsewhere or gone are skipped and dropped.
                if w.try_claim() {
                    w.deposit(Lease::new(key.clone(), class, r.load.clone(), self.inbox.clone(), r.route.clone()));
                } else {
                    r.load.give_back(class);
                }
            }
        }
        r.publish();
    }

    /// Applies a health observation (see [`super::overlay`]): only about
    /// the resource's current, online generation. Lowered, its waiters lose
    /// a live candidate; recovered, they regain it and are served.
    pub fn observe(&mut self, report: &HealthReport) -> Observed {
        let Some(r) = self.resources.get_mut(&report.key) else { return Observed::Stale };
        if !r.online || r.generation != report.generation {
            return Observed::Stale;
        }
        let observed = r.health.observe(report);
        match observed {
            Observed::Lowered | Observed::Starting => {
                r.tell_waiters(false);
                r.compact();
                r.publish();
            }
            Observed::Recovered => {
                r.tell_waiters(true);
                self.pump(&report.key);
            }
            Observed::Unchanged | Observed::Stale => {}
        }
        observed
    }

    /// The route of `key`'s node while it is online in `generation`.
    pub fn route_of(&self, key: &ResourceKey, generation: Generation) -> Option<NodeRoute> {
        let r = self.resources.get(key)?;
        (r.online && r.generation == generation).then(|| r.route.clone()).flatten()
    }

    /// What a recovery probe of `key` needs while its overlay is lowered in
    /// `generation`: the route to its node and the target to ask about.
    pub fn probe_plan(&self, key: &ResourceKey, generation: Generation) -> Option<(NodeRoute, String)> {
        let r = self.resources.get(key)?;
        if !r.online || r.generation != generation || r.health.overlay == Overlay::Healthy {
            return None;
        }
        Some((r.route.clone()?, r.health.probe_target.clone()?))
    }

    /// In-use counts of `key` (normal, long), for tests and the snapshot.
    pub fn in_use(&self, key: &ResourceKey) -> Option<(u32, u32)> {
        self.resources.get(key).map(|r| (r.load.in_use(LeaseClass::Normal), r.load.in_use(LeaseClass::Long)))
    }
}
