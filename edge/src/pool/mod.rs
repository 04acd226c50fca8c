//! The provider pool: capacity leases per provider resource, sharded by
//! owner core, with queue admission and generation fences.
//!
//! A resource is one provider on one node (`node_id + provider_id`). Its
//! authoritative counters and its FIFO of waiters live on one owner core
//! (`hash(key) % workers`, [`crate::mesh::owner_of`]); other cores reach it by message.
//! Load is published through atomics ([`ResourceLoad`]) for selection and
//! the snapshot. Capacity is released only by dropping a [`Lease`].

mod admit;
pub mod affinity;
pub mod keys;
mod lease;
mod load;
mod overlay;
mod select;
mod shard;
pub mod shares;
#[cfg(test)]
mod tests;
mod waiter;

use std::{hash::Hash, sync::Arc};

pub use admit::{admit, plan, AdmitError, Admitted, Plan};
pub use affinity::{AffinityKey, Choice};
pub use lease::Lease;
pub use load::{ModelUsage, PoolView, ResourceLoad};
pub use overlay::{HealthReport, Observed, Overlay, Source};
pub use select::{Candidate, LeastLoaded, SelectionPolicy};
pub use shard::Shard;
pub use waiter::{Waiter, WaiterState};

/// Identifies a provider resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    /// Node id.
    pub node: Arc<str>,
    /// Provider id on that node.
    pub provider: Arc<str>,
}

impl ResourceKey {
    /// The key of `provider` on `node`.
    pub fn new(node: &str, provider: &str) -> Self {
        Self { node: node.into(), provider: provider.into() }
    }

    /// The key of a model's target (its ids shared, not copied).
    pub fn of(target: &iop_core::config::ModelTarget) -> Self {
        Self { node: target.node.clone(), provider: target.provider.clone() }
    }
}

impl std::fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.node, self.provider)
    }
}

/// Which capacity pool a request draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseClass {
    /// Prompt within the model's long-context threshold.
    Normal,
    /// Prompt above it.
    Long,
}
