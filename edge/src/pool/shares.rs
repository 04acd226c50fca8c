//! The pool's side of capacity shares (DESIGN.md, "Capacity shares"): a
//! node that serves several edges announces this edge's share of each of
//! its providers, and the edge reports its demand back. Plain functions of
//! the pool view, so the link (`transport::shares`) and the simulation
//! (`iop-sim`) run the same code.

use std::{sync::atomic::Ordering, time::Duration};

use iop_core::wire::pb;

use super::{LeaseClass, PoolView, ResourceKey};

/// How often a changed demand is reported. Slower left slots idle beside
/// waiters in the simulation while a share waited for the next report.
pub const REPORT_EVERY: Duration = Duration::from_millis(50);
/// A demand that does not change is still reported this often.
pub const REPORT_ANYWAY: Duration = Duration::from_secs(5);

/// Applies announcement `s` of `node`'s connection `generation`; `grown`
/// gets each resource whose share was applied (it may have grown: its
/// owner serves its queue). True when any share was applied.
pub fn apply(
    view: &PoolView,
    node: &str,
    generation: u64,
    s: &pb::CapacityShares,
    mut grown: impl FnMut(ResourceKey),
) -> bool {
    let mut applied = false;
    for p in &s.shares {
        let key = ResourceKey::new(node, &p.provider);
        let Some(load) = view.resources.get(&key) else { continue };
        if load.share.apply(generation, s.epoch, p.normal, p.long) {
            applied = true;
            grown(key);
        }
    }
    applied
}

/// This edge's demand on `node`'s providers now (connection `generation`).
pub fn demand(view: &PoolView, node: &str, generation: u64) -> pb::ShareDemand {
    let mut d = pb::ShareDemand::default();
    for (key, load) in view.of_node(node) {
        d.applied_epoch = d.applied_epoch.max(load.share.epoch(generation));
        d.providers.push(pb::ProviderDemand {
            provider: key.provider.to_string(),
            in_use_normal: load.in_use(LeaseClass::Normal),
            in_use_long: load.in_use(LeaseClass::Long),
            waiting: load.waiters.load(Ordering::Relaxed),
        });
    }
    d.providers.sort_by(|a, b| a.provider.cmp(&b.provider));
    d
}
