//! Published, lock-free view of every resource's load, read by any core
//! for selection and the snapshot; written only by the owner core (and by
//! lease guards for their own count).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc,
    },
};

use iop_core::config::EdgeConfig;

use super::{LeaseClass, Overlay, ResourceKey};

/// Counters of one resource.
#[derive(Debug)]
pub struct ResourceLoad {
    /// Configured normal capacity.
    pub configured_normal: AtomicU32,
    /// Configured long capacity.
    pub configured_long: AtomicU32,
    /// The resource's node is connected and ready.
    pub online: AtomicBool,
    /// The runtime health overlay ([`Overlay`]); lowered, the resource
    /// takes no traffic though it stays online.
    pub health: AtomicU8,
    /// Every ready link of the node is suspect (silent, not answering a
    /// probe): no capacity to offer, though it stays live for waiters.
    pub suspect: AtomicBool,
    /// Normal leases in use: the count itself, taken and given back by any
    /// core (see [`Self::try_take`]).
    pub in_use_normal: AtomicU32,
    /// Long leases in use.
    pub in_use_long: AtomicU32,
    /// The node connection generation the owner saw ready (0: none).
    pub generation: AtomicU64,
    /// Waiters queued on this resource.
    pub waiters: AtomicU32,
    /// Lease guards alive (checked against in-use counts to catch leaks).
    pub live_guards: AtomicI64,
    /// The node's share of this provider for this edge (a node serving
    /// several edges announces one; see DESIGN.md, "Capacity shares").
    pub share: Share,
}

/// A node's capacity share for this edge: in force for the connection
/// generation it came on only (a node that comes back without shares, or
/// with new ones, is not held to the old).
#[derive(Debug)]
pub struct Share {
    normal: AtomicU32,
    long: AtomicU32,
    generation: AtomicU64,
    /// (generation, epoch) of the announcement applied: announcements of
    /// one generation may arrive on several links out of order.
    applied: parking_lot::Mutex<(u64, u64)>,
}

impl Default for Share {
    fn default() -> Self {
        Self {
            normal: AtomicU32::new(u32::MAX),
            long: AtomicU32::new(u32::MAX),
            generation: AtomicU64::new(0),
            applied: parking_lot::Mutex::new((0, 0)),
        }
    }
}

impl Share {
    /// Applies announcement `epoch` of connection `generation` unless a
    /// newer one is in force; true when it was applied.
    pub fn apply(&self, generation: u64, epoch: u64, normal: u32, long: u32) -> bool {
        let mut applied = self.applied.lock();
        if (generation, epoch) <= *applied {
            return false;
        }
        *applied = (generation, epoch);
        self.normal.store(normal, Ordering::SeqCst);
        self.long.store(long, Ordering::SeqCst);
        self.generation.store(generation, Ordering::SeqCst);
        true
    }

    /// The epoch of the announcement applied for connection `generation` (0: none).
    pub fn epoch(&self, generation: u64) -> u64 {
        let applied = self.applied.lock();
        if applied.0 == generation {
            applied.1
        } else {
            0
        }
    }

    /// The share of `class` in force for connection `generation` (none:
    /// the capacity is this edge's alone).
    pub fn of(&self, class: LeaseClass, generation: u64) -> Option<u32> {
        if generation == 0 || self.generation.load(Ordering::SeqCst) != generation {
            return None;
        }
        Some(match class {
            LeaseClass::Normal => self.normal.load(Ordering::SeqCst),
            LeaseClass::Long => self.long.load(Ordering::SeqCst),
        })
    }
}

impl ResourceLoad {
    /// A resource with the given configured capacities, offline.
    pub fn new(normal: u32, long: u32) -> Self {
        Self {
            configured_normal: AtomicU32::new(normal),
            configured_long: AtomicU32::new(long),
            online: AtomicBool::new(false),
            health: AtomicU8::new(0),
            suspect: AtomicBool::new(false),
            in_use_normal: AtomicU32::new(0),
            in_use_long: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            waiters: AtomicU32::new(0),
            live_guards: AtomicI64::new(0),
            share: Share::default(),
        }
    }

    /// The runtime health overlay.
    pub fn overlay(&self) -> Overlay {
        Overlay::from_u8(self.health.load(Ordering::Acquire))
    }

    /// Online and not lowered by the overlay: may take traffic.
    pub fn live(&self) -> bool {
        self.online.load(Ordering::Acquire) && self.overlay() == Overlay::Healthy
    }

    /// Effective capacity of `class`: configured when live and its node
    /// answers, else 0.
    pub fn capacity(&self, class: LeaseClass) -> u32 {
        if !self.live() || self.suspect.load(Ordering::Acquire) {
            return 0;
        }
        let configured = match class {
            LeaseClass::Normal => self.configured_normal.load(Ordering::Relaxed),
            LeaseClass::Long => self.configured_long.load(Ordering::Relaxed),
        };
        self.shared(class, configured)
    }

    /// `configured` within the node's share of `class`, when one is in force.
    pub fn shared(&self, class: LeaseClass, configured: u32) -> u32 {
        self.shared_in(class, configured, self.generation.load(Ordering::Acquire))
    }

    /// `configured` within the share of `class` in force for connection
    /// `generation` (the owner core knows it before it publishes it).
    pub fn shared_in(&self, class: LeaseClass, configured: u32, generation: u64) -> u32 {
        match self.share.of(class, generation) {
            Some(share) => configured.min(share),
            None => configured,
        }
    }

    /// Leases of `class` in use.
    pub fn in_use(&self, class: LeaseClass) -> u32 {
        match class {
            LeaseClass::Normal => self.in_use_normal.load(Ordering::Relaxed),
            LeaseClass::Long => self.in_use_long.load(Ordering::Relaxed),
        }
    }

    fn counter(&self, class: LeaseClass) -> &AtomicU32 {
        match class {
            LeaseClass::Normal => &self.in_use_normal,
            LeaseClass::Long => &self.in_use_long,
        }
    }

    /// Takes one lease of `class` if fewer than `cap` are in use. The count
    /// is shared by every core, so a core takes capacity without asking the
    /// owner (which only keeps the queues); sequentially consistent, paired
    /// with the waiter count (see `Lease::drop`).
    pub fn try_take(&self, class: LeaseClass, cap: u32) -> bool {
        self.counter(class).fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < cap).then_some(n + 1)).is_ok()
    }

    /// Gives one lease of `class` back.
    pub fn give_back(&self, class: LeaseClass) {
        let _ = self.counter(class).fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Fraction of `class` capacity in use (∞ when there is none).
    pub fn utilisation(&self, class: LeaseClass) -> f64 {
        let cap = self.capacity(class);
        if cap == 0 {
            f64::INFINITY
        } else {
            f64::from(self.in_use(class)) / f64::from(cap)
        }
    }
}

/// Token usage accounted for one model (counted when a run or tunnel ends
/// with usage reported; atomics, so any core adds without a lock).
#[derive(Debug, Default)]
pub struct ModelUsage {
    /// Completed runs and tunnels whose provider reported usage.
    pub reported: AtomicU64,
    /// Completed ones whose provider reported none (unknown, never zero).
    pub unreported: AtomicU64,
    /// Prompt tokens.
    pub input_tokens: AtomicU64,
    /// Completion tokens.
    pub output_tokens: AtomicU64,
    /// Reasoning tokens, where reported.
    pub reasoning_tokens: AtomicU64,
    /// Cached prompt tokens, where reported.
    pub cached_input_tokens: AtomicU64,
}

impl ModelUsage {
    /// Adds one completed stream's usage (`None`: the provider reported none).
    pub fn add(&self, usage: Option<&iop_core::exec::Usage>) {
        let Some(u) = usage else {
            self.unreported.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.reported.fetch_add(1, Ordering::Relaxed);
        self.input_tokens.fetch_add(u.input_tokens, Ordering::Relaxed);
        self.output_tokens.fetch_add(u.output_tokens, Ordering::Relaxed);
        self.reasoning_tokens.fetch_add(u.reasoning_tokens.unwrap_or(0), Ordering::Relaxed);
        self.cached_input_tokens.fetch_add(u.cached_input_tokens.unwrap_or(0), Ordering::Relaxed);
    }
}

/// Every resource of one config revision, plus per-model waiter counts and
/// usage.
#[derive(Debug, Default)]
pub struct PoolView {
    /// Loads by resource.
    pub resources: HashMap<ResourceKey, Arc<ResourceLoad>>,
    /// Each node's resources (a link's demand report reads its node's
    /// alone, not every resource of the fleet).
    by_node: HashMap<Arc<str>, Vec<(ResourceKey, Arc<ResourceLoad>)>>,
    /// Waiters per public model name (bounded by `max_waiters`).
    pub waiters: HashMap<String, Arc<AtomicU32>>,
    /// Usage per public model name.
    pub usage: HashMap<String, Arc<ModelUsage>>,
    /// Client API keys and their rates (`[[api_keys]]`).
    pub keys: Vec<Arc<super::keys::KeyState>>,
}

impl PoolView {
    /// The view for `config`, reusing the counters of `prev` for resources
    /// and models that still exist (so in-flight leases stay counted).
    pub fn build(config: &EdgeConfig, prev: Option<&PoolView>) -> Self {
        let mut resources = HashMap::new();
        let mut by_node: HashMap<Arc<str>, Vec<_>> = HashMap::new();
        for node in &config.nodes {
            let of_node = by_node.entry(node.id.as_str().into()).or_default();
            for p in &node.providers {
                let key = ResourceKey::new(&node.id, &p.id);
                // Kept counters get their new capacity from the owner core at commit.
                let load = match prev.and_then(|v| v.resources.get(&key)) {
                    Some(l) => l.clone(),
                    None => Arc::new(ResourceLoad::new(p.capacity.get(), p.long_capacity)),
                };
                of_node.push((key.clone(), load.clone()));
                resources.insert(key, load);
            }
        }
        let waiters = config
            .models
            .iter()
            .map(|m| {
                let c = prev.and_then(|v| v.waiters.get(&m.name)).cloned().unwrap_or_default();
                (m.name.clone(), c)
            })
            .collect();
        let usage = config
            .models
            .iter()
            .map(|m| (m.name.clone(), prev.and_then(|v| v.usage.get(&m.name)).cloned().unwrap_or_default()))
            .collect();
        let keys = super::keys::build(&config.api_keys, prev.map_or(&[][..], |v| &v.keys[..]));
        Self { resources, by_node, waiters, usage, keys }
    }

    /// The resources of `node`.
    pub fn of_node(&self, node: &str) -> impl Iterator<Item = (&ResourceKey, &Arc<ResourceLoad>)> {
        self.by_node.get(node).into_iter().flatten().map(|(k, l)| (k, l))
    }
}
