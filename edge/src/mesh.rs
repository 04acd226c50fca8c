//! The fixed mesh of worker cores: the messages between them, the two
//! sharding functions (which core owns a resource, which core serves a
//! node's link) and [`post`], the one way a core hands another a message it
//! must never lose without waiting on the caller's path.

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use iop_core::{
    config::EdgeConfig,
    rt::{
        mailbox::{self, SendError},
        oneshot::OneshotSender,
    },
};

use crate::{
    link::NodeRoute,
    pool::{Lease, LeaseClass, PoolView, ResourceKey, ResourceLoad, Waiter},
    registry::Generation,
};

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
    /// The node's share of a resource this core owns was applied (it may
    /// have grown): grant its queue what is free.
    Pump {
        /// Resource.
        key: ResourceKey,
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
    AdoptLink(Box<crate::link::Arrival>),
    /// Stop serving.
    Shutdown,
}

/// Queues `msg` on `inbox` now, or, when it is full, from a task of its own
/// that waits for room: never blocks the caller, never loses the message
/// while the edge runs (a closed inbox means shutdown: it is dropped here).
pub fn post(inbox: &mailbox::Sender<CoreMsg>, msg: CoreMsg) {
    match inbox.try_send(msg) {
        Ok(()) => {}
        Err(SendError::Full(msg)) => {
            let inbox = inbox.clone();
            monoio::spawn(async move {
                let _ = inbox.send(msg).await;
            });
        }
        Err(SendError::Closed(_)) => {}
    }
}

/// The core owning `key`'s authoritative state. `DefaultHasher::new()` has
/// fixed keys, so every core computes the same owner.
pub fn owner_of(key: &ResourceKey, workers: usize) -> usize {
    let mut h = DefaultHasher::new();
    key.node.hash(&mut h);
    key.provider.hash(&mut h);
    (h.finish() % workers.max(1) as u64) as usize
}

/// The edge core a node's link `index` is served on: links of one node go
/// to consecutive cores from a start that depends on the node, so neither
/// one core carries all of a node's traffic nor all nodes start on core 0.
pub fn link_core(node_id: &str, index: u32, workers: usize) -> usize {
    let start =
        node_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let workers = workers.max(1) as u64;
    ((start % workers + u64::from(index) % workers) % workers) as usize
}
